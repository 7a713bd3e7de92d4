"""Fake results of views and indexing without FakeTensorMode's dispatch: `view`/`reshape`,
`permute`/`transpose`/`expand`, `unsqueeze`/`flatten`, `x[...]` reads and stores, `split`,
`chunk`, `unbind`, `contiguous` — split from `_meta_rules` (whose table lists them and whose
conditions they share: a rule answers only when it is sure, else None and FakeTensorMode
runs). `_symbolic_rules` has their symbolic-size versions."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from dynamo_rs import _native
# `_meta_rules` imports this module last, once the helpers below exist (as `_creation_rules`).
from dynamo_rs._meta_rules import (
    SIGNATURES, _NUMBERS, _bind, _canonical, _contiguous, _new, _plain, _ready, _same_float, _view)


def _sizes_arg(rest):
    """`t.view(2, 3)` or `t.view((2, 3))`: the sizes as a tuple of ints, or None."""
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        rest = tuple(rest[0])
    if all(type(s) is int for s in rest):
        return tuple(rest)
    return None


def _receiver_and_ints(mode, args, kwargs):
    """`(t, ints)` for `t.method(*ints)` or `t.method(ints)` on a ready tensor, else None."""
    if kwargs or not args or not _ready(mode, args[0]):
        return None
    ints = _sizes_arg(args[1:])
    return None if ints is None else (args[0], ints)


def _reshaping(copy_allowed: bool):
    """`view` (`copy_allowed=False`) and `reshape`. FakeTensorMode views by PrimTorch's
    algorithm (`_native.fake_view_layout`), whose strides for size-1 dimensions differ from
    ATen's; `reshape` copies exactly when ATen's rule finds no view (`_native.view_layout`),
    then views the contiguous copy the same way."""
    def rule(mode, args, kwargs):
        received = _receiver_and_ints(mode, args, kwargs)
        if received is None:
            return None
        x, shape = received
        layout = _native.fake_view_layout(x.shape, x.stride(), shape)
        if layout is None:
            return None
        sizes, strides = layout
        if copy_allowed and _native.view_layout(x.shape, x.stride(), shape)[1] is None:
            copied = _native.fake_view_layout(x.shape, _native.contiguous_strides(x.shape), shape)
            if copied is None or copied[1] is None:
                return None
            return _new(mode, x, sizes, copied[1])
        if strides is None:
            return None
        return _view(mode, x, sizes, strides)
    return rule


def _reshaping_as(copy_allowed: bool):
    """`x.reshape_as(other)` / `x.view_as(other)`: `reshape`/`view` to `other`'s sizes."""
    def rule(mode, args, kwargs):
        if len(args) != 2 or kwargs or type(args[1]) is not FakeTensor or not _plain(mode, args[1]):
            return None
        return _reshaping(copy_allowed)(mode, (args[0], tuple(args[1].shape)), {})
    return rule


def _normalize(mode, args, kwargs):
    """`F.normalize(x, p, dim, eps)`: `x / norm(x, dim, keepdim).clamp_min(eps).expand_as(x)`.
    The norm is a fresh reduction (row-major, `dim` of size 1), broadcast along `dim` (stride
    0), so the result has the elementwise layout of `x` and that broadcast denominator."""
    bound = _bind(lambda input, p=2.0, dim=1, eps=1e-12, out=None: (input, p, dim, eps, out), args, kwargs)
    if bound is None:
        return None
    x, p, dim, eps, out = bound
    if out is not None or type(dim) is not int or not isinstance(p, _NUMBERS) or not isinstance(eps, _NUMBERS):
        return None
    if not _ready(mode, x) or not _same_float(x) or x.dim() == 0:
        return None
    d = _native.wrap_dim(dim, x.dim())
    if d is None:
        return None
    shape = tuple(x.shape)
    if _canonical(x):
        return _contiguous(mode, x, shape)
    kept = list(shape)
    kept[d] = 1
    denominator = list(_native.contiguous_strides(kept))
    denominator[d] = 0
    layout = _native.elementwise_layout([(shape, x.stride()), (shape, tuple(denominator))])
    if layout is None:
        return None
    return _new(mode, x, shape, layout[1])


def _torch_reshape(mode, args, kwargs):
    bound = _bind(lambda input, shape: (input, shape), args, kwargs)
    if bound is None:
        return None
    x, shape = bound
    return _reshaping(True)(mode, (x, shape), {})


def _sized_view(layout_of):
    """`t.permute(*dims)` / `t.expand(*sizes)` (or with one tuple): a view whose layout
    `layout_of(sizes, strides, ints)` computes, None when it does not apply."""
    def rule(mode, args, kwargs):
        received = _receiver_and_ints(mode, args, kwargs)
        if received is None:
            return None
        x, ints = received
        layout = layout_of(x.shape, x.stride(), ints)
        return None if layout is None else _view(mode, x, *layout)
    return rule


def _transpose(mode, args, kwargs):
    bound = _bind(SIGNATURES["transpose"], args, kwargs)
    if bound is None:
        return None
    x, d0, d1 = bound
    if type(d0) is not int or type(d1) is not int or not _ready(mode, x):
        return None
    d0, d1 = _native.wrap_dim(d0, x.dim()), _native.wrap_dim(d1, x.dim())
    if d0 is None or d1 is None or x.dim() == 0:
        return None
    dims = list(range(x.dim()))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return _view(mode, x, *_native.permute_layout(x.shape, x.stride(), dims))


# Tensor attributes that are views with the dimensions reordered: the order, by rank (None:
# not this rank). `.T` of other than 2 dimensions is deprecated (it warns): left to torch.
_TRANSPOSED_ATTRIBUTES = {
    "T": lambda n: [1, 0] if n == 2 else None,
    "mT": lambda n: [*range(n - 2), n - 1, n - 2] if n >= 2 else None,
}


def _attribute(mode, args, kwargs):
    """`x.T`, `x.mT` (and `.H`, `.mH` of a real tensor, the same): a view with the dimensions
    reordered (F.linear's `weight.T` in hand-written layers)."""
    if kwargs or len(args) != 2 or not isinstance(args[0], FakeTensor) or type(args[1]) is not str:
        return None
    x, name = args
    if name in ("H", "mH"):
        if x.is_complex():
            return None
        name = "T" if name == "H" else "mT"
    order = _TRANSPOSED_ATTRIBUTES.get(name)
    if order is None or not _ready(mode, x):
        return None
    dims = order(x.dim())
    if dims is None:
        return None
    return _view(mode, x, *_native.permute_layout(x.shape, x.stride(), dims))


def _unsqueeze(mode, args, kwargs):
    bound = _bind(SIGNATURES["unsqueeze"], args, kwargs)
    if bound is None:
        return None
    x, dim = bound
    if type(dim) is not int or not _ready(mode, x):
        return None
    layout = _native.unsqueeze_layout(x.shape, x.stride(), dim)
    return None if layout is None else _view(mode, x, *layout)


def _flatten(mode, args, kwargs):
    bound = _bind(SIGNATURES["flatten"], args, kwargs)
    if bound is None:
        return None
    x, start, end = bound
    if type(start) is not int or type(end) is not int or not _ready(mode, x) or x.dim() == 0:
        return None
    start, end = _native.wrap_dim(start, x.dim()), _native.wrap_dim(end, x.dim())
    if start is None or end is None or start >= end:
        return None  # flattening one dimension returns the input itself; leave it to torch
    sizes = list(x.shape)
    flat = 1
    for s in sizes[start:end + 1]:
        flat *= s
    return _reshaping(True)(mode, (x, (*sizes[:start], flat, *sizes[end + 1:])), {})


def _index_items(index):
    """A basic index as `_native.index_layout` items, or None for anything else (tensors,
    booleans, lists: advanced indexing)."""
    items = []
    for item in index if type(index) is tuple else (index,):
        if type(item) is int:
            items.append((0, item, None, 1))
        elif type(item) is slice:
            parts = (item.start, item.stop, 1 if item.step is None else item.step)
            if not all(p is None or type(p) is int for p in parts):
                return None
            items.append((1, *parts))
        elif item is None:
            items.append((2, None, None, 1))
        elif item is Ellipsis:
            items.append((3, None, None, 1))
        else:
            return None
    return items


def _getitem(mode, args, kwargs):
    if kwargs or len(args) != 2:
        return None
    x, index = args
    if not isinstance(x, FakeTensor) or not _ready(mode, x):
        return None
    if isinstance(index, FakeTensor):
        return _take_rows(mode, x, index)
    if isinstance(index, tuple) and index and all(isinstance(i, FakeTensor) for i in index):
        return _take_points(mode, x, index)
    items = _index_items(index)
    if items is None:
        return None
    layout = _native.index_layout(x.shape, x.stride(), x.storage_offset(), items)
    if layout is None or not all(s > 0 for s in layout[0]):
        return None
    return _view(mode, x, *layout)


class _NoValue:
    """What a rule answers for an operation whose result is None (`x[i] = v`): a rule's None
    means "no answer"."""

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE = _NoValue()

# Python ints a tensor of each integer dtype can be filled with.
_INT_RANGES = {torch.int64: (-2**63, 2**63), torch.int32: (-2**31, 2**31)}


def _setitem(mode, args, kwargs):
    """`x[index] = value` with a basic index (ints, slices, None, Ellipsis) into a plain tensor
    that no autograd rule concerns, and a number or a tensor that broadcasts to the indexed
    part: FakeTensorMode would only check that and answer None (`x` keeps its metadata)."""
    if kwargs or len(args) != 3:
        return None
    x, index, value = args
    if not isinstance(x, FakeTensor) or not _ready(mode, x) or x.requires_grad:
        return None
    items = None if isinstance(index, torch.Tensor) else _index_items(index)
    if items is None:
        return None
    layout = _native.index_layout(x.shape, x.stride(), x.storage_offset(), items)
    if layout is None or not all(s > 0 for s in layout[0]):
        return None
    if any(st == 0 and s > 1 for s, st in zip(x.shape, x.stride())):
        return None  # elements that share memory cannot be written
    if isinstance(value, FakeTensor):
        if not _ready(mode, value) or value.requires_grad or value._fake_device != x._fake_device:
            return None
        if value.is_complex() and not x.is_complex():
            return None
        if value.untyped_storage()._cdata == x.untyped_storage()._cdata:
            return None  # overlapping source and destination: torch's own checks
        sizes = list(value.shape)
        while len(sizes) > len(layout[0]) and sizes[0] == 1:
            sizes.pop(0)  # leading size-1 dimensions are dropped, as torch's copy does
        if len(sizes) > len(layout[0]):
            return None
        if not all(v in (1, t) for v, t in zip(reversed(sizes), reversed(layout[0]))):
            return None
        return NO_VALUE
    if type(value) is float and x.dtype.is_floating_point:
        return NO_VALUE
    if type(value) is int and (x.dtype.is_floating_point or x.dtype in _INT_RANGES
                               and _INT_RANGES[x.dtype][0] <= value < _INT_RANGES[x.dtype][1]):
        return NO_VALUE
    if type(value) is bool and x.dtype is torch.bool:
        return NO_VALUE
    return None


def _take_rows(mode, x, index):
    """`x[index]` with an integer index tensor (a lookup table indexed by precomputed
    positions, as Swin's relative-position bias): rows of `x` gathered into a fresh tensor of
    sizes `index.shape + x.shape[1:]`, for canonical operands with no size-1 dimension in the
    result (whose strides torch's index kernel chooses by its own rule). Boolean masks select
    a data-dependent number of rows: FakeTensorMode's business."""
    if index.dtype not in (torch.int64, torch.int32) or not _ready(mode, x, index) or x.dim() == 0:
        return None
    if not _canonical(x) or not _canonical(index):
        return None
    sizes = (*index.shape, *x.shape[1:])
    if min(sizes) == 1:
        return None
    return _contiguous(mode, x, sizes)


def _take_points(mode, x, indices):
    """`x[i, j, ...]` with an integer index tensor for every dimension (transformers'
    padding mask looked up at broadcast batch and key positions): one element per point of
    the indices' broadcast shape, in a fresh row-major tensor (torch's index kernel sees only
    zero strides, so it keeps the natural order)."""
    if len(indices) != x.dim() or not _ready(mode, x, *indices):
        return None
    if any(i.dtype not in (torch.int64, torch.int32) for i in indices):
        return None
    try:
        sizes = tuple(torch.broadcast_shapes(*(i.shape for i in indices)))
    except RuntimeError:
        return None  # torch raises: its business
    if not sizes:
        return None
    return _contiguous(mode, x, sizes)


def _split(mode, args, kwargs):
    bound = _bind(SIGNATURES["split"], args, kwargs)
    if bound is None:
        return None
    x, split, dim = bound
    if type(dim) is not int or not _ready(mode, x):
        return None
    if not (type(split) is int or isinstance(split, (tuple, list)) and all(type(s) is int for s in split)):
        return None
    layouts = _native.split_layouts(x.shape, x.stride(), x.storage_offset(), split, dim)
    if layouts is None or not all(s > 0 for layout in layouts for s in layout[0]):
        return None
    return tuple(_view(mode, x, *layout) for layout in layouts)


def _chunk(mode, args, kwargs):
    """`x.chunk(n, dim)`: ATen's `split` by `ceil(size / n)` (fewer than n parts when that
    divides unevenly); an empty dimension (split into n empty parts) is left to torch."""
    bound = _bind(lambda input, chunks, dim=0: (input, chunks, dim), args, kwargs)
    if bound is None:
        return None
    x, chunks, dim = bound
    if type(chunks) is not int or chunks <= 0 or type(dim) is not int or not _ready(mode, x) or x.dim() == 0:
        return None
    d = _native.wrap_dim(dim, x.dim())
    if d is None or x.shape[d] == 0:
        return None
    return _split(mode, (x, -(-x.shape[d] // chunks), d), {})


def _unbind(mode, args, kwargs):
    bound = _bind(lambda input, dim=0: (input, dim), args, kwargs)
    if bound is None:
        return None
    x, dim = bound
    if type(dim) is not int or not _ready(mode, x) or x.dim() == 0:
        return None
    d = _native.wrap_dim(dim, x.dim())
    if d is None:
        return None
    full = [(1, None, None, 1)] * d
    return tuple(
        _view(mode, x, *_native.index_layout(x.shape, x.stride(), x.storage_offset(), [*full, (0, i, None, 1)]))
        for i in range(x.shape[d]))


def _contiguous_method(mode, args, kwargs):
    if kwargs or len(args) != 1 or not _ready(mode, args[0]):
        return None
    x = args[0]
    if x.is_contiguous():
        return x
    return _contiguous(mode, x, tuple(x.shape))
