//! Python face of `dynamo_shapes`, for `dynamo_rs._meta_rules`: each function takes sizes
//! and strides as tuples of ints and returns the result's, or `None` where the rule has no
//! answer (the caller then asks FakeTensorMode, which also produces torch's error message).

use dynamo_shapes::elementwise::Operand;
use dynamo_shapes::index::{Index, ViewLayout};
use dynamo_shapes::{conv, elementwise, index, layout, view};
use pyo3::prelude::*;

type Layout = (Vec<i64>, Vec<i64>);

/// Output sizes and strides of an elementwise operation over `operands` (sizes, strides),
/// as fake tensors get them; a Python number taking part is `((), ())`.
#[pyfunction]
fn elementwise_layout(operands: Vec<Layout>) -> Option<Layout> {
    let shapes: Vec<&[i64]> = operands.iter().map(|(s, _)| s.as_slice()).collect();
    let shape = layout::broadcast_shapes(&shapes).ok()?;
    // Numbers and 0-d (CPU scalar) tensors have no say in the layout.
    let tensors: Vec<Operand<'_>> = operands
        .iter()
        .filter(|(sizes, _)| !sizes.is_empty())
        .map(|(sizes, strides)| Operand { sizes, strides })
        .collect();
    let strides = elementwise::elementwise_strides(&shape, &tensors)?;
    Some((shape, strides))
}

/// A rule for the strides of a view: `(old sizes, old strides, new sizes)` to new strides.
type ViewStrides = fn(&[i64], &[i64], &[i64]) -> Option<Vec<i64>>;

/// The sizes `shape` (may hold one -1) stands for, with `strides_of(sizes, strides, new
/// sizes)`; `None` for a shape that does not fit.
fn view_layout_by(
    sizes: &[i64],
    strides: &[i64],
    shape: &[i64],
    strides_of: ViewStrides,
) -> Option<(Vec<i64>, Option<Vec<i64>>)> {
    let new_sizes = view::infer_size(shape, layout::numel(sizes)).ok()?;
    let new_strides = strides_of(sizes, strides, &new_sizes);
    Some((new_sizes, new_strides))
}

/// `(sizes, strides or None)` of `view`/`reshape` to `shape` by ATen's rule: strides when
/// the result can share storage, `None` when `reshape` has to copy.
#[pyfunction]
fn view_layout(
    sizes: Vec<i64>,
    strides: Vec<i64>,
    shape: Vec<i64>,
) -> Option<(Vec<i64>, Option<Vec<i64>>)> {
    view_layout_by(&sizes, &strides, &shape, view::view_strides)
}

/// `view_layout` as FakeTensorMode computes it (see [`view::reference_view_strides`]).
#[pyfunction]
fn fake_view_layout(
    sizes: Vec<i64>,
    strides: Vec<i64>,
    shape: Vec<i64>,
) -> Option<(Vec<i64>, Option<Vec<i64>>)> {
    view_layout_by(&sizes, &strides, &shape, view::reference_view_strides)
}

#[pyfunction]
fn permute_layout(sizes: Vec<i64>, strides: Vec<i64>, dims: Vec<i64>) -> Option<Layout> {
    view::permute(&sizes, &strides, &dims)
}

#[pyfunction]
fn unsqueeze_layout(sizes: Vec<i64>, strides: Vec<i64>, dim: i64) -> Option<Layout> {
    view::unsqueeze(&sizes, &strides, dim)
}

#[pyfunction]
fn expand_layout(sizes: Vec<i64>, strides: Vec<i64>, shape: Vec<i64>) -> Option<Layout> {
    view::expand(&sizes, &strides, &shape)
}

/// Absolute dimension index, or `None` when out of range.
#[pyfunction]
fn wrap_dim(dim: i64, ndim: usize) -> Option<usize> {
    view::wrap_dim(dim, ndim)
}

#[pyfunction]
fn contiguous_strides(sizes: Vec<i64>) -> Vec<i64> {
    layout::contiguous_strides(&sizes)
}

#[pyfunction]
fn is_contiguous(sizes: Vec<i64>, strides: Vec<i64>) -> bool {
    layout::is_contiguous(&sizes, &strides)
}

/// Strides of a fresh tensor of `sizes` converted to channels-last (or left row-major).
#[pyfunction]
fn strides_in_format(sizes: Vec<i64>, channels_last: bool) -> Option<Vec<i64>> {
    layout::strides_in_format(&sizes, channels_last)
}

#[pyfunction]
fn suggests_channels_last(sizes: Vec<i64>, strides: Vec<i64>) -> bool {
    layout::suggests_channels_last(&sizes, &strides)
}

#[pyfunction]
fn is_non_overlapping_and_dense(sizes: Vec<i64>, strides: Vec<i64>) -> bool {
    layout::is_non_overlapping_and_dense(&sizes, &strides)
}

#[pyfunction]
fn conv_output_sizes(
    input: Vec<i64>,
    weight: Vec<i64>,
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    groups: i64,
) -> Option<Vec<i64>> {
    conv::conv_output_sizes(&input, &weight, &stride, &padding, &dilation, groups)
}

/// The view `t[items]`: `(sizes, strides, storage offset)`. Each item is `(kind, a, b, step)`:
/// kind 0 an integer `a`, 1 a slice `a:b:step`, 2 `None`, 3 `...`.
#[pyfunction]
fn index_layout(
    sizes: Vec<i64>,
    strides: Vec<i64>,
    offset: i64,
    items: Vec<(u8, Option<i64>, Option<i64>, i64)>,
) -> Option<ViewLayout> {
    let items = items
        .into_iter()
        .map(|(kind, a, b, step)| match kind {
            0 => a.map(Index::Int),
            1 => Some(Index::Slice {
                start: a,
                stop: b,
                step,
            }),
            2 => Some(Index::NewAxis),
            3 => Some(Index::Ellipsis),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    index::index(&sizes, &strides, offset, &items)
}

/// The views of `split(split_size_or_sizes, dim)`.
#[pyfunction]
fn split_layouts(
    sizes: Vec<i64>,
    strides: Vec<i64>,
    offset: i64,
    split: Bound<'_, PyAny>,
    dim: i64,
) -> Option<Vec<ViewLayout>> {
    if let Ok(size) = split.extract::<i64>() {
        return index::split(&sizes, &strides, offset, size, dim);
    }
    let lengths: Vec<i64> = split.extract().ok()?;
    index::split_with_sizes(&sizes, &strides, offset, &lengths, dim)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(elementwise_layout, m)?)?;
    m.add_function(wrap_pyfunction!(view_layout, m)?)?;
    m.add_function(wrap_pyfunction!(fake_view_layout, m)?)?;
    m.add_function(wrap_pyfunction!(permute_layout, m)?)?;
    m.add_function(wrap_pyfunction!(unsqueeze_layout, m)?)?;
    m.add_function(wrap_pyfunction!(expand_layout, m)?)?;
    m.add_function(wrap_pyfunction!(wrap_dim, m)?)?;
    m.add_function(wrap_pyfunction!(contiguous_strides, m)?)?;
    m.add_function(wrap_pyfunction!(is_contiguous, m)?)?;
    m.add_function(wrap_pyfunction!(is_non_overlapping_and_dense, m)?)?;
    m.add_function(wrap_pyfunction!(strides_in_format, m)?)?;
    m.add_function(wrap_pyfunction!(suggests_channels_last, m)?)?;
    m.add_function(wrap_pyfunction!(conv_output_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(index_layout, m)?)?;
    m.add_function(wrap_pyfunction!(split_layouts, m)?)?;
    Ok(())
}
