"""Changes to sets that existed before the call — arguments, globals, attributes: `seen.add(k)`
on a registry, a `warned` set, `s |= other`. The trace changes a copy standing for the set
(which is guarded by its elements) and the generated code gives the real set the copy's final
elements, as the same object. Each case runs eagerly and compiled on equal inputs and compares
results, the sets afterwards and identities; equal inputs again add no graph. Cases the copy
cannot stand for (`pop()`, tensors as elements, sets of other objects) still give eager's
results."""

from __future__ import annotations

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
    def __init__(self, s):
        self.s = s


def inputs():
    s = {1, 2}
    return torch.ones(3), s, Box({7})


def compare_both(fn, make=inputs, calls=2):
    """Runs `fn` eagerly and compiled `calls` times on fresh equal inputs, comparing results
    and arguments (sharing included) after each call; returns the compile counter."""
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(calls):
        eager_args = make()
        expected = fn(*eager_args)
        compiled_args = make()
        actual = compiled(*compiled_args)
        Comparer().compare((expected, eager_args), (actual, compiled_args))
    return counter


# --- every way to change a set ------------------------------------------------------------------


def add_and_read(t, s, box):
    s.add(3)
    return t * len(s) + (3 in s)


def discard_and_remove(t, s, box):
    s.discard(1)
    s.discard(99)
    s.remove(2)
    return t + len(s)


def update_family(t, s, box):
    s.update([5, 6], (7,))
    s.difference_update({6})
    s.intersection_update({1, 2, 5, 7, 8})
    s.symmetric_difference_update({8, 1})
    return t * len(s) + 2 * (8 in s) + 4 * (1 in s)


def cleared_then_refilled(t, s, box):
    s.clear()
    s.add("x")
    return t + len(s)


def in_place_operators(t, s, box):
    s |= {4, 5}
    s &= {1, 4, 5}
    s -= {5}
    s ^= {9}
    return t * len(s) + (9 in s)


def reads_after_change_use_the_new_elements(t, s, box):
    before = 3 in s
    s.add(3)
    return t * (before + (3 in s) * 10 + len(s.union({100})) * 100)


def change_through_an_attribute(t, s, box):
    box.s.add(8)
    box.s.discard(7)
    return t * len(box.s)


def bound_method_taken_before_the_change(t, s, box):
    add = s.add
    add(10)
    add(11)
    return t + len(s)


def changed_set_is_returned_as_itself(t, s, box):
    s.add(t.shape[0])
    return t + 1, s


def changed_then_graph_break(t, s, box):
    s.add(4)
    print("break", len(s))
    s.add(5)
    return t * len(s) + (4 in s)


def changed_inside_an_inlined_function(t, s, box):
    def remember(seen, key):
        if key in seen:
            return 0
        seen.add(key)
        return 1

    return t * (remember(s, 3) + remember(s, 3) + remember(s, 1))


CHANGES = [
    add_and_read,
    discard_and_remove,
    update_family,
    cleared_then_refilled,
    in_place_operators,
    reads_after_change_use_the_new_elements,
    change_through_an_attribute,
    bound_method_taken_before_the_change,
    changed_set_is_returned_as_itself,
    changed_then_graph_break,
    changed_inside_an_inlined_function,
]


@pytest.mark.parametrize("fn", CHANGES, ids=lambda f: f.__name__)
def test_changes_to_an_existing_set_are_replayed(fn, capsys) -> None:
    counter = compare_both(fn, calls=3)
    assert counter.frame_count >= 1, "compiled a graph"
    frames = counter.frame_count
    compare_both(fn, calls=1)  # a new compiled function: its own count
    compiled = dynamo_rs.compile(fn, backend=counter)
    compiled(*inputs())
    assert counter.frame_count == frames, "equal inputs again: no new graph"


def test_returned_set_is_the_callers_object() -> None:
    compiled = dynamo_rs.compile(changed_set_is_returned_as_itself, backend=CompileCounter())
    t, s, box = inputs()
    _, out = compiled(t, s, box)
    assert out is s and s == {1, 2, 3}


# --- a registry at module level ------------------------------------------------------------------

SEEN: set = set()


def warn_once(t, key):
    if key not in SEEN:
        SEEN.add(key)
        return t + 1
    return t - 1


def test_module_level_registry_changes_once_per_key() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(warn_once, backend=counter)
    t = torch.ones(2)
    SEEN.clear()
    try:
        expected = []
        for key in ("a", "a", "b", "a", "b"):
            expected.append((warn_once(t, key), set(SEEN)))
        SEEN.clear()
        for (want, want_seen), key in zip(expected, ("a", "a", "b", "a", "b")):
            torch.testing.assert_close(compiled(t, key), want)
            assert SEEN == want_seen
        # The registry is guarded by its elements and the key by its value: one graph per
        # (registry, key) pair met — 5 here — and none for a pair met again.
        assert counter.frame_count == 5
        frames = counter.frame_count
        for _ in range(3):
            torch.testing.assert_close(compiled(t, "a"), t - 1)
        assert counter.frame_count == frames
    finally:
        SEEN.clear()


def test_registry_changed_between_calls_recompiles() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(warn_once, backend=counter)
    t = torch.ones(2)
    SEEN.clear()
    try:
        torch.testing.assert_close(compiled(t, "k"), t + 1)
        SEEN.discard("k")  # changed by someone else: the next call must add it again
        torch.testing.assert_close(compiled(t, "k"), t + 1)
        assert SEEN == {"k"}
        torch.testing.assert_close(compiled(t, "k"), t - 1)
    finally:
        SEEN.clear()


# --- one set under two names -----------------------------------------------------------------


def add_to_one_read_the_other(t, a, b):
    a.add(3)
    return t * len(b) + (3 in b)


def test_sets_that_become_one_object_recompile() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(add_to_one_read_the_other, backend=counter)
    t = torch.ones(2)
    for shared in (False, True, False, True):
        eager_a = {1}
        eager_b = eager_a if shared else {1}
        compiled_a = {1}
        compiled_b = compiled_a if shared else {1}
        expected = add_to_one_read_the_other(t, eager_a, eager_b)
        actual = compiled(t, compiled_a, compiled_b)
        Comparer().compare((expected, eager_a, eager_b), (actual, compiled_a, compiled_b))
        assert (compiled_a is compiled_b) == shared
    assert counter.frame_count == 2, "one graph for distinct sets, one for a shared one"


def test_global_and_argument_that_are_one_set() -> None:
    def add_to_argument_read_global(t, s):
        s.add(42)
        return t * (42 in SEEN)

    counter = CompileCounter()
    compiled = dynamo_rs.compile(add_to_argument_read_global, backend=counter)
    t = torch.ones(2)
    SEEN.clear()
    try:
        torch.testing.assert_close(compiled(t, {1}), t * 0)
        assert 42 not in SEEN
        torch.testing.assert_close(compiled(t, SEEN), t * 1)
        assert SEEN == {42}
        SEEN.clear()
        torch.testing.assert_close(compiled(t, {1}), t * 0)
    finally:
        SEEN.clear()


# --- what the copy cannot stand for: eager's results all the same ------------------------------


def pops_an_element(t, s, box):
    k = s.pop()
    return t * k, s


def adds_a_tensor(t, s, box):
    s.add(t)
    return t + len(s)


class Key:
    def __init__(self, n):
        self.n = n


def object_inputs():
    return torch.ones(3), {Key(1), Key(2)}, Box(set())


def set_of_objects_changed(t, s, box):
    s.add(Key(3))
    return t * len(s)


def iterates_after_a_change(t, s, box):
    s.add(30)
    return t * sum(sorted(s)), sorted(s)


def removes_a_missing_element(t, s, box):
    try:
        s.remove(99)
    except KeyError:
        return t - 1
    return t + 1


@pytest.mark.parametrize("fn,make", [
    (pops_an_element, inputs),
    (adds_a_tensor, inputs),
    (set_of_objects_changed, object_inputs),
    (iterates_after_a_change, inputs),
    (removes_a_missing_element, inputs),
], ids=lambda v: getattr(v, "__name__", ""))
def test_changes_the_copy_cannot_stand_for_give_eager_results(fn, make, capsys) -> None:
    if fn is set_of_objects_changed:
        # Objects compare by identity: compare sizes only.
        counter = CompileCounter()
        compiled = dynamo_rs.compile(fn, backend=counter)
        for _ in range(2):
            t, s, box = make()
            torch.testing.assert_close(compiled(t, s, box), fn(*make()))
            assert len(s) == 3
        return
    if fn is adds_a_tensor:
        counter = CompileCounter()
        compiled = dynamo_rs.compile(fn, backend=counter)
        t, s, box = make()
        torch.testing.assert_close(compiled(t, s, box), t + 3)
        assert t in s and len(s) == 3
        return
    compare_both(fn, make)
