"""Slices of `nn.Sequential` and `nn.ModuleList` are new containers of their class, made on
every call as eager makes them. Regression: a slice live at a graph break was handed on as a
plain list, and calling it raised `TypeError: 'list' object is not callable` in the user's
program."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield


class Blocks(nn.Module):
    def __init__(self, sequence=nn.Sequential):
        super().__init__()
        torch.manual_seed(0)
        self.seq = sequence(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])


def _break():
    print("", end="")


class SliceLiveAtBreak(Blocks):
    def forward(self, x):
        head = self.seq[:2]
        _break()
        return head(x)


class SliceReturned(Blocks):
    def forward(self, x):
        return self.seq[1:](x), self.blocks[::2], self.seq[:1]


class SliceChanged(Blocks):
    def forward(self, x):
        kept = self.blocks[:1]
        kept.append(self.blocks[2])
        for block in kept:
            x = block(x)
        return x, kept


class ResidualSequential(nn.Sequential):
    def forward(self, x):
        for module in self:
            x = x + module(x)
        return x


class CustomForwardSlice(Blocks):
    def __init__(self):
        super().__init__(ResidualSequential)

    def forward(self, x):
        return self.seq[:2](x)


def _same(got, expected):
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    elif isinstance(expected, nn.Module):
        # A new container of the same class holding the same child modules.
        assert type(got) is type(expected) and got is not expected
        assert list(got) == list(expected) and all(a is b for a, b in zip(got, expected))
    else:
        assert type(got) is type(expected) and len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)


@pytest.mark.parametrize("cls", [SliceLiveAtBreak, SliceReturned, SliceChanged, CustomForwardSlice])
def test_a_module_slice_is_a_container_of_its_class(cls) -> None:
    model = cls().eval()
    compiled = dynamo_rs.compile(model, backend=CompileCounter())
    for _ in range(2):
        x = torch.randn(2, 4)
        with torch.no_grad():
            _same(compiled(x), model(x))
    # Made anew on every call, as eager makes it.
    if cls is SliceReturned:
        assert compiled(x)[1] is not compiled(x)[1]


class EveryOther(nn.Sequential):
    """A container whose own `__getitem__` slices differently."""

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return nn.Sequential(*list(self)[::2])
        return super().__getitem__(idx)


class SlicesItsOwnWay(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.seq = EveryOther(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        return self.seq[:2](x)


def test_a_container_with_its_own_slicing_is_not_modelled() -> None:
    model = SlicesItsOwnWay().eval()
    compiled = dynamo_rs.compile(model, backend=CompileCounter())
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
