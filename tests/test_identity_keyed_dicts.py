"""Dicts given to the frame keyed by objects that equal only themselves: enum members
(`{Mode.TRAIN: x}`), modules (`{layer: scale}`), classes, plain instances. They were
guarded by the dict's identity, so a new dict with the same keys recompiled on every call
(TorchDynamo's `test_tuple_enum_as_key_dict`), and dicts keyed by modules ran the frame
eagerly. Now dict trackers whose keys guard finds exactly those objects; a key handed out
by iteration is read from the object itself (a module called reads its parameters, an
attribute read is guarded). Side by side with TorchDynamo (`language_harness`)."""

from __future__ import annotations

import enum

import pytest
import torch
from torch import nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Tag:
    def __init__(self, scale):
        self.scale = scale


LAYERS = [nn.Linear(3, 3), nn.Linear(3, 3)]
TAGS = [Tag(2.0), Tag(3.0)]


@case(lambda: {Mode.TRAIN: torch.ones(3), Mode.EVAL: torch.zeros(3)}, t(3))
def lookup_by_enum_member(d, x):
    return d[Mode.EVAL] + x * (Mode.TRAIN in d)


@case(lambda: {Mode.TRAIN: torch.ones(3), Mode.EVAL: torch.full((3,), 2.0)}, t(3))
def iterate_enum_keys(d, x):
    out = x
    for mode, value in d.items():
        out = out + value * len(mode.value)
    return out


@case(lambda: {LAYERS[0]: 2.0, LAYERS[1]: 3.0}, t(3))
def call_modules_used_as_keys(d, x):
    for layer, scale in d.items():
        x = layer(x) * scale
    return x


@case(lambda: {TAGS[0]: torch.ones(3), TAGS[1]: torch.ones(3)}, t(3))
def read_attributes_of_instance_keys(d, x):
    for tag in d:
        x = x + d[tag] * tag.scale
    return x


@case(lambda: {nn.Linear: 1.0, nn.ReLU: 2.0}, t(3))
def lookup_by_class(d, x):
    return x * d[type(LAYERS[0])] + sum(d.values())


@case(lambda: {Mode.TRAIN: torch.ones(3)}, t(3))
def store_under_an_enum_key(d, x):
    d[Mode.EVAL] = x + 1
    return len(d), d[Mode.TRAIN] * 2


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_new_dict_with_the_same_enum_keys_does_not_recompile() -> None:
    dynamo_rs.reset()
    counter = CompileCounter()
    layer = nn.Linear(1, 1)
    compiled = dynamo_rs.compile(lambda d: layer(d[Mode.TRAIN]), backend=counter)
    for _ in range(3):
        d = {Mode.TRAIN: torch.rand(8, 1)}
        assert torch.equal(compiled(d), layer(d[Mode.TRAIN]))
    assert counter.frame_count == 1


def test_other_keys_or_a_changed_key_object_recompile() -> None:
    dynamo_rs.reset()
    counter = CompileCounter()
    tag = Tag(2.0)

    def fn(d, x):
        for k in d:
            x = x + (k.scale if isinstance(k, Tag) else 1)
        return x

    compiled = dynamo_rs.compile(fn, backend=counter)
    x = torch.zeros(2)
    assert torch.equal(compiled({tag: 0}, x), fn({tag: 0}, x))
    tag.scale = 5.0  # the key's attribute the trace read
    assert torch.equal(compiled({tag: 0}, x), fn({tag: 0}, x))
    other = Tag(2.0)  # an equal-looking but different key
    assert torch.equal(compiled({other: 0}, x), fn({other: 0}, x))
    assert torch.equal(compiled({Mode.TRAIN: 0}, x), fn({Mode.TRAIN: 0}, x))
