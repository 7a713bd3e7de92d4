"""Fake results of common tensor operations without FakeTensorMode's dispatch.

The translator needs, for every operation it records, a fake result with the right sizes,
strides, dtype and device. FakeTensorMode computes it by running torch's meta kernels and
decompositions through Python dispatch: 0.2–6 ms per operation the first time a process meets
that operation and shape (batch_norm alone decomposes into some twenty fake operations). For
the operations below the answer is integer arithmetic (in Rust: `dynamo_shapes`, through
`_native`) and a fake tensor built the way FakeTensorMode's own cache builds one.

A rule answers only when it is sure: plain fake tensors of this mode with static, non-zero
sizes, no autograd history to build (grad mode off or nothing requiring grad), no autocast,
no torch-function mode (which could change what the call does), and arguments the rule
understands. Otherwise it returns None and FakeTensorMode runs, which
also raises torch's own error for bad input. With `config.verify_meta_rules` (on in the test
suite) every answer is checked against FakeTensorMode's.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F
from torch._subclasses import fake_tensor as fake_tensor_module
from torch._prims_common import suggest_memory_format as _suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from dynamo_rs import _constant_fakes, _meta_run, _native
from dynamo_rs._fakes import wrap_meta

_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_HALF = frozenset({torch.float16, torch.bfloat16})
_NUMBERS = (int, float)


# `FakeTensor.layout` and `.device` are Python properties (an mkldnn check; the meta device
# inside kernels): the rules run on every traced operation, so they read the underlying
# values directly, with the same meaning.
_tensor_layout = torch.Tensor.layout.__get__
_has_mkldnn = fake_tensor_module._dispatch_keys_has_mkldnn


def _plain(mode: FakeTensorMode, t) -> bool:
    """A fake tensor of `mode` the rules can describe."""
    return (
        type(t) is FakeTensor
        and t.fake_mode is mode
        and t.constant is None
        and not _has_mkldnn(t.dispatch_keys)
        and _tensor_layout(t) is torch.strided
        and not t.is_conj()
        and not t.is_neg()
        and all(type(s) is int and s > 0 for s in t.shape)
    )


def _plain_context(tensors) -> bool:
    """No autocast or torch-function mode active, not in inference mode (whose views of
    tensors requiring grad do not require grad, unlike no_grad's), and no autograd graph to
    record."""
    if (torch._C._is_any_autocast_enabled() or torch._C._len_torch_function_stack()
            or torch.is_inference_mode_enabled()):
        return False
    return not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors)


def _ready(mode: FakeTensorMode, *tensors) -> bool:
    """Every tensor plain, on one device, in a plain context."""
    if not all(_plain(mode, t) for t in tensors):
        return False
    device = tensors[0]._fake_device
    return all(t._fake_device == device for t in tensors) and _plain_context(tensors)


def _new(mode: FakeTensorMode, like: FakeTensor, sizes, strides, dtype=None) -> FakeTensor:
    """A fresh fake tensor (its own storage)."""
    meta = torch.empty_strided(sizes, strides, dtype=dtype or like.dtype, device="meta")
    return wrap_meta(mode, meta, like.fake_device)


def note_unlinked_view(mode: FakeTensorMode, base) -> None:
    """Records that a view of `base`'s storage was made without autograd's link (grad mode
    off): an in-place operation recording autograd on that storage later in the trace must
    not be traced (`_capture.run_fake` breaks the graph there)."""
    storages = getattr(mode, "dynamo_rs_unlinked_views", None)
    if storages is None:
        storages = mode.dynamo_rs_unlinked_views = set()
    storages.add(base.untyped_storage()._cdata)


class NeedsAutogradView(Exception):
    """A rule's result would be a view made with grad mode on: left to FakeTensorMode (see
    `_view`)."""


def _view(mode: FakeTensorMode, base: FakeTensor, sizes, strides, offset=None) -> FakeTensor:
    """A fake tensor over `base`'s storage, as FakeTensorMode's cache makes view results.
    A view requires grad when its base does, even with grad mode off.

    Made this way it shares storage but is no autograd view of `base`: an in-place operation
    that records autograd on one of them later (`out[:, :n].copy_(linear(x))`, `base.mul_(w)`
    with `w` requiring grad) would leave the other's `requires_grad`, `is_leaf` and `grad_fn`
    as they were, where eager code sees them change. With grad mode on, views are therefore
    made by FakeTensorMode, through autograd (raises NeedsAutogradView; `infer` declines)."""
    if torch.is_grad_enabled():
        raise NeedsAutogradView
    note_unlinked_view(mode, base)
    meta = torch.empty_strided((), (), dtype=base.dtype, device="meta")
    meta.set_(base.untyped_storage(), base.storage_offset() if offset is None else offset, sizes, strides)
    if base.requires_grad:
        meta.requires_grad_(True)
    return wrap_meta(mode, meta, base.fake_device)


def _elementwise(mode: FakeTensorMode, operands, dtype, out_dtype=None) -> FakeTensor | None:
    """A fresh result of an elementwise operation over tensors and numbers, or None where
    torch's meta kernels take a path the layout rule does not model:
    - an input contiguous with unusual strides on size-1 dimensions ([4, 1] with strides
      (1, 4)): some kernels keep such strides, some renumber them;
    - an input that is not dense (expanded, sliced with steps) and has to be converted to the
      computation dtype first (mixed dtypes, or half precision, which is computed in float32):
      the conversion makes a dense copy, whose layout then decides."""
    tensors = [o for o in operands if isinstance(o, FakeTensor) and o.dim() > 0]
    converts = len({o.dtype for o in tensors}) > 1 or any(o.dtype != dtype or o.dtype in _HALF for o in tensors)
    for o in tensors:
        if o.is_contiguous() and not _canonical(o):
            return None
        if converts and not _native.is_non_overlapping_and_dense(o.shape, o.stride()):
            return None
    if len(tensors) == 1 and any(isinstance(o, FakeTensor) and o.dim() == 0 for o in operands):
        # A 0-d tensor operand (not a Python number) sends FakeTensorMode to PrimTorch's
        # reference, which gives a lone dense operand's strides to the result exactly, size-1
        # dimensions included ([1, 4, 1, 2] with strides (8, 1, 1, 4) stays so).
        (t,) = tensors
        if _native.is_non_overlapping_and_dense(t.shape, t.stride()):
            return _new(mode, t, t.shape, t.stride(), out_dtype or dtype)
    layouts = [((), ()) if isinstance(o, _NUMBERS) else (o.shape, o.stride()) for o in operands]
    layout = _native.elementwise_layout(layouts)
    if layout is None:
        return None
    like = next(o for o in operands if isinstance(o, FakeTensor))
    return _new(mode, like, layout[0], layout[1], out_dtype or dtype)


def _bind(signature, args, kwargs):
    """The call's arguments bound by `signature` (a lambda with the operation's parameters,
    returning the ones the rule needs), or None when they do not fit it."""
    try:
        return signature(*args, **kwargs)
    except TypeError:
        return None


# The parameters of the operations the rules answer, as torch declares them (shared with
# `_symbolic_rules`): each binds a call's arguments and returns the ones a rule reads.
SIGNATURES = {
    "with_inplace": lambda input, inplace=False: (input, inplace),
    "gelu": lambda input, approximate="none": (input, approximate),
    "dropout": lambda input, p=0.5, training=True, inplace=False: (input, p, training, inplace),
    "batch_norm": (
        lambda input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5:
        (input, running_mean, running_var, weight, bias, training)),
    "layer_norm": (
        lambda input, normalized_shape, weight=None, bias=None, eps=1e-5:
        (input, normalized_shape, weight, bias)),
    "softmax": lambda input, dim, _stacklevel=3, dtype=None: (input, dim, dtype),
    "arange": (
        lambda start, end=None, step=1, *, dtype=None, device=None, requires_grad=False:
        (start, end, step, dtype, device, requires_grad)),
    "conv2d": (
        lambda input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1:
        (input, weight, bias, stride, padding, dilation, groups)),
    "max_pool2d": (
        lambda input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False:
        (input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)),
    "adaptive_pool": lambda input, output_size: (input, output_size),
    "linear": lambda input, weight, bias=None: (input, weight, bias),
    "addmm": lambda input, mat1, mat2, *, beta=1, alpha=1: (input, mat1, mat2, beta, alpha),
    "split": lambda tensor, split_size_or_sections, dim=0: (tensor, split_size_or_sections, dim),
    "embedding": (
        lambda input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False:
        (input, weight, max_norm, sparse)),
    "unsqueeze": lambda input, dim: (input, dim),
    "flatten": lambda input, start_dim=0, end_dim=-1: (input, start_dim, end_dim),
    "transpose": lambda input, dim0, dim1: (input, dim0, dim1),
    "cat": lambda tensors, dim=0: (tensors, dim),
    "sdpa": (
        lambda query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, *, enable_gqa=False:
        (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)),
    "mean": lambda input, dim=None, keepdim=False, *, dtype=None: (input, dim, keepdim, dtype),
    "norm": lambda input, p="fro", dim=None, keepdim=False, dtype=None: (input, p, dim, keepdim, dtype),
    "vector_norm": (
        lambda x, ord=2, dim=None, keepdim=False, *, dtype=None: (x, ord, dim, keepdim, dtype)),
    "interpolate": (
        lambda input, size=None, scale_factor=None, mode="nearest", align_corners=None,
        recompute_scale_factor=None, antialias=False:
        (input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)),
}


def _float_unary(mode, x, inplace=False):
    if not _ready(mode, x) or x.dtype not in _FLOATS:
        return None
    if inplace:
        return x
    return _elementwise(mode, (x,), x.dtype)


# --- elementwise -------------------------------------------------------------------------


def _unary(mode, args, kwargs):
    if kwargs or len(args) != 1:
        return None
    return _float_unary(mode, args[0])


def _with_inplace(mode, args, kwargs):
    """relu / silu / hardswish / hardsigmoid (input, inplace=False)."""
    bound = _bind(SIGNATURES["with_inplace"], args, kwargs)
    if bound is None:
        return None
    x, inplace = bound
    if type(inplace) is not bool:
        return None
    return _float_unary(mode, x, inplace)


def _leaky_relu(mode, args, kwargs):
    bound = _bind(lambda input, negative_slope=0.01, inplace=False: (input, negative_slope, inplace), args, kwargs)
    if bound is None:
        return None
    x, slope, inplace = bound
    if type(inplace) is not bool or type(slope) not in _NUMBERS:
        return None
    return _float_unary(mode, x, inplace)


def _gelu(mode, args, kwargs):
    bound = _bind(SIGNATURES["gelu"], args, kwargs)
    if bound is None:
        return None
    x, approximate = bound
    if approximate not in ("none", "tanh"):
        return None
    return _float_unary(mode, x)


def _hardtanh(mode, args, kwargs):
    """hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False) — ReLU6's clamp."""
    bound = _bind(lambda input, min_val=-1.0, max_val=1.0, inplace=False: (input, min_val, max_val, inplace),
                  args, kwargs)
    if bound is None:
        return None
    x, low, high, inplace = bound
    if type(inplace) is not bool or type(low) not in _NUMBERS or type(high) not in _NUMBERS or low > high:
        return None  # torch raises for min_val > max_val: FakeTensorMode says so
    # Under FakeTensorMode hardtanh decomposes into a clamp, whose strides for size-1
    # dimensions of a permuted input follow the decomposition's rule, not TensorIterator's.
    if not _ready(mode, x) or not _canonical(x):
        return None
    return _float_unary(mode, x, inplace)


def _clamp(mode, args, kwargs):
    """clamp(input, min=None, max=None) with numbers for bounds: a dense input's strides are
    kept, another input's order is kept. Inputs with size-1 dimensions are declined unless
    canonical (FakeTensorMode renumbers their strides by rules of its own)."""
    bound = _bind(lambda input, min=None, max=None: (input, min, max), args, kwargs)
    if bound is None:
        return None
    x, low, high = bound
    if not isinstance(x, FakeTensor) or not _ready(mode, x) or (low is None and high is None):
        return None
    bounds = [b for b in (low, high) if b is not None]
    if not all(type(b) in _NUMBERS for b in bounds):
        return None
    if x.dtype not in _FLOATS and not (x.dtype in (torch.int64, torch.int32) and all(type(b) is int for b in bounds)):
        return None  # a float bound makes an integer result floating; bool is refused
    if 1 in x.shape and not _canonical(x):
        return None  # the strides of size-1 dimensions follow rules of their own
    if _native.is_non_overlapping_and_dense(x.shape, x.stride()):
        return _new(mode, x, x.shape, x.stride())
    return _elementwise(mode, (x,), x.dtype)


def _relu6(mode, args, kwargs):
    """relu6(input, inplace=False): hardtanh(input, 0, 6, inplace)."""
    bound = _bind(SIGNATURES["with_inplace"], args, kwargs)
    return None if bound is None else _hardtanh(mode, (bound[0], 0.0, 6.0, bound[1]), {})


def _dropout(mode, args, kwargs):
    bound = _bind(SIGNATURES["dropout"], args, kwargs)
    if bound is None:
        return None
    x, p, training, inplace = bound
    if training is not False or type(inplace) is not bool or not isinstance(p, _NUMBERS) or not 0 <= p <= 1:
        return None
    # Outside training, dropout returns its input itself.
    return x if _ready(mode, x) else None


def _binary_operands(mode, args, kwargs, ready):
    """The tensors among the two positional operands of a binary operation, if there is
    one and `ready` (this module's or `_symbolic_rules`') accepts them; else None."""
    if kwargs or len(args) != 2:
        return None
    tensors = [o for o in args if isinstance(o, FakeTensor)]
    if not tensors or not ready(mode, *tensors):
        return None
    return tensors


def _binary(true_division: bool = False, inplace: bool = False):
    def rule(mode, args, kwargs):
        tensors = _binary_operands(mode, args, kwargs, _ready)
        if tensors is None:
            return None
        a, b = args
        for o in args:
            if isinstance(o, FakeTensor):
                if o.dtype is torch.bool or o.dtype.is_complex:
                    return None
            elif type(o) not in _NUMBERS or (type(o) is int and not -2**63 <= o < 2**63):
                return None  # not a number, or one torch cannot hold (FakeTensorMode raises)
        dtype = torch.result_type(a, b)
        if true_division and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        if inplace and isinstance(a, FakeTensor):
            # `a op= b` writes into `a`: the result must have its shape, cast into its
            # dtype, and `a` may not have elements that overlap (nor share `b`'s storage).
            shape = _native.elementwise_layout([(o.shape, o.stride()) if isinstance(o, FakeTensor) else ((), ())
                                                for o in args])
            if shape is None or tuple(shape[0]) != tuple(a.shape) or not torch.can_cast(dtype, a.dtype):
                return None
            if any(st == 0 and s > 1 for s, st in zip(a.shape, a.stride())):
                return None
            if isinstance(b, FakeTensor) and b.untyped_storage()._cdata == a.untyped_storage()._cdata:
                return None
            return a
        return _elementwise(mode, args, dtype)
    return rule


def _compare_or_logical(logical: bool, tensor_first: bool = False):
    """`a < b` (and the other comparisons; a bool result) or `a & b` (and `|`, `^`) of bool
    tensors: tensors of one dtype and numbers that do not change it (no operand converted),
    broadcast as elementwise arithmetic is (mask building: `kv_idx <= q_idx`, `mask & padding`).
    `tensor_first`: torch's functions and methods, whose first argument must be a tensor."""
    def rule(mode, args, kwargs):
        tensors = compare_operands(mode, args, kwargs, _ready, logical, tensor_first)
        if tensors is None:
            return None
        return _elementwise(mode, args, tensors[0].dtype, torch.bool)
    return rule


def compare_operands(mode, args, kwargs, ready, logical: bool, tensor_first: bool):
    """The tensors among the operands of a comparison or logical operation when the rules
    can answer it (see `_compare_or_logical`; `ready` is this module's or `_symbolic_rules`'),
    else None."""
    tensors = _binary_operands(mode, args, kwargs, ready)
    if tensors is None:
        return None
    if tensor_first and not isinstance(args[0], FakeTensor):
        return None  # `torch.lt(2, x)` raises: the input must be a tensor
    dtype = tensors[0].dtype
    if dtype.is_complex or any(t.dtype != dtype for t in tensors):
        return None
    if logical and dtype is not torch.bool:
        return None
    for o in args:
        if isinstance(o, FakeTensor):
            continue
        if type(o) not in (*_NUMBERS, bool) or (type(o) is int and not -2**63 <= o < 2**63):
            return None
    return tensors if torch.result_type(*args) == dtype else None


# --- layers ------------------------------------------------------------------------------


def _canonical(t: FakeTensor) -> bool:
    """Row-major with the strides a fresh tensor gets, size-1 dimensions included. Layers
    (convolution, pooling, norms) choose their output layout from the input's by rules with
    special cases for ambiguous strides; for canonical inputs every rule says canonical."""
    return t.stride() == tuple(_native.contiguous_strides(t.shape))


def _same_float(*tensors) -> bool:
    dtype = tensors[0].dtype
    return dtype in _FLOATS and all(t.dtype == dtype for t in tensors)


def _contiguous(mode, x, sizes):
    return _new(mode, x, sizes, _native.contiguous_strides(sizes))


def _linear(mode, args, kwargs):
    bound = _bind(SIGNATURES["linear"], args, kwargs)
    if bound is None:
        return None
    x, w, b = bound
    tensors = (x, w) if b is None else (x, w, b)
    if not _ready(mode, *tensors) or not _same_float(*tensors):
        return None
    if x.dim() < 1 or w.dim() != 2 or x.shape[-1] != w.shape[1]:
        return None
    if b is not None and tuple(b.shape) != (w.shape[0],):
        return None
    return _contiguous(mode, x, (*x.shape[:-1], w.shape[0]))


def _addmm(mode, args, kwargs):
    bound = _bind(SIGNATURES["addmm"], args, kwargs)
    if bound is None:
        return None
    b, m1, m2, beta, alpha = bound
    if not isinstance(beta, _NUMBERS) or not isinstance(alpha, _NUMBERS):
        return None
    if not _ready(mode, b, m1, m2) or not _same_float(b, m1, m2):
        return None
    if m1.dim() != 2 or m2.dim() != 2 or m1.shape[1] != m2.shape[0]:
        return None
    out = (m1.shape[0], m2.shape[1])
    # The bias must expand to the product's shape (a bias that would broadcast it bigger is
    # an error).
    if _native.expand_layout(b.shape, b.stride(), out) is None:
        return None
    return _contiguous(mode, m1, out)


def _matmul(mode, args, kwargs):
    """`a @ b` (and `bmm`) on the paths whose result is a fresh contiguous tensor: 2-D @ 2-D,
    and a batched first operand with a 2-D or batched second one (batches broadcast). 1-D
    operands and a 2-D first operand with a batched second one (computed transposed) are left
    to FakeTensorMode."""
    if kwargs or len(args) != 2:
        return None
    a, b = args
    if not isinstance(a, FakeTensor) or not isinstance(b, FakeTensor):
        return None
    if not _ready(mode, a, b) or not _same_float(a, b):
        return None
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        return None
    if a.dim() == 2 and b.dim() == 2:
        out = (a.shape[0], b.shape[1])
    elif a.dim() >= 3:
        # Batched first operand: one bmm over the broadcast batch (or one mm with `a`
        # folded), whatever the operands' layouts — a fresh row-major result (checked over
        # broadcast batches, transposed, sliced and permuted operands).
        batch = _broadcast_batch(a.shape[:-2], b.shape[:-2])
        if batch is None:
            return None
        out = (*batch, a.shape[-2], b.shape[-1])
    else:
        return None
    return _contiguous(mode, a, out)


def _broadcast_batch(first, second):
    """The broadcast of two batch shapes, or None when they do not broadcast."""
    first, second = tuple(first), tuple(second)
    length = max(len(first), len(second))
    first = (1,) * (length - len(first)) + first
    second = (1,) * (length - len(second)) + second
    batch = []
    for x, y in zip(first, second):
        if x != y and 1 not in (x, y):
            return None
        batch.append(y if x == 1 else x)
    return tuple(batch)


def _bmm(mode, args, kwargs):
    """`torch.bmm`: 3-D operands only (anything else is an error torch reports)."""
    if kwargs or len(args) != 2 or any(not isinstance(t, FakeTensor) or t.dim() != 3 for t in args):
        return None
    if args[0].shape[0] != args[1].shape[0]:
        return None  # bmm does not broadcast: torch's error
    return _matmul(mode, args, kwargs)


def _softmax(mode, args, kwargs):
    """softmax over a dimension of a contiguous float tensor, no dtype: same layout."""
    bound = _bind(SIGNATURES["softmax"], args, kwargs)
    if bound is None:
        return None
    x, dim, dtype = bound
    if dtype is not None or type(dim) is not int or not isinstance(x, FakeTensor):
        return None
    if not _ready(mode, x) or x.dtype not in _FLOATS or x.dim() == 0 or not _canonical(x):
        return None
    if not -x.dim() <= dim < x.dim():
        return None
    return _contiguous(mode, x, tuple(x.shape))


def _pair(value, n):
    if type(value) is int:
        return (value,) * n
    if isinstance(value, (tuple, list)) and len(value) == n and all(type(v) is int for v in value):
        return tuple(value)
    return None


def _conv2d(mode, args, kwargs):
    bound = _bind(SIGNATURES["conv2d"], args, kwargs)
    if bound is None:
        return None
    x, w, b, stride, padding, dilation, groups = bound
    tensors = (x, w) if b is None else (x, w, b)
    if not _ready(mode, *tensors) or not _same_float(*tensors) or type(groups) is not int:
        return None
    if padding == "valid":
        padding = 0
    stride, padding, dilation = _pair(stride, 2), _pair(padding, 2), _pair(dilation, 2)
    if stride is None or padding is None or dilation is None or x.dim() != 4:
        return None
    if b is not None and tuple(b.shape) != (w.shape[0],):
        return None
    sizes = _native.conv_output_sizes(x.shape, w.shape, stride, padding, dilation, groups)
    if sizes is None:
        return None
    # Like FakeTensorMode: the output is row-major, then converted to the memory format the
    # backend torch would pick for these tensors (channels-last for channels-last inputs on
    # most backends) — asked of torch itself, which only reads the tensors' metadata.
    backend = torch._C._select_conv_backend(
        x, w, bias=b, stride=list(stride), padding=list(padding), dilation=list(dilation),
        transposed=False, output_padding=[0, 0], groups=groups)
    memory_format = torch._C._conv_determine_backend_memory_format(x, w, backend)
    if memory_format not in (torch.contiguous_format, torch.channels_last):
        return None
    strides = _native.strides_in_format(sizes, memory_format is torch.channels_last)
    return _new(mode, x, sizes, strides)


def _batch_norm(mode, args, kwargs):
    bound = _bind(SIGNATURES["batch_norm"], args, kwargs)
    if bound is None:
        return None
    x, mean, var, w, b, training = bound
    # Training updates the running statistics (FakeTensorMode's business) — unless there
    # are none (`F.batch_norm(w, None, None, training=True)`: weight standardisation in
    # NFNets), which only normalises by the batch's own statistics.
    if training is True and mean is None and var is None:
        if not _ready(mode, x) or not _same_float(x) or x.dim() < 2 or not _canonical(x):
            return None
        if x.numel() // x.shape[1] <= 1:
            return None  # F.batch_norm raises on one value per channel: torch says so
        if any(t is not None and (not _ready(mode, x, t) or tuple(t.shape) != (x.shape[1],)
                                  or t.dtype != x.dtype) for t in (w, b)):
            return None
        return _contiguous(mode, x, tuple(x.shape))
    if training is not False or mean is None or var is None:
        return None
    tensors = [t for t in (x, mean, var, w, b) if t is not None]
    if not _ready(mode, *tensors) or not _same_float(*tensors) or x.dim() < 2:
        return None
    channels = (x.shape[1],)
    if any(tuple(t.shape) != channels for t in tensors[1:]):
        return None
    # Row-major for a row-major input, also one whose leading dimensions of size 1 have
    # larger strides (a slice of the channels of a larger batch of one: hybrid attention
    # nets' split projections); other layouts are left to FakeTensorMode.
    sizes, strides = tuple(x.shape), x.stride()
    canonical = tuple(_native.contiguous_strides(sizes))
    lead = next((i for i, n in enumerate(sizes) if n != 1), len(sizes))
    if strides[lead:] != canonical[lead:] or any(s < c for s, c in zip(strides[:lead], canonical)):
        return None  # (a smaller stride on a leading 1 is a permuted layout torch keeps)
    return _contiguous(mode, x, sizes)


def _layer_norm(mode, args, kwargs):
    bound = _bind(SIGNATURES["layer_norm"], args, kwargs)
    if bound is None:
        return None
    x, shape, w, b = bound
    shape = _pair(shape, 1) if type(shape) is int else shape
    if not isinstance(shape, (tuple, list, torch.Size)) or not shape or not all(type(s) is int for s in shape):
        return None
    tensors = [t for t in (x, w, b) if t is not None]
    if not _ready(mode, *tensors) or not _same_float(*tensors):
        return None
    shape = tuple(shape)
    if tuple(x.shape[x.dim() - len(shape):]) != shape or any(tuple(t.shape) != shape for t in tensors[1:]):
        return None
    # The kernel allocates its output like `input.contiguous()`: canonical, except that a
    # contiguous input with unusual strides on size-1 dimensions passes some of them on.
    if x.is_contiguous() and not _canonical(x):
        return None
    return _contiguous(mode, x, tuple(x.shape))


def _embedding(mode, args, kwargs):
    bound = _bind(SIGNATURES["embedding"], args, kwargs)
    if bound is None:
        return None
    idx, w, max_norm, sparse = bound
    # max_norm renormalises rows of the weight in place: FakeTensorMode's business.
    if max_norm is not None or sparse is not False or not _ready(mode, idx, w):
        return None
    if idx.dtype not in (torch.int64, torch.int32) or w.dim() != 2 or w.dtype not in _FLOATS:
        return None
    return _contiguous(mode, w, (*idx.shape, w.shape[1]))


def _cat(mode, args, kwargs):
    bound = _bind(SIGNATURES["cat"], args, kwargs)
    if bound is None:
        return None
    tensors, dim = bound
    if not isinstance(tensors, (tuple, list)) or not tensors or type(dim) is not int:
        return None
    if not all(isinstance(t, FakeTensor) for t in tensors) or not _ready(mode, *tensors):
        return None
    first = tensors[0]
    d = _native.wrap_dim(dim, first.dim())
    if d is None or first.dim() == 0 or not _same_float(*tensors):
        return None
    if not all(t.dim() == first.dim() for t in tensors) or first.dim() == 5:
        return None
    # The output is channels-last when every input suggests it, else row-major (c10's
    # `cat_compute_output_memory_format`).
    channels_last = all(_native.suggests_channels_last(t.shape, t.stride()) for t in tensors)
    if channels_last and first.dim() != 4:
        return None
    if any(tuple(t.shape[:d]) != tuple(first.shape[:d]) or tuple(t.shape[d + 1:]) != tuple(first.shape[d + 1:])
           for t in tensors):
        return None
    sizes = list(first.shape)
    sizes[d] = sum(t.shape[d] for t in tensors)
    strides = _native.strides_in_format(sizes, channels_last)
    if strides is None:
        return None
    return _new(mode, first, tuple(sizes), strides)


def _cat_of_nonempty(mode, args, kwargs):
    """`torch.cat` with 1-d empty tensors among the inputs (an empty key/value cache:
    `torch.cat([torch.tensor([]), k], dim=-2)`): torch skips them, so the rest decide — when
    the empty ones are plain, of the others' dtype and device."""
    bound = _bind(SIGNATURES["cat"], args, kwargs)
    if bound is None or not isinstance(bound[0], (tuple, list)):
        return None
    tensors, dim = bound
    if not all(isinstance(t, FakeTensor) and t.fake_mode is mode for t in tensors):
        return None
    kept = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    if len(kept) == len(tensors):
        return _cat(mode, args, kwargs)
    if not kept:
        return None
    for t in tensors:
        if t.dtype != kept[0].dtype or t._fake_device != kept[0]._fake_device or t.requires_grad:
            return None
        if _tensor_layout(t) is not torch.strided:
            return None
    return _cat(mode, (kept, dim), {})


def _adaptive_avg_pool2d(mode, args, kwargs):
    bound = _bind(SIGNATURES["adaptive_pool"], args, kwargs)
    if bound is None:
        return None
    x, size = bound
    if not _ready(mode, x) or x.dim() != 4 or not _canonical(x) or x.dtype not in _FLOATS:
        return None
    if type(size) is int:
        size = (size, size)
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        return None
    size = tuple(x.shape[2 + i] if s is None else s for i, s in enumerate(size))
    if not all(type(s) is int and s > 0 for s in size):
        return None
    return _contiguous(mode, x, (*x.shape[:2], *size))


def _sliding_blocks(spatial, kernel, stride, padding, dilation):
    """How many positions a window takes along each spatial dimension (a one-channel
    convolution's output size), or None when it does not fit somewhere (torch raises)."""
    sizes = _native.conv_output_sizes((1, 1, *spatial), (1, 1, *kernel), stride, padding, dilation, 1)
    return None if sizes is None else tuple(sizes[2:])


def _pool2d(mode, x, kernel, stride, padding, dilation):
    """The fresh (N, C, *windows) result of a 2-d pooling of a canonical float image, or
    None."""
    if not _ready(mode, x) or x.dim() != 4 or not _canonical(x) or x.dtype not in _FLOATS:
        return None
    kernel = _pair(kernel, 2)
    stride = kernel if stride is None or stride == [] or stride == () else _pair(stride, 2)
    padding, dilation = _pair(padding, 2), _pair(dilation, 2)
    if kernel is None or stride is None or padding is None or dilation is None:
        return None
    if any(2 * p > k for p, k in zip(padding, kernel)):
        return None  # torch: "pad should be at most half of effective kernel size"
    windows = _sliding_blocks(x.shape[2:], kernel, stride, padding, dilation)
    return None if windows is None else _contiguous(mode, x, (*x.shape[:2], *windows))


def _interpolate(mode, args, kwargs):
    """`F.interpolate` of a 4-d float image (`nearest`, `nearest-exact`, `bilinear`,
    `bicubic`), to a size given or by a scale factor: (N, C, H', W') with H' = floor(H * scale)
    as torch computes it, laid out as torch's kernels lay it out: a fresh tensor made
    contiguous in the format torch suggests for the input (`suggest_memory_format`), which
    keeps row-major strides where size-1 dimensions make them channels-last too. Inputs are
    canonical or exactly channels-last (other strides on a size-1 dimension can steer the
    decompositions elsewhere: left to FakeTensorMode)."""
    bound = _bind(SIGNATURES["interpolate"], args, kwargs)
    if bound is None:
        return None
    x, size, scale, how, align_corners, recompute, antialias = bound
    supported = interpolation_supported(how, align_corners, antialias) or (
        antialias is False
        and ((how == "bicubic" and align_corners in (None, True, False))
             or (how == "nearest-exact" and align_corners is None)))
    if not supported or not isinstance(x, FakeTensor):
        return None
    if not _ready(mode, x):
        return None
    if x.dim() != 4 or x.dtype not in _FLOATS:
        return None
    exactly_channels_last = x.stride() == tuple(_native.strides_in_format(x.shape, True))
    if not (_canonical(x) or exactly_channels_last):
        return None
    if (size is None) == (scale is None) or recompute not in (None, True, False):
        return None
    if size is not None:
        if recompute:
            return None  # torch raises
        sizes = spatial_pair(size, (int,))
        if sizes is None or not all(type(s) is int for s in sizes):
            return None
    else:
        scales = spatial_pair(scale, _NUMBERS)
        if scales is None or not all(type(f) in _NUMBERS and f > 0 for f in scales):
            return None
        sizes = [math.floor(float(n) * f) for n, f in zip(x.shape[2:], scales)]
    if min(sizes) < 1:
        return None  # torch raises
    out = (x.shape[0], x.shape[1], *sizes)
    in_format = _suggest_memory_format(x)
    strides = _native.contiguous_strides(out)
    if in_format is torch.channels_last and not _is_channels_last_contiguous(out, strides):
        strides = _native.strides_in_format(out, True)
    return _new(mode, x, out, strides)


def _is_channels_last_contiguous(sizes, strides) -> bool:
    """`Tensor.is_contiguous(memory_format=torch.channels_last)` of these sizes and strides:
    dimensions C, W, H, N in that order each step by the product of the ones before, size-1
    dimensions excepted."""
    expected = 1
    for d in (1, 3, 2, 0):
        if sizes[d] != 1:
            if strides[d] != expected:
                return False
            expected *= sizes[d]
    return True


def spatial_pair(value, scalar_types) -> list | None:
    """`F.interpolate`'s `size` or `scale_factor` for an image: one value for both spatial
    dimensions, or a sequence of two; else None."""
    if type(value) in scalar_types:
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return list(value)
    return None


def interpolation_supported(how, align_corners, antialias) -> bool:
    """The `F.interpolate` modes the rules answer (static and symbolic): `nearest` (no
    `align_corners`: torch raises) and `bilinear`, without antialiasing."""
    if antialias is not False:
        return False
    if how == "nearest":
        return align_corners is None
    return how == "bilinear" and align_corners in (None, True, False)


def _max_pool2d(mode, args, kwargs):
    bound = _bind(SIGNATURES["max_pool2d"], args, kwargs)
    if bound is None:
        return None
    x, kernel, stride, padding, dilation, ceil_mode, return_indices = bound
    if ceil_mode is not False or return_indices is not False:
        return None
    return _pool2d(mode, x, kernel, stride, padding, dilation)


def _avg_pool2d(mode, args, kwargs):
    bound = _bind(
        lambda input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
        divisor_override=None: (input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
        args, kwargs)
    if bound is None:
        return None
    x, kernel, stride, padding, ceil_mode, count_include_pad, divisor = bound
    if ceil_mode is not False or type(count_include_pad) is not bool or divisor is not None:
        return None
    return _pool2d(mode, x, kernel, stride, padding, 1)


def _pad(mode, args, kwargs):
    """F.pad(input, pad, mode="constant", value=None), constant mode with no negative pad
    (a negative pad crops through a view first)."""
    bound = _bind(lambda input, pad, mode="constant", value=None: (input, pad, mode, value), args, kwargs)
    if bound is None:
        return None
    x, pads, pad_mode, value = bound
    if pad_mode != "constant" or (value is not None and type(value) not in _NUMBERS):
        return None
    if not isinstance(pads, (tuple, list)) or len(pads) % 2 or not all(type(p) is int and p >= 0 for p in pads):
        return None
    if not _ready(mode, x) or len(pads) // 2 > x.dim() or not _canonical(x):
        return None
    sizes = list(x.shape)
    for i in range(len(pads) // 2):
        sizes[x.dim() - 1 - i] += pads[2 * i] + pads[2 * i + 1]
    return _contiguous(mode, x, tuple(sizes))


def _block_geometry(kernel, dilation, padding, stride):
    """kernel, dilation, padding, stride of unfold/fold as pairs of ints, or None."""
    geometry = tuple(_pair(v, 2) for v in (kernel, dilation, padding, stride))
    return None if any(v is None for v in geometry) else geometry


def _unfold(mode, args, kwargs):
    """F.unfold (im2col) of a batched image: (N, C, H, W) -> (N, C * kh * kw, blocks), a
    fresh contiguous tensor."""
    bound = _bind(lambda input, kernel_size, dilation=1, padding=0, stride=1:
                  (input, kernel_size, dilation, padding, stride), args, kwargs)
    if bound is None:
        return None
    x, *geometry = bound
    geometry = _block_geometry(*geometry)
    # The decomposition indexes the (padded) input, whose layout the result keeps.
    if geometry is None or not _ready(mode, x) or x.dim() != 4 or x.dtype not in _FLOATS or not _canonical(x):
        return None
    kernel, dilation, padding, stride = geometry
    counts = _sliding_blocks(x.shape[2:], kernel, stride, padding, dilation)
    if counts is None:
        return None
    sizes = (x.shape[0], x.shape[1] * kernel[0] * kernel[1], counts[0] * counts[1])
    if sizes[2] == 1:
        return None  # one block: the decomposition's reshape leaves its own stride on it
    return _contiguous(mode, x, sizes)


def _fold(mode, args, kwargs):
    """F.fold (col2im) of batched blocks: (N, C * kh * kw, blocks) -> (N, C, H, W). torch's
    decomposition sums the blocks into a fresh (N, C, H + 2 ph, W + 2 pw) buffer and cuts the
    padding off by a constant pad of negative widths: with no padding, or padding on both
    dimensions, the result is a fresh contiguous tensor; with padding on one dimension only
    it is a copy of a view whose layout follows `clone`'s own rules (declined)."""
    bound = _bind(lambda input, output_size, kernel_size, dilation=1, padding=0, stride=1:
                  (input, output_size, kernel_size, dilation, padding, stride), args, kwargs)
    if bound is None:
        return None
    x, size, *geometry = bound
    size, geometry = _pair(size, 2), _block_geometry(*geometry)
    if size is None or geometry is None or not _ready(mode, x) or x.dim() != 3 or x.dtype not in _FLOATS \
            or not _canonical(x):
        return None
    kernel, dilation, padding, stride = geometry
    counts = _sliding_blocks(size, kernel, stride, padding, dilation)
    if counts is None or x.shape[1] % (kernel[0] * kernel[1]) or x.shape[2] != counts[0] * counts[1]:
        return None
    sizes = (x.shape[0], x.shape[1] // (kernel[0] * kernel[1]), *size)
    if (padding[0] > 0) != (padding[1] > 0) or (padding[0] > 0 and min(size) == 1):
        # (A padded output of height or width 1 is a view of the padded buffer.)
        return None
    return _contiguous(mode, x, sizes)


def _group_norm(mode, args, kwargs):
    bound = _bind(
        lambda input, num_groups, weight=None, bias=None, eps=1e-5: (input, num_groups, weight, bias),
        args, kwargs)
    if bound is None:
        return None
    x, groups, w, b = bound
    tensors = [t for t in (x, w, b) if t is not None]
    if type(groups) is not int or groups <= 0 or not _ready(mode, *tensors) or not _same_float(*tensors):
        return None
    if x.dim() < 2 or not _canonical(x) or x.shape[1] % groups:
        return None
    spatial = 1
    for size in x.shape[2:]:
        spatial *= size
    if x.shape[0] * x.shape[1] // groups * spatial == 1:
        return None  # F.group_norm raises for one value per group (`_verify_batch_size`)
    if any(tuple(t.shape) != (x.shape[1],) for t in tensors[1:]):
        return None
    return _contiguous(mode, x, tuple(x.shape))


def _sdpa(mode, args, kwargs):
    """`scaled_dot_product_attention` where torch's CPU dispatch's choice is certain:
    - the flash kernel, laid out like `empty_like(query)`: 4-d, no mask, equal head sizes,
      unit-stride last dimensions, flash enabled and ranked before math;
    - the math path, a fresh contiguous (*batch, L, Ev): five or more dimensions (timm's
      Twins and Hiera keep a window dimension before the heads; the fused kernels take 4-d
      only), or a mask (boolean, or additive of the query's dtype, broadcasting to (B, H, L, S):
      Swin's and TinyViT's relative-position bias) that is 3-d or with differing head sizes;
    - with another mask flash may be taken: answered only for a canonical query, on which
      both agree.
    Dropout, grouped-query attention and everything else (3-d inputs, laid out like the query
    by another route, among them) are FakeTensorMode's."""
    bound = _bind(SIGNATURES["sdpa"], args, kwargs)
    if bound is None:
        return None
    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa = bound
    if dropout_p != 0.0 or type(is_causal) is not bool or enable_gqa is not False:
        return None
    if not (scale is None or type(scale) is float):
        return None
    tensors = (q, k, v) if mask is None else (q, k, v, mask)
    if not all(isinstance(t, FakeTensor) for t in tensors) or not _ready(mode, *tensors):
        return None
    if not _same_float(q, k, v) or q.device.type != "cpu" or not q.dim() == k.dim() == v.dim() >= 4:
        return None
    *batch, length, e = q.shape
    *key_batch, s, ek = k.shape
    *value_batch, sv, ev = v.shape
    if key_batch != batch or value_batch != batch or e != ek or s != sv or 0 in (*batch, length, s, e, ev):
        return None
    math_result = (*batch, length, ev)
    if q.dim() >= 5:
        return None if mask is not None or is_causal else _contiguous(mode, q, math_result)
    if mask is not None:
        if is_causal or not (mask.dtype is torch.bool or mask.dtype == q.dtype) or not 2 <= mask.dim() <= 4:
            return None
        if not all(m in (1, t) for m, t in zip(reversed(mask.shape), reversed((*batch, length, s)))):
            return None
        if mask.dim() == 3 or e != ev or _canonical(q):
            return _contiguous(mode, q, math_result)
        return None
    if e != ev or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return None
    order = torch._C._get_sdp_priority_order()
    flash, math_path = int(torch._C._SDPBackend.FLASH_ATTENTION), int(torch._C._SDPBackend.MATH)
    if not torch._C._get_flash_sdp_enabled() or flash not in order:
        return None
    if math_path in order and order.index(math_path) < order.index(flash):
        return None
    return _elementwise(mode, (q,), q.dtype)


def _multi_head_attention(mode, args, kwargs):
    """`F.multi_head_attention_forward` as `nn.MultiheadAttention` calls it on its slow path
    (torchvision's ViT): batched (L, N, E) inputs, packed input projection, no masks, no extra
    key/value biases, no dropout, `need_weights=False`. The output projection's result viewed
    as (L, N, E) is fresh and contiguous; the weights are None."""
    bound = _bind(
        lambda query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
        bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True,
        key_padding_mask=None, need_weights=True, attn_mask=None, use_separate_proj_weight=False,
        q_proj_weight=None, k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
        average_attn_weights=True, is_causal=False:
        (query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
         add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training, key_padding_mask, need_weights,
         attn_mask, use_separate_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, static_k,
         static_v, is_causal),
        args, kwargs)
    if bound is None:
        return None
    (q, k, v, embed_dim, heads, w_in, b_in, bias_k, bias_v, zero_attn, dropout_p, w_out, b_out, training,
     padding_mask, need_weights, attn_mask, separate, qw, kw, vw, static_k, static_v, is_causal) = bound
    if need_weights is not False or is_causal is not False or zero_attn is not False or separate is not False:
        return None
    if any(x is not None for x in (bias_k, bias_v, padding_mask, attn_mask, qw, kw, vw, static_k, static_v)):
        return None
    if not (dropout_p == 0.0 or training is False) or type(heads) is not int or heads <= 0:
        return None
    tensors = (q, k, v, w_in, b_in, w_out, b_out)
    if not all(isinstance(t, FakeTensor) for t in tensors) or not _ready(mode, *tensors) or not _same_float(*tensors):
        return None
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        return None
    length, batch, e = q.shape
    if e != embed_dim or e % heads or k.shape != v.shape or k.shape[1] != batch or k.shape[2] != e:
        return None
    if tuple(w_in.shape) != (3 * e, e) or tuple(b_in.shape) != (3 * e,):
        return None
    if tuple(w_out.shape) != (e, e) or tuple(b_out.shape) != (e,) or min(length, batch, e, k.shape[0]) == 0:
        return None
    return _contiguous(mode, q, (length, batch, e)), None


def _pow(mode, args, kwargs):
    """`x ** n` / `torch.pow(x, n)` / `x.pow(n)` with a floating tensor and a Python number."""
    if kwargs or len(args) != 2:
        return None
    x, n = args
    if type(n) not in _NUMBERS or not isinstance(x, FakeTensor) or not _ready(mode, x) or x.dtype not in _FLOATS:
        return None
    return _elementwise(mode, (x, n), x.dtype)


_CASTS = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


def _cast(dtype_of_method):
    def rule(mode, args, kwargs):
        if dtype_of_method is None:  # `x.to(dtype)`, `x.to(dtype=, device=)` on its device
            if len(args) == 2 and not kwargs:
                dtype = args[1]
            elif len(args) == 1 and kwargs and set(kwargs) <= {"dtype", "device"}:
                dtype = kwargs.get("dtype", args[0].dtype if isinstance(args[0], FakeTensor) else None)
                device = kwargs.get("device")
                if device is not None and (not isinstance(device, (str, torch.device)) or not isinstance(
                        args[0], FakeTensor) or torch.device(device) != args[0]._fake_device):
                    return None
            else:
                return None
        elif len(args) != 1 or kwargs:
            return None
        else:
            dtype = dtype_of_method
        x = args[0]
        if not isinstance(dtype, torch.dtype) or not _ready(mode, x):
            return None
        if dtype == x.dtype:
            return x  # no conversion: the tensor itself
        if x.dtype.is_complex or dtype.is_complex:
            return None
        # The copy keeps a dense layout (renumbering the strides of size-1 dimensions, which
        # is not modelled); anything else is FakeTensorMode's.
        if _canonical(x):
            return _new(mode, x, x.shape, x.stride(), dtype)
        if 1 in x.shape or not _native.is_non_overlapping_and_dense(x.shape, x.stride()):
            return None
        return _new(mode, x, x.shape, x.stride(), dtype)
    return rule


def _mean(mode, args, kwargs):
    bound = _bind(SIGNATURES["mean"], args, kwargs)
    if bound is None:
        return None
    return _float_reduction(mode, *bound)


def _norm(signature):
    """`x.norm(p, dim, keepdim)`, `torch.norm`, `torch.linalg.vector_norm` of a real float
    tensor with a numeric order (or `"fro"`, the 2-norm over the dimensions given): a
    reduction in the input's dtype, as `mean` is. Torch's own reference implementation
    answers them otherwise, a few milliseconds the first time (an `F.normalize` per block)."""

    def rule(mode, args, kwargs):
        bound = _bind(SIGNATURES[signature], args, kwargs)
        if bound is None:
            return None
        x, order, dim, keepdim, dtype = bound
        if order == "fro":
            if dim is not None and not (type(dim) is int or (isinstance(dim, (tuple, list)) and len(dim) <= 2)):
                return None
        elif type(order) not in _NUMBERS:
            return None
        return _float_reduction(mode, x, dim, keepdim, dtype)

    return rule


def _float_reduction(mode, x, dim, keepdim, dtype):
    """The result of reducing the canonical float tensor `x` over `dim` (None: every
    dimension), keeping its dtype."""
    if dtype is not None or type(keepdim) is not bool or not _ready(mode, x) or x.dtype not in _FLOATS:
        return None
    if not _canonical(x):
        return None
    dims = range(x.dim()) if dim is None else (dim,) if type(dim) is int else dim
    if not isinstance(dims, (range, tuple, list)) or not all(type(d) is int for d in dims):
        return None
    if len(dims) == 0:
        return None  # `dim=()` reduces every dimension; rare enough to leave to torch
    wrapped = {_native.wrap_dim(d, x.dim()) for d in dims}
    if None in wrapped or len(wrapped) != len(dims) or x.dim() == 0:
        return None
    if keepdim:
        sizes = tuple(1 if d in wrapped else s for d, s in enumerate(x.shape))
    else:
        sizes = tuple(s for d, s in enumerate(x.shape) if d not in wrapped)
    return _contiguous(mode, x, sizes)


# Fresh tensors (`new_ones`, `torch.tensor`, `arange`): in `_creation_rules`, which uses the
# helpers above.
from dynamo_rs._creation_rules import _arange, _new_filled, _new_tensor, arange_bounds  # noqa: E402
# Views and indexing: in `_view_rules`, which uses the helpers above too.
from dynamo_rs._view_rules import (  # noqa: E402
    NO_VALUE, _attribute, _chunk, _contiguous_method, _flatten, _getitem, _normalize, _reshaping,
    _reshaping_as, _setitem, _sized_view, _split, _torch_reshape, _transpose, _unbind, _unsqueeze)

RULES = {
    # elementwise
    torch.tanh: _unary, "tanh": _unary, torch.sigmoid: _unary, "sigmoid": _unary,
    torch.rsqrt: _unary, "rsqrt": _unary, torch.sqrt: _unary, "sqrt": _unary,
    torch.exp: _unary, "exp": _unary, torch.cos: _unary, "cos": _unary, torch.sin: _unary, "sin": _unary,
    operator.pow: _pow, torch.pow: _pow, "pow": _pow,
    "to": _cast(None), **{name: _cast(dtype) for name, dtype in _CASTS.items()},
    torch.mean: _mean, "mean": _mean,
    torch.norm: _norm("norm"), "norm": _norm("norm"), torch.linalg.vector_norm: _norm("vector_norm"),
    torch.neg: _unary, operator.neg: _unary, "neg": _unary,
    F.relu: _with_inplace, torch.relu: _unary, "relu": _unary,
    F.silu: _with_inplace, F.hardswish: _with_inplace, F.hardsigmoid: _with_inplace,
    F.gelu: _gelu, F.dropout: _dropout, F.hardtanh: _hardtanh, F.leaky_relu: _leaky_relu,
    F.relu6: _relu6, torch.clamp: _clamp, "clamp": _clamp,
    operator.add: _binary(), operator.sub: _binary(), operator.mul: _binary(),
    operator.truediv: _binary(true_division=True),
    torch.add: _binary(), torch.sub: _binary(), torch.mul: _binary(),
    torch.div: _binary(true_division=True),
    "add": _binary(), "sub": _binary(), "mul": _binary(), "div": _binary(true_division=True),
    operator.iadd: _binary(inplace=True), operator.isub: _binary(inplace=True),
    operator.imul: _binary(inplace=True), operator.itruediv: _binary(true_division=True, inplace=True),
    # layers
    F.linear: _linear, torch.addmm: _addmm, torch.conv2d: _conv2d, F.conv2d: _conv2d,
    F.batch_norm: _batch_norm, F.layer_norm: _layer_norm, F.group_norm: _group_norm,
    F.avg_pool2d: _avg_pool2d, F.pad: _pad, F.unfold: _unfold, F.fold: _fold,
    # views
    "view": _reshaping(False), "reshape": _reshaping(True), torch.reshape: _torch_reshape,
    "view_as": _reshaping_as(False), "reshape_as": _reshaping_as(True), F.normalize: _normalize,
    "permute": _sized_view(_native.permute_layout), torch.permute: _sized_view(_native.permute_layout),
    "transpose": _transpose, torch.transpose: _transpose,
    "unsqueeze": _unsqueeze, torch.unsqueeze: _unsqueeze, "flatten": _flatten, torch.flatten: _flatten,
    "expand": _sized_view(_native.expand_layout), "contiguous": _contiguous_method,
    operator.getitem: _getitem, operator.setitem: _setitem, "split": _split, torch.split: _split, "chunk": _chunk, torch.chunk: _chunk, "unbind": _unbind, torch.unbind: _unbind,
    # layers, continued
    F.embedding: _embedding, torch.cat: _cat_of_nonempty, F.adaptive_avg_pool2d: _adaptive_avg_pool2d,
    F.max_pool2d: _max_pool2d, F.scaled_dot_product_attention: _sdpa, F.interpolate: _interpolate,
    F.multi_head_attention_forward: _multi_head_attention,
    operator.matmul: _matmul, torch.matmul: _matmul, "matmul": _matmul, torch.bmm: _bmm,
    "bmm": _bmm,
    F.softmax: _softmax, torch.softmax: _softmax, "softmax": _softmax,
    getattr: _attribute, torch.arange: _arange, torch.tensor: _new_tensor,
    "new_ones": _new_filled, "new_zeros": _new_filled, "new_empty": _new_filled,
    **{op: _compare_or_logical(False) for op in (
        operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne)},
    **{op: _compare_or_logical(False, tensor_first=True) for op in (
        torch.lt, torch.le, torch.gt, torch.ge, torch.eq, torch.ne, "lt", "le", "gt", "ge", "eq", "ne")},
    **{op: _compare_or_logical(True) for op in (operator.and_, operator.or_, operator.xor)},
}


def infer(mode: FakeTensorMode, target, args, kwargs):
    """The fake result of `target(*args, **kwargs)` (a method name: `args[0]` is the
    receiver), or None when no rule answers."""
    try:
        rule = RULES.get(target)
        on_meta = _meta_run.RULES.get(target)
    except TypeError:  # an unhashable callable
        return None
    # Arithmetic on values the trace knows, and sizes given as such values (`_constant_fakes`).
    constant = _constant_fakes.propagate(mode, target, args, kwargs)
    if constant is not None:
        return constant
    if rule is None and on_meta is None:
        return None
    args, kwargs = _constant_fakes.sizes_as_ints(mode, target, args, kwargs) or (args, kwargs)
    try:
        result = rule(mode, args, kwargs) if rule is not None else None
    except NeedsAutogradView:
        return None
    if result is None and on_meta is not None:
        # What the rule does not model (or no rule): torch's kernels on meta (`_meta_run`).
        result = on_meta(mode, args, kwargs)
    return result
