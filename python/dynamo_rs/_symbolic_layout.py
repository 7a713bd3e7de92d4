"""The strides torch gives an elementwise result over operands with symbolic layouts
(transposed heads, slices, broadcast operands), decided without recording a guard.

Torch decides them in Python (`torch._prims_common`): FakeTensorMode's binary fast path asks
whether every operand is definitely contiguous or channels-last; otherwise the reference
implementation broadcasts the operands and orders their dimensions by stride
(`compute_elementwise_output_logical_to_physical_perm`) and lays the result out in that
order (`prims._prim_elementwise_meta`). Each step is a comparison of sizes or strides through
`guard_or_false` / `guard_or_true`, which on a backed symbol the ShapeEnv cannot decide from
what it knows evaluates the hint *and records a guard*.

Here the same steps are taken in the same order with the same SymInt arithmetic (so the same
sympy expressions), and every comparison is settled only by what the ShapeEnv already knows —
ranges and guards recorded earlier, asked without recording (`static_answer`).
Where torch would have to record a guard, `Undecided` is raised and the rule declines:
FakeTensorMode then answers and records it. An answer given here is therefore one torch
reaches with no guard at all.
"""

from __future__ import annotations

import functools
import operator

import sympy
import torch
from torch import sym_max
from torch.fx.experimental.symbolic_shapes import sym_and, sym_eq, sym_or

_SymBool = torch.SymBool


class Undecided(Exception):
    """A comparison torch would settle with a guard."""


def static_answer(env, question):
    """True or False when what `env` knows (ranges, recorded guards) decides `question` (a
    sympy boolean) without recording anything, else None. Asked uncached: the ShapeEnv's
    cache of static answers is not cleared when a guard is recorded."""
    if question in (sympy.true, sympy.false):
        return bool(question)
    if env is None:
        return None
    answer = type(env)._maybe_evaluate_static.__wrapped__(env, question)
    return None if answer is None else bool(answer)


def _answer(env, expr):
    """What `env` knows of the sympy boolean `expr`: True, False or None. Known answers stay
    known (guards are only ever added); an unknown one is asked again once a guard has been
    recorded since."""
    answers = env.__dict__.setdefault("_dynamo_rs_layout_answers", {})
    known = answers.get(expr)
    if known is not None and (type(known) is bool or known == len(env.guards)):
        return known if type(known) is bool else None
    answer = static_answer(env, expr)
    answers[expr] = len(env.guards) if answer is None else answer
    return answer


def settled(cond) -> bool:
    """`guard_or_false(cond)` or `guard_or_true(cond)` where torch records nothing: a plain
    bool, or a SymBool the ShapeEnv decides from what it knows. Raises `Undecided` else."""
    if type(cond) is bool:
        return cond
    if type(cond) is not _SymBool:
        raise Undecided
    node = cond.node
    expr = node.expr
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    answer = _answer(node.shape_env, expr)
    if answer is None:
        raise Undecided
    return answer


def _product(sizes):
    return functools.reduce(operator.mul, sizes, 1)


def _contiguous_sizes_strides(sizes, strides) -> bool:
    """`check_contiguous_sizes_strides(..., false_if_dde=True)`."""
    expected = 1
    expected_max = 1
    for size, stride in reversed(tuple(zip(sizes, strides))):
        if settled(size == 1):
            continue
        if settled(stride != expected) and settled(stride != expected_max):
            return False
        expected_max = expected_max * sym_max(size, 1)
        expected = expected * size
    return True


def _contiguous(sizes, strides, numel) -> bool:
    """`is_contiguous_or_false` of a tensor with these sizes, strides and element count."""
    if settled(numel < 2):
        return True
    return _contiguous_sizes_strides(sizes, strides)


def _channels_last(sizes, strides) -> bool:
    """`is_channels_last_contiguous_or_false_2d`."""
    if len(sizes) != 4:
        return False
    expected = 1
    for dim in (1, 3, 2, 0):
        if settled(sizes[dim] == 1):
            continue
        if settled(strides[dim] != expected):
            return False
        expected = expected * sizes[dim]
    return True


def strides_like_channels_last(sizes, strides) -> bool:
    """`are_strides_like_channels_last_or_false` (what `suggest_memory_format` asks of a 4-d
    tensor: `cat` lays its result out by it), every comparison settled without a guard."""
    if len(sizes) != 4:
        return False
    if settled(strides[1] == 0):
        return False
    least = 0
    for d in (1, 3, 2, 0):
        if settled(sizes[d] == 0):
            return False
        if settled(strides[d] < least):
            return False
        if d == 0 and settled(least == strides[1]):
            return False
        least = strides[d] * sizes[d]
    return True


def _ge(a, b) -> bool:
    """`ge` of `compute_elementwise_output_logical_to_physical_perm` (a, b >= 0)."""
    if settled(b == 0):
        return True
    if settled(a == 0):
        return False
    return settled(a >= b) or settled(a % b == 0)


def _physical_order(shape, layouts) -> list[int]:
    """`compute_elementwise_output_logical_to_physical_perm` over operands broadcast to
    `shape`, given as (strides, element count) pairs."""
    ndim = len(shape)
    if ndim == 0:
        return []
    if ndim == 1:
        return [0]
    contiguous = True
    channels_last = True
    for strides, numel in layouts:
        contiguous = contiguous and _contiguous(shape, strides, numel)
        channels_last = channels_last and _channels_last(shape, strides)
    if contiguous and not channels_last:
        return list(range(ndim))
    if channels_last and not contiguous:
        return [0, *range(2, ndim), 1]

    def should_swap(a, b):
        for strides, _ in layouts:
            stride_a, stride_b = strides[a], strides[b]
            if settled(stride_a == 0) or settled(stride_b == 0):
                continue
            if settled(stride_a == stride_b):
                if _ge(shape[b], shape[a]):
                    continue
                return 1
            if _ge(stride_b, stride_a):
                return -1
            if _ge(stride_a, stride_b):
                return 1
        return 0

    perm = list(reversed(range(ndim)))
    for i in range(1, ndim):
        dim1 = i
        for dim0 in reversed(range(i)):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return list(reversed(perm))


def _should_expand(sizes, shape) -> bool:
    """`should_expand` of `torch._refs._maybe_broadcast`."""
    if len(sizes) != len(shape):
        return True
    for x, y in zip(sizes, shape):
        if settled(x != y):
            return True
        if settled(sym_and(x == 1, y == 1)):
            pass
        elif settled(sym_or(x == 1, y == 1)):
            return True
        if not settled(x == y):  # its `torch._check(x == y)`
            raise Undecided
    return False


def _broadcast_layout(t, shape):
    """The (strides, element count) of operand `t` as the reference implementation sees it:
    expanded to `shape` where `_maybe_broadcast` expands it (`prims.broadcast_in_dim`:
    strides kept where the size is kept, 0 where it is stretched or new)."""
    sizes, strides = t.shape, t.stride()
    if not _should_expand(sizes, shape):
        return strides, t.numel()
    lead = len(shape) - len(sizes)
    out = []
    for idx in range(len(shape)):
        if idx >= lead:
            size, stride = sizes[idx - lead], strides[idx - lead]
            if settled(size == 1):
                out.append(stride if settled(size == shape[idx]) else 0)
            elif settled(size == shape[idx]):  # its `torch._check`
                out.append(stride)
            else:
                raise Undecided
        elif settled(shape[idx] != 1):
            out.append(0)
        elif not sizes:
            out.append(1)
        else:
            out.append(strides[0] * sizes[0])
    return tuple(out), _product(shape)


def elementwise_strides(shape, tensors, row_major, binary: bool, scalar: bool):
    """The strides FakeTensorMode gives an elementwise result of `shape` over `tensors`
    (operands of one dtype and device, broadcast to `shape`); raises `Undecided` where it
    would record a guard. `binary`: `add`/`sub`/`mul`/`div`, which go through
    FakeTensorMode's fast path first; `scalar`: one operand is a Python number (a wrapped
    0-d tensor there). `row_major(shape)` makes row-major strides (memoised by the caller)."""
    if binary:
        # The fast path: some operand already of the result's shape, and every operand
        # definitely contiguous (a fresh row-major result) or channels-last.
        if any(len(t.shape) == len(shape) and settled(sym_eq(tuple(t.shape), tuple(shape)))
               for t in tensors):
            contiguous = channels_last = True
            for t in tensors:
                contiguous = contiguous and _contiguous(t.shape, t.stride(), t.numel())
                channels_last = channels_last and _channels_last(t.shape, t.stride())
            if contiguous:
                return row_major(shape)
            if channels_last and not scalar:
                raise Undecided  # `torch.empty(memory_format=channels_last)`: not modelled
    # The reference implementation: operands broadcast, dimensions ordered by stride, a
    # result laid out in that order (`prims._prim_elementwise_meta`, `empty_permuted`).
    order = _physical_order(shape, [_broadcast_layout(t, shape) for t in tensors])
    return _permuted_row_major(shape, order, row_major)


def _permuted_row_major(shape, order, row_major):
    """Row-major strides of `shape` laid out in physical `order`, back in logical order."""
    physical = row_major([shape[d] for d in order])
    strides = [None] * len(shape)
    for position, dim in enumerate(order):
        strides[dim] = physical[position]
    return tuple(strides)
