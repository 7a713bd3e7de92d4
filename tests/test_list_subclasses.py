"""Subclasses of `list` that behave as lists and add methods (`transformers`'
`LogitsProcessorList`/`StoppingCriteriaList`: a `__call__` running each item; helper
methods; an override of a named method such as `clear`), made in the frame or given to it.
They were objects whose iteration broke the graph ("iterating over a CustomList object"),
whose `append`/`extend` ran the frame eagerly. Now traced lists of their class: the class's
Python methods inlined, list operations modelled, changes to a given one replayed into the
object itself, one made in the frame handed back as an instance of its class. Side by side
with TorchDynamo (`language_harness`), after TorchDynamo's `test_repros` list-subclass
tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


class ProcessorList(list):
    def __call__(self, x):
        for processor in self:
            x = processor(x)
        return x

    def clear(self):
        pass  # an override of a list method: found on the class first


class HelperList(list):
    scale = 10

    def __call__(self, x):
        for processor in self:
            x = processor(x)
        return x

    def length_times_10(self):
        return len(self) * self.scale

    def append_twice(self, x):
        self.extend([x, x])


class LoggedList(list):
    def append(self, item):
        super().append(item)
        super().append(item * 2)


def merge_lists(default_list, custom_list):
    # transformers.generation.utils._merge_criteria_processor_list, simplified
    if len(custom_list) == 0:
        return default_list
    for default in default_list:
        for custom in custom_list:
            if type(custom) is type(default):
                raise ValueError
    default_list.extend(custom_list)
    return default_list


@case(t(8), lambda: ProcessorList([nn.ReLU(), nn.Sigmoid()]))
def processor_list_given_and_called(x, processors):
    return processors(x)


@case(t(8), lambda: ProcessorList([nn.ReLU(), nn.Sigmoid()]), lambda: ProcessorList([nn.SiLU()]))
def merged_processor_lists(x, left, right):
    combined = merge_lists(left, right)
    return combined(x), len(left)


@case(t(8), lambda: HelperList([nn.ReLU()]), lambda: HelperList([]))
def merge_with_an_empty_list(x, left, right):
    return merge_lists(left, right)(x)


@case(t(10), t(10))
def made_in_the_frame_and_changed(a, b):
    items = HelperList()
    items.extend([True])
    items.append(a)
    items.extend([b])
    items.pop(0)
    items.append(items.length_times_10())
    return sum(items)


@case(t(10), t(10))
def made_in_the_frame_and_returned(a, b):
    first = HelperList([a + 1])
    first.extend(HelperList([b + 2]))
    return first, type(first).__name__, isinstance(first, HelperList), first.length_times_10()


@case(lambda: HelperList([torch.ones(3), torch.zeros(3)]))
def given_and_changed_through_its_own_methods(items):
    items.extend(items[:1])
    items.append_twice(items[1] + 1)
    return len(items), items[-1]


@case(t(3))
def override_calling_the_list_method_through_super(x):
    log = LoggedList()
    log.append(x)
    log.append(x + 1)
    return log, len(log)


@case(t(3))
def clear_overridden_to_keep_items(x):
    items = ProcessorList([torch.sin, torch.cos])
    items.clear()
    return items(x), len(items)


@case(t(3), lambda: HelperList([1, 2, 3]))
def slices_and_copies_are_plain_lists(x, items):
    part, copy, joined = items[1:], items.copy(), items + [4]
    return x * sum(part), type(part).__name__, type(copy).__name__, type(joined).__name__


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_changes_between_calls_are_seen() -> None:
    reset_all()
    counter = CompileCounter()

    def fn(x, items):
        return x * sum(items) + items.length_times_10()

    compiled = dynamo_rs.compile(fn, backend=counter)
    items, x = HelperList([1, 2]), torch.ones(2)
    assert torch.equal(compiled(x, items), fn(x, items))
    items.append(3)
    assert torch.equal(compiled(x, items), fn(x, items))
    items[0] = 7
    assert torch.equal(compiled(x, items), fn(x, items))
    items.scale = 100  # an instance attribute now shadows the class constant
    assert torch.equal(compiled(x, items), fn(x, items))
    HelperList.scale = 5
    try:
        assert torch.equal(compiled(x, HelperList([1])), fn(x, HelperList([1])))
    finally:
        HelperList.scale = 10


def test_a_given_list_subclass_changed_keeps_its_identity() -> None:
    reset_all()

    def fn(items, x):
        items.append_twice(x + 1)
        return items

    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    items = HelperList([torch.zeros(2)])
    assert compiled(items, torch.ones(2)) is items
    assert type(items) is HelperList and len(items) == 3
    assert torch.equal(items[1], torch.full((2,), 2.0)) and items[1] is items[2]


class IndexedList(list):
    def __getitem__(self, i):  # a protocol of its own: not traced as a list
        return super().__getitem__(i) * 2


def test_a_subclass_with_its_own_indexing_keeps_its_behaviour() -> None:
    reset_all()

    def fn(x, items):
        return x * items[0] + sum(items)

    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    items = IndexedList([1, 2])
    assert torch.equal(compiled(torch.ones(2), items), fn(torch.ones(2), items))
    items.append(5)
    assert torch.equal(compiled(torch.ones(2), items), fn(torch.ones(2), items))
