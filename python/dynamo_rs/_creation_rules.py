"""Shape rules for operations that make fresh tensors (`x.new_ones(...)`, `torch.tensor(data)`,
`torch.arange`), split from `_meta_rules` (whose table lists them); `_symbolic_rules` shares
`arange_bounds`."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from dynamo_rs import _constant_fakes, _native
from dynamo_rs._fakes import wrap_meta

def _new_filled(mode, args, kwargs):
    """`x.new_ones(size)`, `new_zeros`, `new_empty` (a size tuple or ints; `dtype=`): a fresh
    row-major tensor on `x`'s device, of its dtype unless given."""
    if not args or not isinstance(args[0], FakeTensor) or not set(kwargs) <= {"dtype"}:
        return None
    x, rest = args[0], args[1:]
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        rest = tuple(rest[0])
    if not all(type(v) is int and v > 0 for v in rest) or not rules._ready(mode, x):
        return None
    dtype = kwargs.get("dtype") or x.dtype
    if not isinstance(dtype, torch.dtype):
        return None
    return rules._new(mode, x, tuple(rest), _native.contiguous_strides(tuple(rest)), dtype)


def _python_data(value, depth=0) -> bool:
    """Python numbers, or (nested) lists and tuples of them."""
    if isinstance(value, (bool, int, float)):
        return True
    return depth < 8 and isinstance(value, (list, tuple)) and all(_python_data(v, depth + 1) for v in value)


def _new_tensor(mode, args, kwargs):
    """`torch.tensor(data)` of Python numbers on the CPU: the real tensor is made (it is
    small: the trace holds its data anyway), and its fake is what FakeTensorMode makes — a
    constant holding the real value when it has at most one element (then arithmetic on it
    and its use as a size are answered by `_constant_fakes`), else a plain fresh tensor."""
    if len(args) != 1 or not _python_data(args[0]) or not set(kwargs) <= {"dtype", "device"}:
        return None
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    if (dtype is not None and not isinstance(dtype, torch.dtype)) or torch.get_default_device().type != "cpu":
        return None
    if device is not None and (not isinstance(device, (str, torch.device)) or torch.device(device) != torch.device("cpu")):
        return None
    try:
        real = torch.tensor(args[0], dtype=dtype)
    except Exception:  # noqa: BLE001 - FakeTensorMode raises torch's own error
        return None
    if real.numel() <= 1:
        return _constant_fakes.constant_fake(mode, real)
    meta = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="meta")
    return wrap_meta(mode, meta, torch.device("cpu"))


def _arange(mode, args, kwargs):
    """`torch.arange` of Python ints on the CPU: a fresh 1-d int64 tensor (position ids, causal
    masks)."""
    bounds = arange_bounds(args, kwargs)
    if bounds is None:
        return None
    start, end, step = bounds
    if not all(type(v) is int for v in (start, end, step)) or step == 0:
        return None
    length = -((start - end) // step)  # ceil((end - start) / step)
    if length <= 0:
        return None
    meta = torch.empty_strided((length,), (1,), dtype=torch.int64, device="meta")
    return wrap_meta(mode, meta, torch.device("cpu"))


def arange_bounds(args, kwargs):
    """(start, end, step) of a `torch.arange` call whose result is an int64 tensor on the CPU
    that does not require grad (what the rules answer), else None."""
    bound = rules._bind(rules.SIGNATURES["arange"], args, kwargs)
    if bound is None:
        return None
    start, end, step, dtype, device, requires_grad = bound
    if end is None:
        start, end = 0, start
    if requires_grad or dtype not in (None, torch.int64) or torch.get_default_device().type != "cpu":
        return None
    if device is not None and torch.device(device) != torch.device("cpu"):
        return None
    return start, end, step


# Last: `_meta_rules` imports this module's rules for its table, and these use its helpers.
from dynamo_rs import _meta_rules as rules  # noqa: E402
