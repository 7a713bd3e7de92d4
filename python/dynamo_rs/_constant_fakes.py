"""Small tensors whose values the trace knows — FakeTensorMode's "constants" — handled
without its dispatch.

FakeTensorMode keeps the real value of a fake tensor made from Python numbers
(`torch.tensor(3)`, `torch.div(seq_len, window, rounding_mode="trunc")`) as its `constant`,
computes operations whose inputs are all such constants on the real values (an output of at
most one element is a constant again), and reads a constant when it is used as a size
(`x.view(b, n, -1)` with `n` a 0-d integer tensor: `__index__` is its value). Each of those
calls costs 0.3–3 ms through its dispatch the first time; here they cost microseconds:

- `propagate`: arithmetic on constants (and on Python numbers through torch functions)
  computed on the real values, the result wrapped as a constant fake exactly as
  FakeTensorMode's constant propagation makes one;
- `sizes_as_ints`: a constant 0-d integer tensor given as a size to a shape-taking method is
  replaced by its value, which is what torch reads from it, so the shape rules can answer.

With `config.verify_meta_rules` every answer is compared with FakeTensorMode's, constants
included.
"""

from __future__ import annotations

import operator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from dynamo_rs._fakes import wrap_meta

# Operations whose result is a fresh tensor computed from their operands' values.
_ARITHMETIC = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.neg,
    torch.add, torch.sub, torch.mul, torch.div, torch.true_divide, torch.floor_divide,
    torch.remainder, torch.neg,
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "neg",
})
# Methods and functions that read sizes (and strides) from their arguments.
_SIZE_TAKING = frozenset({
    "view", "reshape", torch.reshape, "new_zeros", "new_ones", "new_empty", "expand", "repeat",
    "as_strided",
})
_NUMBERS = (int, float, bool)


def _constant(mode: FakeTensorMode, value):
    """The real value behind `value` if it is a constant fake of `mode`, else None."""
    if type(value) is FakeTensor and value.fake_mode is mode and value.constant is not None:
        return value.constant
    return None


def propagate(mode: FakeTensorMode, target, args, kwargs):
    """The constant fake result of arithmetic whose tensor operands are all constants of
    `mode` (a torch function of Python numbers only is such a call too), or None."""
    try:
        if target not in _ARITHMETIC:
            return None
    except TypeError:  # an unhashable callable
        return None
    from dynamo_rs import _meta_rules  # which imports this module

    tensors = 0
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            constant = _constant(mode, value)
            if constant is None or value.requires_grad:
                return None
            tensors += 1
        elif not isinstance(value, _NUMBERS) and value is not None and not isinstance(value, str):
            return None
    if tensors == 0 and (isinstance(target, str) or target.__module__ == "_operator"):
        return None  # Python arithmetic on numbers is not a tensor operation
    if not _meta_rules._plain_context(()):
        return None  # autocast or a torch-function mode could change what the call does
    real_args = [_constant(mode, a) if isinstance(a, torch.Tensor) else a for a in args]
    real_kwargs = {k: _constant(mode, v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    try:
        if isinstance(target, str):
            result = getattr(real_args[0], target)(*real_args[1:], **real_kwargs)
        else:
            result = target(*real_args, **real_kwargs)
    except Exception:  # noqa: BLE001 - FakeTensorMode runs it and raises torch's own error
        return None
    if type(result) is not torch.Tensor or result.numel() > 1 or result.requires_grad:
        return None
    return constant_fake(mode, result)


def constant_fake(mode: FakeTensorMode, real: torch.Tensor) -> FakeTensor:
    """The fake of the fresh real tensor `real`, holding it as its constant, as
    `FakeTensorConverter.from_real_tensor(mode, real, make_constant=True)` makes it."""
    meta = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="meta")
    fake = wrap_meta(mode, meta, real.device)
    fake.constant = real
    # Registered as FakeTensorMode registers its constants: an in-place change to an alias
    # (a view FakeTensorMode makes of this constant) then forgets this value too.
    mode.fake_tensor_converter.add_constant_storage_mapping(fake)
    return fake


def sizes_as_ints(mode: FakeTensorMode, target, args, kwargs):
    """`(args, kwargs)` with every constant 0-d integer fake given as a size replaced by its
    value, or None when the call has none (or is not one that takes sizes)."""
    try:
        if target not in _SIZE_TAKING:
            return None
    except TypeError:
        return None
    replaced = False

    def as_int(value):
        nonlocal replaced
        if isinstance(value, torch.Tensor):
            constant = _constant(mode, value)
            if (constant is not None and constant.dim() == 0 and not constant.is_floating_point()
                    and not constant.is_complex() and constant.dtype is not torch.bool):
                replaced = True
                return int(constant)
            return value
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            return type(value)(as_int(v) for v in value) if type(value) in (list, tuple) else value
        return value

    # Every one of them takes the tensor first (the receiver, or `torch.reshape`'s input).
    new_args = (*args[:1], *(as_int(a) for a in args[1:]))
    new_kwargs = {k: as_int(v) for k, v in kwargs.items()}
    return (new_args, new_kwargs) if replaced else None
