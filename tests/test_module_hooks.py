"""Forward hooks and forward pre-hooks of submodules run inside the graph, as under
TorchDynamo (torch's own `Module._call_impl` is traced): each case side by side with
TorchDynamo. Then the hooks' guards: a hook added, removed or replaced after the first call
recompiles; backward and global hooks still break the graph and match eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)

T24 = t(2, 4)


def _block(**hooks):
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    for kind, fns in hooks.items():
        for fn, kwargs in fns:
            getattr(block[0], f"register_{kind}")(fn, **kwargs)
    return block


DOUBLE_OUT = _block(forward_hook=[(lambda m, i, o: o * 2, {})])
SHIFT_IN = _block(forward_pre_hook=[(lambda m, i: (i[0] + 1,), {})])
SHIFT_IN_BARE = _block(forward_pre_hook=[(lambda m, i: i[0] - 1, {})])
OBSERVE_ONLY = _block(forward_hook=[(lambda m, i, o: None, {})], forward_pre_hook=[(lambda m, i: None, {})])
WITH_KWARGS = _block(
    forward_pre_hook=[(lambda m, a, k: ((a[0] * 3,), k), {"with_kwargs": True})],
    forward_hook=[(lambda m, a, k, o: o + a[0].sum(), {"with_kwargs": True})])
TWO_IN_ORDER = _block(forward_hook=[(lambda m, i, o: o * 2, {}), (lambda m, i, o: o - 1, {}),
                                    (lambda m, i, o: o * 3, {"prepend": True})])
ALWAYS = _block(forward_hook=[(lambda m, i, o: o.tanh(), {"always_call": True})])


class Recorder(nn.Module):
    """A module whose hooks read and write module state."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.scale = 0.5
        self.inner.register_forward_pre_hook(self._pre)
        self.inner.register_forward_hook(self._post)

    def _pre(self, module, args):
        return (args[0] * self.scale,)

    def _post(self, module, args, out):
        return out + module.bias

    def forward(self, x):
        return self.inner(x) + self.inner(x * 2)


RECORDER = Recorder()


@case(T24)
def forward_hook_replaces_output(x):
    return DOUBLE_OUT(x)


@case(T24)
def pre_hook_replaces_args_tuple(x):
    return SHIFT_IN(x)


@case(T24)
def pre_hook_returns_single_value(x):
    return SHIFT_IN_BARE(x)


@case(T24)
def hooks_returning_none(x):
    return OBSERVE_ONLY(x)


@case(T24)
def hooks_with_kwargs(x):
    return WITH_KWARGS(x)


@case(T24)
def hooks_in_registration_order_with_prepend(x):
    return TWO_IN_ORDER(x)


@case(T24)
def always_called_hook(x):
    return ALWAYS(x)


@case(T24)
def bound_method_hooks_reading_module_state(x):
    return RECORDER(x)


@pytest.fixture(autouse=True)
def fresh_caches():
    reset_all()
    yield


@pytest.mark.parametrize(("name", "fn", "make", "spec"), params(CASES))
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)


def test_hook_added_removed_and_replaced_after_compiling() -> None:
    block = _block()
    x = torch.randn(2, 4)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(block, backend=counter)
    torch.testing.assert_close(compiled(x), block(x))
    handle = block[2].register_forward_hook(lambda m, i, o: o * 10)
    torch.testing.assert_close(compiled(x), block(x))
    handle.remove()
    torch.testing.assert_close(compiled(x), block(x))
    block[0].register_forward_pre_hook(lambda m, i: (i[0] * 0,))
    torch.testing.assert_close(compiled(x), block(x))
    # The same hook table, another function under the same id.
    hooks = block[0]._forward_pre_hooks
    key = next(iter(hooks))
    hooks[key] = lambda m, i: (i[0] + 5,)
    torch.testing.assert_close(compiled(x), block(x))
    frames = counter.frame_count
    torch.testing.assert_close(compiled(x), block(x))
    assert counter.frame_count == frames, "an identical call compiles nothing"


def test_hook_side_effects_match_eager() -> None:
    seen: list = []
    block = _block(forward_hook=[(lambda m, i, o: seen.append(tuple(o.shape)), {})])
    x = torch.randn(2, 4)
    block(x)
    expected = list(seen)
    seen.clear()
    torch.testing.assert_close(dynamo_rs.compile(block, backend=CompileCounter())(x), block(x))
    assert seen == expected * 2


@pytest.mark.parametrize("kind", ["full_backward_hook", "global_forward_hook"])
def test_hooks_that_break_the_graph_match_eager(kind) -> None:
    grads: list = []
    block = _block()
    if kind == "full_backward_hook":
        block[0].register_full_backward_hook(lambda m, gi, go: grads.append(go[0].shape))
        handle = None
    else:
        handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        x = torch.randn(2, 4, requires_grad=True)
        expected = block(x)
        expected.sum().backward()
        expected_grad, x.grad = x.grad, None
        got = dynamo_rs.compile(block, backend="eager")(x)
        got.sum().backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(x.grad, expected_grad)
    finally:
        if handle is not None:
            handle.remove()


@pytest.mark.parametrize("kind", ["forward_hook", "forward_pre_hook", "global_forward_hook",
                                  "global_forward_pre_hook", "added_after_calls"])
def test_hooks_on_the_compiled_wrapper_run_as_on_the_module(kind) -> None:
    """The compiled wrapper (`OptimizedModule`) is called the short way only while nothing
    hooks it: hooks registered on the wrapper, or globally, run as `Module.__call__` runs
    them on a plain module."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled = dynamo_rs.compile(block, backend="eager")
    x = torch.randn(2, 4)
    seen: list = []
    handles = []

    def add_hooks(target):
        if kind in ("forward_hook", "added_after_calls"):
            handles.append(target.register_forward_hook(lambda m, i, o: o * 10))
        elif kind == "forward_pre_hook":
            handles.append(target.register_forward_pre_hook(lambda m, i: (i[0] + 1,)))
        elif kind == "global_forward_hook":
            handles.append(nn.modules.module.register_module_forward_hook(
                lambda m, i, o: seen.append(type(m).__name__)))
        else:
            handles.append(nn.modules.module.register_module_forward_pre_hook(
                lambda m, i: seen.append(type(m).__name__)))

    try:
        if kind == "added_after_calls":
            for _ in range(3):
                torch.testing.assert_close(compiled(x), block(x))
        add_hooks(compiled)
        got = compiled(x)
        calls_compiled = list(seen)
        seen.clear()
        for handle in handles:
            handle.remove()
        handles.clear()
        reference = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        reference.load_state_dict(block.state_dict())
        add_hooks(reference)
        expected = reference(x)
        torch.testing.assert_close(got, expected)
        # Global hooks see the wrapper where they would see the plain module.
        if kind.startswith("global"):
            assert "OptimizedModule" in calls_compiled and "Sequential" in seen
    finally:
        for handle in handles:
            handle.remove()


# The compiled wrapper calls the wrapped module's `forward` directly only when
# `Module.__call__` would do nothing else: every way of making it do more — hooks on the
# module (registered before compiling or between calls), global hooks, a class or instance
# that overrides the call machinery, `_compiled_call_impl`, a patched `Module._call_impl`, a
# replaced `forward`, JIT tracing — runs as it runs eagerly.

class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        return self.linear(x).relu() * scale


class _OwnCall(_Scaled):
    calls = 0

    def __call__(self, *args, **kwargs):
        type(self).calls += 1
        return super().__call__(*args, **kwargs) + 1


class _OwnCallImpl(_Scaled):
    calls = 0

    def _call_impl(self, *args, **kwargs):
        type(self).calls += 1
        return super()._call_impl(*args, **kwargs) - 1


def _pair(cls=_Scaled):
    """A module, an eager twin with the same weights, and the module compiled."""
    module, twin = cls(), cls()
    twin.load_state_dict(module.state_dict())
    return module, twin, dynamo_rs.compile(module, backend="eager")


def _on_both(module, twin, register):
    return [register(module), register(twin)]


HOOKS_ON_THE_MODULE = {
    "forward_hook": lambda m: m.register_forward_hook(lambda mod, i, o: o * 10),
    "forward_pre_hook": lambda m: m.register_forward_pre_hook(lambda mod, i: (i[0] + 1,)),
    "pre_hook_with_kwargs": lambda m: m.register_forward_pre_hook(
        lambda mod, a, k: (a, {**k, "scale": 3.0}), with_kwargs=True),
    "always_called_hook": lambda m: m.register_forward_hook(lambda mod, i, o: o - 2,
                                                            always_call=True),
    "full_backward_hook": lambda m: m.register_full_backward_hook(lambda mod, gi, go: None),
}


@pytest.mark.parametrize("when", ["before_compiling", "between_calls"])
@pytest.mark.parametrize("kind", sorted(HOOKS_ON_THE_MODULE))
def test_hooks_on_the_wrapped_module_run_as_eagerly(kind, when) -> None:
    module, twin, compiled = _pair()
    x = torch.randn(2, 4, requires_grad=kind == "full_backward_hook")
    register = HOOKS_ON_THE_MODULE[kind]
    handles = []
    try:
        if when == "before_compiling":
            handles += _on_both(module, twin, register)
        else:
            for _ in range(2):
                torch.testing.assert_close(compiled(x), twin(x))
            handles += _on_both(module, twin, register)
        for _ in range(2):
            torch.testing.assert_close(compiled(x, scale=2.0), twin(x, scale=2.0))
        for handle in handles:
            handle.remove()
        handles.clear()
        # Removed again: the short call resumes and still matches.
        torch.testing.assert_close(compiled(x), twin(x))
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("cls", [_OwnCall, _OwnCallImpl], ids=["own___call__", "own__call_impl"])
def test_a_class_with_its_own_call_machinery_is_called_through_it(cls) -> None:
    module, twin, compiled = _pair(cls)
    x = torch.randn(2, 4)
    cls.calls = 0
    for _ in range(3):
        torch.testing.assert_close(compiled(x), twin(x))
    assert cls.calls == 6  # three calls each, compiled and eager


def test_instance_level_call_machinery_and_forward_are_honoured() -> None:
    module, twin, compiled = _pair()
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), twin(x))
    seen = []

    def counting_call_impl(*args, **kwargs):
        seen.append("compiled_call_impl")
        return type(module)._call_impl(module, *args, **kwargs) * 2

    # What `module.compile()` installs, here a plain function.
    module._compiled_call_impl = counting_call_impl
    twin._compiled_call_impl = lambda *a, **k: type(twin)._call_impl(twin, *a, **k) * 2
    torch.testing.assert_close(compiled(x), twin(x))
    assert seen == ["compiled_call_impl"]
    module._compiled_call_impl = twin._compiled_call_impl = None
    module.forward = lambda x, scale=1.0: x * 5
    twin.forward = lambda x, scale=1.0: x * 5
    torch.testing.assert_close(compiled(x), twin(x))
    del module.forward, twin.forward
    torch.testing.assert_close(compiled(x), twin(x))


def test_a_patched_module_call_impl_runs(monkeypatch) -> None:
    """`nn.Module._call_impl` replaced after compiling (instrumentation): the module and the
    submodule it calls go through the replacement, as eagerly (TorchDynamo's compiled call
    also records its wrapper)."""
    module, twin, compiled = _pair()
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), twin(x))
    original = nn.Module._call_impl
    calls = []

    def instrumented(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "_call_impl", instrumented)
    for _ in range(2):
        got = compiled(x)
        compiled_calls = list(calls)
        calls.clear()
        torch.testing.assert_close(got, twin(x))
        assert compiled_calls == calls == ["_Scaled", "Linear"]
        calls.clear()
    monkeypatch.undo()
    torch.testing.assert_close(compiled(x), twin(x))
    assert calls == []


def test_submodules_with_their_own_call_machinery_run_it() -> None:
    """Called from a compiled forward: a submodule whose class has its own `__call__` or
    `_call_impl`, or whose instance has a `_compiled_call_impl` (what `module.compile()`
    sets), runs it as eagerly — also when it is set after the first call."""

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.own_call, self.own_call_impl, self.linear = _OwnCall(), _OwnCallImpl(), nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(self.own_call_impl(self.own_call(x)))

    module, twin = Outer(), Outer()
    twin.load_state_dict(module.state_dict())
    compiled = dynamo_rs.compile(module, backend="eager")
    x = torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), twin(x))
    for m in (module, twin):
        m.linear._compiled_call_impl = lambda *a, **k: torch.zeros(2, 4)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), twin(x))
    for m in (module, twin):
        del m.linear._compiled_call_impl
    torch.testing.assert_close(compiled(x), twin(x))


def test_jit_tracing_a_compiled_module_sees_the_module_call() -> None:
    module, twin, compiled = _pair()
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), twin(x))
    traced_eager = torch.jit.trace(twin, x, check_trace=False)
    traced = torch.jit.trace(compiled, x, check_trace=False)
    y = torch.randn(2, 4)
    torch.testing.assert_close(traced(y), traced_eager(y))
