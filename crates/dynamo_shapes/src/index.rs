//! Basic indexing, `t[1, :, None, ..., ::2]`: integers, slices with a positive step, `None`
//! and one `...`. The result is always a view of the tensor. (Tensor or boolean indices are
//! advanced indexing, which copies; this module does not model them.)

use crate::view::wrap_dim;

/// One entry of an index tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    /// Selects one position and drops the dimension.
    Int(i64),
    /// `start:stop:step`, each end optional (Python's defaults); `step` is positive.
    Slice {
        start: Option<i64>,
        stop: Option<i64>,
        step: i64,
    },
    /// `None`: a new dimension of size 1.
    NewAxis,
    /// `...`: as many full slices as the other entries leave dimensions.
    Ellipsis,
}

/// Sizes, strides and storage offset of a view.
pub type ViewLayout = (Vec<i64>, Vec<i64>, i64);

/// The view `t[items]` of a tensor with the given layout, or `None` when the index is out of
/// range or not basic (torch raises; the caller lets FakeTensorMode say how).
pub fn index(sizes: &[i64], strides: &[i64], offset: i64, items: &[Index]) -> Option<ViewLayout> {
    let consuming = items
        .iter()
        .filter(|i| matches!(i, Index::Int(_) | Index::Slice { .. }))
        .count();
    let ellipses = items
        .iter()
        .filter(|i| matches!(i, Index::Ellipsis))
        .count();
    if consuming > sizes.len() || ellipses > 1 {
        return None;
    }
    let mut out_sizes = Vec::with_capacity(sizes.len() + items.len());
    let mut out_strides = Vec::with_capacity(sizes.len() + items.len());
    let mut offset = offset;
    let mut dim = 0;
    for item in items {
        match *item {
            Index::Int(i) => {
                let size = sizes[dim];
                let i = if i < 0 { i + size } else { i };
                if !(0..size).contains(&i) {
                    return None;
                }
                offset += i * strides[dim];
                dim += 1;
            }
            Index::Slice { start, stop, step } => {
                if step <= 0 {
                    return None;
                }
                let size = sizes[dim];
                let clamp = |v: i64| (if v < 0 { v + size } else { v }).clamp(0, size);
                let start = start.map_or(0, clamp);
                let stop = stop.map_or(size, clamp).max(start);
                out_sizes.push((stop - start + step - 1) / step);
                out_strides.push(strides[dim] * step);
                offset += start * strides[dim];
                dim += 1;
            }
            Index::NewAxis => {
                // The stride of a new size-1 dimension, as `unsqueeze` gives it.
                let stride = if dim < sizes.len() {
                    sizes[dim] * strides[dim]
                } else {
                    1
                };
                out_sizes.push(1);
                out_strides.push(stride);
            }
            Index::Ellipsis => {
                let kept = sizes.len() - consuming;
                out_sizes.extend_from_slice(&sizes[dim..dim + kept]);
                out_strides.extend_from_slice(&strides[dim..dim + kept]);
                dim += kept;
            }
        }
    }
    out_sizes.extend_from_slice(&sizes[dim..]);
    out_strides.extend_from_slice(&strides[dim..]);
    Some((out_sizes, out_strides, offset))
}

/// The views `split(split_size, dim)` returns: chunks of `split_size` along `dim`, the last
/// one shorter if it has to be.
pub fn split(
    sizes: &[i64],
    strides: &[i64],
    offset: i64,
    split_size: i64,
    dim: i64,
) -> Option<Vec<ViewLayout>> {
    let d = wrap_dim(dim, sizes.len())?;
    if sizes.is_empty() || split_size <= 0 {
        return None;
    }
    let lengths: Vec<i64> = (0..sizes[d])
        .step_by(split_size as usize)
        .map(|start| split_size.min(sizes[d] - start))
        .collect();
    split_with_sizes(sizes, strides, offset, &lengths, dim)
}

/// The views `split([l0, l1, ...], dim)` returns; the lengths must add up to the size.
pub fn split_with_sizes(
    sizes: &[i64],
    strides: &[i64],
    offset: i64,
    lengths: &[i64],
    dim: i64,
) -> Option<Vec<ViewLayout>> {
    let d = wrap_dim(dim, sizes.len())?;
    if sizes.is_empty() || lengths.iter().any(|&l| l < 0) || lengths.iter().sum::<i64>() != sizes[d]
    {
        return None;
    }
    let mut start = 0;
    let mut out = Vec::with_capacity(lengths.len());
    for &length in lengths {
        let mut s = sizes.to_vec();
        s[d] = length;
        out.push((s, strides.to_vec(), offset + start * strides[d]));
        start += length;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Index::*;

    const FULL: Index = Slice {
        start: None,
        stop: None,
        step: 1,
    };

    #[test]
    fn select_and_slice() {
        // t of [4, 5] contiguous: t[1, 1:4:2] -> sizes [2], stride 2, offset 5 + 1.
        assert_eq!(
            index(
                &[4, 5],
                &[5, 1],
                0,
                &[
                    Int(1),
                    Slice {
                        start: Some(1),
                        stop: Some(4),
                        step: 2
                    }
                ]
            )
            .unwrap(),
            (vec![2], vec![2], 6)
        );
        assert_eq!(
            index(&[4, 5], &[5, 1], 0, &[Int(-1)]).unwrap(),
            (vec![5], vec![1], 15)
        );
        assert!(index(&[4, 5], &[5, 1], 0, &[Int(4)]).is_none());
    }

    #[test]
    fn slices_clamp_like_python() {
        assert_eq!(
            index(
                &[4],
                &[1],
                0,
                &[Slice {
                    start: Some(-10),
                    stop: Some(100),
                    step: 1
                }]
            )
            .unwrap(),
            (vec![4], vec![1], 0)
        );
        assert_eq!(
            index(
                &[4],
                &[1],
                0,
                &[Slice {
                    start: Some(3),
                    stop: Some(1),
                    step: 1
                }]
            )
            .unwrap(),
            (vec![0], vec![1], 3)
        );
    }

    #[test]
    fn new_axes_and_ellipsis() {
        assert_eq!(
            index(&[2, 3, 4], &[12, 4, 1], 0, &[Ellipsis, Int(0)]).unwrap(),
            (vec![2, 3], vec![12, 4], 0)
        );
        assert_eq!(
            index(&[2, 3], &[3, 1], 0, &[FULL, NewAxis]).unwrap(),
            (vec![2, 1, 3], vec![3, 3, 1], 0)
        );
        assert_eq!(
            index(&[2, 3], &[3, 1], 0, &[Ellipsis, NewAxis]).unwrap(),
            (vec![2, 3, 1], vec![3, 1, 1], 0)
        );
        assert!(index(&[2, 3], &[3, 1], 0, &[Ellipsis, Ellipsis]).is_none());
    }

    #[test]
    fn splits() {
        let parts = split(&[2, 7], &[7, 1], 0, 3, 1).unwrap();
        assert_eq!(
            parts.iter().map(|p| (p.0[1], p.2)).collect::<Vec<_>>(),
            vec![(3, 0), (3, 3), (1, 6)]
        );
        assert!(split_with_sizes(&[2, 7], &[7, 1], 0, &[3, 3], 1).is_none());
    }
}
