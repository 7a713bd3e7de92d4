//! The layout torch's fake and meta tensors give the result of an elementwise operation
//! (`add`, `mul`, `gelu`, …): PrimTorch's rule, which their meta kernels follow. (Eager CPU
//! kernels use TensorIterator's, which agrees except for the strides of size-1 dimensions
//! and some shortcuts; fake tensors are what a graph's metadata must match.)
//!
//! The operands are the tensor operands expanded to the output shape; Python numbers and 0-d
//! CPU tensors have no say. If all are contiguous (and not all channels-last), the output is
//! contiguous; if all are channels-last (and not all contiguous), channels-last. Otherwise
//! the dimensions are ordered from innermost to outermost by an insertion sort over the
//! operands' strides, in which a broadcast (stride-0) dimension has no say and an operand
//! whose strides tie defers to the next, and the output is dense in that order.

use crate::layout::{contiguous_strides, is_channels_last_contiguous, is_contiguous};
use crate::view::expand;

/// One tensor input of the operation: its own sizes and strides (before broadcasting).
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    pub sizes: &'a [i64],
    pub strides: &'a [i64],
}

/// Strides of the output of shape `shape` (the broadcast of the operands' shapes).
/// `operands` are the tensor operands with at least one dimension. `None` only if an operand
/// does not broadcast to `shape`.
pub fn elementwise_strides(shape: &[i64], operands: &[Operand<'_>]) -> Option<Vec<i64>> {
    let expanded: Vec<Vec<i64>> = operands
        .iter()
        .map(|op| expand(op.sizes, op.strides, shape).map(|(_, strides)| strides))
        .collect::<Option<_>>()?;
    let ndim = shape.len();
    if ndim <= 1 || expanded.is_empty() {
        return Some(contiguous_strides(shape));
    }
    let all_contiguous = expanded.iter().all(|s| is_contiguous(shape, s));
    let all_channels_last = expanded
        .iter()
        .all(|s| is_channels_last_contiguous(shape, s));
    // perm[0] is the innermost dimension.
    let perm: Vec<usize> = if all_contiguous && !all_channels_last {
        (0..ndim).rev().collect()
    } else if all_channels_last && !all_contiguous {
        let mut outer_first = vec![0];
        outer_first.extend(2..ndim);
        outer_first.push(1);
        outer_first.into_iter().rev().collect()
    } else {
        sort_dimensions(shape, &expanded)
    };
    // Dense in that order, size-0 dimensions counted as 1.
    let mut strides = vec![0; ndim];
    let mut next = 1;
    for &d in &perm {
        strides[d] = next;
        next *= shape[d].max(1);
    }
    Some(strides)
}

/// Dimensions from innermost to outermost by the operands' strides (the insertion sort shared
/// by TensorIterator and PrimTorch; `strides` are per operand, 0 where broadcast).
fn sort_dimensions(shape: &[i64], strides: &[Vec<i64>]) -> Vec<usize> {
    let ndim = shape.len();
    // 1: `dim0` goes outside `dim1`; -1: inside; 0: no operand can tell.
    let should_swap = |dim0: usize, dim1: usize| -> i32 {
        for strides in strides {
            let (stride0, stride1) = (strides[dim0], strides[dim1]);
            if stride0 == 0 || stride1 == 0 {
                continue;
            }
            if stride0 < stride1 {
                return -1;
            }
            if stride0 > stride1 {
                return 1;
            }
            if shape[dim0] > shape[dim1] {
                return 1;
            }
        }
        0
    };
    // Start from row-major order.
    let mut perm: Vec<usize> = (0..ndim).rev().collect();
    for i in 1..ndim {
        let mut dim1 = i;
        for dim0 in (0..i).rev() {
            let comparison = should_swap(perm[dim0], perm[dim1]);
            if comparison > 0 {
                perm.swap(dim0, dim1);
                dim1 = dim0;
            } else if comparison < 0 {
                break;
            }
        }
    }
    perm
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op<'a>(sizes: &'a [i64], strides: &'a [i64]) -> Operand<'a> {
        Operand { sizes, strides }
    }

    // Expected values are torch 2.15's, from meta tensors with the same operands.
    #[test]
    fn one_operand_keeps_its_order() {
        assert_eq!(
            elementwise_strides(&[2, 5, 5, 8], &[op(&[2, 5, 5, 8], &[200, 5, 1, 25])]).unwrap(),
            vec![200, 5, 1, 25]
        );
        // Contiguous and channels-last at once: sorted, the size-1 dimension stays outermost.
        assert_eq!(
            elementwise_strides(&[4, 1, 2, 3], &[op(&[4, 1, 2, 3], &[6, 24, 3, 1])]).unwrap(),
            vec![6, 24, 3, 1]
        );
    }

    #[test]
    fn contiguous_operands_give_canonical_strides() {
        assert_eq!(
            elementwise_strides(&[1, 3], &[op(&[1, 3], &[1, 1])]).unwrap(),
            vec![3, 1]
        );
        assert_eq!(
            elementwise_strides(&[5, 3], &[op(&[5, 1], &[1, 1]), op(&[1, 3], &[3, 1])]).unwrap(),
            vec![3, 1]
        );
    }

    #[test]
    fn expanded_operands_decide_by_their_strides() {
        // [3, 3] transposed times [4, 1, 3, 3] expanded (eager CPU gives (9, 9, 1, 3)).
        let a = op(&[3, 3], &[1, 3]);
        let b = op(&[4, 1, 3, 3], &[0, 3, 0, 1]);
        assert_eq!(
            elementwise_strides(&[4, 1, 3, 3], &[a, b]).unwrap(),
            vec![9, 3, 1, 3]
        );
        assert_eq!(
            elementwise_strides(&[4, 3], &[op(&[4, 3], &[1, 4]), op(&[4, 1], &[1, 1])]).unwrap(),
            vec![1, 4]
        );
    }

    #[test]
    fn channels_last_operands_give_channels_last() {
        let s = [2, 8, 5, 5];
        let cl = [200, 1, 40, 8];
        assert_eq!(
            elementwise_strides(&s, &[op(&s, &cl), op(&s, &cl)]).unwrap(),
            cl.to_vec()
        );
    }
}
