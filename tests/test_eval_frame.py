"""The frame-evaluation hook: every behaviour is checked by running the same code with the
hook off and on (the hook's callback substitutes an identical-but-reassembled code object,
so any difference is the hook's fault) and comparing results, exceptions and tracebacks."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import traceback
import types
import warnings
import weakref

import pytest

import dynamo_rs
from dynamo_rs import bytecode, eval_frame
from dynamo_rs.eval_frame import SKIP, set_eval_frame


def identity(code: types.CodeType) -> types.CodeType:
    return bytecode.assemble(bytecode.decode(code), like=code)


class Recorder:
    """A callback that substitutes the reassembled code for every frame, guarded by `check`
    when given, and records what it was asked."""

    def __init__(self, check=None, only=None):
        self.calls: list[tuple[str, int]] = []
        self.frames: list[types.FrameType] = []
        self.check = check
        self.only = only  # set of code names to take over; others run as they are

    def __call__(self, frame, cache_size):
        self.calls.append((frame.f_code.co_name, cache_size))
        if self.only is not None and frame.f_code.co_name not in self.only:
            return None
        self.frames.append(frame)
        return (self.check, identity(frame.f_code))

    def names(self):
        return [name for name, _ in self.calls]


class hooked:
    def __init__(self, callback):
        self.callback = callback

    def __enter__(self):
        self.previous = set_eval_frame(self.callback)
        return self.callback

    def __exit__(self, *exc):
        set_eval_frame(self.previous)


# The context manager's own exit runs while the hook is on; keep it out of what tests count.
eval_frame.skip_code(hooked.__exit__)


@pytest.fixture(autouse=True)
def fresh_state():
    dynamo_rs.reset()
    eval_frame.skip_code(hooked.__exit__)
    eval_frame.reset_stats()
    saved = (dynamo_rs.config.cache_size_limit, dynamo_rs.config.suppress_errors)
    yield
    dynamo_rs.config.cache_size_limit, dynamo_rs.config.suppress_errors = saved
    assert not eval_frame.is_enabled(), "a test left the hook on"


def outcome(fn, *args, **kwargs):
    try:
        return ("value", fn(*args, **kwargs))
    except Exception as err:  # noqa: BLE001
        frames = [(f.name, f.lineno) for f in traceback.extract_tb(err.__traceback__)]
        return ("raise", type(err), str(err), frames[1:])  # frames[0] is this helper


def same_with_hook(fn, *args, **kwargs):
    expected = outcome(fn, *args, **kwargs)
    with hooked(Recorder()) as rec:
        got = outcome(fn, *args, **kwargs)
    assert got == expected
    return rec


# --- arguments -------------------------------------------------------------------------------


def positional(a, b, c=3):
    return (a, b, c)


def posonly(a, b=2, /, c=3, *, d, e=5):
    return (a, b, c, d, e)


def star(*args, **kwargs):
    return (args, kwargs)


def everything(a, /, b, *args, c, d=4, **kwargs):
    return (a, b, args, c, d, kwargs)


def posonly_name_in_kwargs(a, /, **kwargs):
    return (a, kwargs)


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    [
        (positional, (1, 2), {}),
        (positional, (1,), {"b": 5, "c": 6}),
        (posonly, (1,), {"d": 4}),
        (posonly, (1, 9, 8), {"d": 7, "e": 6}),
        (star, (), {}),
        (star, (1, 2, 3), {"x": 1, "y": [2]}),
        (everything, (1, 2, 3, 4), {"c": 5, "z": 6}),
        (everything, (1,), {"b": 2, "c": 3}),
        (posonly_name_in_kwargs, (1,), {"a": 2}),
        (positional, (1,), {}),  # TypeError: missing argument, raised before the frame exists
    ],
)
def test_arguments_of_every_kind(fn, args, kwargs) -> None:
    same_with_hook(fn, *args, **kwargs)
    if fn is not positional or args != (1,) or kwargs:
        # The frame ran through the hook: compiled now or in an earlier case, then reused.
        assert eval_frame.cache_entries(fn)
        assert eval_frame.stats()["hits"] + eval_frame.stats()["callbacks"] >= 1


def test_callback_sees_the_frame() -> None:
    def caller():
        return everything(1, 2, 3, c=4, k=5)

    rec = Recorder(only={"everything"})
    with hooked(rec):
        caller()
    frame = rec.frames[0]
    assert isinstance(frame, types.FrameType)
    assert frame.f_code is everything.__code__
    assert frame.f_back is not None and frame.f_back.f_code is caller.__code__
    assert frame.f_globals is globals()
    assert frame.f_locals == {"a": 1, "b": 2, "args": (3,), "c": 4, "d": 4, "kwargs": {"k": 5}}


# --- closures, cells, classes ----------------------------------------------------------------


def make_counter(start):
    count = start  # a cell: written by the inner function

    def bump(step=1):
        nonlocal count
        count += step
        return count

    return bump


def cell_argument(x):
    # `x` is both an argument and a cell: MAKE_CELL wraps the passed value.
    def get():
        return x

    x += 1
    return get()


class Base:
    def hello(self, n):
        return f"base{n}"


class Child(Base):
    def hello(self, n):
        return "child+" + super().hello(n + 1)


def test_closures_and_cells() -> None:
    same_with_hook(lambda: [make_counter(10)(2) for _ in range(3)])
    bump = make_counter(0)
    expected = [bump(), bump(5)]
    bump = make_counter(0)
    with hooked(Recorder()):
        got = [bump(), bump(5)]
    assert got == expected and eval_frame.cache_entries(bump)
    same_with_hook(cell_argument, 41)
    same_with_hook(lambda: Child().hello(1))


def test_closure_functions_made_repeatedly_use_their_own_cells() -> None:
    adders = [(lambda x, i=i: x + i) for i in range(5)]

    def scaled(k):
        return lambda x: x * k

    with hooked(Recorder()):
        got = [f(10) for f in adders] + [scaled(k)(3) for k in range(4)]
    assert got == [10, 11, 12, 13, 14, 0, 3, 6, 9]


# --- recursion, exceptions, tracebacks -------------------------------------------------------


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def depth(n):
    return 0 if n == 0 else 1 + depth(n - 1)


def fails(x):
    data = {"a": 1}
    return data[x]


def fails_deeper(x):
    try:
        return fails(x)
    except KeyError as err:
        raise ValueError(f"no {x}") from err


def test_recursion() -> None:
    rec = same_with_hook(fib, 15)
    assert rec.names().count("fib") == 1  # compiled once, then cache hits
    assert eval_frame.stats()["hits"] >= 986
    same_with_hook(depth, 200)


def test_runaway_recursion_raises_recursion_error() -> None:
    with hooked(Recorder()):
        with pytest.raises(RecursionError):
            depth(10**6)


def test_exceptions_and_tracebacks_match() -> None:
    same_with_hook(fails, "a")
    same_with_hook(fails, "missing")
    same_with_hook(fails_deeper, "missing")
    with hooked(Recorder()):
        try:
            fails_deeper("zz")
        except ValueError as err:
            chained = err.__cause__
    assert isinstance(chained, KeyError)
    names = [f.name for f in traceback.extract_tb(chained.__traceback__)]
    assert names == ["fails_deeper", "fails"]


def test_sys_getframe_inside_transformed_code_sees_the_caller() -> None:
    def inner():
        f = sys._getframe()
        return f.f_code.co_name, f.f_back.f_code.co_name

    def outer():
        return inner()

    expected = outer()
    with hooked(Recorder()):
        assert outer() == expected == ("inner", "outer")


# --- what the hook leaves alone --------------------------------------------------------------


def gen(n):
    for i in range(n):
        yield helper(i)


def helper(i):
    return i * 2


async def coro(n):
    await asyncio.sleep(0)
    return helper(n)


async def agen(n):
    for i in range(n):
        yield helper(i)


def test_generators_and_coroutines_are_not_intercepted() -> None:
    async def collect():
        return [x async for x in agen(3)]

    with hooked(Recorder()) as rec:
        got = (list(gen(4)), asyncio.run(coro(5)), asyncio.run(collect()))
    assert got == ([0, 2, 4, 6], 10, [0, 2, 4])
    assert "gen" not in rec.names() and "coro" not in rec.names() and "agen" not in rec.names()
    # ... but what they call is.
    assert "helper" in rec.names()
    assert eval_frame.code_mode(gen) == "skip"


def test_callback_runs_with_the_hook_off() -> None:
    seen = []

    def callback(frame, n):
        seen.append(frame.f_code.co_name)
        helper(1)  # would recurse into the callback if the hook were on
        return None

    with hooked(callback):
        positional(1, 2)
    assert seen == ["positional"]


def test_frames_called_from_transformed_code_are_intercepted() -> None:
    def leaf(x):
        return x + 1

    def middle(x):
        return leaf(x) * 2

    def top(x):
        return middle(x) + 1

    with hooked(Recorder()) as rec:
        assert top(1) == 5
        assert top(2) == 7
    assert rec.names() == ["top", "middle", "leaf"]
    assert eval_frame.stats()["hits"] == 3


def test_our_package_and_torch_are_skipped() -> None:
    import torch

    with hooked(Recorder()) as rec:
        torch.nn.functional.relu(torch.ones(2))
        dynamo_rs.eval_frame.disable(positional)
    assert not [n for n in rec.names() if n in ("relu", "disable")]


def test_skip_sentinel_skips_the_code_for_good() -> None:
    calls = []

    def callback(frame, n):
        calls.append(frame.f_code.co_name)
        return SKIP

    with hooked(callback):
        for _ in range(3):
            helper(1)
    assert calls == ["helper"]
    assert eval_frame.code_mode(helper) == "skip"
    eval_frame.reset_code(helper)
    assert eval_frame.code_mode(helper) == "default"


# --- disable ---------------------------------------------------------------------------------


def test_disable_covers_the_function_and_its_callees() -> None:
    @dynamo_rs.disable
    def quiet(x):
        return helper(x) + positional(1, 2)[0]

    class Holder:
        @dynamo_rs.disable
        def method(self, x):
            return helper(x)

    with hooked(Recorder()) as rec:
        assert quiet(3) == 7
        assert Holder().method(4) == 8
        assert eval_frame.is_enabled()  # back on after the disabled call
        helper(5)
    assert rec.names() == ["helper"]  # only the call made outside the disabled functions
    assert quiet.__name__ == "quiet" and quiet.__wrapped__(3) == 7
    with pytest.raises(TypeError, match="callable"):
        dynamo_rs.disable(42)


def test_disabled_function_exceptions_propagate() -> None:
    wrapped = dynamo_rs.disable(fails)
    with hooked(Recorder()):
        with pytest.raises(KeyError):
            wrapped("nope")
        assert eval_frame.is_enabled()


# --- threads ---------------------------------------------------------------------------------


def test_only_the_hooked_thread_is_intercepted() -> None:
    def work(tag, n):
        return [helper(i) for i in range(n)] + [tag]

    results = {}
    names_seen = []
    barrier = threading.Barrier(2)

    def unhooked_thread():
        barrier.wait()
        results["plain"] = work("plain", 200)

    def hooked_thread():
        rec = Recorder()
        barrier.wait()
        with hooked(rec):
            results["hooked"] = work("hooked", 200)
        names_seen.extend(rec.names())

    threads = [threading.Thread(target=unhooked_thread), threading.Thread(target=hooked_thread)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["plain"][:-1] == results["hooked"][:-1] == [2 * i for i in range(200)]
    stats = eval_frame.stats()
    # The hooked thread compiled `work` and `helper` once each and hit the cache 199 times.
    assert names_seen.count("helper") == 1 and names_seen.count("work") == 1
    assert stats["hits"] == 199  # none from the unhooked thread


# --- the cache -------------------------------------------------------------------------------


def typed(x):
    return repr(type(x).__name__) + str(x)


class ByType:
    """A callback that compiles one entry per argument type, guarded on that type."""

    def __init__(self):
        self.calls = []

    def __call__(self, frame, cache_size):
        if frame.f_code is not typed.__code__:
            return None
        kind = type(frame.f_locals["x"])
        self.calls.append((kind, cache_size))
        check = lambda f_locals, kind=kind: type(f_locals["x"]) is kind  # noqa: E731
        check.kind = kind
        return (check, identity(frame.f_code))


def entry_kinds(fn):
    return [check.kind for check, _ in eval_frame.cache_entries(fn)]


def test_entries_are_reused_and_kept_most_recent_first() -> None:
    cb = ByType()
    with hooked(cb):
        assert typed(1) == "'int'1"
        assert typed(2) == "'int'2"          # hit: no new callback
        assert typed("s") == "'str's"        # miss: second entry, at the front
        assert entry_kinds(typed) == [str, int]
        assert typed(3) == "'int'3"          # hit on the older entry moves it to the front
        assert entry_kinds(typed) == [int, str]
        assert typed(1.5) == "'float'1.5"
    assert cb.calls == [(int, 0), (str, 1), (float, 2)]
    assert entry_kinds(typed) == [float, int, str]
    assert eval_frame.stats()["hits"] >= 2


def test_guard_errors_propagate() -> None:
    def bad_check(f_locals):
        raise LookupError("guard exploded")

    def callback(frame, n):
        return (bad_check, identity(frame.f_code)) if frame.f_code is typed.__code__ else None

    with hooked(callback):
        typed(1)  # miss: the entry is stored and run without checking
        with pytest.raises(LookupError, match="guard exploded"):
            typed(2)  # lookup runs the check


def test_cache_size_limit_warns_once_then_runs_uncompiled() -> None:
    dynamo_rs.config.cache_size_limit = 2
    cb = ByType()
    with hooked(cb):
        typed(1)
        typed("a")
        with pytest.warns(RuntimeWarning, match=r"typed .*test_eval_frame.py:\d+\).*cache_size_limit \(2"):
            assert typed(2.5) == "'float'2.5"   # third kind: over the limit, runs as is
        with warnings.catch_warnings():
            warnings.simplefilter("error")       # no second warning
            assert typed(b"b") == "'bytes'b'b'"
            assert typed(7) == "'int'7"           # existing entries still used
    assert [kind for kind, _ in cb.calls] == [int, str]
    assert eval_frame.code_mode(typed) == "run_only"


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError):
        dynamo_rs.config.cache_size_limit = 0
    with pytest.raises(AttributeError, match="no setting"):
        dynamo_rs.config.not_a_setting = 1


# --- bad callbacks ---------------------------------------------------------------------------


def only_for(target):
    """Applies a callback to `target`'s frames only; others run as they are."""

    def decorate(callback):
        def scoped(frame, n):
            return callback(frame, n) if frame.f_code is target.__code__ else None

        scoped.__name__ = callback.__name__
        return scoped

    return decorate


@only_for(positional)
def raising_callback(frame, n):
    raise RuntimeError("callback failed")


@only_for(positional)
def wrong_type_callback(frame, n):
    return "not an entry"


@only_for(positional)
def wrong_signature_callback(frame, n):
    return (None, (lambda a, b, c, d: 0).__code__)


@only_for(positional)
def not_callable_check(frame, n):
    return (42, frame.f_code)


@only_for(positional)
def code_not_code(frame, n):
    return (None, "code")


@pytest.mark.parametrize(
    ("callback", "error", "message"),
    [
        (raising_callback, RuntimeError, "callback failed"),
        (wrong_type_callback, TypeError, r"returned str; expected None, SKIP or \(check, code\)"),
        (wrong_signature_callback, TypeError, "different argument count"),
        (not_callable_check, TypeError, "check of type int"),
        (code_not_code, TypeError, "expected a code object"),
    ],
)
def test_bad_callbacks_raise_or_fall_back(callback, error, message) -> None:
    # Strict: the error reaches the caller, naming the function and where it is.
    dynamo_rs.config.suppress_errors = False
    with hooked(callback):
        with pytest.raises(error, match=message):
            positional(1, 2)
    # Lenient: one warning, and the frame runs uncompiled with the right result.
    dynamo_rs.config.suppress_errors = True
    with hooked(callback):
        with pytest.warns(RuntimeWarning, match=r"compiling positional \(.*test_eval_frame.py:\d+\) failed"):
            assert positional(1, 2) == (1, 2, 3)


def test_signature_checks_name_the_difference() -> None:
    @only_for(positional)
    def renamed(frame, n):
        return (None, (lambda a, z, c=3: 0).__code__)

    @only_for(positional)
    def other_freevars(frame, n):
        k = 1
        return (None, (lambda a, b, c=3: k).__code__)

    dynamo_rs.config.suppress_errors = False
    for callback, message in [(renamed, "argument names"), (other_freevars, "free variables")]:
        with hooked(callback):
            with pytest.raises(TypeError, match=message):
                positional(1, 2)


def test_set_eval_frame_rejects_non_callables() -> None:
    with pytest.raises(TypeError, match="callable or None"):
        set_eval_frame(42)
    assert not eval_frame.is_enabled()


def test_set_eval_frame_inside_disabled_region_does_not_leak_the_hook() -> None:
    inner_callback = Recorder()

    @dynamo_rs.disable
    def sets_its_own():
        set_eval_frame(inner_callback)
        return positional(1, 2)

    with hooked(Recorder()):
        sets_its_own()
        assert eval_frame.is_enabled()
    assert not eval_frame.is_enabled()
    # The evaluator is uninstalled again: plain calls are not examined.
    eval_frame.reset_stats()
    positional(1, 2)
    assert eval_frame.stats()["frames"] == 0


# --- memory ----------------------------------------------------------------------------------


def make_functions(n, keep=None):
    """Creates, calls and drops `n` fresh functions with a closure each."""
    for i in range(n):
        namespace: dict = {}
        # One name for all: unique names would grow the interpreter's interned-string table,
        # which tracemalloc would count against us.
        exec(f"def f(a, b=1):\n    k = {i}\n    def g():\n        return k + a\n    return g() + b\n",
             namespace)
        fn = namespace["f"]
        assert fn(1) == i + 2
        if keep is not None:
            keep.append(weakref.ref(fn.__code__))
        del fn, namespace


def compile_exec_code(made=None):
    def callback(frame, n):
        if frame.f_code.co_filename != "<string>":  # only the exec'd functions
            return None
        new = identity(frame.f_code)
        if made is not None:
            made.append(weakref.ref(new))
        return (lambda f_locals: True, new)

    return callback


def test_compiled_functions_and_their_entries_are_freed() -> None:
    made: list = []
    originals: list = []
    with hooked(compile_exec_code(made)):
        make_functions(1000, keep=originals)
    gc.collect()
    assert len(made) == 2000  # f and g of each function
    assert all(ref() is None for ref in originals), "original code objects were kept alive"
    assert all(ref() is None for ref in made), "transformed code objects were kept alive"


def test_compiling_and_deleting_10000_functions_returns_memory() -> None:
    import tracemalloc

    with hooked(compile_exec_code()):
        make_functions(300)  # warm-up: allocator pools, interned strings
        gc.collect()
        states_before = eval_frame.stats()["live_code_states"]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        make_functions(10_000)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        states_after = eval_frame.stats()["live_code_states"]
    assert eval_frame.stats()["callbacks"] >= 20_000
    # Our per-code state (Rust memory, invisible to tracemalloc) is freed with each code ...
    assert states_after <= states_before
    # ... and so is everything Python-side: 20,000 cache entries would be megabytes.
    assert after - before < 256 * 1024, f"{after - before} bytes still allocated"
