"""Functions the traced code makes (closures, lambdas, nested `def`s) that escape the frame —
returned, stored in a global or a container, live at a graph break — are made again by the
generated code from their code, defaults and closure. Each case runs eagerly, with
dynamo_rs.compile and with torch.compile; the functions that come out are called and what
they return compared, and our graph count must be TorchDynamo's (`KNOWN_EAGER`: at most)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter


def _make_adder(k):
    def add(z, *, w=2):
        return z + k * w

    return add


def returns_a_closure_over_a_tensor(x):
    g = _make_adder(x.sum())
    return x * 2, g


def returns_a_counter(x):
    c = 0

    def bump():
        nonlocal c
        c += 1
        return c

    bump()
    return x * c, bump


def returns_a_lambda_with_defaults(x, scale=3):
    f = lambda v, s=scale: v * s  # noqa: E731
    return x.cos(), f


def returns_the_same_function_twice(x):
    g = _make_adder(2)
    return x + 1, g, g


def stores_a_function_in_a_dict(x):
    table = {"inc": lambda v: v + 1, "neg": lambda v: -v}
    return x.sin(), table


ESCAPED: dict = {}


def stores_a_function_in_a_global(x):
    ESCAPED["f"] = _make_adder(x.mean())
    return x - 1


def cell_written_after_a_break(x):
    c = 0

    def read():
        return c

    print("break")
    c = 5
    return x + read(), read


def two_functions_share_a_cell(x):
    n = 3

    def get():
        return n

    def put(v):
        nonlocal n
        n = v

    return x * 2, get, put


def _call_all(value, probe):
    """What the functions inside `value` give when called (`probe` for their argument), the
    rest as it is; functions in the same places must give the same answers."""
    if callable(value) and not isinstance(value, torch.Tensor):
        try:
            return ("fn", value(probe))
        except TypeError:
            return ("fn", value())
    if isinstance(value, (tuple, list)):
        return type(value)(_call_all(v, probe) for v in value)
    if isinstance(value, dict):
        return {k: _call_all(v, probe) for k, v in value.items()}
    return value


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(b, a)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b


CASES = [
    returns_a_closure_over_a_tensor,
    returns_a_counter,
    returns_a_lambda_with_defaults,
    returns_the_same_function_twice,
    stores_a_function_in_a_dict,
    cell_written_after_a_break,
    two_functions_share_a_cell,
]


# A cell the compiled frame goes on using after a graph break, or shared by two functions
# that escape, cannot be stood for by a new cell: those frames run eagerly (right results;
# TorchDynamo captures them).
KNOWN_EAGER = {cell_written_after_a_break, two_functions_share_a_cell}


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_escaping_function(fn) -> None:
    dynamo_rs.reset()
    torch._dynamo.reset()
    x = torch.linspace(-1, 1, 6)
    probe = torch.arange(6.0)
    theirs = torch._dynamo.testing.CompileCounter()
    torch.compile(fn, backend=theirs)(x)
    ours = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=ours)
    for _ in range(2):  # the second call runs the cached code
        expected, got = fn(x), compiled(x)
        _same(_call_all(expected, probe), _call_all(got, probe))
        # Calling them again: state kept in their cells moves on the same way.
        _same(_call_all(expected, probe), _call_all(got, probe))
    if fn in KNOWN_EAGER:
        assert ours.frame_count <= theirs.frame_count
    else:
        assert ours.frame_count == theirs.frame_count


def test_the_same_function_stays_one_object() -> None:
    dynamo_rs.reset()
    _, a, b = dynamo_rs.compile(returns_the_same_function_twice, backend=CompileCounter())(torch.ones(2))
    assert a is b


def test_a_function_stored_in_a_global() -> None:
    dynamo_rs.reset()
    x = torch.linspace(0, 1, 4)
    ours = CompileCounter()
    out = dynamo_rs.compile(stores_a_function_in_a_global, backend=ours)(x)
    got = ESCAPED.pop("f")
    expected_out = stores_a_function_in_a_global(x)
    expected = ESCAPED.pop("f")
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(got(x), expected(x))
    assert ours.frame_count == 1


def test_a_captured_function_keeps_its_metadata() -> None:
    dynamo_rs.reset()
    _, g = dynamo_rs.compile(returns_a_closure_over_a_tensor, backend=CompileCounter())(torch.ones(3))
    assert g.__qualname__ == "_make_adder.<locals>.add"
    assert g.__kwdefaults__ == {"w": 2}
    assert g.__module__ == __name__


# --- a closure compiled as its own frame, its free variables handed on ------------------------


def _counting_closure():
    """A closure whose nested function writes the closure's free variable (`nonlocal`), and
    one that lets a nested function escape over it; fresh per side, compared call by call."""
    count = 0

    def step(x, verbose=False):
        def bump(by):
            nonlocal count
            count += by
            return count

        total = 0
        for _ in range(2):
            total += bump(1)
        if verbose:
            print("count", count)  # a graph break after the stores
        return x * total + count

    def reader(x):
        return x + count, (lambda: count)

    return step, reader


@pytest.mark.parametrize("verbose", [False, True])
def test_closure_frame_writes_its_free_variable_through_a_nested_function(verbose, capsys) -> None:
    eager_step, eager_read = _counting_closure()
    step, read = _counting_closure()
    compiled_step = dynamo_rs.compile(step, backend=CompileCounter())
    compiled_read = dynamo_rs.compile(read, backend=CompileCounter())
    x = torch.ones(2)
    for _ in range(3):
        torch.testing.assert_close(compiled_step(x, verbose), eager_step(x, verbose))
        # The other closure over the same cell sees every store.
        expected, expected_fn = eager_read(x)
        got, got_fn = compiled_read(x)
        torch.testing.assert_close(got, expected)
        assert got_fn() == expected_fn()


# --- functions made in the trace over the compiled frame's own free variables -----------------


def _outer_scope():
    """Closures over a scope outside the compiled frame: the frame returns a function that
    reads and writes (`nonlocal`) the frame's free variables, and a chain of nested closures
    over them and the frame's own locals (TorchDynamo's test_return_nested_function and
    test_nested_closure)."""
    out = None
    base = torch.full((3,), 0.5)

    def make(a, b):
        nonlocal out
        c = a + b
        d = a + 1.0
        out = c * 0  # the frame itself writes the free variable first

        def use(f=7, g=9.0):
            nonlocal out
            out = a + b * 10
            return c * f - d * g + base

        return use

    def chain(a):
        v1 = a.sin()

        def level2(*args, **kwargs):
            v2 = a.cos() + args[0] + kwargs["b"]

            def level3(v3=a * 2):
                def level4():
                    return base + v1 + v2 + v3 + 1

                return level4

            return level3

        return level2(1, b=2)()

    def last():
        return out

    return make, chain, last


def _run_outer_scope(compile_fn, counter) -> None:
    eager_make, eager_chain, eager_last = _outer_scope()
    make, chain, last = _outer_scope()
    compiled_make = compile_fn(make, backend=counter)
    compiled_chain = compile_fn(chain, backend=counter)
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0])
    for _ in range(2):
        expected_use, got_use = eager_make(a, b), compiled_make(a, b)
        torch.testing.assert_close(last(), eager_last())  # the frame's own write
        torch.testing.assert_close(got_use(1.5), expected_use(1.5))
        torch.testing.assert_close(last(), eager_last())  # the returned function's write
        # The returned function compiled as a frame of its own.
        compiled_use = compile_fn(got_use, backend=counter)
        torch.testing.assert_close(compiled_use(2.0, g=1.0), expected_use(2.0, g=1.0))
        torch.testing.assert_close(last(), eager_last())
        torch.testing.assert_close(compiled_chain(a)(), eager_chain(a)())


def test_a_returned_function_shares_the_frames_free_variables() -> None:
    dynamo_rs.reset()
    torch._dynamo.reset()
    theirs = torch._dynamo.testing.CompileCounter()
    _run_outer_scope(torch.compile, theirs)
    ours = CompileCounter()
    _run_outer_scope(dynamo_rs.compile, ours)
    # TorchDynamo guards the free variable `out` that `make` writes before it reads it (None on
    # the first round, a tensor on the second) and compiles `make` again; a constant the
    # frame is given is guarded only once the trace reads it, so one `make` serves both.
    assert ours.frame_count == theirs.frame_count - 1
