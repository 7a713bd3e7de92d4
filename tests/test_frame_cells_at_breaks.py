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


def assert_same(expected, got):
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    elif isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected)
        for e, g in zip(expected, got):
            assert_same(e, g)
    else:
        assert got == expected


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
