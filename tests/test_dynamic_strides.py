"""Automatic dynamic strides: a frame called with tensors of the same sizes whose strides
change from call to call on their own (a slice `buf[:, 0:1]` of buffers of growing width, a
transposed operand one call and a row-major one the next) compiled a new static graph for
every stride until the cache limit ran the frame eagerly. As TorchDynamo, a stride seen to
change — one that is not the product of another dimension's stride and size, which stays
inferred from the sizes — gets a symbol of its own in the next compile, and later strides
reuse that graph. Each case runs a sequence of calls eagerly, through dynamo_rs and through
torch.compile, and compares every result and exception with eager and the graph counts with
TorchDynamo's."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter

WIDTHS = [1, 2, 3, 4, 5, 1, 6, 2, 9, 11, 3]


def column(width: int):
    """A (4, 1) column: row-major when `width` is 1, else a slice of a (4, width) buffer
    (strides (width, 1))."""
    return torch.randn(4, width)[:, 0:1] if width > 1 else torch.randn(4, 1)


CASES = {
    "multiply": (lambda x, y: x * y, lambda w: (column(w), torch.randn(4, 1))),
    "stride_read": (lambda x: x * x.stride(0), lambda w: (column(w),)),
    "is_contiguous_branch": (lambda x: x + 1 if x.is_contiguous() else x - 1, lambda w: (column(w),)),
    "view": (lambda x: x.view(-1) * 2, lambda w: (column(w),)),
    "reshape": (lambda x: x.reshape(-1) * 2, lambda w: (column(w),)),
    "contiguous": (lambda x: x.contiguous().view(-1) + 1, lambda w: (column(w),)),
    "row_sums_of_a_slice": (lambda x: x.sum(1), lambda w: (torch.randn(3, w + 2)[:, :2],)),
    "transposed_or_not": (lambda x: x.t() @ x,
                          lambda w: (torch.randn(w + 2, 3)[:2] if w % 2 else torch.randn(3, w + 2).t()[:2],)),
    "last_dim_slice_3d": (lambda x: x.mean(-1) + x.amax(-1), lambda w: (torch.randn(2, 3, w + 2)[..., :2],)),
    "linear_on_a_slice": (lambda x, w_: torch.nn.functional.linear(x, w_),
                          lambda w: (torch.randn(3, w + 4)[:, 1:5], torch.randn(2, 4))),
}


def _outcome(fn, args):
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - compared by type
        return type(err)


def _run(compile_, counter, fn, make):
    compiled = compile_(fn, backend=counter)
    outcomes = []
    for width in WIDTHS:
        torch.manual_seed(width)
        args = make(width)
        outcomes.append((_outcome(fn, args), _outcome(compiled, args)))
    return outcomes


@pytest.mark.parametrize("name", sorted(CASES))
def test_changing_strides_reuse_one_dynamic_graph(name):
    fn, make = CASES[name]
    dynamo_rs.reset()
    ours = CompileCounter()
    outcomes = _run(dynamo_rs.compile, ours, fn, make)
    torch._dynamo.reset()
    theirs = torch._dynamo.testing.CompileCounter()
    _run(torch.compile, theirs, fn, make)
    for expected, got in outcomes:
        if isinstance(expected, torch.Tensor):
            torch.testing.assert_close(got, expected)
        else:
            assert got is expected
    assert ours.frame_count <= theirs.frame_count
    assert ours.frame_count <= 3  # not one graph per stride


def _placeholder_strides(gm) -> list:
    """The strides of the graph's tensor inputs as traced (the fakes' symbolic strides)."""
    return [tuple(node.meta["example_value"].stride()) for node in gm.graph.nodes
            if node.op == "placeholder" and isinstance(node.meta.get("example_value"), torch.Tensor)]


def test_strides_following_sizes_stay_inferred():
    """Row-major tensors of changing sizes: their strides follow the sizes and get no symbol
    of their own (the graph's strides are products of the size symbols)."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(_placeholder_strides(gm))
        return gm.forward

    f = dynamo_rs.compile(lambda x: x * 2, backend=backend)
    for rows in (3, 4, 5):
        x = torch.randn(rows, 6)
        torch.testing.assert_close(f(x), x * 2)
    assert len(seen) == 2
    # The row stride is the static column count: no symbol, though the rows changed.
    assert all(type(s) is int for s in seen[-1][0]) and seen[-1][0] == (6, 1)


def test_a_changing_stride_gets_its_own_symbol():
    seen = []

    def backend(gm, example_inputs):
        seen.append(_placeholder_strides(gm))
        return gm.forward

    f = dynamo_rs.compile(lambda x: x + 1, backend=backend)
    for width in (2, 3, 7):
        x = column(width)
        torch.testing.assert_close(f(x), x + 1)
    assert len(seen) == 2
    assert isinstance(seen[1][0][0], torch.SymInt)  # the stride that changed
    assert seen[1][0][1] == 1  # the one that did not
