"""`raise` in the compiled frame itself, inside its own `try`: the trace follows the raise to
the handler as Python does (the exception is caught in the trace, the handler's code is in
the graph). Raises the frame's handlers do not catch leave the frame as in eager. Each case
compares the result — or the exception's type and message — with eager."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


def caught(x):
    try:
        raise ValueError("bad")
    except ValueError as e:
        return x + len(e.args[0])


def caught_by_base_class(x):
    try:
        raise KeyError("k")
    except LookupError:
        return x * 2


def caught_after_work_in_try(x):
    y = x.sin()
    try:
        if y.shape[0] > 1:
            raise RuntimeError("wide")
        y = y + 1
    except RuntimeError:
        y = y - 1
    return y


def finally_runs_then_handler(x):
    out = [x]
    try:
        try:
            raise IndexError("i")
        finally:
            out.append(x + 1)
    except IndexError:
        out.append(x * 3)
    return torch.stack(out)


def not_caught_by_the_handler(x):
    try:
        raise TypeError("wrong type " + str(x.shape[0]))
    except ValueError:
        return x
    return x + 1


def raised_in_a_loop(x):
    total = x
    for k in range(3):
        try:
            if k == 1:
                raise StopIteration
            total = total + k
        except StopIteration:
            total = total * 2
    return total


CASES = [caught, caught_by_base_class, caught_after_work_in_try, finally_runs_then_handler,
         not_caught_by_the_handler, raised_in_a_loop]


def outcome(fn, x):
    try:
        return fn(x), None
    except Exception as e:  # noqa: BLE001 - compared with eager's
        return None, (type(e), str(e))


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_raise_in_the_frame(fn) -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(2):
        x = torch.randn(4)
        (want, want_error), (got, got_error) = outcome(fn, x), outcome(compiled, x)
        assert got_error == want_error
        if want is not None:
            torch.testing.assert_close(got, want)
    if fn in (caught, caught_by_base_class, caught_after_work_in_try):
        assert counter.frame_count == 1, "caught in the trace: one graph"
