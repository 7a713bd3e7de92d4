"""Data-dependent branches: `a and b` / `a or b` on a tensor, and paths that meet again.

`a and b` / `a or b` where `a` is a tensor whose truth the trace cannot know:

CPython 3.11 compiles them to `JUMP_IF_FALSE_OR_POP`/`JUMP_IF_TRUE_OR_POP`, which keep the
value on the stack when they jump. The frame could not be split there and ran eagerly;
now the graph ends before the jump, the generated code makes it on the real value and each
side continues in a resume function (the taken side receives the value too), as TorchDynamo
does. Compared with eager over inputs taking both sides, graph counts with TorchDynamo's
(`graphs_delta`: we make fewer where one call's path ends in a constant).

Paths that meet again: a resume function split at a later branch makes the original
function's resume functions (not its own), so the paths through `if c1` share what follows
it, as TorchDynamo's do — k branches in a row made up to 2^k resume functions before."""

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
    (two_conditions_joined, -2),
    (or_returns_either_value, 0),
    (and_or_chain, 0),
    (and_in_a_method, -2),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_short_circuit_on_a_tensor(fn, delta):
    converter = run_cases(fn, CALLS, graphs_delta=delta)
    assert converter.breaks


def three_branches_in_a_row(x, c1, c2, c3):
    x = x + 1
    if c1:
        x = x + 2
    x = x + 3
    if c2:
        x = x + 4
    x = x + 5
    if c3:
        x = x + 6
    return x + 7


def test_paths_through_branches_join():
    import dynamo_rs
    from dynamo_rs.testing import CompileCounter

    x = torch.randn(4)
    ours = CompileCounter()
    compiled = dynamo_rs.compile(three_branches_in_a_row, backend=ours)
    theirs = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(three_branches_in_a_row, backend=theirs)
    for _ in range(2):
        for bits in range(8):
            # Distinct tensors per argument (one tensor passed for several conditions:
            # test_lazy_inputs.py::test_branches_on_arguments_join_their_resume_functions).
            flags = [torch.tensor([float(bits >> k & 1)]) for k in range(3)]
            torch.testing.assert_close(compiled(x, *flags), three_branches_in_a_row(x, *flags))
            reference(x, *flags)
    # The prefix and one resume function per place after a branch (6), each compiled once.
    assert ours.frame_count == theirs.frame_count == 7
