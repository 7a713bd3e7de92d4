"""Instances of classes with `__slots__` made in the frame — a user's small records, and
torch's pytree `TreeSpec` (a frozen slotted dataclass) behind `tree_map`/`tree_flatten`.
They broke the graph at the class's call. Now traced as other plain instances: a slot is an
attribute the instance may hold, an unset slot or a name that is not a slot raises
`AttributeError` as in Python, and one handed back is made with `object.__new__`. Side by
side with TorchDynamo (`language_harness`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.utils._pytree as pytree

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


class Pair:
    __slots__ = ("first", "second")

    def __init__(self, first, second):
        self.first = first
        self.second = second

    def total(self):
        return self.first + self.second


class Scaled(Pair):
    __slots__ = ("scale",)

    def __init__(self, first, second, scale):
        super().__init__(first, second)
        self.scale = scale

    def total(self):
        return super().total() * self.scale


@dataclasses.dataclass(frozen=True, slots=True)
class Frozen:
    x: torch.Tensor
    k: int = 2

    def doubled(self):
        return self.x * self.k


@case(t(3), t(3))
def slotted_record(x, y):
    p = Pair(x, y)
    p.first = p.first * 2
    return p.total()


@case(t(3), t(3))
def slotted_subclass_with_super(x, y):
    return Scaled(x, y, 3.0).total()


@case(t(3))
def unset_slot_raises_attribute_error(x):
    p = Pair.__new__(Pair)
    p.first = x
    try:
        return p.second
    except AttributeError:
        return x + 1


@case(t(3))
def a_name_that_is_not_a_slot_raises(x):
    p = Pair(x, x)
    try:
        p.third = 1
    except AttributeError:
        return x - 1
    return x


@case(t(3))
def frozen_slotted_dataclass(x):
    f = Frozen(x)
    return f.doubled() + Frozen(x, 3).doubled()


@case(t(3))
def tree_map_over_nested_containers(x):
    return pytree.tree_map(lambda v: v * 2, {"a": x, "b": [x, (x + 1,)]})


@case(t(3))
def tree_flatten_then_unflatten(x):
    leaves, spec = pytree.tree_flatten((x, {"k": x + 1, "j": [x * 3]}))
    return pytree.tree_unflatten([leaf.sin() for leaf in leaves], spec)


@case(t(3))
def tree_leaves_summed(x):
    return sum(pytree.tree_leaves({"a": x, "b": [x, x * 2]}))


@case(t(3))
def tree_map_only_tensors(x):
    return pytree.tree_map_only(torch.Tensor, lambda v: v + 1, (x, 3, "s", [x]))


@case(t(2, 3))
def tree_structure_compared(x):
    same = pytree.tree_structure([x, x]) == pytree.tree_structure([x + 1, x])
    return x * 2 if same else x


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_slotted_classes(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_a_slotted_instance_handed_back():
    def f(x, y):
        return Pair(x.sin(), y)

    x, y = torch.randn(3), torch.randn(3)
    dynamo_rs.reset()
    counter = CompileCounter()
    got = dynamo_rs.compile(f, backend=counter)(x, y)
    assert type(got) is Pair and not hasattr(got, "__dict__")
    torch.testing.assert_close(got.first, x.sin())
    assert got.second is y
    assert counter.frame_count == 1
