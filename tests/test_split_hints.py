"""Code shared by several objects where only some of them break the graph: a stack of
layers of one class, every other one a mixture of experts whose routing needs `nonzero()`
(Switch Transformers, a break under TorchDynamo too) — the loop over the layers is in a
frame that runs as it is (a break inside a loop), so each layer's call is a frame of its own.

The first trace, failing inside the second layer, remembered where each function it had
inlined failed, to stop there when that function next runs as a frame (a trace saved). The
next frame of that code was the *first* layer's, which does not break: it was split at the
same call all the same — 4 graphs for one layer where TorchDynamo makes 1. A remembered
break is now for the object it was made for (the function's first argument, `self`); the
same code run for another object is traced the usual way. Graphs, ops and results are
compared with TorchDynamo's and eager."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter

pytestmark = pytest.mark.usefixtures("reset_compilers")


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).relu()


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
        self.router = nn.Linear(8, 2)

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i in (choice == 0).nonzero().flatten().tolist():
            out[i] = self.experts[0](x[i])
        return out + x


class FeedForward(nn.Module):
    def __init__(self, sparse):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.mlp = Experts() if sparse else Dense()

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Block(nn.Module):
    def __init__(self, sparse):
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.ff = FeedForward(sparse)

    def forward(self, x):
        return self.ff(x + self.attn(x).tanh())


class Stack(nn.Module):
    def __init__(self, pattern):
        super().__init__()
        self.blocks = nn.ModuleList([Block(sparse) for sparse in pattern])
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _graphs_and_ops(counter):
    return counter.frame_count, counter.op_count


@pytest.mark.parametrize("pattern", [
    (False, True),
    (False, True, False, True),
    (True, False, False),
    (False, False, True, True),
], ids=lambda p: "".join("S" if s else "D" for s in p))
def test_layers_that_do_not_break_stay_in_one_graph(pattern) -> None:
    torch.manual_seed(0)
    model = Stack(pattern).eval()
    x = torch.randn(6, 8)
    ours, theirs = CompileCounter(), torch._dynamo.testing.CompileCounter()
    compiled = dynamo_rs.compile(model, backend=ours)
    reference = torch.compile(model, backend=theirs)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(compiled(x), expected)
        reference(x)
        torch.testing.assert_close(compiled(x), expected)
        reference(x)
    assert compiled._dynamo_rs_converter.failures == [] or all(
        "nonzero" in reason or "tolist" in reason or "loop" in reason
        for _, reason in compiled._dynamo_rs_converter.failures)
    assert _graphs_and_ops(ours) == _graphs_and_ops(theirs)


def test_the_breaking_layer_still_uses_the_remembered_break() -> None:
    """The hint still saves the second trace for the object it was made for."""
    torch.manual_seed(0)
    model = Stack((True,)).eval()
    compiled = dynamo_rs.compile(model, backend=CompileCounter())
    with torch.no_grad():
        compiled(torch.randn(6, 8))
    converter = compiled._dynamo_rs_converter
    # The root frame is skipped (a break inside its loop); the block's frame and each frame
    # it inlined down to the break are traced once each, stopped where the first trace failed.
    names = [name for name, _, _ in converter.frames]
    assert names.count("Block.forward") == 1 and names.count("FeedForward.forward") == 1
    assert all(outcome != "eager" for name, _, outcome in converter.frames
               if name in ("Block.forward", "FeedForward.forward"))
