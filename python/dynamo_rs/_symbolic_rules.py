"""Fake results of common operations on tensors with symbolic sizes (dynamic shapes).

With symbolic sizes FakeTensorMode answers every operation through torch's Python meta
functions and decompositions over sympy expressions: 1–6 ms per operation (an inference
`batch_norm` decomposes into some twenty symbolic operations). For the operations below the
result's sizes and strides follow from the inputs' without a single decision on a symbolic
value, so they are computed here directly, with the same torch helpers (and so the same sympy
expressions) FakeTensorMode would use.

The one rule every rule keeps: **no decision on a symbolic value that a guard would have to
settle.** A comparison of two SymInts through `==`, `<` or `bool()` records a guard in the
ShapeEnv (and could record one FakeTensorMode would not, or miss one it would). Sizes are
compared *structurally* (`_same`: the same sympy expression) or by what the ShapeEnv already
knows without recording anything (`known_not_one`, `_static_answer`: a symbol's range, guards
recorded earlier); where neither tells, the rule declines (returns None) and FakeTensorMode
answers, recording what it must. The exceptions record exactly the guard torch's own meta
function records for the same call: a batch norm's `Ne(size, 1)` for sizes its statistics
broadcast against (`_settle`), and the convolution backend's choice (asked of torch itself).

Layouts: row-major inputs give row-major results; elementwise operations on transposed,
sliced or broadcast operands take torch's own layout steps with every comparison settled by
what the ShapeEnv knows (`_symbolic_layout`; where torch would record a guard they are
FakeTensorMode's); views keep a layout, or re-cut a row-major block; transposes, slices and
splits move strides and offsets as they are. With `config.verify_meta_rules`
(on in the test suite) every answer is checked against FakeTensorMode's: the same sympy
expressions for sizes and strides, and no guard recorded by FakeTensorMode that the rule did
not record or that does not follow from what it recorded (see `_rule_check.check`).
"""

from __future__ import annotations

import operator

import sympy
import torch
import torch.nn.functional as F
from torch._prims_common import make_channels_last_strides_for, make_contiguous_strides_for, suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._sympy.functions import FloorDiv

from dynamo_rs import _meta_rules as static
from dynamo_rs import _symbolic_layout
from dynamo_rs._symbolic_layout import static_answer as _static_answer
from dynamo_rs._meta_rules import (
    SIGNATURES, _bind, _FLOATS, _has_mkldnn, _new, _NUMBERS, _pair, _plain_context, _tensor_layout, _view)

_SymInt = torch.SymInt


def _expr(value):
    """An int as itself, a SymInt as its sympy expression."""
    return value.node.expr if type(value) is _SymInt else value


def _same(a, b) -> bool:
    """Whether two sizes are the same by structure (the same int, or the same sympy
    expression) — never by evaluating a symbolic comparison, which would record a guard."""
    return bool(_expr(a) == _expr(b))


def _same_sizes(a, b) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def _hint(size):
    """The value behind a size: an int itself, a backed SymInt's hint, else None."""
    if type(size) is int:
        return size
    if free_unbacked_symbols(size):
        return None
    return size.node.hint


def _unify(a, b) -> bool:
    """Whether sizes `a` and `b` are the same — by structure, or made so the way torch's
    meta functions make them: two sizes an operation needs equal (the sizes broadcast
    against each other, the joined tensors' other sizes, a normalised shape, a product's
    inner size) that the ShapeEnv cannot tell apart are compared, and their equality
    recorded as a guard (`Eq(s5, s36)`, after which the ShapeEnv replaces one symbol by the
    other; `Eq(s7, 384)` specialises). The inputs of a frame compiled again with automatic
    dynamic shapes get a symbol per size (as under TorchDynamo), so the first operation
    relating two of them records that guard; through FakeTensorMode it costs 10–50 ms.

    Only a backed symbol against a size of the same value (not 0 or 1), one of the two
    static or known not to be 1 (a size of 1 broadcasts: torch asks that first; an int
    handed to the frame may be anything, and once equal to such a size it is not 1 either).
    Where the equality becomes a replacement the sizes are then the same by structure and
    the rule's answer is torch's, under the same guard; where it does not (`Eq(s50 + s56,
    384)`) the guard stays recorded — every caller asks only for an equality torch's meta
    function must establish too — and the rule declines."""
    if _same(a, b):
        return True
    if type(a) is not _SymInt and type(b) is not _SymInt:
        return False
    hint = _hint(a)
    if hint is None or hint != _hint(b) or hint in (0, 1):
        return False
    if not all(type(s) is int or _tame(s) for s in (a, b)) or \
            not any(type(s) is int or _known_not_one(s) for s in (a, b)):
        return False
    if not bool(a == b):  # records Eq(a, b); true by the hints
        return False
    return _same(a, b)


def _unify_sizes(a, b) -> bool:
    """`_unify` over two lists of sizes of one length, pairwise."""
    return len(a) == len(b) and all(_unify(x, y) for x, y in zip(a, b))


def _simple(size) -> bool:
    """A static size, or a product of symbols and numbers (no floor division, remainder,
    sum): sizes torch reshapes without guards."""
    if type(size) is int:
        return True
    for factor in sympy.Mul.make_args(_expr(size)):
        base, exponent = factor.as_base_exp()
        if not (base.is_Symbol or base.is_Integer) or not exponent.is_Integer:
            return False
    return True


def _tame(size) -> bool:
    """A size whose expression torch's meta functions reason about without guards of their
    own: static, or sums and products (integer powers) of symbols and numbers with at most
    one level of floor division by a number (a convolution's or pooling's output,
    `(s - 1)//2 + 1`). Anything else — window partitions and paddings (`Mod`, divisions of
    divisions), `Max` of a "same" padding, square roots of sizes — is left to FakeTensorMode,
    which records what its reshapes of them need."""
    if type(size) is int:
        return True

    def tame(expr, inside_division: bool) -> bool:
        if expr.is_Symbol or expr.is_Integer:
            return True
        if isinstance(expr, (sympy.Add, sympy.Mul)):
            return all(tame(arg, inside_division) for arg in expr.args)
        if isinstance(expr, sympy.Pow):
            return expr.exp.is_Integer and expr.exp > 0 and tame(expr.base, inside_division)
        if isinstance(expr, FloorDiv):
            numerator, divisor = expr.args
            return not inside_division and divisor.is_Integer and tame(numerator, True)
        return False

    return tame(_expr(size), False)


def _square_free(size) -> bool:
    """A static size, or a product of distinct symbols and a number: what torch's floor
    division simplifies exactly when a view splits it (`(b*t)//b` is `t`; `(h**2)//h` stays)."""
    if type(size) is int:
        return True
    bases = []
    for factor in sympy.Mul.make_args(_expr(size)):
        if factor.is_Integer:
            continue
        if not factor.is_Symbol or factor in bases:
            return False
        bases.append(factor)
    return True


def _is_one(size) -> bool:
    return type(size) is int and size == 1


def _known_not_one(size) -> bool:
    """Whether a backed symbolic size is known not to be 1 without recording anything: from
    its symbol's range (an input size is at least 2: 0 and 1 are specialised) or from guards
    recorded earlier."""
    return known_not_one(size.node.shape_env, size.node.expr)


def known_not_one(env, expr) -> bool:
    """`_known_not_one` of a sympy expression in `env`."""
    # Known stays known (guards are only added); an unknown answer is asked again once a
    # guard has been recorded since.
    answers = env.__dict__.setdefault("_dynamo_rs_not_one", {})
    answer = answers.get(expr)
    if answer is not None and (answer is True or answer == len(env.guards)):
        return answer is True
    # Asked in two forms: which one the ShapeEnv's pattern matching against what recorded
    # guards imply recognises depends on how sympy normalised the expression.
    for question in (sympy.Ne(expr, 1), sympy.Ne(expr - 1, 0)):
        if _known(env, question):
            answers[expr] = True
            return True
    answers[expr] = len(env.guards)
    return False


def _size_ok(size, maybe_one: bool) -> bool:
    """A static positive size, or a symbolic one with a value behind it (unbacked symbols
    from `.item()` / `nonzero()` are left to FakeTensorMode).

    Torch's meta functions treat a size of 1 apart (broadcasting, the ambiguous strides of
    size-1 dimensions), so on a symbolic size that might be 1 most of them record a guard
    that it is not. Unless the rule says its answer holds for 1 as well (`maybe_one`), a
    symbolic size must be known not to be 1 already — the first operation on a new derived
    size, such as a strided convolution's output, then goes through FakeTensorMode, or
    through a rule that records that guard itself (`_settle`)."""
    if type(size) is int:
        return size > 0
    if type(size) is not _SymInt or free_unbacked_symbols(size) or not _tame(size):
        return False
    return maybe_one or _known_not_one(size)


def _plain(mode: FakeTensorMode, t, maybe_one: bool = False) -> bool:
    """A fake tensor of `mode` the rules can describe: `_meta_rules._plain`, with sizes that
    may be symbolic (see `_size_ok`)."""
    return (
        type(t) is FakeTensor
        and t.fake_mode is mode
        and t.constant is None
        and not _has_mkldnn(t.dispatch_keys)
        and _tensor_layout(t) is torch.strided
        and not t.is_conj()
        and not t.is_neg()
        and all(_size_ok(s, maybe_one) for s in t.shape)
    )


def _ready(mode: FakeTensorMode, *tensors, maybe_one: bool = False) -> bool:
    if not all(_plain(mode, t, maybe_one) for t in tensors):
        return False
    device = tensors[0]._fake_device
    return all(t._fake_device == device for t in tensors) and _plain_context(tensors)


def _settle(t: FakeTensor) -> bool:
    """Records that each symbolic size of `t` is not 1 (the guard torch's meta functions
    record when they broadcast it), or returns False when one is 1 now (the rule then
    declines, before recording anything)."""
    unknown = [s for s in t.shape if type(s) is _SymInt and not _known_not_one(s)]
    if any(s.node.hint is None or s.node.hint in (0, 1) for s in unknown):
        return False
    for s in unknown:
        # Records `Ne(s, 1)` and, unless known, `Ne(s, 0)` (torch checks the element count
        # is not 0); both true by the hint.
        if not bool(s != 1):
            return False
        if not _known(s.node.shape_env, sympy.Ne(s.node.expr, 0)) and not bool(s != 0):
            return False
    return True


def _known(env, question) -> bool:
    """Whether `question` holds by what `env` knows, recording nothing."""
    return _static_answer(env, question) is True


def implied_by_sizes(env, guard) -> bool:
    """Whether `guard` (a sympy boolean) follows from sizes being non-negative integers and
    from what `env` knows of each: `Ne(P, 1)` for a product P of sizes each known not to be
    1 (torch records it for the ambiguous strides of a block of dimensions after a rule
    recorded `Ne(size, 1)` for each), and `P >= 2` for a product of sizes each known to be
    at least 1, one of them known not to be 1 (an element count). See `_rule_check.check`."""
    if isinstance(guard, sympy.Ne) and guard.rhs == 0:
        # An element count is not 0 when no factor is (after taking common factors out:
        # `(h - 1)*(32*h - 32)` is `32*(h - 1)**2`).
        for factor in sympy.Mul.make_args(sympy.factor_terms(guard.lhs)):
            base, exponent = factor.as_base_exp()
            if not (exponent.is_Integer and exponent > 0) or not _known(env, sympy.Ne(base, 0)):
                return False
        return True
    if isinstance(guard, sympy.Ne) and guard.rhs == 1:
        product, need = guard.lhs, "not one"
    elif isinstance(guard, (sympy.Ge, sympy.Gt)) and guard.rhs == (2 if isinstance(guard, sympy.Ge) else 1):
        product, need = guard.lhs, "at least two"
    elif isinstance(guard, (sympy.Le, sympy.Lt)) and guard.lhs == (2 if isinstance(guard, sympy.Le) else 1):
        product, need = guard.rhs, "at least two"
    else:
        return False
    bases = []
    for factor in sympy.Mul.make_args(product):
        base, exponent = factor.as_base_exp()
        if not (exponent.is_Integer and exponent > 0):
            return False
        bases.append(base)
    if need == "not one":
        return all(known_not_one(env, b) for b in bases)
    return all(_known(env, sympy.Ge(b, 1)) for b in bases) and any(known_not_one(env, b) for b in bases)


def _row_major(sizes) -> tuple:
    """`make_contiguous_strides_for(sizes)`, remembered per ShapeEnv by the sizes' expressions
    (the SymInt arithmetic costs some 100 µs a shape; a model meets each shape many times)
    and by how much the ShapeEnv knows: its `Max(1, s)` terms simplify once a replacement or
    a guard bounds `s` (an int argument unified with a tensor's size)."""
    env = next((s.node.shape_env for s in sizes if type(s) is _SymInt), None)
    if env is None:
        return make_contiguous_strides_for(sizes)
    memo = env.__dict__.setdefault("_dynamo_rs_row_major", {})
    key = (tuple(map(_expr, sizes)), len(env.replacements), len(env.guards))
    strides = memo.get(key)
    if strides is None:
        strides = memo[key] = tuple(make_contiguous_strides_for(sizes))
    return strides


def _canonical(t: FakeTensor) -> bool:
    """Row-major with the strides a fresh tensor of its sizes gets (structurally), at
    offset 0."""
    return _same(t.storage_offset(), 0) and _same_sizes(t.stride(), _row_major(t.shape))


def _known_not_contiguous(t: FakeTensor) -> bool:
    """Whether torch's contiguity test (`check_contiguous_sizes_strides`: from the last
    dimension, sizes 1 skipped, each stride the product of the sizes after it) answers
    False for `t` by what the ShapeEnv knows already — every step it takes decided without a
    guard. False when it is contiguous or when some step would need a guard."""
    expected = 1
    for size, stride in reversed(tuple(zip(t.shape, t.stride()))):
        if _is_one(size):
            continue
        if type(size) is _SymInt and not _known_not_one(size):
            return False
        if _same(stride, expected):
            expected = expected * size
            continue
        if type(stride) is int and type(expected) is int:
            return True  # two different numbers
        env = next(v.node.shape_env for v in (stride, expected) if type(v) is _SymInt)
        return _known(env, sympy.Ne(_expr(stride), _expr(expected)))
    return False


def _fresh(mode, like, sizes, dtype=None) -> FakeTensor:
    return _new(mode, like, sizes, _row_major(sizes), dtype)


def _static_ints(values) -> bool:
    return all(type(v) is int for v in values)


# --- elementwise -------------------------------------------------------------------------


def _elementwise_strides(shape, operands, prims: bool = False, binary: bool = False,
                         scalar: bool = False):
    """The strides of an elementwise result of `shape` over tensor `operands` (broadcast to
    it): row-major when every operand is row-major. Over transposed, sliced or broadcast
    operands, for operations torch computes through PrimTorch's elementwise meta (`prims`:
    the `_unary` ones and `add`/`sub`/`mul`/`div`), the strides its layout code gives when
    it decides them without a guard (`_symbolic_layout`); else None. Only for sizes that
    are products of symbols: torch lays results out with `Max(1, size)` in some paths and
    `size` in others (by what the ShapeEnv knows), and the two forms are one expression only
    when sympy itself knows the size is positive. `binary`/`scalar`: see `_symbolic_layout`."""
    if all(_canonical(t) for t in operands):
        return _row_major(shape)
    if not prims or not all(_simple(s) for s in shape):
        return None
    try:
        return _symbolic_layout.elementwise_strides(shape, operands, _row_major, binary, scalar)
    except _symbolic_layout.Undecided:
        return None


def _float_unary(mode, x, inplace=False, prims=False):
    if not isinstance(x, FakeTensor) or not _ready(mode, x) or x.dtype not in _FLOATS:
        return None
    if inplace:
        return x if _canonical(x) else None
    strides = _elementwise_strides(x.shape, [x], prims=prims)
    return None if strides is None else _new(mode, x, x.shape, strides)


def _unary(mode, args, kwargs):
    if kwargs or len(args) != 1:
        return None
    return _float_unary(mode, args[0], prims=True)


def _with_inplace(mode, args, kwargs):
    bound = _bind(SIGNATURES["with_inplace"], args, kwargs)
    if bound is None or type(bound[1]) is not bool:
        return None
    return _float_unary(mode, *bound)


def _gelu(mode, args, kwargs):
    bound = _bind(SIGNATURES["gelu"], args, kwargs)
    if bound is None or bound[1] not in ("none", "tanh"):
        return None
    return _float_unary(mode, bound[0])


def _dropout(mode, args, kwargs):
    bound = _bind(SIGNATURES["dropout"], args, kwargs)
    if bound is None:
        return None
    x, p, training, inplace = bound
    if training is not False or type(inplace) is not bool or not isinstance(p, _NUMBERS) or not 0 <= p <= 1:
        return None
    return x if isinstance(x, FakeTensor) and _ready(mode, x) else None


def _broadcast(shapes):
    """The broadcast of `shapes` decided by structure alone: per dimension (aligned from the
    right) the sizes that are not a static 1 must all be the same expression; None when they
    are not (torch would have to compare them, and record a guard)."""
    rank = max(len(s) for s in shapes)
    columns = []
    for i in range(rank):
        sizes = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        wide = [s for s in sizes if not _is_one(s)]
        if any(not _same(s, wide[0]) and _hint(s) != _hint(wide[0]) for s in wide[1:]):
            return None  # sizes that cannot broadcast (or unknown values): nothing recorded
        columns.append(wide)
    out = []
    for wide in columns:
        if not wide:
            out.append(1)
        elif all(_same(s, wide[0]) for s in wide[1:]):
            out.append(wide[0])
        elif all(_unify(s, wide[0]) for s in wide[1:]):
            out.append(wide[0] if type(wide[0]) is int else next((s for s in wide if type(s) is int), wide[0]))
        else:
            return None
    return out


def _binary(true_division: bool = False, inplace: bool = False):
    """Elementwise arithmetic on tensors of one float dtype and Python numbers: operands
    row-major, shapes broadcast by structure; the result is row-major (`a op= b`: `a`)."""
    def rule(mode, args, kwargs):
        tensors = static._binary_operands(mode, args, kwargs, _ready)
        if tensors is None:
            return None
        dtype = tensors[0].dtype
        for o in args:
            if isinstance(o, FakeTensor):
                if o.dtype != dtype or dtype not in _FLOATS or o.dim() == 0:
                    return None
            elif type(o) not in _NUMBERS or (type(o) is int and not -2**63 <= o < 2**63):
                return None
        shape = _broadcast([t.shape for t in tensors])
        if shape is None:
            return None
        a, b = args
        if inplace and isinstance(a, FakeTensor):
            if not _same_sizes(a.shape, shape) or not all(_canonical(t) for t in tensors):
                return None
            if isinstance(b, FakeTensor) and b.untyped_storage()._cdata == a.untyped_storage()._cdata:
                return None
            return a
        if not isinstance(a, FakeTensor):
            # `2 - x`, `2 / x`: torch's reversed operations (`rsub`, `reciprocal`).
            if not all(_canonical(t) for t in tensors):
                return None
        strides = _elementwise_strides(shape, tensors, prims=True, binary=True, scalar=len(tensors) == 1)
        return None if strides is None else _new(mode, tensors[0], tuple(shape), strides, dtype)
    return rule


def _compare_or_logical(logical: bool, tensor_first: bool = False):
    """`a < b` (and the other comparisons; a bool result) or `a & b` (and `|`, `^`) of bool
    tensors, over row-major operands of one dtype and numbers that do not change it,
    broadcast by structure (or by the equalities torch records, `_unify`): a row-major bool
    result. The masks of attention over a symbolic sequence length (`kv_idx <= q_idx`,
    `causal & padding`). `tensor_first`: torch's functions and methods, whose first argument
    must be a tensor."""
    def rule(mode, args, kwargs):
        tensors = static.compare_operands(mode, args, kwargs, _ready, logical, tensor_first)
        if tensors is None or not all(_canonical(t) for t in tensors):
            return None
        shape = _broadcast([t.shape for t in tensors])
        if shape is None:
            return None
        return _new(mode, tensors[0], tuple(shape), _row_major(shape), torch.bool)
    return rule


# --- layers ------------------------------------------------------------------------------


def _batch_norm(mode, args, kwargs):
    """Inference batch norm (running statistics given): the input's sizes, row-major."""
    bound = _bind(SIGNATURES["batch_norm"], args, kwargs)
    if bound is None:
        return None
    x, mean, var, w, b, training = bound
    if training is not False or mean is None or var is None:
        return None
    tensors = [t for t in (x, mean, var, w, b) if t is not None]
    if not _ready(mode, *tensors, maybe_one=True) or not static._same_float(*tensors) or x.dim() < 2:
        return None
    channels = x.shape[1]
    if type(channels) is not int or any(tuple(t.shape) != (channels,) for t in tensors[1:]):
        return None
    # The statistics broadcast against the input: torch records that its symbolic sizes
    # are not 1, and so does the rule (the first batch norm after a strided convolution).
    if not _canonical(x) or not _settle(x):
        return None
    return _new(mode, x, x.shape, x.stride())


def _layer_norm(mode, args, kwargs):
    bound = _bind(SIGNATURES["layer_norm"], args, kwargs)
    if bound is None:
        return None
    x, shape, w, b = bound
    shape = (shape,) if type(shape) is int else shape
    if not isinstance(shape, (tuple, list, torch.Size)) or not shape or not _static_ints(shape):
        return None
    tensors = [t for t in (x, w, b) if t is not None]
    if not _ready(mode, *tensors) or not static._same_float(*tensors):
        return None
    shape = tuple(shape)
    if x.dim() < len(shape) or not _unify_sizes(x.shape[x.dim() - len(shape):], shape):
        return None
    if any(tuple(t.shape) != shape for t in tensors[1:]):
        return None
    if _canonical(x):
        return _new(mode, x, x.shape, x.stride())
    # torch normalises a row-major copy of a non-contiguous input (ConvNeXt's and
    # Sequencer's channels-last images permuted from NCHW).
    if _known_not_contiguous(x):
        return _fresh(mode, x, x.shape)
    return None


def _softmax(mode, args, kwargs):
    bound = _bind(SIGNATURES["softmax"], args, kwargs)
    if bound is None:
        return None
    x, dim, dtype = bound
    if dtype is not None or type(dim) is not int or not isinstance(x, FakeTensor):
        return None
    if not _ready(mode, x) or x.dtype not in _FLOATS or x.dim() == 0 or not -x.dim() <= dim < x.dim():
        return None
    return _new(mode, x, x.shape, x.stride()) if _canonical(x) else None


def _conv_size(size, kernel, stride, padding, dilation):
    """The number of window positions along one dimension, by the formula torch's meta
    functions use (so the same sympy expression for a symbolic size)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _conv2d(mode, args, kwargs):
    """2-d convolution of a row-major image (symbolic batch and spatial sizes, static channels)
    with a static row-major weight, on the row-major path."""
    bound = _bind(SIGNATURES["conv2d"], args, kwargs)
    if bound is None:
        return None
    x, w, b, stride, padding, dilation, groups = bound
    tensors = (x, w) if b is None else (x, w, b)
    # The output sizes' formula and the row-major layout hold for sizes of 1 as well.
    if not _ready(mode, *tensors, maybe_one=True) or not static._same_float(*tensors) \
            or type(groups) is not int or groups < 1:
        return None
    if padding == "valid":
        padding = 0
    stride, padding, dilation = _pair(stride, 2), _pair(padding, 2), _pair(dilation, 2)
    if stride is None or padding is None or dilation is None or x.dim() != 4 or w.dim() != 4:
        return None
    if not _static_ints(w.shape) or not _static_ints(w.stride()) or not static._canonical(w):
        return None
    if w.shape[0] % groups or not _unify(x.shape[1], w.shape[1] * groups):
        return None
    if b is not None and tuple(b.shape) != (w.shape[0],):
        return None
    if not _canonical(x) or not all(s > 0 for s in stride) or not all(p >= 0 for p in padding):
        return None
    # Which kernel runs, and so the output's memory format, torch decides from the tensors
    # (asked as FakeTensorMode asks it, so it records the same guards: NNPACK, for one,
    # takes batches of 16 or more).
    backend = torch._C._select_conv_backend(
        x, w, bias=b, stride=list(stride), padding=list(padding), dilation=list(dilation),
        transposed=False, output_padding=[0, 0], groups=groups)
    if torch._C._conv_determine_backend_memory_format(x, w, backend) != torch.contiguous_format:
        return None
    spatial = [_conv_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i]) for i in range(2)]
    if any(type(s) is int and s < 1 for s in spatial):
        return None
    return _fresh(mode, x, (x.shape[0], w.shape[0], *spatial))


def _max_pool2d(mode, args, kwargs):
    bound = _bind(SIGNATURES["max_pool2d"], args, kwargs)
    if bound is None:
        return None
    x, kernel, stride, padding, dilation, ceil_mode, return_indices = bound
    if ceil_mode is not False or return_indices is not False:
        return None
    if not isinstance(x, FakeTensor) or not _ready(mode, x) or x.dim() != 4 or x.dtype not in _FLOATS:
        return None
    if type(x.shape[1]) is not int or not _canonical(x):
        return None
    kernel = _pair(kernel, 2)
    stride = kernel if stride is None or stride == [] or stride == () else _pair(stride, 2)
    padding, dilation = _pair(padding, 2), _pair(dilation, 2)
    if kernel is None or stride is None or padding is None or dilation is None:
        return None
    if any(2 * p > k for p, k in zip(padding, kernel)) or not all(s > 0 for s in stride):
        return None
    spatial = [_conv_size(x.shape[2 + i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(2)]
    if any(type(s) is int and s < 1 for s in spatial):
        return None
    # torch checks each output size is at least 1 (recording the guard where that is not
    # known): so does the rule, declining where it does not hold now.
    unknown = [s for s in spatial if type(s) is _SymInt and not _known(s.node.shape_env, sympy.Ge(s.node.expr, 1))]
    if any(s.node.hint is None or s.node.hint < 1 for s in unknown):
        return None
    for s in unknown:
        if not bool(s >= 1):
            return None
    return _fresh(mode, x, (*x.shape[:2], *spatial))


def _adaptive_avg_pool2d(mode, args, kwargs):
    bound = _bind(SIGNATURES["adaptive_pool"], args, kwargs)
    if bound is None:
        return None
    x, size = bound
    if not isinstance(x, FakeTensor) or not _ready(mode, x) or x.dim() != 4 or x.dtype not in _FLOATS:
        return None
    if type(x.shape[1]) is not int or not _canonical(x):
        return None
    size = (size, size) if type(size) is int else size
    if not isinstance(size, (tuple, list)) or len(size) != 2 or not all(type(s) is int and s > 0 for s in size):
        return None
    return _fresh(mode, x, (*x.shape[:2], *size))


def _linear(mode, args, kwargs):
    bound = _bind(SIGNATURES["linear"], args, kwargs)
    if bound is None:
        return None
    x, w, b = bound
    tensors = (x, w) if b is None else (x, w, b)
    if not _ready(mode, *tensors) or not static._same_float(*tensors):
        return None
    if x.dim() < 1 or w.dim() != 2 or not _static_ints(w.shape) or not _unify(x.shape[-1], w.shape[1]):
        return None
    # torch folds the leading dimensions into one and unfolds them again (a view of a
    # row-major input, of any rank); on sizes that are floor divisions and remainders
    # (windows, padded images) that takes guards of its own.
    if not all(_simple(size) for size in x.shape):
        return None
    if b is not None and tuple(b.shape) != (w.shape[0],):
        return None
    if not _canonical(x):
        return None
    return _fresh(mode, x, (*x.shape[:-1], w.shape[0]))


def _addmm(mode, args, kwargs):
    """`addmm(bias, m1, m2)` with a row-major `m1` of symbolic rows and a static `m2`."""
    bound = _bind(SIGNATURES["addmm"], args, kwargs)
    if bound is None:
        return None
    b, m1, m2, beta, alpha = bound
    if not isinstance(beta, _NUMBERS) or not isinstance(alpha, _NUMBERS):
        return None
    if not _ready(mode, b, m1, m2) or not static._same_float(b, m1, m2):
        return None
    if m1.dim() != 2 or m2.dim() != 2 or not _same(m1.shape[1], m2.shape[0]) or not _canonical(m1):
        return None
    out = (m1.shape[0], m2.shape[1])
    if b.dim() > 2 or not _static_ints(b.shape) or _broadcast([b.shape, out]) is None:
        return None
    if len(b.shape) == 2 and not _is_one(b.shape[0]) or b.shape[-1] not in (1, out[1]):
        return None
    return _fresh(mode, m1, out)


# --- views -------------------------------------------------------------------------------


def _numel(sizes):
    total = 1
    for s in sizes:
        total = total * s
    return total


def _compact(sizes, strides) -> bool:
    """Whether dimensions `sizes` with `strides` are one row-major block (each stride the
    next one times the next size, by structure), whatever its innermost stride."""
    return all(_same(strides[i], strides[i + 1] * sizes[i + 1]) for i in range(len(sizes) - 1))


def _carried(sizes, old) -> bool:
    """Whether every symbolic size of a view is one of the input's sizes, or the product of a
    run of them (dimensions kept or merged, by structure). Splitting a symbolic size into
    symbolic parts (tokens back into an image, `(h*w) -> (h, w)`) torch answers by division
    with sizes like `(h**2)//h` and guards that they agree; and over sizes that are not
    products of symbols, row-major strides take forms (`Max(1, h)`) torch's view does not:
    both left to it, except a row-major input whose sizes and the view's are products of
    distinct symbols (`(b*t, c) -> (b, t, c)`), which torch's division splits exactly."""
    runs = {_expr(s) for s in old}
    exprs = [_expr(s) for s in old]
    for start in range(len(exprs)):
        product = exprs[start]
        for end in range(start + 1, len(exprs)):
            product = product * exprs[end]
            runs.add(product)
    return all(type(s) is int or _expr(s) in runs for s in sizes)


def _size_one_inserted(x, sizes):
    """The strides of `x` (any layout) viewed as `sizes` when `sizes` are its sizes with
    size-1 dimensions inserted, as torch's reshape algorithm gives them: a 1 before a
    dimension of size `n` and stride `s` is split off it (`split_dim`) with stride `s * n`, a
    1 after the last dimension gets the last stride. None for anything else, and where
    torch would compare a symbolic size with 1 that the ShapeEnv cannot settle."""
    in_sizes, in_strides = list(x.shape), list(x.stride())
    strides: list = []
    index = 0
    for length in sizes:
        if index >= len(in_sizes):
            if not _is_one(length) or not in_sizes:
                return None
            strides.append(in_strides[-1])
            continue
        if _same(length, in_sizes[index]):
            strides.append(in_strides[index])
            index += 1
            continue
        size = in_sizes[index]
        if not _is_one(length) or _is_one(size):
            return None
        if type(size) is _SymInt and not _known_not_one(size):
            return None
        strides.append(in_strides[index] * size)
    if index != len(in_sizes):
        return None
    return tuple(strides)


def _unify_view_sizes(in_sizes, sizes) -> tuple:
    """Before a view of `in_sizes` as `sizes` (one may be -1): when, leaving out static 1s,
    both have as many sizes and each given size has the value of the input size at its
    place, those pairs are unified (`_unify`) — torch's view algorithm walks the two in
    step and compares each pair (a resume function handed `B, H, W` as ints viewing a tensor
    whose sizes are symbols of their own: `v.reshape(B, W, H, -1)`). Anything else is left
    as it is (the rule then decides by structure, or declines).

    Returns `sizes` with each given size that is now the same as the input's replaced by the
    input's own SymInt: one made for an int argument keeps the expressions it was made with
    (`Max(1, s98)` for a row-major stride, where the input's `s59` is known to be at least
    2 and torch's strides say `s59`)."""
    sizes = tuple(sizes)
    if sum(1 for t in sizes if type(t) is int and t == -1) > 1:
        return sizes
    kept_in = [t for t in in_sizes if not _is_one(t)]
    kept = [i for i, t in enumerate(sizes) if not _is_one(t)]
    if len(kept_in) != len(kept):
        return sizes
    pairs = [(i, u) for i, u in zip(kept, kept_in) if not (type(sizes[i]) is int and sizes[i] == -1)]
    if not all(_same(sizes[i], u) for i, u in pairs):
        if any(_hint(sizes[i]) is None or _hint(sizes[i]) != _hint(u) for i, u in pairs):
            return sizes
        # Torch's walk pairs sizes this way only while each is a size of its own: a product
        # or sum may be split or merged instead.
        if not all(_same(sizes[i], u) or any(type(v) is _SymInt and isinstance(_expr(v), sympy.Symbol)
                                             for v in (sizes[i], u)) for i, u in pairs):
            return sizes
        for i, u in pairs:
            if not _unify(sizes[i], u):
                return sizes
    unified = list(sizes)
    for i, u in pairs:
        if type(unified[i]) is _SymInt and _same(unified[i], u):
            unified[i] = u
    return tuple(unified)


def _reshaping(copy_allowed: bool):
    """`view` / `reshape` to sizes given as ints and SymInts (at most one -1, inferred only
    where the division is exact by structure): the same sizes (the input's own layout), or
    a common leading part with the rest one row-major block re-cut (the input's strides for
    the leading part, the block's innermost stride times row-major strides for the rest) —
    which covers splitting and merging heads over a slice of a fused projection."""
    def rule(mode, args, kwargs):
        if kwargs or not args or not isinstance(args[0], FakeTensor) or not _ready(mode, args[0]):
            return None
        x, rest = args[0], args[1:]
        if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
            rest = tuple(rest[0])
        if not all(type(s) in (int, _SymInt) for s in rest):
            return None
        rest = _unify_view_sizes(x.shape, rest)
        if any(type(s) is int and s < 1 and s != -1 for s in rest) or \
                any(type(s) is _SymInt and not _size_ok(s, False) for s in rest):
            return None
        free = [i for i, s in enumerate(rest) if type(s) is int and s == -1]
        if len(free) > 1:
            return None
        numel = _numel(x.shape)
        sizes = list(rest)
        if free:
            known = _numel(s for i, s in enumerate(rest) if i != free[0])
            inferred = numel // known
            # Only an exact quotient (the sympy division left no floor): otherwise torch
            # checks divisibility, which may need a guard.
            if type(inferred) is _SymInt and inferred.node.expr.atoms(FloorDiv):
                return None
            if type(inferred) is int and (type(numel) is not int or type(known) is not int or numel % known):
                return None
            if type(inferred) is _SymInt and inferred.node.expr.is_Integer:
                inferred = int(inferred.node.expr)
            if not _size_ok(inferred, False):
                return None
            sizes[free[0]] = inferred
        if _same_sizes(sizes, x.shape):
            return _view(mode, x, x.shape, x.stride())
        if not _same(_numel(sizes), numel):
            return None  # torch would check the element counts agree: a guard
        if not _carried(sizes, x.shape) and not (
                _canonical(x) and all(_square_free(t) for t in (*sizes, *x.shape))):
            return None
        if _canonical(x) and not any(_is_one(t) for t in sizes):
            return _view(mode, x, tuple(sizes), _row_major(sizes), 0)
        inserted = _size_one_inserted(x, sizes)
        if _canonical(x) and _same_sizes([t for t in sizes if not _is_one(t)],
                                         [t for t in x.shape if not _is_one(t)]):
            # A row-major tensor with size-1 dimensions added or dropped (`(h, w, c) ->
            # (1, h, w, c)`, a batch of 1 folded away): torch's algorithm splits them off
            # or squeezes them, and every stride stays row-major — as torch writes them
            # where a 1 is split off (`s * n`, not `Max(1, n) * s`: the same value, but a
            # size unified with an int argument has no sign for sympy to drop the `Max`).
            return _view(mode, x, tuple(sizes), inserted if inserted is not None else _row_major(sizes), 0)
        if inserted is not None:
            return _view(mode, x, tuple(sizes), inserted)
        in_sizes, in_strides = tuple(x.shape), tuple(x.stride())
        if any(_is_one(t) for t in in_sizes) and not any(_is_one(t) for t in sizes):
            # An input dimension of size 1 holds no layout: torch's view merges it into
            # its neighbour whatever its stride (a batch of 1 folded into a permuted row).
            kept = [i for i, t in enumerate(in_sizes) if not _is_one(t)]
            in_sizes = tuple(in_sizes[i] for i in kept)
            in_strides = tuple(in_strides[i] for i in kept)
        prefix = 0
        while prefix < min(len(sizes), len(in_sizes)) and _same(sizes[prefix], in_sizes[prefix]):
            prefix += 1
        old_sizes, old_strides = in_sizes[prefix:], in_strides[prefix:]
        tail = sizes[prefix:]
        if not old_sizes and not tail:
            return _view(mode, x, tuple(sizes), in_strides)
        if not old_sizes or not tail or any(_is_one(t) for t in tail) or any(_is_one(t) for t in old_sizes):
            return None  # size-1 dimensions get strides by rules of their own
        if not _compact(old_sizes, old_strides) or not _same(_numel(tail), _numel(old_sizes)):
            return None
        inner = old_strides[-1]
        tail_strides = tuple(inner * t for t in _row_major(tail)) if not _same(inner, 1) else _row_major(tail)
        return _view(mode, x, tuple(sizes), (*in_strides[:prefix], *tail_strides))
    return rule


def _contiguous_method(mode, args, kwargs):
    """`x.contiguous()`: `x` itself when row-major, else a row-major copy. Other layouts
    that torch also counts as contiguous (size-1 dimensions with other strides) are left
    to it."""
    if kwargs or len(args) != 1 or not isinstance(args[0], FakeTensor) or not _ready(mode, args[0]):
        return None
    x = args[0]
    if _canonical(x):
        return x
    if any(_is_one(s) for s in x.shape):
        return None
    if _compact(x.shape, x.stride()) and _same(x.stride()[-1], 1):
        return None  # row-major at an offset: torch's business
    return _fresh(mode, x, x.shape)


def _split(mode, args, kwargs):
    """`x.split(n, dim)` along a dimension of static size at a static stride: views at
    static offsets."""
    bound = _bind(SIGNATURES["split"], args, kwargs)
    if bound is None:
        return None
    x, split, dim = bound
    if type(dim) is not int or type(split) is not int or split < 1 or not isinstance(x, FakeTensor):
        return None
    if not _ready(mode, x) or not -x.dim() <= dim < x.dim():
        return None
    dim %= x.dim()
    size, stride, offset = x.shape[dim], x.stride()[dim], x.storage_offset()
    if type(size) is not int or type(stride) is not int:
        return None
    parts = []
    for start in range(0, size, split):
        sizes = list(x.shape)
        sizes[dim] = min(split, size - start)
        parts.append(_view(mode, x, tuple(sizes), x.stride(), offset + start * stride))
    return tuple(parts) if parts else None


def _pow(mode, args, kwargs):
    if kwargs or len(args) != 2 or type(args[1]) not in _NUMBERS:
        return None
    return _float_unary(mode, args[0])


def _embedding(mode, args, kwargs):
    bound = _bind(SIGNATURES["embedding"], args, kwargs)
    if bound is None:
        return None
    idx, w, max_norm, sparse = bound
    if max_norm is not None or sparse is not False or not _ready(mode, idx, w):
        return None
    if idx.dtype not in (torch.int64, torch.int32) or w.dim() != 2 or w.dtype not in _FLOATS:
        return None
    if not _static_ints(w.shape) or not _canonical(idx):
        return None
    return _fresh(mode, w, (*idx.shape, w.shape[1]))


def _unsqueeze(mode, args, kwargs):
    """`x.unsqueeze(d)` of a row-major tensor: a row-major view."""
    bound = _bind(SIGNATURES["unsqueeze"], args, kwargs)
    if bound is None:
        return None
    x, dim = bound
    if not isinstance(x, FakeTensor) or type(dim) is not int or not _ready(mode, x) or not _canonical(x):
        return None
    if not -x.dim() - 1 <= dim <= x.dim():
        return None
    dim %= x.dim() + 1
    sizes = (*x.shape[:dim], 1, *x.shape[dim:])
    return _view(mode, x, sizes, _row_major(sizes))


def _flatten(mode, args, kwargs):
    bound = _bind(SIGNATURES["flatten"], args, kwargs)
    if bound is None:
        return None
    x, start, end = bound
    if not isinstance(x, FakeTensor) or type(start) is not int or type(end) is not int or x.dim() == 0:
        return None
    n = x.dim()
    start, end = start + n if start < 0 else start, end + n if end < 0 else end
    if not 0 <= start < end < n:
        return None  # one dimension (the input itself) or out of range: torch's business
    sizes = list(x.shape)
    return _reshaping(True)(mode, (x, (*sizes[:start], _numel(sizes[start:end + 1]), *sizes[end + 1:])), {})


def _transpose(mode, args, kwargs):
    """A transpose of any layout: the sizes and strides swapped (the same SymInts)."""
    bound = _bind(SIGNATURES["transpose"], args, kwargs)
    if bound is None:
        return None
    x, d0, d1 = bound
    if not isinstance(x, FakeTensor) or type(d0) is not int or type(d1) is not int or not _ready(mode, x):
        return None
    n = x.dim()
    if n == 0 or not -n <= d0 < n or not -n <= d1 < n:
        return None
    d0, d1 = d0 % n, d1 % n
    sizes, strides = list(x.shape), list(x.stride())
    sizes[d0], sizes[d1] = sizes[d1], sizes[d0]
    strides[d0], strides[d1] = strides[d1], strides[d0]
    return _view(mode, x, tuple(sizes), tuple(strides))


def _permute(mode, args, kwargs):
    if kwargs or not args or not isinstance(args[0], FakeTensor) or not _ready(mode, args[0]):
        return None
    x, dims = args[0], args[1:]
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    n = x.dim()
    if len(dims) != n or not _static_ints(dims) or not all(-n <= d < n for d in dims):
        return None
    dims = [d % n for d in dims]
    if sorted(dims) != list(range(n)):
        return None
    sizes, strides = x.shape, x.stride()
    return _view(mode, x, tuple(sizes[d] for d in dims), tuple(strides[d] for d in dims))


def _not_channels_last(t: FakeTensor) -> bool:
    """Whether a tensor certainly does not suggest the channels-last format (so that `cat`
    gives a row-major result): not 4-d, row-major, or with a static stride other than 1 on
    its static channel dimension of more than one channel."""
    if t.dim() != 4 or _canonical(t):
        return True
    channels, stride = t.shape[1], t.stride()[1]
    if type(channels) is int and channels > 1 and type(stride) is int and stride != 1:
        return True
    # Symbolic sizes or strides (Sequencer's permuted halves): torch's own test, each step
    # settled by what the ShapeEnv knows, or no answer.
    try:
        return not _symbolic_layout.strides_like_channels_last(t.shape, t.stride())
    except _symbolic_layout.Undecided:
        return False


def _cat(mode, args, kwargs):
    """`torch.cat` of tensors of one float dtype and rank, equal (by structure) but for the
    joined dimension, none suggesting channels-last: a row-major result. One-dimensional
    empty tensors are skipped, as torch does (an empty cache concatenated with new keys)."""
    bound = _bind(SIGNATURES["cat"], args, kwargs)
    if bound is None:
        return None
    tensors, dim = bound
    if not isinstance(tensors, (tuple, list)) or not tensors or type(dim) is not int:
        return None
    if not all(isinstance(t, FakeTensor) for t in tensors) or not static._same_float(*tensors):
        return None
    kept = [t for t in tensors if not (t.dim() == 1 and _same(t.shape[0], 0))]
    if not kept or not _ready(mode, *kept):
        return None
    if any(t.fake_mode is not mode or t._fake_device != kept[0]._fake_device for t in tensors):
        return None
    first = kept[0]
    n = first.dim()
    if n == 0 or not -n <= dim < n or not all(t.dim() == n for t in kept):
        return None
    d = dim % n
    for t in kept:
        if not _not_channels_last(t):
            return None
    for t in kept:
        if not _unify_sizes(t.shape[:d], first.shape[:d]) or not _unify_sizes(t.shape[d + 1:], first.shape[d + 1:]):
            return None
    total = kept[0].shape[d]
    for t in kept[1:]:
        total = total + t.shape[d]
    sizes = list(first.shape)
    sizes[d] = total
    if not _size_ok(total, False):
        return None
    return _fresh(mode, first, tuple(sizes))


def _getitem(mode, args, kwargs):
    """Basic indexing by a tuple of slices, None (a new dimension of size 1) and an
    Ellipsis: a slice is either the whole dimension (`:` or `0:`), or has static bounds and
    step on a dimension of static size and stride. A view at a moved offset; a None takes
    the stride torch's `unsqueeze` gives it there (the next dimension's size times its
    stride, or 1 at the end) — a mask's `ids[None, None, :, None]`."""
    if kwargs or len(args) != 2:
        return None
    x, index = args
    if not isinstance(x, FakeTensor) or not _ready(mode, x):
        return None
    if type(index) is tuple and index and all(isinstance(i, FakeTensor) for i in index):
        return _gather_all_dims(mode, x, index)
    items = list(index) if type(index) is tuple else [index]
    if sum(item is Ellipsis for item in items) > 1 or \
            not all(type(i) is slice or i is Ellipsis or i is None for i in items):
        return None
    slices = sum(type(item) is slice for item in items)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        fill = x.dim() - slices
        if fill < 0:
            return None
        items = items[:at] + [slice(None)] * fill + items[at + 1:]
        slices += fill
    if slices > x.dim():
        return None
    items += [slice(None)] * (x.dim() - slices)
    sizes, strides = list(x.shape), list(x.stride())
    out_sizes, out_strides = [], []
    offset = x.storage_offset()
    d = 0  # the input's dimension the next slice applies to
    for item in items:
        if item is None:
            out_sizes.append(1)
            out_strides.append(sizes[d] * strides[d] if d < len(sizes) else 1)
            continue
        size, stride = sizes[d], strides[d]
        d += 1
        if not (item.step is None and item.stop is None and item.start in (None, 0)):
            if type(size) is not int or type(stride) is not int:
                return None
            if not all(p is None or type(p) is int for p in (item.start, item.stop, item.step)):
                return None
            start, stop, step = item.indices(size)
            if step < 1:
                return None
            size = len(range(start, stop, step))
            if size < 1:
                return None
            offset = offset + start * stride
            stride = stride * step
        out_sizes.append(size)
        out_strides.append(stride)
    return _view(mode, x, tuple(out_sizes), tuple(out_strides), offset)


def _expand(mode, args, kwargs):
    """`x.expand(*sizes)`, laid out as torch's `broadcast_in_dim` does on symbolic sizes: a
    widened size-1 dimension gets stride 0, a kept one its stride (-1, or the same size by
    structure or by the equality torch records); a new leading dimension stride 0, or if it
    is of size 1, the next input dimension's size times its stride (1 past the last). Sizes
    to widen to must be known not to be 1 (torch would guard it)."""
    if kwargs or len(args) < 2 or not isinstance(args[0], FakeTensor) or not _ready(mode, args[0]):
        return None
    x, sizes = args[0], args[1:]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)):
        sizes = tuple(sizes[0])
    if not all(type(t) in (int, _SymInt) for t in sizes) or len(sizes) < x.dim():
        return None
    lead = len(sizes) - x.dim()
    in_sizes, in_strides = x.shape, x.stride()

    def widened(target) -> bool | None:
        """Whether a size-1 dimension becomes `target` wide: None when not known."""
        if type(target) is int:
            return target != 1
        return True if _size_ok(target, False) else None

    out_sizes, out_strides = [], []
    for i, target in enumerate(sizes):
        if type(target) is int and target < 0 and not (target == -1 and i >= lead):
            return None
        if i < lead:
            wide = widened(target)
            if wide is None:
                return None
            out_sizes.append(target)
            out_strides.append(0 if wide else in_strides[0] * in_sizes[0] if x.dim() else 1)
            continue
        size, stride = in_sizes[i - lead], in_strides[i - lead]
        if type(target) is int and target == -1:
            target = size
        if _is_one(size):
            wide = widened(target)
            if wide is None:
                return None
            out_sizes.append(target)
            out_strides.append(0 if wide else stride)
        elif _unify(size, target):
            out_sizes.append(size)
            out_strides.append(stride)
        else:
            return None
    return _view(mode, x, tuple(out_sizes), tuple(out_strides))


def _arange(mode, args, kwargs):
    """`torch.arange(n)` (and `arange(0, n)`) of a symbolic length known to be at least 2,
    on the CPU: a fresh 1-d int64 tensor of `n` elements (positions over a symbolic sequence
    length)."""
    bounds = static.arange_bounds(args, kwargs)
    if bounds is None:
        return None
    start, end, step = bounds
    if start != 0 or type(start) is not int or step != 1 or type(step) is not int:
        return None
    if type(end) is not _SymInt or not _size_ok(end, False) or not isinstance(_expr(end), sympy.Symbol):
        return None
    meta = torch.empty_strided((end,), (1,), dtype=torch.int64, device="meta")
    return static.wrap_meta(mode, meta, torch.device("cpu"))


def _gather_all_dims(mode, x, index):
    """`x[i, j]` with an integer tensor for every dimension (`mask[batch_idx, kv_idx]` over
    broadcast position grids): a fresh row-major tensor of the indices' broadcast shape, of
    `x`'s dtype. The indices' values are not looked at (they are not known while tracing)."""
    if len(index) != x.dim() or not _ready(mode, *index):
        return None
    if any(i.dtype not in (torch.int64, torch.int32) or not _canonical(i) for i in index):
        return None
    if any(i._fake_device != x._fake_device for i in index):
        return None
    shape = _broadcast([i.shape for i in index])
    if shape is None:
        return None
    return _new(mode, x, tuple(shape), _row_major(shape))


def _cast(dtype_of_method):
    """`x.to(dtype)` / `x.float()`...: `x` itself when it has that dtype already, else a
    copy in a float dtype, row-major for a row-major `x`."""
    def rule(mode, args, kwargs):
        if dtype_of_method is None:
            if len(args) == 2 and not kwargs:
                dtype = args[1]
            elif len(args) == 1 and list(kwargs) == ["dtype"]:
                dtype = kwargs["dtype"]
            else:
                return None
        elif len(args) != 1 or kwargs:
            return None
        else:
            dtype = dtype_of_method
        x = args[0]
        if not isinstance(dtype, torch.dtype) or not isinstance(x, FakeTensor) or not _ready(mode, x):
            return None
        if x.dtype is torch.bool:
            return None
        if dtype == x.dtype:
            return x
        if dtype not in _FLOATS or not _canonical(x):
            return None
        return _new(mode, x, x.shape, x.stride(), dtype)
    return rule


def _sdpa(mode, args, kwargs):
    """`scaled_dot_product_attention` on torch's CPU flash path (4-d, no mask, no dropout,
    no grouped heads, equal static head sizes, unit-stride last dimensions, flash enabled and
    ranked before math): laid out like `empty_like(query)`."""
    bound = _bind(SIGNATURES["sdpa"], args, kwargs)
    if bound is None:
        return None
    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa = bound
    if dropout_p != 0.0 or type(is_causal) is not bool or enable_gqa is not False:
        return None
    if not (scale is None or type(scale) is float):
        return None
    if not all(isinstance(t, FakeTensor) for t in (q, k, v)) or not _ready(mode, q, k, v):
        return None
    if not static._same_float(q, k, v) or q.device.type != "cpu" or not q.dim() == k.dim() == v.dim() == 4:
        return None
    if not _same_sizes(q.shape[:2], k.shape[:2]) or not _same_sizes(q.shape[:2], v.shape[:2]):
        return None
    if mask is not None:
        return _sdpa_masked(mode, q, k, v, mask, is_causal)
    e, ek, ev = q.shape[3], k.shape[3], v.shape[3]
    if type(e) is not int or e != ek or e != ev or not _same(k.shape[2], v.shape[2]):
        return None
    if any(t.stride(-1) != 1 or type(t.stride(-1)) is not int for t in (q, k, v)):
        return None
    order = torch._C._get_sdp_priority_order()
    flash, math_path = int(torch._C._SDPBackend.FLASH_ATTENTION), int(torch._C._SDPBackend.MATH)
    if not torch._C._get_flash_sdp_enabled() or flash not in order:
        return None
    if math_path in order and order.index(math_path) < order.index(flash):
        return None
    return _new(mode, q, q.shape, _row_major(q.shape)) if _canonical(q) else None


def _sdpa_masked(mode, q, k, v, mask, is_causal):
    """With a mask (bool, or additive of the query's dtype, broadcasting to (B, H, L, S) by
    structure): a row-major (B, H, L, Ev) result where both of torch's CPU paths agree — a
    row-major query (as `_meta_rules._sdpa`; the masked attention of a decoder over a
    symbolic length)."""
    if is_causal or not isinstance(mask, FakeTensor) or not _ready(mode, mask):
        return None
    if not (mask.dtype is torch.bool or mask.dtype == q.dtype) or not 2 <= mask.dim() <= 4:
        return None
    if type(q.shape[3]) is not int or q.shape[3] != k.shape[3]:
        return None
    target = (*q.shape[:3], k.shape[2])
    pairs = [(m, t) for m, t in zip(reversed(mask.shape), reversed(target)) if not _is_one(m)]
    if any(not _same(m, t) and _hint(m) != _hint(t) for m, t in pairs) or _hint(k.shape[2]) != _hint(v.shape[2]):
        return None
    if not _unify(k.shape[2], v.shape[2]) or not all(_unify(m, t) for m, t in pairs):
        return None
    if mask.dim() != 3 and q.shape[3] == v.shape[3] and not _canonical(q):
        return None
    out = (*q.shape[:3], v.shape[3])
    return _new(mode, q, out, _row_major(out))


def _mean(mode, args, kwargs):
    """`x.mean(dims, keepdim)` of a row-major float tensor over listed dimensions."""
    bound = _bind(SIGNATURES["mean"], args, kwargs)
    if bound is None:
        return None
    x, dim, keepdim, dtype = bound
    if dtype is not None or type(keepdim) is not bool or not isinstance(x, FakeTensor):
        return None
    if not _ready(mode, x) or x.dtype not in _FLOATS or x.dim() == 0 or not _canonical(x):
        return None
    dims = (dim,) if type(dim) is int else dim
    if not isinstance(dims, (tuple, list)) or not dims or not _static_ints(dims):
        return None
    n = x.dim()
    if not all(-n <= d < n for d in dims):
        return None
    wrapped = {d % n for d in dims}
    if len(wrapped) != len(dims):
        return None
    if keepdim:
        sizes = tuple(1 if d in wrapped else s for d, s in enumerate(x.shape))
    else:
        sizes = tuple(s for d, s in enumerate(x.shape) if d not in wrapped)
    return _fresh(mode, x, sizes)


def _interpolate(mode, args, kwargs):
    """`F.interpolate` of a 4-d float image on the CPU, `nearest` or `bilinear`, to sizes
    given as ints and SymInts or by integer scale factors: (N, C, H', W') in the layout
    torch's decompositions give it, `suggest_memory_format` of the input — asked of torch
    for an input of static sizes and strides (nothing symbolic to decide), row-major for a
    row-major input of symbolic sizes. FakeTensorMode answers a bilinear resize through
    some thirty symbolic operations (15–75 ms a call; Mask R-CNN pastes each detected mask
    with one). A symbolic output size not known to be other than 1 gets the guard torch's
    decomposition records for it; channels-last strides of a size-1 dimension are
    ambiguous, and left to torch."""
    bound = _bind(SIGNATURES["interpolate"], args, kwargs)
    if bound is None:
        return None
    x, size, scale, how, align_corners, recompute, antialias = bound
    if not static.interpolation_supported(how, align_corners, antialias) or recompute not in (None, False):
        return None
    if not isinstance(x, FakeTensor) or not _ready(mode, x) or x.dim() != 4 or x.dtype not in _FLOATS:
        return None
    if x._fake_device.type != "cpu":
        return None  # on CUDA torch keeps few channels row-major: another layout rule
    if (size is None) == (scale is None):
        return None
    if size is not None:
        sizes = static.spatial_pair(size, (int, _SymInt))
    else:
        scales = static.spatial_pair(scale, _NUMBERS)
        if scales is None or not all(type(f) in _NUMBERS and f > 0 and int(f) == f for f in scales):
            return None
        # As torch computes an integer scale's size: the input's size times the integer.
        sizes = [n * int(f) for n, f in zip(x.shape[2:], scales)]
    if sizes is None or not all(_positive(s) for s in sizes):
        return None
    out = (x.shape[0], x.shape[1], *sizes)
    if all_static((x,), {}):
        memory_format = suggest_memory_format(x)
    elif _canonical(x):
        memory_format = torch.contiguous_format
    else:
        return None
    if memory_format is torch.contiguous_format:
        strides = _row_major(out)
    elif memory_format is torch.channels_last and all(type(s) is not int or s > 1 for s in sizes):
        # A size-1 dimension makes channels-last strides ambiguous: left to torch (a
        # symbolic size is settled not to be 1 below).
        strides = make_channels_last_strides_for(out)
    else:
        return None
    # Torch's decomposition lays out its intermediate results by whether each output size
    # is 1, recording that it is not (`Max(1, w) >= 2` for `max(w, 1)` of an int argument):
    # recorded here too, so the graph serves the sizes FakeTensorMode's would.
    unsettled = [s for s in sizes if type(s) is _SymInt and not _known_not_one(s)]
    if any(s.node.hint is None or s.node.hint < 2 for s in unsettled):
        return None
    if not all(bool(s != 1) for s in unsettled):
        return None
    return _new(mode, x, out, strides)


def _positive(size) -> bool:
    """A size of at least 1: a static one, or a backed symbolic one the ShapeEnv knows to be
    (`Max(1, h)` of an int argument `h`, which may be any int) — recording nothing."""
    if type(size) is int:
        return size >= 1
    if type(size) is not _SymInt or free_unbacked_symbols(size):
        return False
    return _known(size.node.shape_env, sympy.Ge(size.node.expr, 1))


_CASTS = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


RULES = {
    torch.tanh: _unary, "tanh": _unary, torch.sigmoid: _unary, "sigmoid": _unary,
    torch.rsqrt: _unary, "rsqrt": _unary, torch.sqrt: _unary, "sqrt": _unary,
    torch.exp: _unary, "exp": _unary, torch.cos: _unary, "cos": _unary, torch.sin: _unary, "sin": _unary,
    torch.neg: _unary, operator.neg: _unary, "neg": _unary,
    F.relu: _with_inplace, torch.relu: _unary, "relu": _unary,
    F.silu: _with_inplace, F.hardswish: _with_inplace, F.hardsigmoid: _with_inplace,
    F.gelu: _gelu, F.dropout: _dropout,
    operator.add: _binary(), operator.sub: _binary(), operator.mul: _binary(),
    operator.truediv: _binary(true_division=True),
    torch.add: _binary(), torch.sub: _binary(), torch.mul: _binary(), torch.div: _binary(true_division=True),
    "add": _binary(), "sub": _binary(), "mul": _binary(), "div": _binary(true_division=True),
    operator.iadd: _binary(inplace=True), operator.isub: _binary(inplace=True),
    operator.imul: _binary(inplace=True), operator.itruediv: _binary(true_division=True, inplace=True),
    F.linear: _linear, torch.addmm: _addmm, torch.conv2d: _conv2d, F.conv2d: _conv2d,
    F.batch_norm: _batch_norm, F.layer_norm: _layer_norm,
    F.max_pool2d: _max_pool2d, F.adaptive_avg_pool2d: _adaptive_avg_pool2d,
    F.softmax: _softmax, torch.softmax: _softmax, "softmax": _softmax,
    "view": _reshaping(False), "reshape": _reshaping(True), "flatten": _flatten, torch.flatten: _flatten,
    "transpose": _transpose, torch.transpose: _transpose, "permute": _permute, torch.permute: _permute,
    "contiguous": _contiguous_method, "split": _split, torch.split: _split,
    operator.pow: _pow, torch.pow: _pow, "pow": _pow, F.embedding: _embedding,
    "unsqueeze": _unsqueeze, torch.unsqueeze: _unsqueeze,
    torch.cat: _cat, operator.getitem: _getitem, torch.mean: _mean, "mean": _mean,
    F.scaled_dot_product_attention: _sdpa, F.interpolate: _interpolate,
    "to": _cast(None), **{name: _cast(dtype) for name, dtype in _CASTS.items()},
    "expand": _expand, torch.arange: _arange,
    **{op: _compare_or_logical(False) for op in (
        operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne)},
    **{op: _compare_or_logical(False, tensor_first=True) for op in (
        torch.lt, torch.le, torch.gt, torch.ge, torch.eq, torch.ne, "lt", "le", "gt", "ge", "eq", "ne")},
    **{op: _compare_or_logical(True) for op in (operator.and_, operator.or_, operator.xor)},
}


_SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def all_static(args, kwargs) -> bool:
    """Whether no argument holds a symbolic value: no SymInt/SymFloat/SymBool, and every
    tensor's sizes, strides and offset ints (lists, tuples and dicts looked into)."""
    def static(value) -> bool:
        kind = type(value)
        if kind is FakeTensor:
            return (all(type(s) is int for s in value.shape) and all(type(s) is int for s in value.stride())
                    and type(value.storage_offset()) is int)
        if kind in (tuple, list):
            return all(static(v) for v in value)
        if kind is dict:
            return all(static(v) for v in value.values())
        return not isinstance(value, _SYMBOLIC_TYPES)
    return all(static(a) for a in args) and all(static(v) for v in kwargs.values())


def infer(mode: FakeTensorMode, target, args, kwargs):
    """The fake result of `target(*args, **kwargs)` with symbolic sizes about, or None."""
    try:
        rule = RULES.get(target)
    except TypeError:  # an unhashable callable
        return None
    if rule is None:
        return None
    try:
        return rule(mode, args, kwargs)
    except static.NeedsAutogradView:
        return None
