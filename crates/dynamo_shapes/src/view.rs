//! Views: the sizes and strides of `view`/`reshape`/`permute`/`unsqueeze`/`expand` results,
//! which share their input's storage.

use crate::layout::{numel, ShapeError};

/// Replaces the one `-1` in a `view`/`reshape` target by what the element count implies, and
/// checks that the count matches.
pub fn infer_size(shape: &[i64], numel_in: i64) -> Result<Vec<i64>, ShapeError> {
    let mut inferred = None;
    let mut known = 1i64;
    for (d, &size) in shape.iter().enumerate() {
        match size {
            -1 if inferred.is_none() => inferred = Some(d),
            s if s >= 0 => known *= s,
            _ => {
                return Err(ShapeError::InvalidShape {
                    shape: shape.to_vec(),
                })
            }
        }
    }
    let mismatch = || ShapeError::NumelMismatch {
        shape: shape.to_vec(),
        numel: numel_in,
    };
    let mut out = shape.to_vec();
    match inferred {
        Some(d) => {
            if known == 0 || numel_in % known != 0 {
                return Err(mismatch());
            }
            out[d] = numel_in / known;
        }
        None if known != numel_in => return Err(mismatch()),
        None => {}
    }
    Ok(out)
}

/// Strides that let a tensor of `old_sizes`/`old_strides` be viewed as `new_sizes` (same
/// element count) without copying, or `None` when no such strides exist (then `view` fails
/// and `reshape` copies). ATen's rule: the old dimensions are cut into chunks that are
/// contiguous among themselves, and each chunk must be covered by whole new dimensions.
pub fn view_strides(old_sizes: &[i64], old_strides: &[i64], new_sizes: &[i64]) -> Option<Vec<i64>> {
    // A view to the same shape keeps the strides as they are (torch's meta kernels return an
    // alias; the chunk rule below would renumber the strides of size-1 dimensions).
    if old_sizes == new_sizes {
        return Some(old_strides.to_vec());
    }
    if old_sizes.is_empty() {
        return Some(vec![1; new_sizes.len()]);
    }
    let count = numel(old_sizes);
    if count == 0 {
        if old_sizes == new_sizes {
            return Some(old_strides.to_vec());
        }
        let mut strides = vec![0; new_sizes.len()];
        for d in (0..new_sizes.len()).rev() {
            strides[d] = if d + 1 == new_sizes.len() {
                1
            } else {
                new_sizes[d + 1].max(1) * strides[d + 1]
            };
        }
        return Some(strides);
    }
    let mut strides = vec![0; new_sizes.len()];
    let mut view_d = new_sizes.len() as isize - 1;
    let mut chunk_base_stride = *old_strides.last()?;
    let mut tensor_numel = 1;
    let mut view_numel = 1;
    for tensor_d in (0..old_sizes.len()).rev() {
        tensor_numel *= old_sizes[tensor_d];
        let chunk_ends = tensor_d == 0
            || (old_sizes[tensor_d - 1] != 1
                && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
        if chunk_ends {
            while view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d as usize] == 1) {
                strides[view_d as usize] = view_numel * chunk_base_stride;
                view_numel *= new_sizes[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = old_strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(strides)
}

/// The strides FakeTensorMode gives `view(new_sizes)`, or `None` when it cannot be a view.
/// Fake (and meta) tensors view through PrimTorch's reshape algorithm, not ATen's chunk rule
/// ([`view_strides`]): both agree on which views exist and on the strides of dimensions of
/// size > 1, but not on those of size 1. The algorithm builds the new dimensions left to
/// right: a dimension already of the right size is kept; otherwise old dimensions are merged
/// (which must be possible without a copy) until their product is a multiple of the new
/// size, which is then split off as the outer part; new trailing 1s split the last dimension,
/// old trailing 1s are dropped. `new_sizes` has no -1 and the same element count.
pub fn reference_view_strides(
    old_sizes: &[i64],
    old_strides: &[i64],
    new_sizes: &[i64],
) -> Option<Vec<i64>> {
    if numel(old_sizes) == 0 {
        return Some(crate::layout::contiguous_strides(new_sizes));
    }
    if old_sizes.is_empty() || new_sizes.is_empty() {
        // To and from 0-d tensors: rare, left to FakeTensorMode.
        return None;
    }
    if crate::layout::is_contiguous(old_sizes, old_strides) {
        if new_sizes.len() == 1 && old_sizes.len() > 1 {
            return Some(vec![1]);
        }
        if new_sizes.len() == 2 && old_sizes.len() == 1 {
            return Some(vec![new_sizes[1], 1]);
        }
    }
    let mut sizes = old_sizes.to_vec();
    let mut strides = old_strides.to_vec();
    let mut idx = 0;
    for &length in new_sizes {
        if idx >= sizes.len() {
            if length != 1 {
                return None;
            }
            let last = sizes.len() - 1;
            let outer = sizes[last];
            split_dim(&mut sizes, &mut strides, last, outer);
            idx += 1;
            continue;
        }
        if length == sizes[idx] {
            idx += 1;
            continue;
        }
        if length <= 0 {
            return None;
        }
        let mut accum = sizes[idx];
        let mut end = idx;
        while accum % length != 0 {
            end += 1;
            accum *= *sizes.get(end)?;
        }
        if end != idx {
            collapse(&mut sizes, &mut strides, idx, end)?;
        }
        if accum != length {
            split_dim(&mut sizes, &mut strides, idx, length);
        }
        idx += 1;
    }
    while idx < sizes.len() {
        if sizes[idx] != 1 {
            return None;
        }
        sizes.remove(idx);
        strides.remove(idx);
    }
    Some(strides)
}

/// Dimension `dim` split into `outer` × the rest, the rest inside.
fn split_dim(sizes: &mut Vec<i64>, strides: &mut Vec<i64>, dim: usize, outer: i64) {
    let inner = sizes[dim] / outer;
    let stride = strides[dim];
    sizes.splice(dim..=dim, [outer, inner]);
    strides.splice(dim..=dim, [stride * inner, stride]);
}

/// Dimensions `start..=end` merged into one, or `None` when that needs a copy: every
/// neighbouring pair must be adjacent in memory unless one of the two has size 1. The merged
/// stride is the smallest among the dimensions not of size 1 (and the last).
fn collapse(sizes: &mut Vec<i64>, strides: &mut Vec<i64>, start: usize, end: usize) -> Option<()> {
    let viewable = (start..end)
        .all(|d| sizes[d] == 1 || sizes[d + 1] == 1 || strides[d] == strides[d + 1] * sizes[d + 1]);
    if !viewable {
        return None;
    }
    let mut stride = strides[end];
    for d in start..end {
        if sizes[d] != 1 {
            stride = stride.min(strides[d]);
        }
    }
    let length: i64 = sizes[start..=end].iter().product();
    sizes.splice(start..=end, [length]);
    strides.splice(start..=end, [stride]);
    Some(())
}

/// A dimension index as Python writes it (negative from the end) made absolute, for a tensor
/// of `ndim` dimensions (0-d tensors accept 0 and -1).
pub fn wrap_dim(dim: i64, ndim: usize) -> Option<usize> {
    let n = ndim.max(1) as i64;
    let d = if dim < 0 { dim + n } else { dim };
    (0..n).contains(&d).then_some(d as usize)
}

/// Sizes and strides after `permute(dims)`; `None` unless `dims` is a permutation.
pub fn permute(sizes: &[i64], strides: &[i64], dims: &[i64]) -> Option<(Vec<i64>, Vec<i64>)> {
    if dims.len() != sizes.len() {
        return None;
    }
    let mut seen = vec![false; sizes.len()];
    let mut out = (
        Vec::with_capacity(dims.len()),
        Vec::with_capacity(dims.len()),
    );
    for &dim in dims {
        let d = wrap_dim(dim, sizes.len())?;
        if std::mem::replace(&mut seen[d], true) {
            return None;
        }
        out.0.push(sizes[d]);
        out.1.push(strides[d]);
    }
    Some(out)
}

/// Sizes and strides after `unsqueeze(dim)`.
pub fn unsqueeze(sizes: &[i64], strides: &[i64], dim: i64) -> Option<(Vec<i64>, Vec<i64>)> {
    let d = wrap_dim(dim, sizes.len() + 1)?;
    let stride = if d >= sizes.len() {
        1
    } else {
        sizes[d] * strides[d]
    };
    let (mut s, mut t) = (sizes.to_vec(), strides.to_vec());
    s.insert(d, 1);
    t.insert(d, stride);
    Some((s, t))
}

/// Sizes and strides after `expand(target)` (`-1` keeps a size); `None` if not expandable.
pub fn expand(sizes: &[i64], strides: &[i64], target: &[i64]) -> Option<(Vec<i64>, Vec<i64>)> {
    if target.len() < sizes.len() {
        return None;
    }
    let offset = target.len() - sizes.len();
    let mut out = (vec![0; target.len()], vec![0; target.len()]);
    for d in (0..target.len()).rev() {
        let want = target[d];
        if d < offset {
            if want < 0 {
                return None;
            }
            // A new leading dimension: stride 0 (or as if contiguous when it has size 1,
            // which is what ATen's inferExpandGeometry gives).
            out.0[d] = want;
            out.1[d] = if d + 1 == target.len() {
                1
            } else {
                out.0[d + 1] * out.1[d + 1]
            };
            if want != 1 {
                out.1[d] = 0;
            }
            continue;
        }
        let (size, stride) = (sizes[d - offset], strides[d - offset]);
        let want = if want == -1 { size } else { want };
        if size == want {
            out.0[d] = size;
            out.1[d] = stride;
        } else if size == 1 && want >= 0 {
            out.0[d] = want;
            out.1[d] = 0;
        } else {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::contiguous_strides;

    #[test]
    fn infer_one_size() {
        assert_eq!(infer_size(&[-1, 4], 12).unwrap(), vec![3, 4]);
        assert!(infer_size(&[-1, 5], 12).is_err());
        assert!(infer_size(&[-1, -1], 12).is_err());
        assert!(infer_size(&[2, 5], 12).is_err());
    }

    #[test]
    fn view_of_contiguous_is_contiguous() {
        let old = [2, 3, 4];
        let new = [6, 4];
        assert_eq!(
            view_strides(&old, &contiguous_strides(&old), &new).unwrap(),
            contiguous_strides(&new)
        );
    }

    #[test]
    fn view_across_a_transpose_fails() {
        // [3, 4] transposed to [4, 3]: flattening needs a copy.
        assert_eq!(view_strides(&[4, 3], &[1, 4], &[12]), None);
        // Splitting the last dimension of the transposed tensor is fine.
        assert_eq!(
            view_strides(&[4, 3], &[1, 4], &[2, 2, 3]).unwrap(),
            vec![2, 1, 4]
        );
    }

    #[test]
    fn views_of_zero_dim() {
        assert_eq!(view_strides(&[], &[], &[1, 1]).unwrap(), vec![1, 1]);
    }

    #[test]
    fn permutations() {
        assert_eq!(
            permute(&[2, 3, 4], &[12, 4, 1], &[0, 2, 1]).unwrap(),
            (vec![2, 4, 3], vec![12, 1, 4])
        );
        assert_eq!(
            permute(&[2, 3], &[3, 1], &[-1, 0]).unwrap(),
            (vec![3, 2], vec![1, 3])
        );
        assert!(permute(&[2, 3], &[3, 1], &[0, 0]).is_none());
    }

    #[test]
    fn unsqueeze_strides() {
        assert_eq!(
            unsqueeze(&[2, 3], &[3, 1], 1).unwrap(),
            (vec![2, 1, 3], vec![3, 3, 1])
        );
        assert_eq!(
            unsqueeze(&[2, 3], &[3, 1], -1).unwrap(),
            (vec![2, 3, 1], vec![3, 1, 1])
        );
    }

    #[test]
    fn expansion() {
        assert_eq!(
            expand(&[3, 1], &[1, 1], &[2, 3, 4]).unwrap(),
            (vec![2, 3, 4], vec![0, 1, 0])
        );
        assert!(expand(&[3, 2], &[2, 1], &[3, 4]).is_none());
    }
}
