"""A frame's argument or free variable held in a cell, read by the trace, then rebound before a
graph break where a closure made in the trace shares the cell: the generated code stores the
cell's new value (the closure must see it), and everything it rebuilds afterwards from the
argument — an attribute store replayed, a value handed to the resume function — must still
read the value the frame was called with. It read the cell again and got the new value: a
wrong result the fuzzer found (seed 5,213,627: `p0.a = n0; n0 = t0.dim(); sum(1 for x in
sorted(G_SET) if x > n0)`). Each function runs eagerly and compiled over calls whose
arguments change, and results and the objects they changed are compared."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from language_harness import compare

G_SET = {0}


class Box:
    def __init__(self, a):
        self.a = a


def int_argument_stored_then_rebound(t0, n0, box):
    box.a = n0
    n0 = t0.dim()
    w = sum(1 for x in sorted(G_SET) if x > n0)  # sorted() of a global set: a graph break
    return t0 * w + 1, box.a


def tensor_argument_stored_then_rebound(x, n, box):
    box.a = x
    x = x * 2
    scale = lambda: x * n  # noqa: E731 - a closure over the rebound cell
    torch._dynamo.graph_break()
    return box.a + scale(), box.a


def tensor_argument_live_across_the_break(x, n, box):
    first = x
    x = x + n
    later = lambda: x  # noqa: E731
    torch._dynamo.graph_break()
    return first * 3, later()


def int_argument_in_a_list_stored(t0, n0, box):
    box.a = [n0, n0 + 1]
    n0 = -1
    probe = lambda: n0  # noqa: E731
    torch._dynamo.graph_break()
    return t0 + probe(), box.a


def make_nonlocal_counter():
    count = 0

    def bump(x, n, box):
        nonlocal count
        before = count
        box.a = count
        count = count + n
        seen = lambda: count  # noqa: E731
        torch._dynamo.graph_break()
        return x + before, seen(), box.a

    return bump


FUNCTIONS = [
    int_argument_stored_then_rebound,
    tensor_argument_stored_then_rebound,
    tensor_argument_live_across_the_break,
    int_argument_in_a_list_stored,
]


def calls():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(1, 3, generator=g), n) for n in (2, 0, 5, 5, -3)]


def run(fn, arguments):
    outs = []
    for x, n in arguments:
        box = Box(7)
        result = fn(x.clone(), n, box)
        outs.append((result, box.a))
    return outs


assert_same = compare  # results and the objects they changed, as the language cases compare


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_arguments_in_cells_keep_their_values(fn):
    dynamo_rs.reset()
    expected = run(fn, calls())
    got = run(dynamo_rs.compile(fn, backend="eager"), calls())
    assert_same(expected, got)


def test_free_variable_rebound_before_a_break():
    dynamo_rs.reset()
    eager, compiled = make_nonlocal_counter(), make_nonlocal_counter()
    compiled = dynamo_rs.compile(compiled, backend="eager")
    assert_same(run(eager, calls()), run(compiled, calls()))


# --- closures made before a break share the frame's cells with the resume function -------
# The resume function is handed the frame's cells themselves: a variable rebound after the
# break is seen by a closure made before it, as in eager Python. It was handed their values
# in fresh cells, so such frames ran eagerly ("a function made in the trace that shares a
# cell with the frame at a graph break, written after it").

from functools import partial  # noqa: E402


def _twice(x, **kwargs):
    return x + x


def partial_rebound_between_calls(x):
    def inner():
        torch._dynamo.graph_break()
        return op(x)

    op = partial(_twice, dim=10)
    first = inner()
    op = partial(_twice, other=10)
    return inner() + first


def lambda_rebound_between_calls(x, y):
    one = lambda a, b: a + b  # noqa: E731

    def inner():
        torch._dynamo.graph_break()
        return one(x, y)

    res = inner()
    one = lambda a, b: a - b  # noqa: E731
    res = res + inner()
    return res


def closure_writes_after_a_data_dependent_branch(x):
    t = torch.zeros(1)

    def write():
        t[0] = backup

    if x.sum() > -1e5:  # a branch on a tensor: a graph break
        pass
    backup = 1
    write()
    return t + x


def counter_closure_across_a_break(x):
    count = 0

    def bump(by):
        nonlocal count
        count += by
        return count

    bump(1)
    torch._dynamo.graph_break()
    bump(2)
    total = bump(3)
    return x * total, count


def closure_returned_after_its_variable_changes(x):
    scale = 2

    def apply(t):
        return t * scale

    torch._dynamo.graph_break()
    scale = 5
    return apply(x), apply


def cell_argument_rebound_after_a_break(x, n):
    read = lambda: n  # noqa: E731
    torch._dynamo.graph_break()
    n = n + 10
    return x + read(), read()


def two_breaks_and_a_cell(x):
    acc = []
    add = acc.append
    total = x

    def grow(t):
        nonlocal total
        total = total + t
        add(t)

    grow(x)
    torch._dynamo.graph_break()
    grow(x * 2)
    torch._dynamo.graph_break()
    grow(x * 3)
    return total, len(acc)


def locals_of_a_resume_function_with_cells(x):
    # `locals()` reads a cell variable through its cell (it showed the cell object itself).
    n = 3
    read = lambda: n  # noqa: E731
    torch._dynamo.graph_break()
    n = n + 1
    return x + 1, locals()["n"], read()


SHARED = [
    locals_of_a_resume_function_with_cells,
    partial_rebound_between_calls,
    lambda_rebound_between_calls,
    closure_writes_after_a_data_dependent_branch,
    counter_closure_across_a_break,
    closure_returned_after_its_variable_changes,
    cell_argument_rebound_after_a_break,
    two_breaks_and_a_cell,
]


def _arguments(fn):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, generator=g)
    n_args = fn.__code__.co_argcount
    if fn is cell_argument_rebound_after_a_break:
        return (x, 4)
    return (x,) if n_args == 1 else (x, torch.randn(3, generator=g))


def _plain(value):
    if callable(value) and not isinstance(value, torch.Tensor):
        return value(torch.ones(3))  # a closure returned: what it computes now
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


@pytest.mark.parametrize("fn", SHARED, ids=lambda f: f.__name__)
def test_closures_share_cells_with_the_resume_function(fn):
    dynamo_rs.reset()
    from dynamo_rs.testing import CompileCounter

    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(2):
        assert_same(_plain(fn(*_arguments(fn))), _plain(compiled(*_arguments(fn))))
    explained = dynamo_rs.explain(fn)(*_arguments(fn))
    assert not explained.eager_frames, explained.eager_frames
