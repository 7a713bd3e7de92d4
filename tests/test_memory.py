"""What compiled code keeps alive: a compiled model and the inputs of its first call are freed
once the user drops them, without `dynamo_rs.reset()` (guards keep tensor metadata, not
tensors); and compiling, calling and dropping models over and over does not grow memory."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x, extra):
        return self.lin(x).relu() * self.scale + extra["bias"]


def plain_function(x, y):
    return (x @ y).sin() + y.sum()


@pytest.mark.parametrize("backend", ["counter", "eager", "aot_eager"])
def test_deleted_model_and_first_inputs_are_freed(backend) -> None:
    def run():
        model = Net()
        compiled = dynamo_rs.compile(model, backend=CompileCounter() if backend == "counter"
                                     else backend)
        x, bias = torch.randn(2, 4), torch.randn(4)
        expected = model(x, {"bias": bias})
        torch.testing.assert_close(compiled(x, {"bias": bias}), expected)
        torch.testing.assert_close(compiled(x, {"bias": bias}), expected)
        return [weakref.ref(o) for o in (model, model.lin.weight, model.scale, x, bias)]

    refs = run()
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)


def test_function_inputs_are_freed() -> None:
    compiled = dynamo_rs.compile(plain_function, backend=CompileCounter())

    def run():
        x, y = torch.randn(3, 3), torch.randn(3, 3)
        torch.testing.assert_close(compiled(x, y), plain_function(x, y))
        return weakref.ref(x), weakref.ref(y)

    refs = run()
    gc.collect()
    assert [r() is None for r in refs] == [True, True]


def _live_counts() -> tuple[int, int]:
    gc.collect()
    objects = gc.get_objects()
    return len(objects), sum(1 for o in objects if issubclass(type(o), torch.Tensor))


def test_compile_delete_cycles_do_not_grow() -> None:
    counter = CompileCounter()

    def cycle() -> None:
        model = Net()
        compiled = dynamo_rs.compile(model, backend=counter)
        compiled(torch.randn(2, 4), {"bias": torch.randn(4)})
        fn = dynamo_rs.compile(plain_function, backend=counter)
        fn(torch.randn(3, 3), torch.randn(3, 3))

    for _ in range(50):
        cycle()
    before = _live_counts()
    for _ in range(10_000):
        cycle()
    after = _live_counts()
    # Instances of one class share compiled code: two graphs in all.
    assert counter.frame_count == 2
    assert after[1] <= before[1], f"live tensors {before[1]} -> {after[1]}"
    assert after[0] - before[0] < 100, f"live objects {before[0]} -> {after[0]}"


def test_code_states_are_dropped_with_their_code_objects() -> None:
    """Every code object the hook saw carries our state; freeing the code frees it (a set of
    live states: teardown of many code objects is linear, 50k in 0.37 s, was 1.3 s)."""
    from dynamo_rs import _native

    def make(i):
        namespace: dict = {}
        exec(f"def f(x):\n    return x + {i}\n", namespace)  # noqa: S102 - distinct code objects
        return namespace["f"]

    before = _native.stats()["live_code_states"]
    functions = [make(i) for i in range(2000)]
    previous = _native.set_eval_frame(lambda *args: None)
    try:
        for fn in functions:
            fn(1)
    finally:
        _native.set_eval_frame(previous)
    assert _native.stats()["live_code_states"] >= before + 2000
    del functions, fn
    gc.collect()
    assert _native.stats()["live_code_states"] <= before + 1


def test_a_traceback_keeps_what_its_frames_refer_to() -> None:
    """A frame of compiled code kept by a traceback refers to its globals and builtins; they
    must stay alive as long as it does, even when the function and its module are gone (the
    frame runs a function made for the entry, which must own what the frame borrows)."""
    from dynamo_rs import _native

    fail = []

    def backend(gm, example_inputs):
        def run(*args):
            if fail:
                raise RuntimeError("the compiled graph failed")
            return gm.forward(*args)
        return run

    def make_function():
        namespace: dict = {"__name__": "short_lived", "torch": torch}
        exec(  # noqa: S102 - a module that is dropped while its traceback lives
            "MARKER = ['still here']\n"
            "def fails(x):\n"
            "    return x.sin() * 2\n",
            namespace,
        )
        return namespace["fails"]

    converter = _native.Converter(backend, fullgraph=False)
    tb = None
    previous = _native.set_eval_frame(converter)
    try:
        make_function()(torch.ones(3))  # compiles
        fail.append(True)
        try:
            make_function()(torch.ones(3))  # the function is a temporary
        except RuntimeError as err:
            tb = err.__traceback__
    finally:
        _native.set_eval_frame(previous)
    assert tb is not None
    gc.collect()
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    user = [f for f in frames if f.f_code.co_name == "fails"]
    assert user, [f.f_code.co_name for f in frames]
    # Churn the allocator so that freed memory would be reused.
    junk = [{"k": [i]} for i in range(20000)]
    for frame in user:
        assert frame.f_globals["MARKER"] == ["still here"]
        assert "len" in frame.f_builtins
    del junk


MODEL = None


def uses_global_model(x):
    return MODEL(x) + 1


def test_object_guarded_by_identity_is_not_kept_alive() -> None:
    """A model reached through a global is guarded by identity; the guard holds it weakly, so
    deleting it frees it (and a later object at the same address is not taken for it)."""
    global MODEL
    MODEL = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = dynamo_rs.compile(uses_global_model, backend=CompileCounter())
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), uses_global_model(x))
    torch.testing.assert_close(compiled(x), uses_global_model(x))
    ref = weakref.ref(MODEL)
    MODEL = None
    gc.collect()
    assert ref() is None
    MODEL = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    torch.testing.assert_close(compiled(x), uses_global_model(x))
    MODEL = None


def test_garbage_collector_paused_only_while_tracing() -> None:
    """The cyclic collector is paused while a frame is traced, on again while the backend
    compiles (Inductor makes cyclic garbage in quantity) and afterwards; a program that turned
    it off keeps it off."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.isenabled())
        return gm.forward

    def fn(x):
        return x.sin() + 1

    for enabled in (True, False):
        dynamo_rs.reset()
        (gc.enable if enabled else gc.disable)()
        try:
            dynamo_rs.compile(fn, backend=backend)(torch.randn(3))
            assert gc.isenabled() == enabled
        finally:
            gc.enable()
    assert seen == [True, False]


GLOBAL_TENSOR = torch.randn(4)


class BreakingNet(torch.nn.Module):
    """Parameters, a buffer, a global tensor and the argument, with a graph break between
    two graphs (so a frame is traced more than once)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        y = self.lin(x) * self.scale + GLOBAL_TENSOR
        print("", end="")
        return (y.relu() @ self.lin.weight).sum(0) + x.sum(0)


@pytest.mark.parametrize("dynamic", [None, True, False])
@pytest.mark.parametrize("backend", ["counter", "eager", "aot_eager"])
def test_captures_leave_no_weak_references_on_user_tensors(backend, dynamic) -> None:
    """The fake mode a trace ran in remembers the real tensors it converted through weak
    references with callbacks; once the trace (and the backend) are done, none is left on the
    user's tensors — a dropped fake mode waits for the cycle collector, and CPython 3.11 can
    crash freeing a tensor whose weak references the collector frees at the same time (see
    the next test)."""
    model = BreakingNet()
    compiled = dynamo_rs.compile(model, backend=CompileCounter() if backend == "counter" else backend,
                                 dynamic=dynamic)
    inputs = [torch.randn(n, 4) for n in (2, 3, 5)]
    for x in inputs:
        torch.testing.assert_close(compiled(x), model(x))
    tensors = {"argument": inputs[-1], "first argument": inputs[0], "weight": model.lin.weight,
               "bias": model.lin.bias, "buffer": model.scale, "global": GLOBAL_TENSOR}
    counts = {name: weakref.getweakrefcount(t) for name, t in tensors.items()}
    assert counts == dict.fromkeys(tensors, 0)


_MANY_CAPTURES_THEN_FREE = """
import gc, sys, torch, dynamo_rs

def run():
    shared = torch.randn(3)
    other = torch.randn(3)
    for i in range(15):
        namespace = {}
        exec(f"def f{i}(a, b):\\n    return (a * {i} + b).sin()\\n", namespace)
        fn = namespace[f"f{i}"]
        torch.testing.assert_close(dynamo_rs.compile(fn, backend=sys.argv[1])(shared, other),
                                   fn(shared, other))
    # A collection at (nearly) every allocation: the one CPython makes while freeing
    # `shared` collects whatever cyclic garbage still refers to it weakly.
    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        del shared
    finally:
        gc.set_threshold(*old)

run()
print("freed")
"""


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_freeing_a_tensor_seen_by_many_captures_does_not_crash(backend, tmp_path) -> None:
    """Regression (found by the fuzzer as a segfault after ~2,700 programs): fifteen frames
    captured over the same tensor, then the tensor freed with the cycle collector running
    during the free. Run in a fresh interpreter from a file (as `-c` the memory layout
    happens not to crash), since the failure is a crash."""
    import subprocess
    import sys

    script = tmp_path / "many_captures.py"
    script.write_text(_MANY_CAPTURES_THEN_FREE)
    result = subprocess.run([sys.executable, str(script), backend],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("freed")
