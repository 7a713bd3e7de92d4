"""Fake results of composite and layout-only operations by running torch's own kernels on the
fake tensors' meta storage, without FakeTensorMode's per-operation dispatch.

`einsum`, `flip`, `where`, `tril`, `cumsum`, ... have no shape rule of their own in
`_meta_rules`, and FakeTensorMode answers them by dispatching every aten operation they
decompose into through Python (cache key, cache miss, meta kernel, output wrapping): an
`einsum` costs 5–9 ms the first time a process meets its shapes. The same kernels run in
well under a millisecond when called directly on the meta tensors underneath the fakes —
exactly what FakeTensorMode itself does for each aten operation (`in_kernel_invocation_manager`),
with torch's Python meta registrations and decompositions enabled as FakeTensorMode's
dispatch has them (without them, `einsum` lays out size-1 dimensions differently).

Only operations listed here, with the same conditions as every rule (`_meta_rules._ready`:
plain fakes of this mode with static non-zero sizes, one device, no autograd graph to
record, no autocast or torch-function mode), no `out=`, no `device=` and no in-place form;
any exception (a data-dependent kernel, bad input) leaves the call to FakeTensorMode, which
raises torch's own error. Results are fresh tensors or views of an input — a view shares the
input's storage, as FakeTensorMode's views do. With `config.verify_meta_rules` (the test
suite, the fuzzer) every answer is compared with FakeTensorMode's.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode, in_kernel_invocation_manager

from dynamo_rs._fakes import wrap_meta


def _tensors_of(values, out: list) -> bool:
    """Collects the tensors among `values` (one level of lists/tuples, as torch's operations
    take them); False when something else holds a tensor (a dict) or a symbolic number."""
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    out.append(item)
                elif isinstance(item, (torch.SymInt, torch.SymFloat, torch.SymBool, list, tuple, dict)):
                    return False
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, dict)):
            return False
    return True


def _run_on_meta(mode: FakeTensorMode, target, args, kwargs):
    from dynamo_rs import _meta_rules

    if "out" in kwargs or "device" in kwargs:
        return None
    if target in _NEEDS_THREE_ARGUMENTS and len(args) + len(kwargs) < 3:
        return None  # where(condition) is nonzero: data-dependent
    tensors: list = []
    if not _tensors_of(args, tensors) or not _tensors_of(kwargs.values(), tensors) or not tensors:
        return None
    if not _meta_rules._ready(mode, *tensors) or any(t.requires_grad for t in tensors):
        return None
    if target not in _LAYOUT_EXACT and not all(
        _meta_rules._canonical(t) or 1 not in t.shape for t in tensors
    ):
        return None
    device = tensors[0]._fake_device
    try:
        with enable_python_dispatcher(), in_kernel_invocation_manager(mode):
            if isinstance(target, str):
                result = getattr(torch.Tensor, target)(*args, **kwargs)
            else:
                result = target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - FakeTensorMode runs it and raises torch's own error
        return None
    results = result if isinstance(result, tuple) else (result,)
    if not results or not all(type(r) is torch.Tensor and r.is_meta and not r.requires_grad for r in results):
        return None
    if target not in _LAYOUT_EXACT and any(1 in r.shape for r in results):
        return None
    if any(r._is_view() for r in results):
        # Wrapped, a view loses its autograd link to its base (see `_meta_rules._view`).
        if torch.is_grad_enabled():
            return None
        for r in results:
            if r._is_view():
                _meta_rules.note_unlinked_view(mode, r)
    wrapped = tuple(wrap_meta(mode, r, device) for r in results)
    if isinstance(result, tuple):
        return type(result)(wrapped) if type(result) is tuple else None
    return wrapped[0]


def _for(target):
    return lambda mode, args, kwargs: _run_on_meta(mode, target, args, kwargs)


# Functions and methods (by name) answered by running their kernels on meta. Each is a
# composite of layout-preserving aten operations or has a meta kernel that does not read
# values; none is in place or data-dependent.
_FUNCTIONS = (
    torch.einsum, torch.flip, torch.tril, torch.triu, torch.cumsum, torch.where,
    torch.masked_fill, torch.full_like, torch.zeros_like, torch.ones_like, torch.empty_like,
    torch.roll, torch.any, torch.all, torch.stack, torch.baddbmm, torch.outer,
    torch.logsumexp, torch.amax, torch.amin, torch.sum, torch.prod, torch.var, torch.std,
    torch.minimum, torch.maximum, torch.atan2, torch.lerp, torch.addcmul, torch.addcdiv,
    torch.log_softmax, F.log_softmax, torch.abs, torch.sign, torch.log,
    torch.log1p, torch.expm1, torch.erf, torch.floor, torch.ceil, torch.round, torch.trunc,
    torch.square, torch.reciprocal, torch.tan, torch.atan, torch.sinh, torch.cosh,
    F.softplus, F.elu, F.mish, F.logsigmoid, F.glu, F.pixel_shuffle, F.pixel_unshuffle,
    torch.swapaxes, torch.repeat_interleave, torch.gather, torch.clone, torch.mean,
    torch.div, torch.add, torch.sub, torch.mul,
    # Operations with a rule of their own, for the cases the rule does not model.
    F.layer_norm, F.group_norm, F.batch_norm, F.adaptive_avg_pool2d, F.avg_pool2d,
    F.max_pool2d, F.pad, F.unfold, F.fold, F.softmax, torch.softmax, torch.matmul, torch.bmm,
    F.linear, F.gelu, F.silu, F.relu, F.hardswish, F.hardsigmoid, F.leaky_relu, F.relu6,
    F.hardtanh, torch.clamp, torch.sigmoid, torch.tanh, torch.exp, torch.sqrt, torch.rsqrt,
    torch.cat, torch.pow, F.normalize,
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.matmul, operator.neg, operator.invert, operator.pow,
)
_METHODS = (
    "flip", "tril", "triu", "cumsum", "where", "masked_fill", "roll", "any", "all",
    "type_as", "bool", "int", "long", "sum", "amax", "amin", "prod", "var", "std", "logsumexp",
    "abs", "sign", "log", "log1p", "expm1", "erf", "floor", "ceil", "round", "trunc", "square",
    "reciprocal", "tan", "atan", "sinh", "cosh", "log_softmax", "minimum", "maximum", "lerp",
    "repeat", "expand_as", "as_strided", "narrow", "diagonal", "movedim", "swapaxes", "squeeze",
    "clamp_min", "clamp_max", "norm", "repeat_interleave", "gather", "clone", "mean",
    "softmax", "matmul", "bmm", "add", "sub", "mul", "div", "pow", "float", "half", "double",
    "sigmoid", "tanh", "exp", "sqrt", "rsqrt", "relu", "clamp",
)

_NEEDS_THREE_ARGUMENTS = (torch.where, "where")
# FakeTensorMode answers some operations through torch's Python decompositions (`where`,
# `tril`, `stack`, `norm`, `pad`), which can lay out size-1 dimensions differently from the
# meta kernels (the stride of a size-1 dimension is arbitrary, and the two paths choose
# differently). Calls with a size-1 dimension in a result, or in an input that is not
# canonical, are left to FakeTensorMode, except for operations seen to agree on every layout
# the test sweeps.
_LAYOUT_EXACT = (
    torch.einsum, F.layer_norm, F.batch_norm, F.adaptive_avg_pool2d, F.avg_pool2d, F.max_pool2d,
    torch.roll, torch.matmul, torch.repeat_interleave, "repeat_interleave", torch.mean, "mean",
    "expand_as", torch.swapaxes, "swapaxes", torch.clone, "clone", F.unfold,
)

RULES = {**{f: _for(f) for f in _FUNCTIONS}, **{m: _for(m) for m in _METHODS}}
