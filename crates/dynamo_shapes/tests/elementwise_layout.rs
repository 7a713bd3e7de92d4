//! Properties of the elementwise output layout that hold whatever the operands look like:
//! the result is dense and non-overlapping in the broadcast shape; operands that are all
//! row-major give row-major; one dense operand without size-1 dimensions passes its
//! layout on.

use dynamo_shapes::elementwise::{elementwise_strides, Operand};
use dynamo_shapes::layout::{broadcast_shapes, contiguous_strides, is_non_overlapping_and_dense};
use proptest::prelude::*;

/// An operand of `shape`'s rank or less: some sizes 1 (broadcast), strides of some dimension
/// order, sometimes a stepped slice.
fn operand(shape: Vec<i64>) -> impl Strategy<Value = Layout> {
    let ndim = shape.len();
    (
        0..=ndim,
        proptest::collection::vec(any::<bool>(), ndim),
        Just((0..ndim).collect::<Vec<usize>>()).prop_shuffle(),
        1i64..=2,
    )
        .prop_map(move |(drop, ones, order, step)| {
            let sizes: Vec<i64> = shape[drop..]
                .iter()
                .zip(&ones[drop..])
                .map(|(&s, &one)| if one { 1 } else { s })
                .collect();
            let order: Vec<usize> = order
                .into_iter()
                .filter(|&d| d >= drop)
                .map(|d| d - drop)
                .collect();
            let ordered: Vec<i64> = order.iter().map(|&d| sizes[d]).collect();
            let dense = contiguous_strides(&ordered);
            let mut strides = vec![0; sizes.len()];
            for (k, &d) in order.iter().enumerate() {
                strides[d] = dense[k] * step;
            }
            (sizes, strides)
        })
}

/// Sizes and strides of one operand.
type Layout = (Vec<i64>, Vec<i64>);

fn case() -> impl Strategy<Value = (Vec<i64>, Vec<Layout>)> {
    proptest::collection::vec(1i64..=4, 1..=4).prop_flat_map(|shape| {
        let ops = proptest::collection::vec(operand(shape.clone()), 1..=3);
        (Just(shape), ops)
    })
}

proptest! {
    #[test]
    fn the_result_is_dense((_, ops) in case()) {
        let shapes: Vec<&[i64]> = ops.iter().map(|(s, _)| s.as_slice()).collect();
        let shape = broadcast_shapes(&shapes).unwrap();
        let operands: Vec<Operand<'_>> = ops.iter().map(|(sizes, strides)| Operand { sizes, strides }).collect();
        let strides = elementwise_strides(&shape, &operands).unwrap();
        prop_assert!(is_non_overlapping_and_dense(&shape, &strides), "{:?} {:?}", shape, strides);
    }

    #[test]
    fn row_major_operands_give_row_major(shape in proptest::collection::vec(1i64..=4, 1..=4), drop in 0usize..4) {
        let a_strides = contiguous_strides(&shape);
        let b_sizes = shape[drop.min(shape.len())..].to_vec();
        let b_strides = contiguous_strides(&b_sizes);
        let operands = [Operand { sizes: &shape, strides: &a_strides }, Operand { sizes: &b_sizes, strides: &b_strides }];
        prop_assert_eq!(elementwise_strides(&shape, &operands).unwrap(), contiguous_strides(&shape));
    }

    #[test]
    fn one_dense_operand_passes_its_layout_on(
        (shape, order) in proptest::collection::vec(2i64..=4, 1..=4)
            .prop_flat_map(|shape| { let n = shape.len(); (Just(shape), Just((0..n).collect::<Vec<usize>>()).prop_shuffle()) }),
    ) {
        // Dense in a random dimension order, every size above 1.
        let ordered: Vec<i64> = order.iter().map(|&d| shape[d]).collect();
        let dense = contiguous_strides(&ordered);
        let mut strides = vec![0; shape.len()];
        for (k, &d) in order.iter().enumerate() {
            strides[d] = dense[k];
        }
        let operands = [Operand { sizes: &shape, strides: &strides }];
        prop_assert_eq!(elementwise_strides(&shape, &operands).unwrap(), strides);
    }
}
