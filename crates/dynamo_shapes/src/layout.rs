//! Facts about one tensor's layout, and broadcasting. The predicates follow c10's
//! definitions exactly (`TensorImpl`'s contiguity flags), because the layout rules in
//! [`crate::elementwise`] branch on them.

use std::fmt;

/// Shapes that cannot be combined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShapeError {
    /// Two sizes of the same (right-aligned) dimension differ and neither is 1.
    NotBroadcastable { dim: usize, left: i64, right: i64 },
    /// A `view`/`reshape` target whose element count does not match the tensor's.
    NumelMismatch { shape: Vec<i64>, numel: i64 },
    /// More than one `-1`, or a size below -1.
    InvalidShape { shape: Vec<i64> },
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShapeError::NotBroadcastable { dim, left, right } => write!(
                f,
                "sizes {left} and {right} of dimension {dim} (counted from the right) do not broadcast"
            ),
            ShapeError::NumelMismatch { shape, numel } => {
                write!(f, "shape {shape:?} is invalid for input of size {numel}")
            }
            ShapeError::InvalidShape { shape } => write!(f, "invalid shape {shape:?}"),
        }
    }
}

impl std::error::Error for ShapeError {}

/// Number of elements.
pub fn numel(sizes: &[i64]) -> i64 {
    sizes.iter().product()
}

/// Strides of a fresh row-major tensor. Size-0 dimensions count as 1, as in c10, so no
/// stride is 0.
pub fn contiguous_strides(sizes: &[i64]) -> Vec<i64> {
    let mut strides = vec![0; sizes.len()];
    let mut next = 1;
    for d in (0..sizes.len()).rev() {
        strides[d] = next;
        next *= sizes[d].max(1);
    }
    strides
}

/// Strides of a fresh 4-d tensor in channels-last order (N, H, W, C innermost last).
pub fn channels_last_strides(sizes: &[i64]) -> Option<Vec<i64>> {
    if sizes.len() != 4 {
        return None;
    }
    let mut strides = vec![0; 4];
    strides[1] = 1;
    strides[3] = sizes[1];
    strides[2] = strides[3] * sizes[3];
    strides[0] = strides[2] * sizes[2];
    Some(strides)
}

/// Strides of `fresh.to(memory_format=...)` for a fresh (row-major) tensor of `sizes`. `to`
/// keeps a tensor whose *suggested* format is already the target; row-major strides never
/// suggest channels-last (c10's heuristic breaks ties towards row-major), so converting
/// always gives channels-last strides — also for `[N, C, 1, 1]`, which is contiguous in both.
pub fn strides_in_format(sizes: &[i64], channels_last: bool) -> Option<Vec<i64>> {
    if channels_last {
        channels_last_strides(sizes)
    } else {
        Some(contiguous_strides(sizes))
    }
}

/// `tensor.is_contiguous()`: row-major, ignoring the strides of size-1 dimensions; any
/// empty tensor is contiguous.
pub fn is_contiguous(sizes: &[i64], strides: &[i64]) -> bool {
    numel(sizes) == 0 || dense_in_order(sizes, strides, (0..sizes.len()).rev())
}

/// `tensor.is_contiguous(memory_format=torch.channels_last)`, which only 4-d tensors can be.
pub fn is_channels_last_contiguous(sizes: &[i64], strides: &[i64]) -> bool {
    sizes.len() == 4 && dense_in_order(sizes, strides, [1, 3, 2, 0])
}

/// Dense with the dimensions nested in `inner_first` order (innermost first), size-1
/// dimensions having no say.
fn dense_in_order(
    sizes: &[i64],
    strides: &[i64],
    inner_first: impl IntoIterator<Item = usize>,
) -> bool {
    let mut expected = 1;
    for d in inner_first {
        if sizes[d] != 1 {
            if strides[d] != expected {
                return false;
            }
            expected *= sizes[d];
        }
    }
    true
}

/// Whether c10 suggests the channels-last memory format for a 4-d tensor with these strides
/// (`suggest_memory_format()`): strides increasing in the order C, W, H, N, with ambiguous
/// cases (a trivial C dimension, N111-like shapes) resolved towards row-major. Only 4-d
/// tensors can suggest it (5-d ones have their own 3-d variant, not modelled).
pub fn suggests_channels_last(sizes: &[i64], strides: &[i64]) -> bool {
    if sizes.len() != 4 || strides[1] == 0 {
        return false;
    }
    let mut min = 0;
    for d in [1, 3, 2, 0] {
        if sizes[d] == 0 || strides[d] < min {
            return false;
        }
        if d == 0 && min == strides[1] {
            return false;
        }
        min = strides[d];
        if sizes[d] > 1 {
            min *= sizes[d];
        }
    }
    true
}

/// Every element at a distinct offset and the offsets without gaps, in some dimension order.
pub fn is_non_overlapping_and_dense(sizes: &[i64], strides: &[i64]) -> bool {
    let dim = sizes.len();
    if dim == 1 {
        return sizes[0] < 2 || strides[0] == 1;
    }
    let mut order: Vec<usize> = (0..dim).collect();
    // Sizes 0 and 1 last; the rest by increasing stride (a stable sort, as c10's std::sort
    // gives no order among equal strides either and the result does not depend on it).
    order.sort_by(|&a, &b| {
        let (small_a, small_b) = (sizes[a] < 2, sizes[b] < 2);
        small_a.cmp(&small_b).then(if small_a || small_b {
            std::cmp::Ordering::Equal
        } else {
            strides[a].cmp(&strides[b])
        })
    });
    let mut required = 1;
    for &d in &order {
        if sizes[d] < 2 {
            return true;
        }
        if strides[d] != required {
            return false;
        }
        required *= sizes[d];
    }
    true
}

/// The broadcast of several shapes (numpy's rule: right-aligned, equal sizes or 1).
pub fn broadcast_shapes(shapes: &[&[i64]]) -> Result<Vec<i64>, ShapeError> {
    let ndim = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1; ndim];
    for shape in shapes {
        let offset = ndim - shape.len();
        for (i, &size) in shape.iter().enumerate() {
            let slot = &mut out[offset + i];
            if *slot == 1 {
                *slot = size;
            } else if size != 1 && size != *slot {
                return Err(ShapeError::NotBroadcastable {
                    dim: ndim - offset - i - 1,
                    left: *slot,
                    right: size,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_treat_zero_sizes_as_one() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[2, 0, 4]), vec![4, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<i64>::new());
    }

    #[test]
    fn contiguity_ignores_size_one_dimensions() {
        assert!(is_contiguous(&[1, 8], &[1, 1]));
        assert!(is_contiguous(&[2, 3], &[3, 1]));
        assert!(!is_contiguous(&[2, 3], &[1, 2]));
        assert!(is_contiguous(&[0, 3], &[7, 9]));
    }

    #[test]
    fn channels_last() {
        let sizes = [2, 8, 5, 5];
        let strides = channels_last_strides(&sizes).unwrap();
        assert_eq!(strides, vec![200, 1, 40, 8]);
        assert_eq!(strides_in_format(&sizes, true).unwrap(), strides);
        assert_eq!(
            strides_in_format(&[2, 8, 1, 1], true).unwrap(),
            vec![8, 1, 8, 8]
        );
        assert!(is_channels_last_contiguous(&sizes, &strides));
        assert!(!is_contiguous(&sizes, &strides));
        assert!(!is_channels_last_contiguous(&[2, 3], &[3, 1]));
        assert!(suggests_channels_last(&sizes, &strides));
        // Row-major never suggests channels-last, even where it is channels-last contiguous.
        assert!(!suggests_channels_last(&[2, 8, 1, 1], &[8, 1, 1, 1]));
        assert!(!suggests_channels_last(&[2, 1, 1, 1], &[1, 1, 1, 1]));
    }

    #[test]
    fn density() {
        assert!(is_non_overlapping_and_dense(&[2, 3], &[1, 2]));
        assert!(!is_non_overlapping_and_dense(&[2, 3], &[6, 2]));
        assert!(!is_non_overlapping_and_dense(&[2, 3], &[0, 1]));
        assert!(is_non_overlapping_and_dense(&[1, 3], &[100, 1]));
        assert!(is_non_overlapping_and_dense(&[], &[]));
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[&[5, 1], &[1, 3]]).unwrap(), vec![5, 3]);
        assert_eq!(
            broadcast_shapes(&[&[2, 3, 4], &[4], &[]]).unwrap(),
            vec![2, 3, 4]
        );
        assert_eq!(
            broadcast_shapes(&[&[2, 3], &[4, 3]]),
            Err(ShapeError::NotBroadcastable {
                dim: 1,
                left: 2,
                right: 4
            })
        );
    }
}
