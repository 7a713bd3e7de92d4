"""The persistent capture cache: what one process captured, read back by the next without
tracing.

An entry is what a trace produced for one frame: its guards (the sources the trace read and
what each must hold), the FX graph, where the graph's inputs come from, and the code that
replaces the frame. Objects are never pickled. The file is JSON (and the replacement code's
bytecode in `marshal` form, CPython's own format for code objects, which holds literals and
code only); every object an entry refers to is written as how to find it again — a tensor by
its metadata, a function or class by its module and qualified name (a function also by a
hash of its code), a module by name, a constant by value — and an object that cannot be
written that way makes the entry not persisted at all.

Reading an entry back binds it to the frame being called: every source is read on that
frame, each object named in the file is looked up again (and must be the one found at its
source), tensors must have the metadata the trace saw and share storage as they did, and the
guard rebuilt from what was found must pass on the frame — only then is the graph handed to
the backend (whose own caches make that fast) and the entry used. Anything else — a file
from another version, a corrupt or truncated file, a source that changed, a module with
another layer, a global with another value — is a miss, and the frame is traced as usual.

Files are keyed by the code object (file, qualified name, first line, a hash of its
bytecode), the backend and compile options, and the versions of Python, torch and dynamo_rs
(including the installed files' sizes and times); each holds the most recent entries for its
key. Writes go to a temporary file renamed into place, so concurrent processes never see a
partial file.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import marshal
import os
import sys
import tempfile
import time
import types
import weakref
from collections import Counter

import torch

log = logging.getLogger("dynamo_rs.cache")

MAGIC = b"dynamo-rs capture cache\n"
FORMAT = 1
# Entries kept per file (per code object, backend and options), most recent first.
MAX_ENTRIES = 8

# What the cache did in this process: "hits" (entries bound and used), "misses" (lookups
# that found nothing usable), "saved", "not_portable" (entries that refer to an object no
# later process could find again), "rejected" (files ignored: corrupt, truncated, foreign,
# from other versions).
counters: Counter = Counter()


class NotPortable(Exception):
    """An object an entry refers to cannot be found again by a later process."""


class Mismatch(Exception):
    """An entry does not hold for the frame being called."""


class Corrupt(Exception):
    """A cache file is not one this version wrote, or was damaged."""


# ---------------------------------------------------------------------------------------
# Where and under which key


def directory() -> str:
    from dynamo_rs import config

    configured = config.capture_cache_dir
    if configured:
        return os.fspath(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dynamo_rs", "capture")


_environment: dict | None = None


def environment() -> dict:
    """What an entry's validity depends on besides its frame: the versions of Python, torch
    and dynamo_rs, and the installed dynamo_rs files (a rebuilt extension traces
    differently)."""
    global _environment
    if _environment is None:
        import dynamo_rs

        package = os.path.dirname(os.path.abspath(dynamo_rs.__file__))
        files = []
        for name in sorted(os.listdir(package)):
            if name.endswith((".py", ".so", ".pyd")):
                st = os.stat(os.path.join(package, name))
                files.append([name, st.st_size, st.st_mtime_ns])
        _environment = {
            "format": FORMAT,
            "python": sys.version,
            "torch": torch.__version__,
            "dynamo_rs": dynamo_rs.__version__,
            "files": hashlib.sha256(json.dumps(files).encode()).hexdigest(),
        }
    return _environment


def _hash_const(value, digest) -> None:
    if isinstance(value, types.CodeType):
        digest.update(b"code")
        _hash_code(value, digest)
    elif isinstance(value, (tuple, list)):
        digest.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _hash_const(item, digest)
    elif isinstance(value, frozenset):
        # Iteration order depends on string hashing, which differs between processes.
        digest.update(f"frozenset{len(value)}".encode())
        for text in sorted(repr(item) for item in value):
            digest.update(text.encode())
    else:
        digest.update(f"{type(value).__name__}:{value!r}".encode())


def _hash_code(code: types.CodeType, digest) -> None:
    for part in (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                 code.co_flags, code.co_names, code.co_varnames, code.co_freevars,
                 code.co_cellvars, code.co_name, code.co_qualname):
        digest.update(repr(part).encode())
    digest.update(code.co_code)
    digest.update(code.co_exceptiontable)
    _hash_const(code.co_consts, digest)


_code_hashes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def code_hash(code: types.CodeType) -> str:
    """A hash of what `code` does (bytecode, constants, names; not its line numbers), the
    same in every process."""
    try:
        return _code_hashes[code]
    except (KeyError, TypeError):
        pass
    digest = hashlib.sha256()
    _hash_code(code, digest)
    result = digest.hexdigest()
    try:
        _code_hashes[code] = result
    except TypeError:
        pass
    return result


def _trace_settings() -> list:
    """Settings that change what a trace makes of the same code."""
    from torch._dynamo import config as dynamo_config

    return [bool(dynamo_config.capture_scalar_outputs),
            bool(dynamo_config.capture_dynamic_output_shape_ops)]


def file_for(code: types.CodeType, converter) -> str:
    key = json.dumps([environment(), converter.cache_key, _trace_settings(), code.co_filename,
                      code.co_qualname, code.co_firstlineno, code_hash(code)])
    name = hashlib.sha256(key.encode()).hexdigest()[:40]
    return os.path.join(directory(), name[:2], name + ".json")


# ---------------------------------------------------------------------------------------
# Objects, as a later process finds them again


# Names looked up before in this process. A name rebound since (a reload, a patch) gives the
# old object, which then is not the one at its source: the entry does not hold (a miss).
_resolved: dict = {}


def _resolve_name(module: str, qualname: str):
    key = (module, qualname)
    found = _resolved.get(key)
    if found is None:
        found = _resolved[key] = _lookup_name(module, qualname)
    return found


def _lookup_name(module: str, qualname: str):
    mod = sys.modules.get(module)
    if mod is None:
        import importlib

        try:
            mod = importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any failure to import is a miss
            raise Mismatch(f"cannot import {module}: {err}") from None
    obj = mod
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise Mismatch(f"{module}.{qualname} not found") from None
    return obj


def _name_of(obj) -> tuple[str, str] | None:
    """(module, qualified name) under which `obj` is found again, if there is one."""
    candidates = []
    module = getattr(obj, "__module__", None)
    self = getattr(obj, "__self__", None)
    if isinstance(self, types.ModuleType):
        module = self.__name__
    qualname = getattr(obj, "__qualname__", None)
    name = getattr(obj, "__name__", None)
    if isinstance(module, str):
        for q in (qualname, name):
            if isinstance(q, str) and "<" not in q:
                candidates.append((module, q))
    if isinstance(obj, type) and isinstance(name, str):
        # Types of builtins without a name of their own there (`function`, `method`).
        candidates.append(("types", next((k for k, v in vars(types).items() if v is obj), name)))
    for module, q in candidates:
        try:
            if _resolve_name(module, q) is obj:
                return module, q
        except Mismatch:
            continue
    return None


def _function_facts(fn: types.FunctionType) -> list:
    """What a Python function's behaviour in a trace depends on besides its globals and
    cells (guarded where read): its code, defaults and closure size."""
    return [code_hash(fn.__code__), encode(fn.__defaults__), encode(fn.__kwdefaults__),
            fn.__globals__.get("__name__"), len(fn.__closure__ or ())]


_torch_attrs: dict | None = None


def _torch_attr_name(obj) -> str | None:
    """The name in `torch` of a memory format, layout or similar singleton."""
    global _torch_attrs
    if _torch_attrs is None:
        _torch_attrs = {}
        kinds = (torch.memory_format, torch.layout, torch.qscheme)
        for name in dir(torch):
            value = getattr(torch, name, None)
            if isinstance(value, kinds):
                _torch_attrs.setdefault(id(value), name)
    name = _torch_attrs.get(id(obj))
    return name if name is not None and getattr(torch, name, None) is obj else None


def encode(obj):
    """`obj` as JSON: constants by value, everything else by how to find it again; raises
    NotPortable for an object no later process could find."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if type(obj) is int:
        return obj
    if type(obj) is float:
        return ["float", obj.hex()]
    if type(obj) is tuple:
        return ["tuple", [encode(v) for v in obj]]
    if type(obj) is list:
        return ["list", [encode(v) for v in obj]]
    if type(obj) is dict:
        if obj is __builtins__ or obj is getattr(sys.modules.get("builtins"), "__dict__", None):
            return ["globals", "builtins"]
        if "__name__" in obj and "__builtins__" in obj:
            # A module's globals, by the module's name (not its own `__name__` when it was
            # imported under another).
            name = obj.get("__name__")
            if isinstance(name, str) and getattr(sys.modules.get(name), "__dict__", None) is obj:
                return ["globals", name]
            for key, module in list(sys.modules.items()):
                if getattr(module, "__dict__", None) is obj:
                    return ["globals", key]
            raise NotPortable(f"the globals of {name}, not an imported module")
        return ["dict", [[encode(k), encode(v)] for k, v in obj.items()]]
    if type(obj) is slice:
        return ["slice", [encode(obj.start), encode(obj.stop), encode(obj.step)]]
    if obj is Ellipsis:
        return ["ellipsis"]
    if type(obj) is bytes:
        return ["bytes", obj.hex()]
    if isinstance(obj, torch.dtype):
        return ["dtype", str(obj).removeprefix("torch.")]
    if isinstance(obj, torch.device):
        return ["device", str(obj)]
    if type(obj) is torch.Size:
        return ["size", list(obj)]
    if isinstance(obj, types.ModuleType):
        if sys.modules.get(obj.__name__) is obj:
            return ["module", obj.__name__]
        # A module under another name than its own (`_io` calls itself "io").
        for key, module in list(sys.modules.items()):
            if module is obj:
                return ["module", key]
        raise NotPortable(f"module {obj.__name__} not in sys.modules")
    if type(obj).__name__ == "DisabledFunction" and type(obj).__module__ == "dynamo_rs._native":
        return ["disabled", encode(obj.wrapped_callable)]
    torch_name = _torch_attr_name(obj)
    if torch_name is not None:
        return ["torch", torch_name]
    if isinstance(obj, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        # An operator of `torch.ops` by namespace, name and overload (`aten.shallow_copy_data_`).
        overload = obj._overloadname if isinstance(obj, torch._ops.OpOverload) else None
        packet = obj.overloadpacket if overload is not None else obj
        namespace, name = packet._qualified_op_name.split("::", 1)
        return ["op", namespace, name, overload]
    named = _name_of(obj)
    if named is not None:
        facts = _function_facts(obj) if isinstance(obj, types.FunctionType) else None
        return ["named", named[0], named[1], facts]
    owner = getattr(obj, "__self__", None)
    if isinstance(obj, types.BuiltinMethodType) and isinstance(owner, type):
        # A builtin bound to a class (`object.__new__`).
        if getattr(owner, obj.__name__, None) is obj:
            return ["getattr", encode(owner), obj.__name__]
    if isinstance(obj, (types.BuiltinMethodType, types.MethodDescriptorType,
                        types.WrapperDescriptorType, types.MethodWrapperType,
                        types.ClassMethodDescriptorType)) and hasattr(obj, "__objclass__"):
        owner = encode(obj.__objclass__)
        return ["attribute", owner, obj.__name__]
    raise NotPortable(f"{type(obj).__qualname__} object {_short(obj)}")


def _encode_or_none(obj):
    try:
        return encode(obj)
    except NotPortable:
        return None


def decode(value, nodes=None):
    """The object `encode` wrote as `value`, found in this process; raises Mismatch when it
    is not there (any more) or is not what was written. In a graph node's arguments
    (`graph_record`), `nodes` are the nodes made so far, which `["node", i]` stands for."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    tag = value[0]
    if tag == "node" and nodes is not None:
        return nodes[value[1]]
    if tag == "const" and nodes is not None:
        return decode(value[1])
    if tag == "float":
        return float.fromhex(value[1])
    if tag == "tuple":
        return tuple(decode(v, nodes) for v in value[1])
    if tag == "list":
        return [decode(v, nodes) for v in value[1]]
    if tag == "dict":
        return {decode(k): decode(v, nodes) for k, v in value[1]}
    if tag == "globals":
        if value[1] == "builtins":
            import builtins

            return builtins.__dict__
        return decode(["module", value[1]]).__dict__
    if tag == "slice":
        return slice(*(decode(v, nodes) for v in value[1]))
    if tag == "ellipsis":
        return Ellipsis
    if tag == "bytes":
        return bytes.fromhex(value[1])
    if tag == "dtype":
        dtype = getattr(torch, value[1], None)
        if not isinstance(dtype, torch.dtype):
            raise Mismatch(f"no dtype {value[1]}")
        return dtype
    if tag == "device":
        return torch.device(value[1])
    if tag == "size":
        return torch.Size(value[1])
    if tag == "module":
        module = sys.modules.get(value[1])
        if module is None:
            import importlib

            try:
                module = importlib.import_module(value[1])
            except Exception as err:  # noqa: BLE001 - any failure to import is a miss
                raise Mismatch(f"cannot import {value[1]}: {err}") from None
        return module
    if tag == "sys_modules":
        return sys.modules
    if tag == "getattr":
        owner = decode(value[1])
        try:
            return getattr(owner, value[2])
        except AttributeError:
            raise Mismatch(f"no {value[2]} on {owner!r}") from None
    if tag == "disabled":
        from dynamo_rs import _native

        return _native.DisabledFunction(decode(value[1]))
    if tag == "torch":
        return getattr(torch, value[1])
    if tag == "named":
        obj = _resolve_name(value[1], value[2])
        if value[3] is not None:
            if not isinstance(obj, types.FunctionType) or _function_facts(obj) != value[3]:
                raise Mismatch(f"{value[1]}.{value[2]} changed")
        return obj
    if tag == "op":
        try:
            op = getattr(getattr(torch.ops, value[1]), value[2])
            return op if value[3] is None else getattr(op, value[3])
        except (AttributeError, RuntimeError):
            raise Mismatch(f"no operator {value[1]}::{value[2]}") from None
    if tag == "attribute":
        owner = decode(value[1])
        try:
            return owner.__dict__[value[2]]
        except (AttributeError, KeyError):
            raise Mismatch(f"no {value[2]} on {owner!r}") from None
    raise Corrupt(f"unknown object tag {tag!r}")


def _short(obj) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - any repr failure
        text = "<unprintable>"
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------
# Tensors: what the trace saw of them


_type_names: dict = {}


def tensor_facts(t) -> list:
    """What the trace saw of a tensor (what torch's tensor guard checks, and its class,
    offset and whether it is a leaf), comparable with what a file holds."""
    cls = type(t)
    name = _type_names.get(cls)
    if name is None:
        name = _type_names[cls] = encode(cls)
    return [str(t.dtype), str(t.device), list(t.shape), list(t.stride()), t.requires_grad,
            str(torch._C._dispatch_keys(t)), name, t.storage_offset(), t.is_leaf]


# ---------------------------------------------------------------------------------------
# Writing an entry


# Types FX puts in node arguments that are not plain tuples (torch.Size, named tuples):
# written as constants, by `encode`.
_STRUCT_TYPES = (torch.Size,)


def graph_record(gm: torch.fx.GraphModule):
    """The graph, as the file stores it: nodes (op, name, target, args, kwargs) with
    earlier nodes by index; None if some target or constant cannot be written."""
    index = {}
    nodes = []

    def arg(value):
        if isinstance(value, torch.fx.Node):
            return ["node", index[value]]
        if isinstance(value, (tuple, list)) and type(value) not in _STRUCT_TYPES:
            return ["list" if isinstance(value, list) else "tuple", [arg(v) for v in value]]
        if isinstance(value, dict):
            return ["dict", [[encode(k), arg(v)] for k, v in value.items()]]
        if type(value) is slice:
            return ["slice", [arg(value.start), arg(value.stop), arg(value.step)]]
        return ["const", encode(value)]

    try:
        for node in gm.graph.nodes:
            value = _value_record(node.meta["example_value"]) if "example_value" in node.meta else None
            if node.op == "placeholder":
                # The target is the argument's name in the code (`L_x_`), the node's name
                # may differ (`l_x_`).
                nodes.append(["placeholder", node.name, node.target, None, None])
            elif node.op == "call_function":
                nodes.append(["call_function", node.name, encode(node.target),
                              arg(node.args), arg(node.kwargs)])
            elif node.op == "call_method":
                nodes.append(["call_method", node.name, node.target, arg(node.args),
                              arg(node.kwargs)])
            elif node.op == "output":
                nodes.append(["output", node.name, None, arg(node.args), None])
            else:
                raise NotPortable(f"a graph node of kind {node.op}")
            nodes[-1].append(value)
            index[node] = len(nodes) - 1
    except NotPortable as why:
        counters["not_portable"] += 1
        log.debug("not persisted: the graph refers to %s", why)
        return None
    return {"nodes": nodes, "code": _code_record(gm)}


def _code_record(gm: torch.fx.GraphModule):
    """The Python code FX generates for the graph (source, and the globals it names), so a
    later process need not generate it again; None if a global cannot be written."""
    code = gm.graph.python_code(root_module="self")
    try:
        names = [[name, encode(value)] for name, value in code.globals.items()]
    except NotPortable:
        return None
    return {"src": code.src, "globals": names, "prologue": code._prologue_start,
            "lines": None if code._lineno_map is None else [[k, v] for k, v in code._lineno_map.items()]}


class _StoredCode(torch.fx.graph.CodeGen):
    """Gives the stored Python code of a graph the first time its code is generated (when
    the GraphModule is made), and generates it as usual after that (a pass that changes the
    graph makes new code)."""

    def __init__(self, code) -> None:
        super().__init__()
        self.stored = code

    def _gen_python_code(self, *args, **kwargs):
        stored, self.stored = self.stored, None
        if stored is not None:
            return stored
        return super()._gen_python_code(*args, **kwargs)


def _value_record(value):
    """A node's example value as the file stores it: a tensor by its metadata (rebuilt as a
    fake tensor of the same sizes and strides), tuples and lists of those, constants."""
    if isinstance(value, torch.Tensor):
        if type(value).__name__ != "FakeTensor" or not _plain_fake(value):
            raise NotPortable("an example value that is not a plain tensor")
        return ["tensor", list(value.shape), list(value.stride()), str(value.dtype).removeprefix("torch."),
                str(value.device), value.requires_grad, value.storage_offset()]
    if type(value) in (tuple, list):
        return [type(value).__name__, [_value_record(v) for v in value]]
    if value is None or type(value) in (int, float, bool):
        return ["const", encode(value)]
    raise NotPortable(f"an example value of type {type(value).__qualname__}")


def _plain_fake(t) -> bool:
    return (t.layout == torch.strided and not t.is_quantized and not t.is_sparse
            and all(isinstance(d, int) for d in t.shape) and all(isinstance(d, int) for d in t.stride()))


_dtypes: dict = {}
_devices: dict = {}


def _dtype(name: str):
    dtype = _dtypes.get(name)
    if dtype is None:
        dtype = _dtypes[name] = decode(["dtype", name])
    return dtype


def _device(name: str):
    device = _devices.get(name)
    if device is None:
        device = _devices[name] = torch.device(name)
    return device


def _fake_value(mode, record):
    """A fake tensor (or structure of them) made from a `_value_record`; called with
    dispatch off."""
    from dynamo_rs._capture import strided_fake

    tag = record[0]
    if tag == "tensor":
        shape, stride, dtype, device, requires_grad, offset = record[1:]
        return strided_fake(mode, shape, stride, _dtype(dtype), _device(device), requires_grad, offset)
    if tag in ("tuple", "list"):
        items = [_fake_value(mode, r) for r in record[1]]
        return tuple(items) if tag == "tuple" else items
    if tag == "const":
        return decode(record[1])
    raise Corrupt(f"unknown example value tag {tag!r}")


def rebuild_graph(record, mode=None, inputs=()) -> torch.fx.GraphModule:
    """The GraphModule of a stored graph; with a fake mode, every node gets its example
    value as the trace gave it (placeholders: the fakes of `inputs`, the real tensors the
    graph is compiled for), which AOTAutograd's cache and Inductor's passes read."""
    from torch.utils._mode_utils import no_dispatch

    from dynamo_rs._capture import to_fake

    nodes = record["nodes"]
    graph = torch.fx.Graph()
    made: list = []

    real = iter(inputs)
    for op, name, target, args, kwargs, value in nodes:
        if op == "placeholder":
            node = graph.placeholder(target)
            if mode is not None:
                example = next(real)
                # Static fakes made first, as the trace made them (the backend's own
                # conversion would give them symbolic sizes under a ShapeEnv).
                node.meta["example_value"] = (to_fake(mode, example) if isinstance(example, torch.Tensor)
                                              else example)
        elif op == "output":
            node = graph.output(decode(args, made)[0])
        elif op in ("call_function", "call_method"):
            target = decode(target) if op == "call_function" else target
            node = graph.create_node(op, target, decode(args, made), decode(kwargs, made), name=name)
            if mode is not None and value is not None:
                with no_dispatch():
                    node.meta["example_value"] = _fake_value(mode, value)
        else:
            raise Corrupt(f"unknown graph node kind {op!r}")
        made.append(node)
    code = record.get("code")
    if code is not None:
        lines = code["lines"]
        graph._codegen = _StoredCode(torch.fx.graph.PythonCode(
            code["src"], {name: decode(value) for name, value in code["globals"]},
            None if lines is None else {k: v for k, v in lines}, code["prologue"]))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    graph._codegen = torch.fx.graph.CodeGen()
    if code is not None and _verify():
        # The test suite checks that the stored code is what FX generates for the graph.
        fresh = graph.python_code(root_module="self").src
        if fresh != gm.code:
            raise Corrupt("the stored graph code differs from the graph's")
    return gm


def _verify() -> bool:
    from dynamo_rs import config

    return bool(config.verify_meta_rules)


def _encode_guards(description: dict, frame_globals: dict) -> dict:
    """The guard description (`persist::describe`) with every object encoded."""
    sources = []
    raw = description["sources"]
    id_values = {i: g[2] for g in description["guards"] if g[1] == "id" for i in [g[0]]}
    for index, entry in enumerate(raw):
        kind, parent = entry[0], entry[1]
        if kind == "local":
            sources.append(["local", None, entry[2]])
        elif kind == "global":
            _, _, name, globals_, builtins_, root = entry
            where = "frame" if globals_ is frame_globals else encode(globals_)
            sources.append(["global", None, name, where, encode(builtins_), root])
        elif kind == "cell":
            cell = entry[2]
            found = None
            # Read through a function the cell belongs to, at a source that does not
            # itself go through this cell (one interned before it).
            for sid, fn in sorted(id_values.items()):
                closure = getattr(fn, "__closure__", None) or () if sid < index else ()
                for k, c in enumerate(closure):
                    if c is cell and found is None:
                        found = (sid, k)
            if found is None:
                raise NotPortable("a closure cell of a function not known by its source")
            sources.append(["cell", None, found[0], found[1]])
        elif kind == "object":
            root = entry[2]
            if root is sys.modules:
                where = ["sys_modules"]
            else:
                where = encode(root)
                if isinstance(where, list) and where[0] in ("dict", "list", "tuple", "slice"):
                    # Read through on every call: a copy made when loading would not do.
                    raise NotPortable(f"a {where[0]} guarded by its contents as a root")
            sources.append(["object", None, where, entry[3]])
        elif kind in ("attr", "classattr"):
            sources.append([kind, parent, entry[2]])
        elif kind == "item":
            sources.append(["item", parent, encode(entry[2])])
        else:
            raise NotPortable(f"a source of kind {kind}")
    guards = []
    first_of_object: dict = {}
    for g in description["guards"]:
        try:
            _encode_guard(g, guards, first_of_object)
        except NotPortable as why:
            raise NotPortable(f"{why}, in a {g[1]} guard on {_path(raw, g[0])}") from None
    state = description["global_state"]
    return {
        "sources": sources,
        "guards": guards,
        "grad_mode": description["grad_mode"],
        "global_state": None if state is None else state.__getstate__(),
        "mutates_in_place": description["mutates_in_place"],
        "examples": description["examples"],
    }


def _encode_guard(g, guards: list, first_of_object: dict) -> None:
    """Appends guard `g` of a description, encoded, to `guards`. Guards that bind an object
    (tensors, identities) end with which earlier such guard saw the same object (None: a
    new one): a later process must find the same pattern of shared and distinct objects."""
    sid, kind = g[0], g[1]
    if kind in ("tensor", "id"):
        value = g[2]
        first = first_of_object.setdefault(id(value), len(guards))
        alias = None if first == len(guards) else first
        if kind == "tensor":
            # By its metadata, bound to the tensor at the source then.
            guards.append([sid, kind, tensor_facts(value), alias])
        elif type(value) in (tuple, frozenset):
            # A tuple of constants (a function's `__defaults__`) by value, bound to the
            # equal tuple at the source then: what the trace read of it is its items.
            guards.append([sid, "value", encode(value), alias])
        elif isinstance(value, types.CodeType):
            # A code object (a function's `__code__`) by what it does.
            guards.append([sid, "code", code_hash(value), alias])
        else:
            try:
                # By name: the object found under it must be the one at the source.
                guards.append([sid, kind, encode(value), alias])
            except NotPortable:
                if isinstance(value, types.FunctionType):
                    # A function by what it does, bound to the function at the source.
                    guards.append([sid, "function", _function_facts(value), alias])
                elif _name_of(type(value)) is not None and _plain_instance(value):
                    # A long-lived object (a module-level registry) by its class, bound
                    # to the instance at the source: what the trace read of it is guarded
                    # where it was read.
                    guards.append([sid, "instance", encode(type(value)), alias])
                else:
                    raise
    elif kind in ("equals", "type", "keys"):
        guards.append([sid, kind, encode(g[2])])
    elif kind == "contains":
        guards.append([sid, kind, encode(g[2]), g[3]])
    elif kind == "hasattr":
        guards.append([sid, kind, g[2], g[3]])
    elif kind in ("len", "same_object_class", "instance_dict_lacks", "module_call"):
        guards.append([sid, kind, g[2]])
    else:
        raise NotPortable(f"a guard of kind {kind}")


def _plain_instance(value) -> bool:
    """An instance (of a class, a container): not a type, function, module or code object,
    which are found by name or by what they do."""
    return not isinstance(value, (type, types.FunctionType, types.ModuleType, types.CodeType,
                                  types.BuiltinFunctionType))


def _path(sources, i: int) -> str:
    """A readable path of source `i` of a description, for messages."""
    entry = sources[i]
    kind = entry[0]
    if kind in ("local", "global"):
        return f"{'L' if kind == 'local' else 'G'}[{entry[2]!r}]"
    if kind in ("cell", "object"):
        return f"<{kind}>"
    parent = _path(sources, entry[1])
    if kind == "attr":
        return f"{parent}.{entry[2]}"
    if kind == "classattr":
        return f"getattr_static({parent}, {entry[2]!r})"
    return f"{parent}[{_short(entry[2])}]"


def _encode_code(code: types.CodeType, graph_token) -> tuple[str, list]:
    """The replacement code as marshal bytes (base64) with every constant marshal cannot
    hold replaced by a placeholder, and those constants encoded."""
    consts = list(code.co_consts)
    refs = []
    for i, value in enumerate(consts):
        if value is graph_token:
            refs.append([i, ["graph"]])
        elif _marshallable(value):
            continue
        else:
            ref = encode(value)
            if _holds_container(ref):
                # The code may change it: a copy would not do.
                raise NotPortable("a list or dict among the code's constants")
            refs.append([i, ref])
        consts[i] = None
    blob = marshal.dumps(code.replace(co_consts=tuple(consts)))
    return base64.b64encode(blob).decode(), refs


def _holds_container(ref) -> bool:
    """Whether an encoding holds a list or dict written by value (anywhere inside)."""
    if not isinstance(ref, list) or not ref:
        return False
    if ref[0] in ("dict", "list"):
        return True
    return ref[0] == "tuple" and any(_holds_container(item) for item in ref[1])


def _marshallable(value) -> bool:
    if value is None or value is Ellipsis or type(value) in (bool, int, float, complex, str, bytes):
        return True
    if type(value) in (tuple, frozenset):
        return all(_marshallable(v) for v in value)
    if type(value) is types.CodeType:
        return all(_marshallable(v) for v in value.co_consts)
    return False


def save(code, converter, description, inputs, graph, new_code, graph_token, layout) -> None:
    """Adds the entry just compiled for a frame of `code` to its file (see the module's
    documentation); an entry that refers to an object no later process could find is not
    written. Never raises: the cache is an optimisation."""
    try:
        if description["symbolic"]:
            raise NotPortable("symbolic sizes (dynamic shapes are not persisted yet)")
        frame_globals = None
        for source in description["sources"]:
            if source[0] == "global" and source[5]:
                frame_globals = source[3]
        entry = {
            "guards": _encode_guards(description, frame_globals),
            "inputs": list(inputs),
            "input_paths": list(description["input_paths"]),
            "graph": graph,
            "layout": list(layout),
            "created": time.time(),
        }
        entry["code"], entry["consts"] = _encode_code(new_code, graph_token)
    except NotPortable as why:
        counters["not_portable"] += 1
        log.debug("not persisted: %s (%s)", code.co_qualname, why)
        return
    except Exception as err:  # noqa: BLE001 - never fail a compile over the cache
        _warn_once(f"could not write an entry for {code.co_qualname}: {type(err).__name__}: {err}")
        return
    try:
        path = file_for(code, converter)
        try:
            entries = _read(path)["entries"]
        except (OSError, Corrupt):
            entries = []
        entries = [entry] + entries[: MAX_ENTRIES - 1]
        _write(path, {"format": FORMAT, "environment": environment(),
                      "backend": converter.cache_key, "code": _code_label(code),
                      "entries": entries})
        counters["saved"] += 1
    except Exception as err:  # noqa: BLE001 - never fail a compile over the cache
        _warn_once(f"could not write the capture cache: {type(err).__name__}: {err}")


def _code_label(code) -> str:
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


def _write(path: str, payload: dict) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    write_replacing(path, MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def write_replacing(path: str, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path` and renames it into place: a
    concurrent reader sees the old file or the new one, never a part."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def _read(path: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC):
        raise Corrupt("not a dynamo_rs capture cache file")
    rest = data[len(MAGIC):]
    digest, _, body = rest.partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise Corrupt("checksum mismatch (truncated or damaged)")
    try:
        payload = json.loads(body)
    except ValueError as err:
        raise Corrupt(f"unreadable: {err}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise Corrupt("another format")
    if payload.get("environment") != environment():
        raise Corrupt("written by other versions of Python, torch or dynamo_rs")
    if not isinstance(payload.get("entries"), list):
        raise Corrupt("no entries")
    return payload


_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("dynamo_rs capture cache: %s", message)


# ---------------------------------------------------------------------------------------
# Reading an entry back


def load(frame, converter):
    """An entry for `frame` from its file, bound to the frame's objects and compiled by the
    converter's backend, as `(guard, code, seconds spent in the backend)`; None when no
    entry holds. Never raises: a damaged or stale file is a miss (one log line)."""
    code = frame.f_code
    try:
        path = file_for(code, converter)
        try:
            payload = _read(path)
        except FileNotFoundError:
            counters["misses"] += 1
            return None
        except (OSError, Corrupt) as why:
            counters["rejected"] += 1
            _warn_once(f"ignored {path}: {why}")
            return None
        for entry in payload["entries"]:
            try:
                bound = _bind(entry, frame, converter)
            except Mismatch as why:
                log.debug("entry for %s does not hold: %s", code.co_qualname, why)
                continue
            except (Corrupt, KeyError, IndexError, TypeError, ValueError) as why:
                counters["rejected"] += 1
                _warn_once(f"ignored an entry of {path}: {type(why).__name__}: {why}")
                continue
            counters["hits"] += 1
            return bound
        counters["misses"] += 1
        return None
    except Exception as err:  # noqa: BLE001 - never fail a call over the cache
        counters["rejected"] += 1
        _warn_once(f"could not read an entry for {code.co_qualname}: {type(err).__name__}: {err}")
        return None


_roots: dict = {}


def _decode_root(value):
    """`decode` for the roots of sources (module globals, builtins, classes), remembered by
    their encoding: the same few recur in every source of an entry."""
    key = json.dumps(value)
    found = _roots.get(key)
    if found is None:
        found = _roots[key] = decode(value)
    return found


class _Frame:
    """The sources of one entry, read on one frame, each once."""

    def __init__(self, frame, sources) -> None:
        self.locals = frame.f_locals
        self.globals = frame.f_globals
        self.builtins = frame.f_builtins
        self.sources = sources
        self.values: dict = {}

    def dicts(self, source):
        where = self.globals if source[3] == "frame" else _decode_root(source[3])
        return where, _decode_root(source[4])

    def value(self, i: int):
        if i in self.values:
            return self.values[i]
        source = self.sources[i]
        kind = source[0]
        try:
            if kind == "local":
                result = self.locals[source[2]]
            elif kind == "global":
                globals_, builtins_ = self.dicts(source)
                name = source[2]
                result = globals_[name] if name in globals_ else builtins_[name]
            elif kind == "cell":
                fn = self.value(source[2])
                result = fn.__closure__[source[3]].cell_contents
            elif kind == "object":
                result = _decode_root(source[2])
            elif kind == "attr":
                result = getattr(self.value(source[1]), source[2])
            elif kind == "classattr":
                cls = self.value(source[1])
                for klass in type.__getattribute__(cls, "__mro__"):
                    if source[2] in klass.__dict__:
                        result = klass.__dict__[source[2]]
                        break
                else:
                    raise Mismatch(f"no class attribute {source[2]}")
            elif kind == "item":
                result = self.value(source[1])[decode(source[2])]
            else:
                raise Corrupt(f"unknown source kind {kind!r}")
        except (Mismatch, Corrupt):
            raise
        except Exception as err:  # noqa: BLE001 - a source that cannot be read is a miss
            raise Mismatch(f"source {i} ({kind}) cannot be read: {type(err).__name__}") from None
        self.values[i] = result
        return result

    def live_source(self, i: int) -> tuple:
        """Source `i` as `persist::restore_guard` takes it, with this process's objects."""
        source = self.sources[i]
        kind, parent = source[0], source[1]
        if kind == "local":
            return ("local", None, source[2])
        if kind == "global":
            globals_, builtins_ = self.dicts(source)
            return ("global", None, source[2], globals_, builtins_, source[5])
        if kind == "cell":
            fn = self.value(source[2])
            return ("cell", None, fn.__closure__[source[3]])
        if kind == "object":
            return ("object", None, _decode_root(source[2]), source[3])
        if kind in ("attr", "classattr"):
            return (kind, parent, source[2])
        return ("item", parent, decode(source[2]))


# Guards bound to whatever object is at their source when loading, by kind: whether that
# object is what the file recorded (see `_encode_guard`).
_AT_SOURCE = {
    "tensor": lambda v, facts: isinstance(v, torch.Tensor) and tensor_facts(v) == facts,
    "function": lambda v, facts: isinstance(v, types.FunctionType) and _function_facts(v) == facts,
    "code": lambda v, digest: isinstance(v, types.CodeType) and code_hash(v) == digest,
    "value": lambda v, encoded: type(v) in (tuple, frozenset) and _encode_or_none(v) == encoded,
    "instance": lambda v, cls: type(v) is decode(cls),
}


def _check_argument_types(spec: dict, frame_locals) -> None:
    """Raises Mismatch at once when an argument of the frame is not of the class an entry
    requires, by the class's name: one code object often has entries for several callers
    (a decorator's `wrapper` around every model's `forward`), and binding another model's
    entry would look up (even import) its classes before its guards fail."""
    sources = spec["sources"]
    for g in spec["guards"]:
        if g[1] not in ("type", "instance"):
            continue
        source, cls = sources[g[0]], g[2]
        if source[0] != "local" or not (isinstance(cls, list) and cls and cls[0] == "named"):
            continue
        try:
            live = type(frame_locals[source[2]])
        except KeyError:
            raise Mismatch(f"no local {source[2]}") from None
        wanted = (cls[1], cls[2])
        if (getattr(live, "__module__", None), getattr(live, "__qualname__", None)) != wanted \
                and _name_of(live) != wanted:  # (a builtin type is written by another name)
            raise Mismatch(f"{source[2]} is a {live.__qualname__}, not a {cls[2]}")


def _bind(entry: dict, frame, converter):
    from dynamo_rs import _native
    from dynamo_rs._capture import release_real_tensor_memos
    from dynamo_rs._shapes import call_backend, new_fake_mode

    spec = entry["guards"]
    _check_argument_types(spec, frame.f_locals)
    reader = _Frame(frame, spec["sources"])
    guards = []
    # The objects of guards with no alias, by identity (held in `guards`, so ids stay
    # theirs meanwhile).
    distinct: set = set()

    def bound(sid: int, kind: str, value, alias) -> None:
        # The same pattern of shared and distinct objects as when traced.
        if alias is None:
            if id(value) in distinct:
                raise Mismatch(f"the object at source {sid} is another guarded one")
            distinct.add(id(value))
        elif guards[alias][2] is not value:
            raise Mismatch(f"the object at source {sid} is not the one it was")
        guards.append((sid, kind, value))

    for g in spec["guards"]:
        sid, kind = g[0], g[1]
        if kind in _AT_SOURCE:
            # Bound to the object at its source now, if it is what the file recorded.
            value = reader.value(sid)
            if not _AT_SOURCE[kind](value, g[2]):
                raise Mismatch(f"the {kind} at source {sid} differs")
            bound(sid, "tensor" if kind == "tensor" else "id", value, g[3])
        elif kind == "id":
            bound(sid, "id", decode(g[2]), g[3])
        elif kind in ("equals", "type", "keys"):
            guards.append((sid, kind, decode(g[2])))
        elif kind == "contains":
            guards.append((sid, kind, decode(g[2]), g[3]))
        elif kind == "hasattr":
            guards.append((sid, kind, g[2], g[3]))
        elif kind in ("len", "same_object_class", "instance_dict_lacks", "module_call"):
            guards.append((sid, kind, g[2]))
        else:
            raise Corrupt(f"unknown guard kind {kind!r}")
    state = None
    if spec["global_state"] is not None:
        from torch._C._dynamo.guards import GlobalStateGuard

        state = GlobalStateGuard.__new__(GlobalStateGuard)
        state.__setstate__(spec["global_state"])
    description = {
        "sources": [reader.live_source(i) for i in range(len(spec["sources"]))],
        "guards": guards,
        "grad_mode": spec["grad_mode"],
        "global_state": state,
        "mutates_in_place": spec["mutates_in_place"],
        "examples": {i: reader.value(i) for i in spec["examples"]},
    }
    layout = entry["layout"]
    inputs = entry["inputs"]
    guard = _native.restore_guard(description, layout, inputs, converter)
    failure = guard.first_failure(frame.f_locals)
    if failure is not None:
        raise Mismatch(failure)
    # The entry holds: compile its graph (the backend's own caches make this fast).
    examples = [reader.value(i) for i in inputs]
    mode = new_fake_mode()
    try:
        gm = rebuild_graph(entry["graph"], mode, examples)
        start = time.perf_counter()
        compiled = call_backend(converter.backend, gm, examples, mode)
        backend_seconds = time.perf_counter() - start
    finally:
        release_real_tensor_memos(mode)
    if not callable(compiled):
        raise Mismatch("the backend returned something not callable")
    token = _native.DisabledFunction(compiled)
    guard.set_graph_token(token)
    code = marshal.loads(base64.b64decode(entry["code"]))
    if not isinstance(code, types.CodeType):
        raise Corrupt("the stored code is not a code object")
    consts = list(code.co_consts)
    for i, ref in entry["consts"]:
        consts[i] = token if ref == ["graph"] else decode(ref)
    code = code.replace(co_consts=tuple(consts))
    _record_sizes(frame.f_code, converter, entry["input_paths"], examples)
    return guard, code, backend_seconds


def _record_sizes(code, converter, paths, examples) -> None:
    """Records the sizes of the graph's input tensors for automatic dynamic shapes, as a
    trace would have (a later call with other sizes then compiles the changed dimensions
    symbolic at once, not one more static graph first)."""
    from dynamo_rs._shapes import dynamic_dims

    for path, value in zip(paths, examples):
        module_owned = "._parameters[" in path or "._buffers[" in path
        if isinstance(value, torch.Tensor) and type(value) is not torch.nn.Parameter and not module_owned:
            dynamic_dims(value, code, path, converter.dynamic, False)


def clear() -> None:
    """Deletes every entry of the persistent capture cache (the directory's files)."""
    import shutil

    folder = directory()
    if os.path.isdir(folder):
        shutil.rmtree(folder, ignore_errors=True)
