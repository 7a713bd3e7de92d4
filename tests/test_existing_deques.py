"""`collections.deque`s that existed before the call — arguments, attributes, the deque a
graph break hands to a resume function: guarded by type, length, `maxlen` and items, traced
through a copy, and changes replayed into the real deque as the same object. Each case runs
eagerly and compiled on equal inputs and compares results, the deques afterwards (items and
maxlen) and identities; equal inputs again add no graph."""

from __future__ import annotations

import collections
import os
import sys

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from fuzz.harness import Comparer  # noqa: E402


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


class Box:
    def __init__(self, q):
        self.q = q


def inputs():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, generator=g), torch.randn(3, generator=g)
    return a, collections.deque([a, b, 2], maxlen=4), Box(collections.deque([1, 2]))


def same_deques(expected, actual):
    """Deques compared as their items and maxlen (the Comparer knows lists)."""
    def plain(v):
        if isinstance(v, collections.deque):
            return ("deque", v.maxlen, [plain(i) for i in v])
        if isinstance(v, Box):
            return ("box", plain(v.q))
        if isinstance(v, (list, tuple)):
            return type(v)(plain(i) for i in v)
        return v
    Comparer().compare(plain(expected), plain(actual))


def compare_both(fn, calls=3):
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(calls):
        eager_args = inputs()
        expected = fn(*eager_args)
        compiled_args = inputs()
        actual = compiled(*compiled_args)
        same_deques((expected, eager_args), (actual, compiled_args))
    return counter


def queue_methods(t, q, box):
    q.append(t * 2)
    first = q.popleft()
    q.appendleft(first + 1)
    q.rotate(1)
    return q[0] + q[-1] + len(q)


def window_trims_at_maxlen(t, q, box):
    for k in range(3):
        q.append(t + k)
    return sum(x for x in q if isinstance(x, torch.Tensor))


def items_assigned_and_extended_left(t, q, box):
    q[2] = t * 5
    q.extendleft([7, 8])
    return q[2] + q[-1]


def attribute_deque_changed(t, q, box):
    box.q.append(3)
    box.q.popleft()
    return t * len(box.q) + box.q[0]


def cleared(t, q, box):
    q.clear()
    q.append(t - 1)
    return t + len(q)


def read_only(t, q, box):
    return q[0] * q[1] + len(q) + (q.maxlen or 0)


def changed_then_graph_break(t, q, box):
    q.append(t + 1)
    print("break", len(q))
    q.append(t * 2)
    return q[-1] + q[-2]


def returned_as_itself(t, q, box):
    q.pop()
    return t + 1, q


CHANGES = [queue_methods, window_trims_at_maxlen, items_assigned_and_extended_left,
           attribute_deque_changed, cleared, read_only, changed_then_graph_break,
           returned_as_itself]


@pytest.mark.parametrize("fn", CHANGES, ids=lambda f: f.__name__)
def test_existing_deque(fn, capsys) -> None:
    counter = compare_both(fn)
    assert counter.frame_count >= 1, "compiled a graph"
    frames = counter.frame_count
    dynamo_rs.compile(fn, backend=counter)(*inputs())
    assert counter.frame_count == frames, "equal inputs again: no new graph"


def test_returned_deque_is_the_callers_object() -> None:
    t, q, box = inputs()
    _, out = dynamo_rs.compile(returned_as_itself, backend=CompileCounter())(t, q, box)
    assert out is q and len(q) == 2 and q.maxlen == 4


def test_another_maxlen_or_length_recompiles() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(window_trims_at_maxlen, backend=counter)
    t = torch.ones(3)
    for maxlen, items in ((4, [t]), (4, [t]), (2, [t]), (None, [t, t, t])):
        eager_q, compiled_q = collections.deque(items, maxlen), collections.deque(items, maxlen)
        torch.testing.assert_close(compiled(t, compiled_q, None),
                                   window_trims_at_maxlen(t, eager_q, None))
        same_deques(eager_q, compiled_q)
    assert counter.frame_count == 3


def append_to_one_read_the_other(t, a, b):
    a.append(5)
    return t * len(b)


def test_deques_that_become_one_object_recompile() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(append_to_one_read_the_other, backend=counter)
    t = torch.ones(2)
    for shared in (False, True, False, True):
        eager_a = collections.deque([1])
        eager_b = eager_a if shared else collections.deque([1])
        compiled_a = collections.deque([1])
        compiled_b = compiled_a if shared else collections.deque([1])
        expected = append_to_one_read_the_other(t, eager_a, eager_b)
        actual = compiled(t, compiled_a, compiled_b)
        same_deques((expected, eager_a, eager_b), (actual, compiled_a, compiled_b))
    assert counter.frame_count == 2, "one graph for distinct deques, one for a shared one"


class MyDeque(collections.deque):
    def append(self, x):
        super().append(x)
        super().append(x)


def test_deque_subclass_gives_eager_results() -> None:
    def fn(t, q):
        q.append(t)
        return t * len(q)

    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    t = torch.ones(2)
    eager_q, compiled_q = MyDeque([1]), MyDeque([1])
    torch.testing.assert_close(compiled(t, compiled_q), fn(t, eager_q))
    assert len(compiled_q) == len(eager_q) == 3
