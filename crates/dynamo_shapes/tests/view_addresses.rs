//! Views must address the same elements as the indexing they stand for. These properties
//! check every view rule against a direct enumeration: for each position of the view, the
//! storage address its sizes/strides/offset give equals the address of the corresponding
//! position of the original tensor.

use dynamo_shapes::index::{index, split, Index};
use dynamo_shapes::layout::contiguous_strides;
use dynamo_shapes::view::{expand, permute, reference_view_strides, view_strides};
use proptest::prelude::*;

fn address(strides: &[i64], offset: i64, position: &[i64]) -> i64 {
    offset
        + position
            .iter()
            .zip(strides)
            .map(|(p, s)| p * s)
            .sum::<i64>()
}

/// Every multi-index of `sizes`, row-major.
fn positions(sizes: &[i64]) -> Vec<Vec<i64>> {
    let mut all = vec![vec![]];
    for &size in sizes {
        all = all
            .into_iter()
            .flat_map(|prefix| {
                (0..size).map(move |i| {
                    let mut p = prefix.clone();
                    p.push(i);
                    p
                })
            })
            .collect();
    }
    all
}

/// A tensor layout: sizes 1..4 in 1..4 dimensions, strides of a permuted contiguous tensor
/// scaled by a step (so sliced-like gaps appear too), and an offset.
fn layout() -> impl Strategy<Value = (Vec<i64>, Vec<i64>, i64)> {
    (1usize..=4)
        .prop_flat_map(|ndim| {
            (
                proptest::collection::vec(1i64..=4, ndim),
                Just((0..ndim).collect::<Vec<usize>>()).prop_shuffle(),
                1i64..=2,
                0i64..=3,
            )
        })
        .prop_map(|(sizes, order, step, offset)| {
            let ordered: Vec<i64> = order.iter().map(|&d| sizes[d]).collect();
            let dense = contiguous_strides(&ordered);
            let mut strides = vec![0; sizes.len()];
            for (k, &d) in order.iter().enumerate() {
                strides[d] = dense[k] * step;
            }
            (sizes, strides, offset)
        })
}

proptest! {
    #[test]
    fn permuted_views_address_the_permuted_elements((sizes, strides, offset) in layout(), seed in any::<u64>()) {
        let mut dims: Vec<i64> = (0..sizes.len() as i64).collect();
        // A deterministic shuffle from the seed.
        let mut s = seed;
        for i in (1..dims.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            dims.swap(i, (s >> 33) as usize % (i + 1));
        }
        let (view_sizes, view_strides) = permute(&sizes, &strides, &dims).unwrap();
        for p in positions(&view_sizes) {
            let mut original = vec![0; sizes.len()];
            for (k, &d) in dims.iter().enumerate() {
                original[d as usize] = p[k];
            }
            prop_assert_eq!(address(&view_strides, offset, &p), address(&strides, offset, &original));
        }
    }

    #[test]
    fn expanded_views_repeat_the_broadcast_elements((sizes, strides, offset) in layout(), extra in 0usize..=2, grow in 1i64..=3) {
        let mut target: Vec<i64> = vec![grow; extra];
        target.extend(sizes.iter().map(|&s| if s == 1 { grow } else { s }));
        let (view_sizes, view_strides) = expand(&sizes, &strides, &target).unwrap();
        prop_assert_eq!(&view_sizes, &target);
        for p in positions(&view_sizes) {
            let original: Vec<i64> = p[extra..].iter().zip(&sizes).map(|(&i, &s)| if s == 1 { 0 } else { i }).collect();
            prop_assert_eq!(address(&view_strides, offset, &p), address(&strides, offset, &original));
        }
    }

    #[test]
    fn views_of_a_reshape_keep_row_major_order((sizes, strides, offset) in layout(), split_at in 0usize..4) {
        // Target: the same elements with the dimensions regrouped (flatten a prefix).
        let cut = split_at.min(sizes.len());
        let mut target: Vec<i64> = vec![sizes[..cut].iter().product()];
        target.extend_from_slice(&sizes[cut..]);
        if let Some(view) = view_strides(&sizes, &strides, &target) {
            let flat_old = positions(&sizes);
            let flat_new = positions(&target);
            prop_assert_eq!(flat_old.len(), flat_new.len());
            for (old, new) in flat_old.iter().zip(&flat_new) {
                prop_assert_eq!(address(&view, offset, new), address(&strides, offset, old));
            }
        } else {
            // No view exists only when the regrouped dimensions are not contiguous among
            // themselves; a contiguous tensor always has one.
            prop_assert!(strides != contiguous_strides(&sizes));
        }
    }

    #[test]
    fn fake_views_exist_where_aten_views_do_at_the_same_addresses(
        (sizes, strides, offset) in layout(),
        split_at in 0usize..4,
        ones in proptest::collection::vec(0usize..5, 0..=2),
    ) {
        // Where ATen's rule (real tensors) finds a view, PrimTorch's (fake tensors) finds one
        // too, differing only in the strides of size-1 dimensions, which address nothing:
        // every element is at the same address. (The converse does not hold, in torch itself:
        // PrimTorch merges `[2, 1, 2]` with strides `[1, 1, 2]` into one dimension, which a
        // real tensor refuses to view; we follow the fake tensors, as the graph's metadata
        // must.) Targets regroup a prefix and sprinkle in size-1 dimensions.
        let cut = split_at.min(sizes.len());
        let mut target: Vec<i64> = vec![sizes[..cut].iter().product()];
        target.extend_from_slice(&sizes[cut..]);
        for &at in &ones {
            target.insert(at.min(target.len()), 1);
        }
        let aten = view_strides(&sizes, &strides, &target);
        let reference = reference_view_strides(&sizes, &strides, &target);
        if let Some(aten) = aten {
            prop_assert!(reference.is_some());
            let reference = reference.unwrap();
            for p in positions(&target) {
                prop_assert_eq!(address(&reference, offset, &p), address(&aten, offset, &p));
            }
        }
    }

    #[test]
    fn basic_indexing_addresses_the_selected_elements(
        (sizes, strides, offset) in layout(),
        picks in proptest::collection::vec((0u8..3, -5i64..5, -5i64..5, 1i64..=3), 1..=4),
    ) {
        let items: Vec<Index> = picks
            .iter()
            .take(sizes.len())
            .map(|&(kind, a, b, step)| match kind {
                0 => Index::Int(a),
                1 => Index::Slice { start: Some(a), stop: Some(b), step },
                _ => Index::NewAxis,
            })
            .collect();
        let Some((view_sizes, view_strides, view_offset)) = index(&sizes, &strides, offset, &items) else {
            // Only an out-of-range integer is refused.
            prop_assert!(items.iter().any(|i| matches!(i, Index::Int(_))));
            return Ok(());
        };
        // Walk the items, mapping each view position back to an original position.
        for p in positions(&view_sizes) {
            let mut original = Vec::new();
            let mut dim = 0;
            let mut out = 0;
            for item in &items {
                match *item {
                    Index::Int(i) => {
                        original.push(if i < 0 { i + sizes[dim] } else { i });
                        dim += 1;
                    }
                    Index::Slice { start, step, .. } => {
                        let size = sizes[dim];
                        let s = start.map_or(0, |v| (if v < 0 { v + size } else { v }).clamp(0, size));
                        original.push(s + p[out] * step);
                        dim += 1;
                        out += 1;
                    }
                    Index::NewAxis => out += 1,
                    Index::Ellipsis => unreachable!(),
                }
            }
            original.extend_from_slice(&p[out..]);
            prop_assert_eq!(address(&view_strides, view_offset, &p), address(&strides, offset, &original));
        }
    }

    #[test]
    fn split_parts_tile_the_dimension((sizes, strides, offset) in layout(), chunk in 1i64..=3, dim_pick in 0usize..4) {
        let dim = dim_pick % sizes.len();
        let parts = split(&sizes, &strides, offset, chunk, dim as i64).unwrap();
        let mut start = 0;
        for (part_sizes, part_strides, part_offset) in &parts {
            for p in positions(part_sizes) {
                let mut original = p.clone();
                original[dim] += start;
                prop_assert_eq!(address(part_strides, *part_offset, &p), address(&strides, offset, &original));
            }
            start += part_sizes[dim];
        }
        prop_assert_eq!(start, sizes[dim]);
    }
}
