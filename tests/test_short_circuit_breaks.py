"""`a and b` / `a or b` where `a` is a tensor whose truth the trace cannot know.

CPython 3.11 compiles them to `JUMP_IF_FALSE_OR_POP`/`JUMP_IF_TRUE_OR_POP`, which keep the
value on the stack when they jump. The frame could not be split there and ran eagerly;
now the graph ends before the jump, the generated code makes it on the real value and each
side continues in a resume function (the taken side receives the value too), as TorchDynamo
does. Compared with eager over inputs taking both sides, graph counts with TorchDynamo's
(`graphs_delta`: we make fewer where one call's path ends in a constant)."""

from __future__ import annotations

import pytest
import torch

from test_graph_breaks import run_cases


def both_sums_positive(a, b):
    tmp = a.sum() > b.sum() and a.sum() > 0
    if tmp:
        return 1
    return 2


def two_conditions_joined(a, b):
    first = a.sum() > b.sum() and a.sum() > 0
    second = a.sum() < b.sum() or b.sum() > 0
    if first and second:
        return 1, first, second
    return 2, first, second


def or_returns_either_value(a, b):
    return (a.sum() > 0) or b


def and_or_chain(a, b):
    y = a * 2
    z = (y.sum() > 0) and (y.sum() + 1) or (y.sum() - 1)
    return z + b


def and_in_a_method(a, b):
    return _Gate()(a, b)


class _Gate(torch.nn.Module):
    def forward(self, a, b):
        keep = a.max() > 0 and b.min() < 0
        return a * 2 if keep else b * 3


CALLS = [(torch.ones(4), -2 * torch.ones(4)), (-2 * torch.ones(4), torch.ones(4)),
         (torch.ones(4), torch.ones(4))]


@pytest.mark.parametrize("fn,delta", [
    (both_sums_positive, -1),
    (two_conditions_joined, -1),
    (or_returns_either_value, 0),
    (and_or_chain, 0),
    (and_in_a_method, -1),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_short_circuit_on_a_tensor(fn, delta):
    converter = run_cases(fn, CALLS, graphs_delta=delta)
    assert converter.breaks
