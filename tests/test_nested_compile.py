"""Compiled code inside compiled code, as users write it: a submodule compiled on its own and
then the whole model, a helper decorated with `torch.compile` or `dynamo_rs.compile` called
from a compiled function, `compile(compile(f))`. The outer compile traces through the inner
one's original — one graph, the inner backend unused — as TorchDynamo does; each case is run
both ways side by side and compared with eager."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    torch._dynamo.reset()
    yield
    dynamo_rs.reset()
    torch._dynamo.reset()


def _counters(front):
    if front is dynamo_rs.compile:
        return CompileCounter(), CompileCounter()
    return torch._dynamo.testing.CompileCounter(), torch._dynamo.testing.CompileCounter()


def _helper(x):
    return torch.relu(torch.cos(x) + torch.sin(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Model(nn.Module):
    def __init__(self, inner_compile=None, inner_backend=None):
        super().__init__()
        self.block = Block()
        if inner_compile is not None:
            self.block = inner_compile(self.block, backend=inner_backend)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x) + x)


def _inner_compile(front, inner):
    """The compile of the inner function or module: the outer front end's own ("same"), or
    torch.compile's inside ours ("torch"); TorchDynamo's side always uses its own (it cannot
    see through ours)."""
    return dynamo_rs.compile if front is dynamo_rs.compile and inner == "same" else torch.compile


@pytest.mark.parametrize("inner", ["same", "torch"])
def test_compiled_function_called_from_compiled_code(inner) -> None:
    results = {}
    for front in (dynamo_rs.compile, torch.compile):
        inner_counter, outer_counter = _counters(front)
        helper = _inner_compile(front, inner)(_helper, backend=inner_counter)

        def outer(x):
            return helper(x * 2) + 1

        x = torch.randn(5)
        expected = _helper(x * 2) + 1
        torch.testing.assert_close(front(outer, backend=outer_counter)(x), expected)
        results[front] = (inner_counter.frame_count, outer_counter.frame_count, outer_counter.op_count)
        torch._dynamo.reset()
    assert results[dynamo_rs.compile] == results[torch.compile] == (0, 1, 6)


@pytest.mark.parametrize("inner", ["same", "torch"])
def test_compiled_submodule_inside_a_compiled_model(inner) -> None:
    results = {}
    for front in (dynamo_rs.compile, torch.compile):
        inner_counter, outer_counter = _counters(front)
        torch.manual_seed(0)
        model = Model(_inner_compile(front, inner), inner_counter)
        torch.manual_seed(0)
        reference = Model()
        x = torch.randn(3, 4)
        compiled = front(model, backend=outer_counter)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), reference(x))
        results[front] = (inner_counter.frame_count, outer_counter.frame_count, outer_counter.op_count)
        torch._dynamo.reset()
    assert results[dynamo_rs.compile] == results[torch.compile]
    assert results[dynamo_rs.compile][:2] == (0, 1)


def test_a_compiled_submodule_still_compiles_on_its_own() -> None:
    counter = CompileCounter()
    model = Model(dynamo_rs.compile, counter)
    x = torch.randn(3, 4)
    torch.testing.assert_close(model.block(x), model.block._orig_mod(x))
    assert counter.frame_count == 1


@pytest.mark.parametrize("kind", ["function", "module"])
def test_compiling_a_compiled_object_again_uses_the_outer_settings(kind) -> None:
    inner_counter, outer_counter = CompileCounter(), CompileCounter()
    target = _helper if kind == "function" else Block()
    twice = dynamo_rs.compile(dynamo_rs.compile(target, backend=inner_counter), backend=outer_counter,
                              fullgraph=True)
    x = torch.randn(3, 4)
    torch.testing.assert_close(twice(x), target(x))
    assert (inner_counter.frame_count, outer_counter.frame_count) == (0, 1)


def test_replacing_the_inner_compiled_function_recompiles() -> None:
    counter = CompileCounter()
    holder = {"f": dynamo_rs.compile(_helper, backend="eager")}

    def outer(x):
        return holder["f"](x) * 3

    compiled = dynamo_rs.compile(outer, backend=counter)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), outer(x))
    holder["f"] = dynamo_rs.compile(lambda v: v.exp(), backend="eager")
    torch.testing.assert_close(compiled(x), outer(x))
    holder["f"] = lambda v: v - 1  # a plain function now
    torch.testing.assert_close(compiled(x), outer(x))
    assert counter.frame_count == 3
