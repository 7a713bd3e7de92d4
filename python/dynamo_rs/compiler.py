"""`dynamo_rs.compile`: the same signature and behaviour as `torch.compile`."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from dynamo_rs import _inductor_keys, _native
from dynamo_rs.backends import resolve_backend


def compile(  # noqa: A001 - the name mirrors torch.compile
    model: Callable | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable = "inductor",
    mode: str | None = None,
    options: dict | None = None,
    disable: bool = False,
):
    """Compiles `model` (a function or an `nn.Module`) like `torch.compile`: frames are
    captured into FX graphs, handed to `backend(gm, example_inputs)`, guarded, and run
    through the compiled graph while the guards hold."""
    if model is None:
        return functools.partial(compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                 mode=mode, options=options, disable=disable)
    if not callable(model):
        raise TypeError(f"dynamo_rs.compile() expects a callable or an nn.Module, not {type(model).__name__}")
    if disable:
        return model
    # A function or module compiled already (by us or by torch.compile): the outer compile
    # wins, as in torch.compile — the original is compiled with these settings.
    if isinstance(model, OptimizedModule) or (type(model).__name__ == "OptimizedModule" and \
            type(model).__module__ == "torch._dynamo.eval_frame"):
        model = model._orig_mod
    elif getattr(model, "_dynamo_rs_converter", None) is not None and \
            getattr(model, "_torchdynamo_orig_callable", None) is not None:
        model = model._torchdynamo_orig_callable
    if backend == "inductor" or (mode is not None or options is not None):
        if backend != "inductor":
            raise ValueError("mode and options only apply to the inductor backend")
        compiler = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        _inductor_keys.start()
    else:
        compiler = resolve_backend(backend)
    # Backends that run graphs through AOTAutograd's partitioner, which keeps what random
    # operations drew for backward: a checkpointed function with dropout can be captured.
    random_recompute = isinstance(backend, str) and backend in _AOT_BACKENDS
    converter = _native.Converter(compiler, fullgraph=fullgraph, dynamic=dynamic,
                                  cache_key=_cache_key(backend, mode, options, fullgraph, dynamic),
                                  random_recompute=random_recompute)
    if isinstance(model, torch.nn.Module):
        return OptimizedModule(model, converter)
    return _compiled_function(model, converter)


_AOT_BACKENDS = frozenset(("inductor", "aot_eager", "aot_eager_decomp_partition",
                           "aot_eager_decomp_partition_with_mode"))


def _cache_key(backend, mode, options, fullgraph, dynamic) -> str | None:
    """How the persistent capture cache names this compile's backend and options; None when
    the backend is a callable (no later process can be known to have the same one) or the
    options are not plain data."""
    import json

    if not isinstance(backend, str):
        return None
    try:
        return json.dumps([backend, mode, options, fullgraph, dynamic], sort_keys=True)
    except (TypeError, ValueError):
        return None


# `_run(converter, fn, args, kwargs)`: `fn(*args, **kwargs)` with the converter installed as
# this thread's frame callback, the previous one restored afterwards (one native call).
_run = _native.call_with_callback
# `_call_compiled_module(wrapper, args, kwargs)`: `OptimizedModule.__call__` (see there).
_call_compiled_module = _native.call_compiled_module


def _compiled_function(fn: Callable, converter) -> Callable:
    @functools.wraps(fn)
    def compiled(*args: Any, **kwargs: Any):
        return _run(converter, fn, args, kwargs)

    compiled._dynamo_rs_converter = converter  # type: ignore[attr-defined]
    # torch.compile always traces the function it is given (`always_optimize_code_objects`).
    code = getattr(fn, "__code__", None)
    if code is not None:
        converter.set_root_code(code)
    compiled._torchdynamo_orig_callable = fn  # type: ignore[attr-defined]
    return compiled


class OptimizedModule(torch.nn.Module):
    """Wraps a module like torch.compile's OptimizedModule: calls go through the compiled
    `forward`; attributes, parameters and state_dict are the original module's."""

    # Attributes of the wrapper itself; every other attribute is set on, read from and deleted
    # from the wrapped module, as under torch.compile (`compiled.scale = 2` must change what
    # the compiled `forward` reads).
    _OWN_ATTRIBUTES = frozenset(("_orig_mod", "_dynamo_rs_converter", "_dynamo_rs_forward_code",
                                 "_dynamo_rs_skipped_code", "_dynamo_rs_initialised"))

    def __init__(self, mod: torch.nn.Module, converter) -> None:
        object.__setattr__(self, "_dynamo_rs_initialised", False)
        super().__init__()
        object.__setattr__(self, "_dynamo_rs_initialised", True)
        self._orig_mod = mod
        self._dynamo_rs_converter = converter
        # The module's own forward is compiled even when it is torch's (nn.Sequential).
        # Forced again on every call: `dynamo_rs.reset()` forgets it, and only this module's
        # calls should bring it back (a raw hook with `skip_torch` must not see torch code).
        forward = type(mod).forward
        if getattr(forward, "_torchdynamo_disable", False):
            # `@torch.compiler.disable` on `forward`: its own frame runs as it is (skipped
            # again on every call, as resets forget it); after a non-recursive disable what
            # it calls is compiled, after a recursive one the wrapper disables all below it.
            # No `_dynamo_rs_forward_code`: calls take `forward` below, not the native
            # shortcut, and the shared wrapper code is never forced on.
            inner = getattr(forward, "_torchdynamo_orig_callable", None)
            self._dynamo_rs_skipped_code = getattr(inner, "__code__", None)
        else:
            self._dynamo_rs_forward_code = getattr(forward, "__code__", None)

    def __call__(self, *args: Any, **kwargs: Any):
        # `Module.__call__` takes two Python frames (`_wrapped_call_impl`, `_call_impl`) for
        # the wrapper and two more for the wrapped module to find that nothing hooks them
        # before `forward` runs: `_call_compiled_module` makes the same tests natively and
        # calls the wrapped module's `forward` under the compiled callback; anything else
        # (hooks, global hooks, JIT tracing, `module.compile()`, a class with its own
        # `__call__`) takes `Module.__call__`'s own path.
        return _call_compiled_module(self, args, kwargs)

    def forward(self, *args: Any, **kwargs: Any):
        own = self.__dict__
        if own.get("_dynamo_rs_forward_code") is not None:
            _native.force_intercept(own["_dynamo_rs_forward_code"])
        elif own.get("_dynamo_rs_skipped_code") is not None:
            _native.skip_code(own["_dynamo_rs_skipped_code"])
        # `self._orig_mod` would miss the instance dict (a submodule lives in `_modules`) and
        # go through `Module.__getattr__` after an AttributeError: ~1 us of every call.
        return _run(self._dynamo_rs_converter, self._modules["_orig_mod"], args, kwargs)

    @property
    def training(self) -> bool:  # type: ignore[override]
        return self._modules["_orig_mod"].training

    @training.setter
    def training(self, value: bool) -> None:
        # `Module.__init__` sets the wrapper's own default before there is a wrapped module.
        if self._dynamo_rs_initialised:
            self._modules["_orig_mod"].training = value

    def __getattr__(self, name: str):
        if name in self._OWN_ATTRIBUTES:
            return super().__getattr__(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN_ATTRIBUTES or hasattr(type(self), name):
            super().__setattr__(name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._OWN_ATTRIBUTES or hasattr(type(self), name):
            super().__delattr__(name)
        else:
            delattr(self._orig_mod, name)

    # Special methods are looked up on the class, past `__getattr__`: the wrapped module's
    # length and truth (an empty `nn.Sequential` is false) are forwarded by hand.
    def __len__(self) -> int:
        return len(self._orig_mod)

    def __bool__(self) -> bool:
        return bool(self._orig_mod)
