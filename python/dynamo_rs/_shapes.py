"""Dynamic shapes: which input dimensions are symbolic, their fake tensors, and the shape
guard of a compiled entry, turned into data the native guard evaluates.

Symbolic sizes are torch's own: a `ShapeEnv` behind the trace's `FakeTensorMode` makes the
symbols (`s0`, `s1`, ...), answers comparisons on them and records each answer the trace
relied on as a guard. What is ours is the policy (which dimensions become symbols: marks,
`dynamic=`, and automatic dynamic — static first, then symbolic for exactly the dimensions
that changed between compiles of the same code) and the plan the native guard runs on every
call: read some sizes and strides, bind each symbol to the first of them, and evaluate the
recorded guards as small integer expressions (no Python source evaluated per call).
"""

from __future__ import annotations

import contextlib
import os
import weakref

import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from dynamo_rs import _capture

# Sizes seen per (code object, input source): an entry per dimension, None once that
# dimension has been seen with two different sizes (automatic dynamic). Weak on the code:
# a function that goes away takes its record with it. `dynamo_rs.reset()` clears it.
FRAME_SIZES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def new_fake_mode():
    """The trace's fake mode, backed by a ShapeEnv. `.item()` stays a graph break, as in
    TorchDynamo by default, unless `torch._dynamo.config.capture_scalar_outputs` is set: then
    it is a graph node whose value is an unbacked symbol. Operations whose output shape
    depends on data (`nonzero`, `unique`, indexing by a boolean mask) likewise break unless
    `capture_dynamic_output_shape_ops` is set: then their sizes are unbacked symbols."""
    from torch._dynamo import config as dynamo_config
    from torch._subclasses.fake_tensor import FakeTensorMode

    env = ShapeEnv(allow_scalar_outputs=bool(dynamo_config.capture_scalar_outputs),
                   allow_dynamic_output_shape_ops=bool(dynamo_config.capture_dynamic_output_shape_ops))
    return FakeTensorMode(allow_non_fake_inputs=False, shape_env=env)


from dynamo_rs._native import ConstraintViolation  # noqa: E402


def call_backend(backend, gm, example_inputs, mode):
    """`backend(gm, example_inputs)` as torch.compile calls it: inside a `TracingContext`
    holding the fake mode the graph was traced with (its ShapeEnv, and fakes for the example
    inputs, symbolic ones included), which AOTAutograd and Inductor read for their caches
    and for dynamic shapes."""
    from torch._guards import TracingContext, tracing

    inductor = _is_inductor(backend)
    if inductor:
        from dynamo_rs import _inductor_keys

        _inductor_keys.prime()
    context = TracingContext(mode)
    floats_code = getattr(mode, "dynamo_rs_float_code", None)
    with tracing(context), _own_tensorify_state() as asked_to_specialize:
        try:
            compiled = backend(gm, example_inputs)
        except Exception as error:
            if _fake_tensor_limit(error):
                raise BackendFallback(f"{type(error).__name__}: {error}") from error
            # AOTAutograd's restart, or any backend that does not take SymFloat inputs
            # (TorchDynamo never hands one to a backend: a backend written against it may
            # expect only tensors and SymInts): the same graph with the floats constant.
            if floats_code is None:
                raise
            raise _floats_specialized(floats_code) from error
        if floats_code is not None and asked_to_specialize():
            # The pass burnt a float into the graph without asking for a restart: the
            # graph is only right for this value, which our guard would not check.
            raise _floats_specialized(floats_code)
    if inductor:
        _inductor_keys.remember()
    # Inductor has chosen where it writes the code it generates (and made it known through
    # this variable): code torch's, never traced (a backward pass runs it under our hook).
    generated = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if generated:
        from dynamo_rs import config

        config.skip_generated_code_in(generated)
    return compiled


@contextlib.contextmanager
def _own_tensorify_state():
    """torch's scalar-tensorification pass (run by AOTAutograd) keeps the names of the float
    symbols it was told to specialise in a process-wide set, which TorchDynamo clears for each
    frame it converts; a name left there by an earlier compile makes the pass burn that float
    into the graph silently instead of asking for a restart. Our backend call starts from an
    empty set and puts the previous contents back afterwards (TorchDynamo may be between a
    restart and its retry). Yields whether the pass asked for a specialisation."""
    try:
        from torch._dynamo.symbolic_convert import TensorifyState
    except ImportError:  # another torch: nothing to isolate
        yield lambda: False
        return
    saved = set(TensorifyState.force_specializations)
    TensorifyState.force_specializations.clear()
    try:
        yield lambda: bool(TensorifyState.force_specializations)
    finally:
        TensorifyState.force_specializations.clear()
        TensorifyState.force_specializations.update(saved)


def _is_inductor(backend) -> bool:
    """Whether `backend` is Inductor (by name, with `mode=`/`options=`, or its entry point):
    the backends that ask for Inductor's installation keys."""
    if isinstance(backend, torch._TorchCompileInductorWrapper):
        return True
    module = getattr(backend, "__module__", None) or ""
    return module.startswith(("torch._inductor", "torch._dynamo.backends.inductor"))


def _marked(tensor, attr: str) -> set:
    return set(getattr(tensor, attr, ()) or ())


def _ranges(tensor) -> dict:
    return {r.dim: (r.min, r.max) for r in getattr(tensor, "_dynamo_dynamic_range", ()) or ()}


def dynamic_dims(tensor, code, name: str, policy, static: bool):
    """The dimensions of `tensor` (seen at source `name` in a frame of `code`) to make
    symbolic, which of those were marked by the user (`mark_dynamic`), and which are
    duck-sized (share a symbol with equal sizes): marks (`mark_static` wins), the dimensions
    whose size changed since an earlier compile of `code` (unless `dynamic=False`), and with
    `dynamic=True` every other dimension, duck-sized. As in TorchDynamo, dimensions seen to
    change get a symbol of their own: equal sizes then are a coincidence, not a rule.
    Parameters and tensors held by modules stay static unless marked (as TorchDynamo's
    `force_parameter_static_shapes`). Records this call's sizes for the next compile."""
    shape = tuple(tensor.shape)
    # `mark_dynamic` (strong: the code must not specialise the dimension) and
    # `maybe_mark_dynamic` (weak: symbolic, but the code may specialise it).
    strong = _marked(tensor, "_dynamo_dynamic_indices")
    marked = strong | _marked(tensor, "_dynamo_weak_dynamic_indices")
    static_marks = _marked(tensor, "_dynamo_static_indices")
    ranges = _ranges(tensor)
    for dim, (low, high) in ranges.items():
        size = shape[dim] if dim < len(shape) else None
        if size is not None and ((low is not None and size < low) or (high is not None and size > high)):
            raise ConstraintViolation(
                f"{name}.size()[{dim}] is {size}, outside the range [{low}, {high}] given to "
                f"mark_dynamic for that dimension")
    automatic: set = set()
    strides: set = set()
    if code is not None and policy is not False and not static:
        sizes = FRAME_SIZES.setdefault(code, {})
        automatic = _changed(sizes, name, list(shape))
        if tensor.layout is torch.strided:
            strides = _changed(sizes, ("strides", name), _stride_pattern(tensor))
    duck: set = set()
    if policy is True and not static:
        duck = set(range(len(shape))) - automatic
    dims = sorted(d for d in (marked | automatic | duck) if d < len(shape) and d not in static_marks)
    user = sorted(d for d in strong if d in dims)
    strides -= static_marks
    return dims, user, sorted(d for d in duck if d in dims), sorted(strides)


def _changed(seen_by_name: dict, name, now: list) -> set:
    """Records `now` (one entry per dimension) under `name`; the dimensions whose entry has
    differed from an earlier call's (then forgotten: None)."""
    seen = seen_by_name.get(name)
    if seen is None or len(seen) != len(now):
        seen_by_name[name] = list(now)
        return set()
    for dim, value in enumerate(now):
        if seen[dim] is not None and seen[dim] != value:
            seen[dim] = None
    return {dim for dim, value in enumerate(seen) if value is None}


def _stride_pattern(tensor) -> list:
    """Each stride of `tensor` as the size it follows from, when it is the product of another
    dimension's stride and size (`("after", j)`: what torch infers for a symbolic size), else
    as its value — so a contiguous tensor whose sizes change has the same pattern, and a
    stride that changes on its own (a slice of tensors of growing width) is seen to change,
    as TorchDynamo's automatic dynamic strides do."""
    shape, stride = tensor.shape, tensor.stride()
    pattern: list = [None] * len(shape)
    follows: dict = {}
    for value, negative_dim in sorted((stride[i], -i) for i in range(len(shape))):
        dim = -negative_dim
        pattern[dim] = follows.get(value, value)
        follows.setdefault(value * shape[dim], ("after", dim))
    return pattern


def symbolic_fake(mode, tensor, name: str, dims: list[int], user: list[int], duck: list[int],
                  strides: list[int] = ()):
    """The fake of `tensor` with symbolic sizes in `dims` (sizes 0 and 1 stay specialised,
    equal sizes share a symbol unless marked by the user, as in TorchDynamo) and a symbol of
    their own for the strides in `strides` (the others follow from the sizes)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import disable_fake_tensor_cache
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        RelaxedUnspecConstraint,
        StatelessSymbolicContext,
        StrictMinMaxConstraint,
    )
    from torch.utils._sympy.value_ranges import ValueRanges

    memo = mode.fake_tensor_converter._get_memo(tensor)
    if memo is not None:
        return memo
    ranges = _ranges(tensor)
    sizes, constraints = [], []
    for dim in range(tensor.dim()):
        if dim not in dims:
            sizes.append(DimDynamic.STATIC)
            constraints.append(None)
        elif dim in duck:
            sizes.append(DimDynamic.DUCK)
            constraints.append(None)
        elif dim in user:
            sizes.append(DimDynamic.DYNAMIC)
            low, high = ranges.get(dim, (None, None))
            if low is None and high is None:
                constraints.append(RelaxedUnspecConstraint(warn_only=False))
            else:
                import sympy

                constraints.append(StrictMinMaxConstraint(
                    vr=ValueRanges(lower=low if low is not None else 0,
                                   upper=high if high is not None else sympy.oo),
                    warn_only=False))
        else:
            sizes.append(DimDynamic.DYNAMIC)
            constraints.append(None)
    base = None
    if tensor._is_view() and tensor._base is not None:
        # The base of a view keeps its sizes (torch would make every one of them a symbol
        # named after a `._base` source that the shape guard has no read for): the view's
        # own sizes, strides and offset are what the graph sees, and the guard that the view
        # fits in its base's storage is then over the view's symbols and a constant.
        rank = tensor._base.dim()
        base = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC] * rank,
                                        constraint_sizes=[None] * rank)
    relaxed = RelaxedUnspecConstraint(warn_only=True)
    context = StatelessSymbolicContext(
        dynamic_sizes=sizes, constraint_sizes=constraints, view_base_context=base,
        dynamic_strides=[DimDynamic.DYNAMIC if d in strides else DimDynamic.INFER_STRIDE
                         for d in range(tensor.dim())],
        constraint_strides=[relaxed if d in strides else None for d in range(tensor.dim())])
    mode.dynamo_rs_symbolic = True  # see `_capture.run_fake`
    if strides:
        mode.dynamo_rs_stride_symbols = True
    # A view is made from its base by `as_strided` through FakeTensorMode's dispatch, whose
    # cache would file an entry for sizes made of the new symbols — never asked for again,
    # and half the cost of the input.
    with disable_fake_tensor_cache(mode):
        return mode.from_tensor(tensor, symbolic_context=context, source=ConstantSource(name))


def input_fake(mode, tensor, code, name: str, policy, static: bool):
    """The fake twin of a graph input: static (the fast path of `_capture.to_fake`) unless
    some dimension is to be symbolic. Returns (fake, user-marked dims or None)."""
    if type(tensor) is torch.nn.Parameter:
        static = True
    dims, user, duck, strides = dynamic_dims(tensor, code, name, policy, static)
    if not dims and not strides:
        return _capture.to_fake(mode, tensor), None
    fake = symbolic_fake(mode, tensor, name, dims, user, duck, strides)
    return fake, user


def dynamic_int(mode, value: int, code, name: str, policy):
    """A frame argument that is an int: a SymInt (the graph takes it as an input) when it is
    to be dynamic — with `dynamic=True`, or once it has been seen with two values (automatic
    dynamic, as TorchDynamo does for ints) — else None (a constant, guarded by value). Like
    TorchDynamo's, the symbol is not specialised on 0 or 1: the value that changed may be
    either."""
    if not _number_is_dynamic(value, code, "int", name, policy):
        return None
    return _symbolic_number(mode, value, name, torch.SymInt)


def dynamic_float(mode, value: float, code, name: str, policy):
    """A frame argument that is a float: a SymFloat (the graph takes it as an input) once it
    has been seen with two values (automatic dynamic, as TorchDynamo makes floats with
    `specialize_float=False`; a sampler's noise level, a scale passed per call), or with
    `dynamic=True` — else None (a constant, guarded by value). Non-finite values stay
    constants, as do the floats of a code whose backend refused them (`FloatsSpecialized`)."""
    if value != value or value in (float("inf"), float("-inf")):
        return None
    if code is not None and FRAME_SIZES.get(code, {}).get(_FLOATS_STATIC):
        return None
    if not _number_is_dynamic(value, code, "float", name, policy):
        return None
    result = _symbolic_number(mode, value, name, torch.SymFloat)
    if result is not None:
        mode.dynamo_rs_float_code = code
    return result


def pin_float_inputs(fake) -> None:
    """Before a SymFloat computed from symbolic floats is made a Python float: each of those
    inputs is specialised to its exact value (`Eq(s, value)`), so the guard compares inputs,
    never a value computed again by the guard. Float arithmetic differs in its last bit by how
    it is written — the user's `x * x` and the guard's `x ** 2` (sympy's form of it) can round
    apart, and a guard `Eq(x**2 / 2, value)` would then fail on the very frame it was made for."""
    import sympy

    expr = fake.node.expr
    if isinstance(expr, sympy.Symbol) or not expr.free_symbols:
        return
    env = fake.node.shape_env
    for symbol in sorted(expr.free_symbols, key=str):
        value = env.var_to_val.get(symbol)
        if value is not None:
            env.evaluate_expr(sympy.Eq(symbol, value))


def _number_is_dynamic(value, code, kind: str, name: str, policy) -> bool:
    """Records this call's value of the number argument `name` of `code`; whether it is to be
    symbolic (`dynamic=True`, or seen with another value before)."""
    if policy is False or code is None:
        return False
    sizes = FRAME_SIZES.setdefault(code, {})
    key = (kind, name)
    seen = sizes.get(key)
    if seen is None:
        sizes[key] = seen = [value]
    elif seen[0] is not None and seen[0] != value:
        seen[0] = None
    return policy is True or seen[0] is None


def _symbolic_number(mode, value, name: str, kind):
    """A SymInt or SymFloat (`kind`) for `value` in the trace's ShapeEnv, or None."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    env = mode.shape_env
    symbol = env.create_unspecified_symbol(value, source=ConstantSource(name),
                                           dynamic_dim=DimDynamic.DYNAMIC)
    make = env.create_symfloatnode if kind is torch.SymFloat else env.create_symintnode
    result = make(symbol, hint=value, source=ConstantSource(name))
    if not isinstance(result, kind):
        return None
    mode.dynamo_rs_symbolic = True
    return result


# The FRAME_SIZES key of a code whose float arguments stay constants: its backend refused
# symbolic floats (see `FloatsSpecialized`).
_FLOATS_STATIC = ("floats", "static")


class BackendFallback(Exception):
    """The backend met one of the limits of fake tensors (an operator whose output shape
    depends on data — in a graph that is differentiated, the backward of `x[mask] = v` needs
    `grad[mask]` — or one without a fake implementation). torch.compile takes that as a
    graph break, not as the backend's failure: the frame runs eagerly (an error only under
    `fullgraph=True`). The message is the original error."""


def _fake_tensor_limit(error: BaseException) -> bool:
    """Whether `error` is one torch.compile lets fall back to eager: one of
    `torch._dynamo.exc.exceptions_allowed_to_be_fallback`, torch's own list (as there, the
    error itself, not one it was raised from)."""
    from torch._dynamo.exc import exceptions_allowed_to_be_fallback

    return isinstance(error, exceptions_allowed_to_be_fallback)


class FloatsSpecialized(Exception):
    """The backend cannot take the graph's symbolic float inputs: AOTAutograd (`aot_eager`,
    `inductor`) runs torch's pass that turns Python float arithmetic into tensor arithmetic,
    which only knows TorchDynamo's way of passing floats (as 0-d tensors) and asks for the
    analysis to start again with the floats specialised; a user's backend may expect only
    tensors and ints. The frame is traced again with its floats as constants, guarded by
    value (a backend that fails on that graph too fails as usual)."""


def _floats_specialized(code) -> FloatsSpecialized:
    """Keeps the float arguments of `code` constant from now on; the error that says so."""
    FRAME_SIZES.setdefault(code, {})[_FLOATS_STATIC] = True
    return FloatsSpecialized()


def _symbolic_builtins() -> dict:
    import builtins
    import math

    return {builtins.min: ("sym_min", torch.sym_min, 2), builtins.max: ("sym_max", torch.sym_max, 2),
            builtins.float: ("sym_float", torch.sym_float, 1), builtins.int: ("sym_int", torch.sym_int, 1),
            math.floor: ("floor", math.floor, 1), math.ceil: ("ceil", math.ceil, 1),
            math.trunc: ("trunc", math.trunc, 1), math.sqrt: ("sym_sqrt", torch.sym_sqrt, 1)}


# Builtins that stay symbolic on symbolic numbers: {builtin: (node name, the symbolic
# equivalent a graph node calls, how many arguments)}.
SYMBOLIC_BUILTINS = _symbolic_builtins()


def symbolic_dims(fake) -> tuple[list[bool], list[bool]] | None:
    """Which sizes and strides of `fake` are symbolic, or None if none is."""
    sizes = [isinstance(s, torch.SymInt) for s in fake.shape]
    strides = [isinstance(s, torch.SymInt) for s in fake.stride()]
    if not any(sizes) and not any(strides):
        return None
    return sizes, strides


# ---------------------------------------------------------------------------------------
# The shape guard plan.
#
# `reads` are (input index, 0 for a size / 1 for a stride, dimension). Expressions are nested
# tuples: ("v", i) the i-th read value, ("i", n) an int, ("f", x) a float, ("add"|"mul"|
# "max"|"min"|"and"|"or", [e...]), ("pow"|"floordiv"|"mod"|"truediv"|"eq"|"ne"|"lt"|"le"|
# "gt"|"ge", a, b), ("not"|"floor"|"ceil"|"trunc"|"float", a), ("b", bool).
# ---------------------------------------------------------------------------------------

class _Untranslatable(Exception):
    pass


def _translate(expr, symbol_reads: dict):
    import sympy
    from torch.utils._sympy import functions as F

    def tr(e):
        if isinstance(e, sympy.Symbol):
            if e not in symbol_reads:
                raise _Untranslatable(f"the symbol {e} is not an input size")
            return ("v", symbol_reads[e])
        if e is sympy.true or isinstance(e, sympy.logic.boolalg.BooleanTrue):
            return ("b", True)
        if e is sympy.false or isinstance(e, sympy.logic.boolalg.BooleanFalse):
            return ("b", False)
        if isinstance(e, sympy.Integer):
            return ("i", int(e))
        if isinstance(e, sympy.Rational):
            return ("truediv", ("i", int(e.p)), ("i", int(e.q)))
        if isinstance(e, sympy.Float):
            return ("f", float(e))
        if isinstance(e, sympy.Add):
            return ("add", [tr(a) for a in e.args])
        if isinstance(e, sympy.Mul):
            return ("mul", [tr(a) for a in e.args])
        if isinstance(e, (F.FloatPow, F.PowByNatural)):
            return ("pow", tr(e.args[0]), tr(e.args[1]))
        if isinstance(e, F.Identity):
            return tr(e.args[0])
        if isinstance(e, F.TruncToFloat):
            return ("float", ("trunc", tr(e.args[0])))
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if isinstance(exp, sympy.Integer) and int(exp) < 0:
                return ("truediv", ("i", 1), ("pow", tr(base), ("i", -int(exp))))
            return ("pow", tr(base), tr(exp))
        if isinstance(e, (F.FloorDiv, F.CleanDiv)):
            return ("floordiv", tr(e.args[0]), tr(e.args[1]))
        if isinstance(e, F.ModularIndexing):
            x, d, m = e.args
            return ("mod", ("floordiv", tr(x), tr(d)), tr(m))
        if isinstance(e, (F.Mod, F.PythonMod, sympy.Mod)):
            return ("mod", tr(e.args[0]), tr(e.args[1]))
        if isinstance(e, (F.IntTrueDiv, F.FloatTrueDiv)):
            return ("truediv", tr(e.args[0]), tr(e.args[1]))
        if isinstance(e, (F.Max, sympy.Max)):
            return ("max", [tr(a) for a in e.args])
        if isinstance(e, (F.Min, sympy.Min)):
            return ("min", [tr(a) for a in e.args])
        if isinstance(e, F.FloorToInt) or isinstance(e, sympy.floor):
            return ("floor", tr(e.args[0]))
        if isinstance(e, F.CeilToInt) or isinstance(e, sympy.ceiling):
            return ("ceil", tr(e.args[0]))
        if isinstance(e, F.TruncToInt):
            return ("trunc", tr(e.args[0]))
        if isinstance(e, F.ToFloat):
            return ("float", tr(e.args[0]))
        relations = {sympy.Eq: "eq", sympy.Ne: "ne", sympy.StrictLessThan: "lt",
                     sympy.LessThan: "le", sympy.StrictGreaterThan: "gt",
                     sympy.GreaterThan: "ge"}
        for cls, op in relations.items():
            if isinstance(e, cls):
                return (op, tr(e.args[0]), tr(e.args[1]))
        if isinstance(e, sympy.And):
            return ("and", [tr(a) for a in e.args])
        if isinstance(e, sympy.Or):
            return ("or", [tr(a) for a in e.args])
        if isinstance(e, sympy.Not):
            return ("not", tr(e.args[0]))
        raise _Untranslatable(f"{type(e).__name__} in a shape guard ({expr})")

    return tr(expr)


def guard_plan(mode, inputs: list, names: list[str], user_marks: list, locations: list,
               positions: list | None = None):
    """The shape guard of a compiled entry. `inputs` are the fakes of the graph inputs that
    have symbolic sizes or strides (`names` their sources, `user_marks` the dimensions the
    user marked dynamic, or None); `locations` are (number of shape guards recorded, where)
    pairs noted by the trace when it specialised a symbolic value.

    Returns (reads, checks): values to read on every call and boolean expressions over them
    (with a description each) that must all hold. Raises `ConstraintViolation` when a
    dimension the user marked dynamic was specialised by the code, naming the line."""
    import sympy

    env = mode.shape_env
    reads: list = []
    symbol_reads: dict = {}
    checks: list = []
    pending: list = []  # (read index, expression) to compare once every symbol is bound
    for k, fake in enumerate(inputs):
        if isinstance(fake, (torch.SymInt, torch.SymFloat)):  # an int or float argument
            expr = fake.node._expr
            index = len(reads)
            reads.append((k, 2, 0))
            if isinstance(expr, sympy.Symbol) and expr not in symbol_reads:
                symbol_reads[expr] = index
            else:
                pending.append((index, expr))
            continue
        for which, values in ((0, fake.shape), (1, fake.stride())):
            for dim, value in enumerate(values):
                if not isinstance(value, torch.SymInt):
                    continue
                # The expression as made (`node.expr` would apply the ShapeEnv's
                # replacements: a symbol specialised to 13 would read as 13 while the
                # guards still name the symbol).
                expr = value.node._expr
                index = len(reads)
                reads.append((k, which, dim))
                if isinstance(expr, sympy.Symbol) and expr not in symbol_reads:
                    symbol_reads[expr] = index
                else:
                    pending.append((index, expr))

    # AOTAutograd (`aot_eager`, `inductor`) makes its own symbol for each int example input,
    # with the source `sym_<position>` and duck-sized by value (two ints equal when traced
    # share one), and records guards on it while tracing the graph: each such symbol reads
    # the int input it was made for, and one shared by several must stay equal across them.
    if positions is not None:
        read_of_position = {}
        for index, (k, which, _) in enumerate(reads):
            if which == 2 and positions[k] is not None:
                read_of_position[positions[k]] = index
        for symbol, sources in env.var_to_sources.items():
            if symbol in symbol_reads:
                continue
            matched = []
            for source in sources:
                name = getattr(source, "source_name", None)
                if isinstance(name, str) and name.startswith("sym_") and name[4:].isdigit():
                    matched.append(read_of_position.get(int(name[4:])))
            if not matched or None in matched:
                continue
            symbol_reads[symbol] = matched[0]
            pending.extend((index, symbol) for index in matched[1:])

    def read_name(index):
        k, which, dim = reads[index]
        if which == 2:
            return names[k]
        return f"{names[k]}.{'size' if which == 0 else 'stride'}()[{dim}]"

    # Symbol names longest first (`s10` is replaced before `s1` could eat its prefix).
    renames = sorted(((str(symbol), read_name(index)) for symbol, index in symbol_reads.items()),
                     key=lambda pair: -len(pair[0]))
    try:
        for index, expr in pending:
            checks.append((("eq", ("v", index), _translate(expr, symbol_reads)),
                           f"{read_name(index)} == {_describe(expr, renames)}"))
        for guard in env.guards:
            checks.append((_translate(guard.expr, symbol_reads), _describe(guard.expr, renames)))
    except _Untranslatable as err:
        raise _capture_unsupported(str(err)) from None
    for symbol, index in symbol_reads.items():
        bounds = env.var_to_range.get(symbol)
        if bounds is None:
            continue
        # Bounds are sympy Integers or infinities (torch's `int_oo` calls itself finite).
        if isinstance(bounds.lower, sympy.Integer):
            checks.append((("ge", ("v", index), ("i", int(bounds.lower))),
                           f"{read_name(index)} >= {int(bounds.lower)}"))
        if isinstance(bounds.upper, sympy.Integer):
            checks.append((("le", ("v", index), ("i", int(bounds.upper))),
                           f"{read_name(index)} <= {int(bounds.upper)}"))
    _check_user_marks(env, inputs, names, user_marks, locations)
    return reads, checks


def _capture_unsupported(message: str) -> Exception:
    return NotImplementedError(f"dynamic shapes: {message}")


def _describe(expr, renames: list) -> str:
    """`expr` as text with each symbol named by the value it reads (`renames`: pairs of a
    symbol's name and the read's, longest symbol names first)."""
    text = str(expr)
    for symbol, name in renames:
        if symbol in text:
            text = text.replace(symbol, name)
    return text


def _check_user_marks(env, inputs, names, user_marks, locations) -> None:
    """A dimension marked with `mark_dynamic` must stay a free symbol: if the trace pinned
    it to one value (or to a range the mark does not allow), say which line did."""
    import sympy

    for k, fake in enumerate(inputs):
        if isinstance(fake, (torch.SymInt, torch.SymFloat)):
            continue
        for dim in user_marks[k] or ():
            value = fake.shape[dim]
            if not isinstance(value, torch.SymInt):
                continue
            symbol = value.node._expr
            if not isinstance(symbol, sympy.Symbol):
                continue
            fixed = env.replacements.get(symbol)
            bounds = env.var_to_range.get(symbol)
            pinned = (fixed is not None and fixed.is_number) or (
                bounds is not None and bounds.lower == bounds.upper)
            if not pinned:
                continue
            where = "unknown line"
            for position, guard in enumerate(env.guards):
                if symbol in guard.expr.free_symbols:
                    where = next((w for count, w in locations if count > position), where)
                    break
            raise ConstraintViolation(
                f"{names[k]}.size()[{dim}] was marked dynamic (mark_dynamic) but the code "
                f"specialises it to {fixed if fixed is not None else bounds.lower} at {where}; "
                f"remove the mark or make the code work for any size")
