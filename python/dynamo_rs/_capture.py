"""Python-side helpers the Rust translator calls: fake-tensor propagation and FX export.

Everything here runs once per compiled frame or once per traced operation; the translator
itself (bytecode, variables, guards, codegen) is in Rust.
"""

from __future__ import annotations

import collections
import linecache
import logging
import operator
import sys
import types
import re
import weakref

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._mode_utils import no_dispatch

from dynamo_rs import _fake_memo, _meta_rules, _rule_check, _symbolic_rules, config
from dynamo_rs._fakes import wrap_meta


class NodeRef:
    """Stands for node `index` of the graph in exported arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def new_fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=False)


def release_real_tensor_memos(mode: FakeTensorMode) -> None:
    """Drops what `mode` remembers about real tensors and storages, once the trace (and the
    backend, which may convert more) is done with it.

    The converter keys those memos by weak references with callbacks on the real tensors.
    A fake mode is full of reference cycles, so once dropped it waits for the cycle
    collector — with its weak references still on the real tensors. CPython 3.11 crashes
    when a tensor holding ten or more such references is freed and the collector runs
    during that free and frees some of them (`PyObject_ClearWeakRefs` walks a list it read
    before the collection): a parameter seen by a dozen captures, then deleted, was enough.
    New dictionaries in place of the old ones free the old references at once, while nothing
    is being freed. The memos are a cache: a mode used again converts anew."""
    describer = mode.fake_tensor_converter.meta_converter.describer
    describer.lookup_tensor = type(describer.lookup_tensor)()
    describer.lookup_storage = type(describer.lookup_storage)()


def to_fake(mode: FakeTensorMode, tensor: torch.Tensor) -> torch.Tensor:
    """The fake twin of a real graph input, memoized per mode (a tensor reached through two
    sources, like tied weights, gets one fake).

    torch's general conversion (`from_tensor`, through its MetaConverter) describes the
    tensor in full: views and their bases, storage sharing, subclasses, symbolic sizes. Most
    inputs are parameters, buffers and activations that are none of these, and for those
    a meta tensor of the same sizes and strides wrapped as a FakeTensor is the same result
    for a fraction of the cost (about a fifth). Anything unusual takes the general path.
    """
    converter = mode.fake_tensor_converter
    memo = converter._get_memo(tensor)
    if memo is not None:
        return memo
    seen = _fast_storages(mode)
    if _plain_dense(tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        # Two plain tensors sharing a storage must alias in the fake world too: the general
        # path tracks storages, so it takes any second user (the first kept its own storage).
        if key not in seen:
            seen.add(key)
            with no_dispatch():
                fake = strided_fake(mode, tensor.shape, tensor.stride(), tensor.dtype, tensor.device,
                                    tensor.requires_grad)
            if type(tensor) is torch.nn.Parameter:
                fake._is_param = True
            converter.set_tensor_memo(tensor, fake)
            return fake
    return mode.from_tensor(tensor, static_shapes=True)


def strided_fake(mode: FakeTensorMode, shape, stride, dtype, device, requires_grad: bool,
                 offset: int = 0) -> torch.Tensor:
    """A plain fake tensor of `mode` with these sizes, strides and storage offset (a meta
    tensor wrapped as a FakeTensor); called with dispatch off."""
    meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    if offset:
        meta = meta.as_strided(shape, stride, offset)
    return wrap_meta(mode, meta, device, requires_grad)


_FAST_STORAGES: "weakref.WeakKeyDictionary[FakeTensorMode, set[int]]" = weakref.WeakKeyDictionary()


def _fast_storages(mode: FakeTensorMode) -> set[int]:
    seen = _FAST_STORAGES.get(mode)
    if seen is None:
        seen = _FAST_STORAGES[mode] = set()
    return seen


def _plain_dense(t: torch.Tensor) -> bool:
    """A leaf (or grad-less) dense strided tensor of a plain type, owning all of its storage
    from offset 0, with at least one dimension (0-dim CPU tensors get scalar memos in the general
    path), and with nothing the general conversion has to describe."""
    return (
        (type(t) is torch.Tensor or type(t) is torch.nn.Parameter)
        and t.layout is torch.strided
        and t._base is None
        and t.dim() > 0
        and t.storage_offset() == 0
        and t.is_leaf
        and not t.is_quantized
        and not t.is_mkldnn
        and not t.is_meta
        and not t.is_conj()
        and not t.is_neg()
        and t.numel() > 0
        and (not t.requires_grad or t.grad_dtype == t.dtype)
        and not torch._C._functorch.is_functorch_wrapped_tensor(t)
        and not torch._is_functional_tensor(t)
        # No gaps and nothing beyond: the fake storage is exactly the elements.
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    )


def _call(target, args, kwargs):
    if isinstance(target, str):  # a method name: args[0] is the receiver
        return getattr(args[0], target)(*args[1:], **kwargs)
    return target(*args, **kwargs)


def make_function(code, globals, defaults, kwdefaults, closure):
    """A function the traced code made with MAKE_FUNCTION, made again by the generated code
    (it escapes: returned, stored, live at a graph break): its code, globals, defaults and
    closure cells, as MAKE_FUNCTION sets them."""
    fn = types.FunctionType(code, globals, code.co_name, defaults, closure)
    fn.__kwdefaults__ = kwdefaults
    fn.__qualname__ = code.co_qualname
    return fn


_log_api_usage_once = torch._C._log_api_usage_once


class UnlinkedViewChanged(RuntimeError):
    """See `_meta_rules.note_unlinked_view`: the graph breaks at such an operation."""


class OutArgumentChanged(RuntimeError):
    """An `out=` tensor the operation would resize (or one that is not contiguous): its new
    sizes would be a change of a graph input's metadata, which AOTAutograd and Inductor do
    not carry out (they raised at the next use). The graph breaks there, as under
    TorchDynamo."""


def _check_out_argument(mode, target, args, kwargs) -> None:
    out = kwargs.get("out")
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if not outs or not all(isinstance(t, torch.Tensor) for t in outs):
        return
    if not all(t.is_contiguous() for t in outs):
        raise OutArgumentChanged("an out= tensor that is not contiguous")
    result = run_fake(mode, target, args, {k: v for k, v in kwargs.items() if k != "out"})
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(results) != len(outs) or any(
            not isinstance(r, torch.Tensor) or tuple(r.shape) != tuple(t.shape)
            for r, t in zip(results, outs)):
        raise OutArgumentChanged("the operation would resize its out= tensor")


# In-place operations of the operator module (`x += y`, `x[i] = y`) and the tensor methods
# behind them, by name.
_IN_PLACE_OPERATORS = frozenset({
    "setitem", "iadd", "isub", "imul", "imatmul", "itruediv", "ifloordiv", "imod", "ipow",
    "ilshift", "irshift", "iand", "ixor", "ior"})
_IN_PLACE_NAMES = _IN_PLACE_OPERATORS | {f"__{name}__" for name in _IN_PLACE_OPERATORS}


def _records_autograd_in_place(target, args, kwargs, unlinked) -> bool:
    """Whether `target(*args, **kwargs)` changes a tensor in place whose storage has a view
    without autograd's link, with an operand that requires grad (so eager autograd would
    make the view, or its base, require grad too)."""
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if not isinstance(name, str):
        return False
    in_place = (name.endswith("_") and not name.startswith("__")) or name in _IN_PLACE_NAMES
    if not in_place or not args or not isinstance(args[0], torch.Tensor):
        return False
    if args[0].untyped_storage()._cdata not in unlinked:
        return False
    operands = [*args, *kwargs.values()]
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in operands)


def run_fake(mode: FakeTensorMode, target, args, kwargs):
    """Runs one traced operation on fake tensors, returning its fake result: by our own
    shape rules where one applies (`_meta_rules`), else by what the same call on inputs of
    the same metadata gave earlier in this trace (`_fake_memo`), else through FakeTensorMode."""
    if target is _log_api_usage_once:
        # torchvision calls it in every `stochastic_depth`; it records a name (once per
        # process) and stays in the graph, as under TorchDynamo: no fake dispatch needed.
        return None
    if kwargs and kwargs.get("out") is not None:
        _check_out_argument(mode, target, args, kwargs)
    unlinked = getattr(mode, "dynamo_rs_unlinked_views", None)
    if unlinked and torch.is_grad_enabled() and _records_autograd_in_place(target, args, kwargs, unlinked):
        raise UnlinkedViewChanged(
            "an in-place operation recording autograd on a tensor that was viewed with grad "
            "mode off in this trace (the fake view has no autograd link to follow it)")
    # With symbolic sizes in the trace (dynamic shapes) an operation on symbolic values is
    # answered by the symbolic rules, which decide nothing a guard would have to settle;
    # one whose arguments are all static is answered as in a static trace.
    symbolic = getattr(mode, "dynamo_rs_symbolic", False)
    static_call = not symbolic or _symbolic_rules.all_static(args, kwargs)
    # The symbolic rules take a stride that is not row-major by its expression for one that
    # is not row-major at all: true of strides torch infers from sizes, not of a stride with
    # a symbol of its own (automatic dynamic strides), which FakeTensorMode compares,
    # recording guards. With such strides about, symbolic calls are FakeTensorMode's.
    # A symbolic float argument (an `eps` or a scale seen with two values) may be specialised
    # by the operation's own meta function, a guard on its value a rule would not record.
    symbolic_float = not static_call and (
        any(type(a) is torch.SymFloat for a in args)
        or any(type(v) is torch.SymFloat for v in kwargs.values()))
    if config.meta_rules and not symbolic_float and (
            static_call or not getattr(mode, "dynamo_rs_stride_symbols", False)):
        rules = _meta_rules if static_call else _symbolic_rules
        result = rules.infer(mode, target, args, kwargs)
        if result is not None:
            if config.verify_meta_rules:
                _rule_check.check(mode, target, args, kwargs, result)
            return None if result is _meta_rules.NO_VALUE else result
    remembered_key = (None, None)
    if config.meta_rules and static_call:
        remembered_key, remembered = _fake_memo.lookup(mode, target, args, kwargs)
        if remembered is not None:
            if config.verify_meta_rules:
                _rule_check.check(mode, target, args, kwargs, remembered)
            return remembered
    if symbolic:
        # As TorchDynamo traces: composite operations (`pad`, `interpolate`) decompose
        # through torch's Python decompositions, which keep sizes symbolic where the C++
        # kernels would read them as ints (and specialise them).
        from torch._dispatch.python import enable_python_dispatcher

        with mode, enable_python_dispatcher():
            result = _call(target, args, kwargs)
    else:
        with mode:
            result = _call(target, args, kwargs)
    _fake_memo.remember(mode, remembered_key, result)
    env = mode.shape_env
    if env is not None and env.pending_fresh_unbacked_symbols:
        # `.item()` under capture_scalar_outputs made an unbacked symbol: bind it to this
        # node now, as TorchDynamo does (the ShapeEnv expects each to be bound once).
        from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings

        bindings = compute_unbacked_bindings(env, result)
        if not hasattr(mode, "dynamo_rs_unbacked_bindings"):
            mode.dynamo_rs_unbacked_bindings = {}
        mode.dynamo_rs_unbacked_bindings[id(result)] = (result, bindings)
        # From here on values with symbolic sizes are about (a `nonzero` result's length):
        # operations on them go through the symbolic rules and torch's Python
        # decompositions, as in a dynamic trace.
        mode.dynamo_rs_symbolic = True
    return result


def forward_template(self):
    """Its code object is the template of the graphs' `forward` functions (Rust's
    `graph_forward` replaces everything but the name, file and flags)."""


_FORWARD_GLOBALS = {"__builtins__": __builtins__}


class CapturedGraphModule(_LazyGraphModule):
    """A GraphModule whose `forward` is made by `graph_forward` from our graph IR (the same
    calls as fx's generated code, assembled as bytecode in microseconds), so capture does not
    pay for fx's code generation and `compile` (10–20 ms on a few hundred nodes). fx's source
    is generated when first needed — `.code`, `str()`, pickling (torch's caches key on it) —
    and from then on its `forward` is fx's own; a `recompile()` (a pass that changed the
    graph) makes `forward` fx's lazily, as `_LazyGraphModule` does."""

    def real_recompile(self) -> None:
        if self._needs_recompile() or "_code" not in self.__dict__:
            self._real_recompile()

    def _real_recompile(self):
        python_code = super()._real_recompile()
        # torch's caches key on the pickled module, whose attributes pickle in the order of
        # its __dict__: fx's code goes where a GraphModule made the usual way has it (right
        # after the graph), so the keys are those of the same graph in a plain GraphModule
        # (the persistent capture cache rebuilds one).
        attributes = self.__dict__
        if next(reversed(attributes)) in _CODE_ATTRIBUTES:
            items = list(attributes.items())
            code = {k: v for k, v in items if k in _CODE_ATTRIBUTES}
            attributes.clear()
            for k, v in items:
                if k not in code:
                    attributes[k] = v
                    if k == "_graph":
                        attributes.update(code)
        return python_code


# What GraphModule.recompile sets on the module.
_CODE_ATTRIBUTES = ("_code", "_lineno_map", "_prologue_start")


def _install_forward(gm: CapturedGraphModule, code) -> None:
    forward = types.FunctionType(code, _FORWARD_GLOBALS, "forward")
    forward.__qualname__ = "CapturedGraphModule.forward"
    type(gm).forward = forward


def export(nodes, outputs, fakes, mode, forward) -> torch.fx.GraphModule:
    """Builds the GraphModule. `nodes` is a list of (op, name, target, args, kwargs) with
    NodeRef standing for earlier nodes; `outputs` the NodeRefs returned, as a tuple. Nodes
    whose value introduced unbacked symbols (`.item()`) carry their bindings, as AOTAutograd
    and Inductor expect (see `run_fake`). `forward`: the code object of the graph's forward
    made by `graph_forward`."""
    root, graph = _fx_graph(nodes, outputs, fakes, getattr(mode, "dynamo_rs_unbacked_bindings", {}))
    gm = CapturedGraphModule(root, graph)
    _install_forward(gm, forward)
    if any(n.target is torch.ops.higher_order.invoke_subgraph for n in graph.nodes):
        _inline_compile_regions(gm)
    return gm


def _inline_compile_regions(gm) -> None:
    """As TorchDynamo before it calls the backend: a nested compile region's subgraph called
    once is inlined (nothing to reuse), or every one with `inline_invoke_subgraph` (torch's
    configuration, and torch's own passes)."""
    import torch._dynamo.config as dynamo_config
    from torch._higher_order_ops.passes import inline_invoke_subgraph as passes

    if dynamo_config.inline_invoke_subgraph:
        passes.inline_invoke_subgraph(gm)
    elif dynamo_config.inline_single_use_invoke_subgraph:
        passes.inline_single_use_invoke_subgraph(gm)
    else:
        return
    for name, module in list(gm.named_children()):
        if not any(n.op == "get_attr" and n.target == name for n in gm.graph.nodes):
            delattr(gm, name)
    gm.recompile()


def region_fingerprint(module) -> str:
    """What makes two nested compile region subgraphs the same: their operations, arguments
    by position (not by name) and their inputs' sizes, strides and dtypes (as TorchDynamo,
    not whether they need gradients: the operator differentiates each call)."""
    index = {}
    parts = []
    for i, node in enumerate(module.graph.nodes):
        index[node] = i
        if node.op == "placeholder":
            value = node.meta.get("example_value")
            described = ((tuple(value.shape), value.stride(), value.storage_offset(), value.dtype,
                          value.device) if isinstance(value, torch.Tensor) else type(value))
            parts.append(f"placeholder {described!r}")
            continue
        args = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: f"%{index[n]}")
        parts.append(f"{node.op} {node.target!r} {args!r}")
    return "\n".join(parts)


def export_subgraph(nodes, outputs, fakes, bare: bool = False) -> torch.fx.GraphModule:
    """The GraphModule of the body of a higher-order operation (`tag_activation_checkpoint`),
    in the same form as `export`'s (returning the tuple of `outputs`; with `bare`, its one
    output itself); small, so its `forward` is torch.fx's own."""
    root, graph = _fx_graph(nodes, outputs, fakes, {}, bare)
    return torch.fx.GraphModule(root, graph)


def iterator_isinstance(cls):
    """`isinstance(iterator, cls)` where which kind of iterator it is (a generator, a list's
    iterator, ...) is not known: True for `object` and the iterator ABCs, False for classes no
    iterator is an instance of (containers, numbers, strings, tensors, modules and their
    subclasses), None when it depends on the kind."""
    import collections.abc

    if isinstance(cls, tuple):
        answers = [iterator_isinstance(c) for c in cls]
        if True in answers:
            return True
        return None if None in answers else False
    if cls in (object, collections.abc.Iterator, collections.abc.Iterable):
        return True
    never = (tuple, list, dict, set, frozenset, str, bytes, bytearray, int, float, complex,
             type(None), torch.Tensor, torch.nn.Module)
    if isinstance(cls, type) and issubclass(cls, never):
        return False
    return None


def shares_storage(tensor, others) -> bool:
    """Whether `tensor` (fake) shares its storage with one of the tensors among `others`."""
    from torch.multiprocessing.reductions import StorageWeakRef

    mine = StorageWeakRef(tensor.untyped_storage())
    return any(isinstance(o, torch.Tensor) and StorageWeakRef(o.untyped_storage()) == mine
               for o in others)


def same_tensor_metadata(first, second) -> bool:
    """Whether two tuples of (fake) tensors agree in sizes, dtypes, devices and whether they
    need gradients: the two sides of a `torch.cond`."""
    return all(a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
               and a.requires_grad == b.requires_grad for a, b in zip(first, second))


# Forward-AD levels entered for real by traced code (`ops_functorch`) and not yet left.
_OPEN_DUAL_LEVELS: list = []


def run_state_primitive(name: str, function, args, kwargs):
    """A functorch or autograd state primitive made for real by the trace, the forward-AD
    levels it enters and leaves noted."""
    result = function(*args, **kwargs)
    if name == "_enter_dual_level":
        _OPEN_DUAL_LEVELS.append(result)
    elif name == "_exit_dual_level":
        level = kwargs.get("level", args[0] if args else None)
        if level in _OPEN_DUAL_LEVELS:
            _OPEN_DUAL_LEVELS.remove(level)
    return result


def leave_functorch_transforms() -> None:
    """Leaves the functorch transforms a trace entered for real (the levels of a traced
    `torch.vmap`, `torch.func.grad`, `jvp`, and forward-AD levels) and did not leave: a trace
    stopped inside one. Frames are traced outside every transform, so all of them are the
    trace's."""
    from torch._C import _functorch

    leave = {_functorch.TransformType.Vmap: _functorch._vmap_decrement_nesting,
             _functorch.TransformType.Grad: _functorch._grad_decrement_nesting,
             _functorch.TransformType.Jvp: _functorch._jvp_decrement_nesting}
    while (top := _functorch.peek_interpreter_stack()) is not None:
        leave[top.key()]()
    while _OPEN_DUAL_LEVELS:
        torch._C._exit_dual_level(level=_OPEN_DUAL_LEVELS.pop())


def is_scalar_bool(fakes) -> bool:
    """Whether `fakes` is one boolean tensor of no dimensions: what the condition of a
    `torch.while_loop` must return."""
    return len(fakes) == 1 and fakes[0].dtype == torch.bool and fakes[0].dim() == 0


def scan_length(xs) -> int | None:
    """The common static length of the tensors a `torch.scan` runs over (their first
    dimension), or None."""
    lengths = {x.shape[0] if x.dim() else None for x in xs}
    if len(lengths) != 1:
        return None
    length = lengths.pop()
    return length if type(length) is int and length > 0 else None


def scan_result_fakes(carries, steps, length: int) -> tuple:
    """The fake results of a `torch.scan`: the final carries (as the function returns
    them) and each step output stacked into a fresh contiguous tensor of `length` rows."""
    from torch.utils._mode_utils import no_dispatch

    stacked = []
    with no_dispatch():
        for y in steps:
            shape = (length, *y.shape)
            stride = torch.empty(shape, device="meta").stride()
            stacked.append(strided_fake(y.fake_mode, shape, stride, y.dtype, y.device, False))
    return (*carries, *stacked)


def _fx_graph(nodes, outputs, fakes, unbacked, bare: bool = False):
    """The root module (holding the submodules `get_attr` nodes name) and the fx Graph."""
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    made: list[torch.fx.Node] = []

    def resolve(value):
        return torch.fx.node.map_aggregate(
            value, lambda v: made[v.index] if isinstance(v, NodeRef) else v
        )

    for (op, name, target, args, kwargs), fake in zip(nodes, fakes):
        if op == "placeholder":
            node = graph.placeholder(name)
        elif op == "get_attr":
            attribute, module = target
            root.add_module(attribute, module)
            node = graph.get_attr(attribute)
            node.name = name
        else:
            node = graph.create_node(op, target, resolve(tuple(args)), resolve(dict(kwargs)), name=name)
        node.meta["example_value"] = fake
        if id(fake) in unbacked and unbacked[id(fake)][0] is fake:
            node.meta["unbacked_bindings"] = unbacked[id(fake)][1]
        made.append(node)
    graph.output(resolve(outputs[0] if bare else tuple(outputs)))
    return root, graph


# Python operators that traced tensor code turns into graph nodes, by BINARY_OP argument
# (CPython 3.11 `dis._nb_ops` order) and COMPARE_OP argument (`dis.cmp_op` order).
BINARY_OPS = [
    operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul,
    operator.mul, operator.mod, operator.or_, operator.pow, operator.rshift, operator.sub,
    operator.truediv, operator.xor,
    operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
    operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift,
    operator.isub, operator.itruediv, operator.ixor,
]
COMPARE_OPS = [operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge]
UNARY_OPS = {"neg": operator.neg, "pos": operator.pos, "invert": operator.invert,
             "not": operator.not_}


def _foldable() -> set:
    """Callables that are pure on constants, so a call with constant arguments is evaluated
    at trace time."""
    import builtins
    import math

    names = ["abs", "all", "any", "bool", "callable", "chr", "dict", "divmod", "enumerate", "id",
             "float", "frozenset", "getattr", "hasattr", "hash", "int", "isinstance",
             "issubclass", "len", "list", "max", "min", "ord", "pow", "range", "repr",
             "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "type", "zip"]
    out = {getattr(builtins, n) for n in names}
    out |= {v for k, v in vars(math).items() if callable(v) and not k.startswith("_")}
    out |= {v for k, v in vars(operator).items() if callable(v) and not k.startswith("_")}
    import inspect

    out |= {inspect.signature}
    out |= {torch.Size, torch.is_grad_enabled, torch.get_default_dtype, torch.is_tensor,
            torch.is_floating_point, torch.device, torch.finfo, torch.iinfo,
            # `Module.to(...)`'s argument parsing: (device, dtype, non_blocking, format).
            torch._C._nn._parse_to,
            # Autocast state: part of torch's global state, which every entry's guard checks.
            torch.is_autocast_enabled, torch.get_autocast_dtype, torch.is_autocast_cpu_enabled,
            torch.is_autocast_cache_enabled, torch._C._is_any_autocast_enabled,
            # So is the deterministic-algorithms setting (torchvision's roi_align asks it).
            torch.are_deterministic_algorithms_enabled,
            torch.is_deterministic_algorithms_warn_only_enabled,
            # 0 while tracing, as when the graph runs: frames are compiled, and their
            # entries used, only with no torch-dispatch mode active (the guard checks).
            torch._C._len_torch_dispatch_stack,
            # Type promotion: a function of dtypes alone.
            torch.promote_types, torch.can_cast,
            # The name of the out-of-tree backend (`rename_privateuse1_backend` sets it once
            # per process): read by torch's foreach helpers (`clip_grad_norm_`).
            torch._C._get_privateuse1_backend_name}
    try:
        import numpy as np
    except ImportError:
        return out
    # NumPy's elementwise math and reductions, on constants (`np.sqrt(2.0)`, `np.prod(shape)`):
    # pure. Arrays are not constants, so a call with one is not folded.
    numpy_names = ["sqrt", "exp", "log", "log2", "log10", "log1p", "expm1", "sin", "cos", "tan",
                   "tanh", "arctan", "arctan2", "abs", "absolute", "floor", "ceil", "round",
                   "power", "prod", "sum", "mean", "maximum", "minimum", "clip", "isclose",
                   "isfinite", "isnan", "isinf", "sign", "hypot", "floor_divide", "mod",
                   "float32", "float64", "int32", "int64"]
    out |= {getattr(np, n) for n in numpy_names if hasattr(np, n)}
    return out


FOLDABLE = _foldable()


_SKIP_MODULE_PREFIXES = ("torch.nn.modules", "torch._dynamo", "torch.fx", "torch.utils",
                         "torch._tensor", "torch.autograd.grad_mode")

# Native modules whose functions change or read interpreter state rather than compute on
# tensors: functorch's transform stack (`_grad_increment_nesting`), saved-tensor hooks and
# the profiler, distributed, JIT, lazy and the compilers' own. A graph function is run on
# fakes while tracing — for these that would push a transform level (or a hook) for real,
# left pushed when the trace then breaks — so calling one is a graph break instead.
_STATEFUL_NATIVE_MODULES = ("torch._C._functorch", "torch._C._autograd", "torch._C._profiler",
                            "torch._C._distributed", "torch._C._jit", "torch._C._lazy",
                            "torch._C._dynamo", "torch._C._export", "torch._C._functionalization",
                            "torch._C._aoti", "torch._C._monitor", "torch._C._itt",
                            "torch._C._nvtx", "torch._C._instruction_counter", "torch._C._cuda",
                            "torch._C._cudnn", "torch._C._acc", "torch._C._verbose")


def _renaming_getattribute_codes() -> tuple:
    """The code of `__getattribute__` functions known to do no more than object's own after
    renaming the name through the class's `attribute_map` — transformers' configuration
    classes, whose guards read dozens of attributes on every call (a microsecond each through
    two Python `__getattribute__` layers). Empty when transformers is not imported."""
    if "transformers" not in sys.modules:
        return ()
    try:
        from transformers.configuration_utils import PreTrainedConfig
    except Exception:  # noqa: BLE001 - another transformers version: no fast path
        return ()
    codes = [vars(PreTrainedConfig)["__getattribute__"].__code__]
    try:
        from transformers.integrations.heterogeneity.configuration_utils import HeterogeneousConfigMixin

        codes.append(vars(HeterogeneousConfigMixin)["__getattribute__"].__code__)
    except Exception:  # noqa: BLE001
        pass
    return tuple(codes)


def renamed_attributes(cls):
    """The `attribute_map` of `cls` when every `__getattribute__` along its MRO is object's or
    one of `_renaming_getattribute_codes` (what they read of the instance — an
    `attribute_map` or `_heterogeneity_spec` set on it — is checked on every read by the
    guard), else None. For such a class `getattr(obj, name)` is object's own lookup of
    `attribute_map.get(name, name)`."""
    codes = None
    found = False
    for klass in cls.__mro__:
        entry = vars(klass).get("__getattribute__")
        if entry is None or klass is object:
            continue
        if codes is None:
            codes = _renaming_getattribute_codes()
        if not isinstance(entry, types.FunctionType) or entry.__code__ not in codes:
            return None
        found = True
    if not found:
        return None
    try:
        renames = type.__getattribute__(cls, "attribute_map")
    except AttributeError:
        return None
    return renames if type(renames) is dict else None


def plain_instance_attribute(obj, name: str):
    """How the guard may read `getattr(obj, name)` straight from the instance dict for as
    long as `type(obj)` does not change (its version tag), or None. `(key, renames, getter)`:
    the value is `obj.__dict__[key]` — the name itself when the class's default (or merely
    renaming, see `renamed_attributes`) lookup finds it there with no data descriptor in the
    way, or the attribute a Python property returns of `self` when the name is such a
    property (`config._attn_implementation` returning `self._attn_implementation_internal`,
    its getter's code checked on every read). `renames` is the class's `attribute_map` for a
    renaming `__getattribute__` (the guard then checks on every read that the name is still
    renamed to `key`, or neither name is renamed, and that the instance holds no
    `attribute_map` or `_heterogeneity_spec` of its own)."""
    cls = type(obj)
    renames = None
    if getattr(cls, "__getattribute__", None) is not object.__getattribute__:
        renames = renamed_attributes(cls)
        if renames is None:
            return None
    try:
        instance_dict = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    if type(instance_dict) is not dict:
        return None
    if renames is not None and ("attribute_map" in instance_dict
                                or instance_dict.get("_heterogeneity_spec") is not None):
        return None
    key, getter = name, None
    if renames is not None and name in renames:
        # A renamed name (`config.hidden_size` -> `n_embd`): object's lookup of its target,
        # which is not renamed again; the guard checks the renaming on every read.
        key = renames[name]
        if type(key) is not str:
            return None
        entry = _class_entry(cls, key)
        if type(entry) is property:
            return None
    else:
        entry = _class_entry(cls, name)
    if type(entry) is property:
        key = _returned_attribute(entry.fget)
        if key is None or (renames is not None and key in renames):
            return None
        getter = entry.fget
        entry = _class_entry(cls, key)
    if entry is not None and (hasattr(type(entry), "__set__") or hasattr(type(entry), "__delete__")):
        return None
    if key not in instance_dict:
        return None
    return key, renames, getter


_MISSING = object()


def _class_entry(cls, name: str):
    """The raw entry for `name` along `cls`'s MRO (descriptors not invoked), or None."""
    for klass in cls.__mro__:
        entry = vars(klass).get(name, _MISSING)
        if entry is not _MISSING:
            return entry
    return None


def _returned_attribute(fget):
    """The name `fget` returns of its only argument when its whole body is `return
    self.<name>` (a property that exposes an attribute), else None."""
    import dis

    if not isinstance(fget, types.FunctionType) or fget.__closure__ is not None:
        return None
    code = fget.__code__
    if code.co_argcount != 1 or code.co_kwonlyargcount or code.co_flags & 0x2c:
        return None
    body = [i for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP", "CACHE")]
    if [i.opname for i in body] != ["LOAD_FAST", "LOAD_ATTR", "RETURN_VALUE"] or body[0].arg != 0:
        return None
    return body[1].argval


def is_graph_function(fn) -> bool:
    """Whether calling `fn` on tensors becomes one graph node (torch and torch.nn.functional
    operations) rather than being inlined or folded."""
    if isinstance(fn, torch._ops.OpOverloadPacket) or isinstance(fn, torch._ops.OpOverload):
        return True
    if isinstance(fn, types.FunctionType) and _allowed_in_graph(fn):
        return True
    module = getattr(fn, "__module__", None) or ""
    if getattr(fn, "__self__", None) is torch._C._nn or module == "torch._C._nn":
        return True
    if module == "torch.nn.functional" and getattr(fn, "__name__", "").startswith("_") \
            and isinstance(fn, types.FunctionType):
        # Private helpers (`_canonical_mask`, `_none_or_dtype`, `_in_projection_packed`) are
        # Python code over the public operations: inlined, as TorchDynamo does.
        return False
    if module in ("torch", "torch.functional", "torch.nn.functional", "torch._C._VariableFunctions",
                  "torch._C._linalg", "torch._C._special", "torch._C._fft", "torch.special",
                  "torch.linalg", "torch.fft"):
        return True
    self_obj = getattr(fn, "__self__", None)
    if self_obj is torch._C._VariableFunctions or self_obj is torch:
        return True
    if module.startswith(_STATEFUL_NATIVE_MODULES):
        return False
    return module.startswith("torch.") and not module.startswith(_SKIP_MODULE_PREFIXES) \
        and callable(fn) and not isinstance(fn, type) and type(fn).__name__ == "builtin_function_or_method"


def disallowed_in_graph(fn) -> bool:
    """Whether `torch._dynamo.disallow_in_graph(fn)` took the torch operation `fn` out of
    graphs: a graph break where it is called, as under TorchDynamo."""
    return _in_trace_rules_registry(fn, "_disallowed_callable_ids")


def _allowed_in_graph(fn) -> bool:
    """Whether `torch.compiler.allow_in_graph(fn)` put the user function `fn` in the graph as
    one call (not traced into; run on fake tensors while tracing), as TorchDynamo does."""
    return _in_trace_rules_registry(fn, "_allowed_callable_ids")


def _in_trace_rules_registry(fn, registry: str) -> bool:
    """Whether `fn` is in one of TorchDynamo's registries of callables, read only when
    TorchDynamo's rules are imported (`allow_in_graph` and `disallow_in_graph` import them);
    a registry of another shape holds nothing."""
    rules = sys.modules.get("torch._dynamo.trace_rules")
    if rules is None:
        return False
    try:
        return id(fn) in getattr(rules, registry)
    except Exception:  # noqa: BLE001 - a registry of another shape: not in it
        return False


_recompiles_log = logging.getLogger("dynamo_rs.recompiles")


def log_recompile(frame) -> None:
    """Called when no cache entry of `frame`'s code applies (and entries exist): puts the first
    failing check of each entry in words on the `dynamo_rs.recompiles` logger (INFO)."""
    if not _recompiles_log.isEnabledFor(logging.INFO):
        return
    from dynamo_rs import _native

    code = frame.f_code
    reasons = []
    for guard, _ in _native.cache_entries(code):
        failure = getattr(guard, "first_failure", None)
        if failure is None:
            continue
        try:
            reason = failure(frame.f_locals)
        except Exception as err:  # a guard that cannot even be evaluated is a reason too
            reason = f"guard raised {type(err).__name__}: {err}"
        reasons.append(reason or "passes now (another backend's entry, or state that changed back)")
    if not reasons:
        return
    where = f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
    _recompiles_log.info("recompiling %s: %s", where, "; ".join(
        f"entry {i}: {r}" for i, r in enumerate(reasons)))


# Resume functions made for graph breaks, per original code object: {(target, stack NULLs,
# locals): code}. Weak: a code object that goes away takes its resume functions with it.
RESUME_CODES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# Each resume function's origin: {resume code: (weak reference to the original code, index of the first instruction
# of its copy of the original's body, the number of its arguments)} — a break inside it makes
# the original's resume function instead of one of its own (`rebased_resume_code`).
RESUME_ORIGINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

_graph_breaks_log = logging.getLogger("dynamo_rs.graph_breaks")
_logged_breaks: set = set()


def log_graph_break(where: str, detail: str, code: str, title: str, hint: str) -> None:
    """One message per break site and reason on the `dynamo_rs.graph_breaks` logger (INFO):
    where (the frame, and the frames it was inlined from), the user's source line, what and
    why (the break's code and title, see docs/graph-breaks.md), and a hint."""
    if (where, detail) in _logged_breaks or not _graph_breaks_log.isEnabledFor(logging.INFO):
        return
    _logged_breaks.add((where, detail))
    source = ""
    located = re.search(r"\(([^()]*):(\d+)\)", where)
    if located:
        line = linecache.getline(located.group(1), int(located.group(2))).strip()
        if line:
            source = f"\n    {line}"
    _graph_breaks_log.info("graph break at %s: %s [%s: %s]%s\n  hint: %s",
                           where, detail, code, title, source, hint)


def _operator_safe_types() -> tuple:
    import enum
    import types

    return (type, frozenset, set, types.FunctionType, types.BuiltinFunctionType, enum.Enum,
            torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout, range, slice)


def replace_contents(container, contents) -> None:
    """Replays the changes a trace made to an existing list, dict, set or deque: it ends up holding
    `contents` (a new one built from the graph's outputs), as the same object."""
    if isinstance(container, list):
        # `list`'s own slice store: a subclass may override methods (`clear`), not this.
        list.__setitem__(container, slice(None), contents)
    elif type(container) is collections.deque:
        container.clear()
        container.extend(contents)
    else:
        container.clear()
        container.update(contents)


_SETATTR_ADDS_ITEMS = None


def model_output_setattr_adds_items() -> bool:
    """Whether the installed transformers' `ModelOutput.__setattr__` makes a field that was
    None an item when given a value (`out.pooler_output = v` then in `to_tuple()`), as it does
    since it tests the dataclass fields; older versions test `self.keys()` and set the
    attribute only. Found once by trying it on a small ModelOutput."""
    global _SETATTR_ADDS_ITEMS
    if _SETATTR_ADDS_ITEMS is None:
        import dataclasses
        from typing import Any, Optional

        from transformers.utils.generic import ModelOutput

        @dataclasses.dataclass
        class _Probe(ModelOutput):
            a: Optional[Any] = None
            b: Optional[Any] = None

        probe = _Probe(a=1)
        probe.b = 2
        _SETATTR_ADDS_ITEMS = list(probe.keys()) == ["a", "b"]
    return _SETATTR_ADDS_ITEMS


_OPERATOR_SAFE = None


def operator_safe(obj) -> bool:
    """Whether an operator on `obj` (an existing object the trace holds) can be evaluated at
    trace time: the object cannot change behind the guard's back (immutable, or a set, which
    is guarded by its elements) and its operators run no user code. An ndarray or an
    instance with a Python `__mul__` is neither. Also what may be a constant argument of a
    graph node (an ndarray there would be read when compiled, not when run)."""
    global _OPERATOR_SAFE
    if _OPERATOR_SAFE is None:
        _OPERATOR_SAFE = _operator_safe_types()
    return isinstance(obj, _OPERATOR_SAFE)


_AUTOGRAD_APPLIES: "weakref.WeakKeyDictionary" = None


def autograd_function_apply(cls):
    """The graph's target for `cls.apply` (an `autograd.Function` called with inputs that
    need gradients): a plain function FX can name, one per class."""
    global _AUTOGRAD_APPLIES
    import weakref

    if _AUTOGRAD_APPLIES is None:
        _AUTOGRAD_APPLIES = weakref.WeakKeyDictionary()
    apply = _AUTOGRAD_APPLIES.get(cls)
    if apply is None:
        ref = weakref.ref(cls)

        def apply(*args):
            return ref().apply(*args)

        apply.__name__ = apply.__qualname__ = f"{cls.__name__}_apply"
        _AUTOGRAD_APPLIES[cls] = apply
    return apply


class InferenceFunctionCtx:
    """The `ctx` an `autograd.Function`'s forward gets when the trace inlines it (no input
    needs a gradient, so no backward will run): what forward records on it is kept as the
    real context would keep it, and nothing reads it afterwards."""

    def save_for_backward(self, *tensors):
        self.to_save = tensors

    def save_for_forward(self, *tensors):
        self.saved_for_forward = tensors

    def mark_dirty(self, *tensors):
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors

    def set_materialize_grads(self, value):
        self.materialize_grads = value


def initialize_lazy_module(module, fake_args, fake_kwargs) -> bool:
    """Makes the parameters of a lazy module (`nn.LazyLinear`, ...) that has none yet, as its
    first call would: `_infer_parameters` on the real module, given real stand-ins of the
    arguments' shapes (a dynamic size by its hint), outside fake mode so what it makes is
    real. The module then is the one it becomes (`Linear`), its hook removed. False when
    `module` is not such a module."""
    from torch.nn.modules.lazy import LazyModuleMixin
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if not isinstance(module, LazyModuleMixin) or not module.has_uninitialized_params():
        return False

    def real(value):
        if not isinstance(value, torch.Tensor):
            return value
        shape = [s.node.hint if isinstance(s, torch.SymInt) else s for s in value.shape]
        return torch.zeros(shape, dtype=value.dtype, device=value.device)

    with unset_fake_temporarily():
        module._infer_parameters(module, tuple(real(a) for a in fake_args),
                                 {k: real(v) for k, v in fake_kwargs.items()})
    return True


def set_function_attributes(fn, attributes, **slots):
    """A function made again by the generated code (see `make_function`), given what the
    traced code stored on it: `__name__`, `__doc__`, ... (`slots`) and its `__dict__`."""
    for name, value in slots.items():
        setattr(fn, name, value)
    fn.__dict__.update(attributes)
    return fn
