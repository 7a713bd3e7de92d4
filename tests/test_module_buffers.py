"""Buffers a module replaces in its own `forward` (`self.buf = tensor`, which `Module.__setattr__`
registers as the buffer): a cache refreshed when the input size changes (timm's ConViT
`rel_indices`), a running counter, a buffer replaced and then read again. Each case runs on two
equal modules, one eagerly and one compiled, over the same calls; outputs, the buffers
afterwards and the graph count are compared (the count with TorchDynamo's on a third copy)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    torch._dynamo.reset()
    yield
    dynamo_rs.reset()
    torch._dynamo.reset()


class SizeCache(torch.nn.Module):
    """Recomputes a buffer when the sequence length changes (ConViT's pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("positions", torch.zeros(1, 3), persistent=False)

    def forward(self, x):
        n = x.shape[1]
        if self.positions is None or self.positions.shape[1] != n:
            self.positions = torch.arange(n, dtype=x.dtype)[None].repeat(x.shape[0], 1)
        return x * self.positions + 1


class RunningCount(torch.nn.Module):
    """Replaces a buffer on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count = self.count + x.shape[0]
        return x / self.count


class ReadsBack(torch.nn.Module):
    """Replaces a buffer, then reads it again (through the attribute and `named_buffers`)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        self.scale = self.scale * 2
        total = sum(b.sum() for _, b in self.named_buffers())
        return x * self.scale + total


class ReadsTable(torch.nn.Module):
    """Replaces a buffer, then reads the `_buffers` dict itself."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        self.scale = self.scale + x.mean()
        return x * self._buffers["scale"]


class InChild(torch.nn.Module):
    """The buffer belongs to a submodule called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.child = RunningCount()

    def forward(self, x):
        return self.child(x) + self.child(x * 2)


class StoredBackInPlace(torch.nn.Module):
    """Stores a buffer back into its own slot after changing it in place: `add_` returns the
    buffer itself, as does an operation with `out=` (spectral norm's power method)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("u", torch.ones(4))
        self.register_buffer("v", torch.zeros(4))

    def forward(self, x):
        self.u = self.u.add_(x.mean())
        self.v = torch.mul(self.u, 2, out=self.v)
        self.u = self.u
        return x * self.u + self.v


class StoredBackThenReplaced(torch.nn.Module):
    """A buffer stored back into its slot, then replaced by a new tensor and read again."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("u", torch.ones(4))

    def forward(self, x):
        self.u = self.u.mul_(0.5)
        self.u = self.u + x.sum(0)
        return x * self.u


def spectral_norm_training() -> torch.nn.Module:
    return torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(4, 3)).train()


CASES = {
    "buffer stored back after an in-place change": (StoredBackInPlace, [(2, 4)] * 3, 0),
    "buffer stored back, then replaced": (StoredBackThenReplaced, [(2, 4)] * 3, 0),
    "spectral norm in training (power iteration with out=)": (
        spectral_norm_training,
        [(2, 4)] * 3,
        0,
    ),
    "cache refreshed when the size changes": (SizeCache, [(2, 4), (2, 4), (2, 6), (2, 6), (2, 4)], 0),
    "buffer replaced on every call": (RunningCount, [(3, 4), (3, 4), (3, 4)], 0),
    # The `_buffers` dict is not read in a trace that replaced one of its entries (the store
    # is replayed after the graph): a graph break there, one more graph than TorchDynamo's;
    # reached through `named_buffers()` inside a generator expression, the frame cannot be
    # split there and runs eagerly (no graph where TorchDynamo makes one).
    "buffer replaced, then read again": (ReadsBack, [(2, 4), (2, 4)], -1),
    "buffer replaced, then its table read": (ReadsTable, [(2, 4), (2, 4)], 1),
    "a submodule's buffer, twice per call": (InChild, [(3, 4), (3, 4)], 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_buffer_replaced_in_forward(name) -> None:
    make, shapes, delta = CASES[name]
    torch.manual_seed(0)
    eager = make()
    ours, theirs = copy.deepcopy(eager), copy.deepcopy(eager)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(ours, backend=counter)
    their_counter = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(theirs, backend=their_counter)
    for shape in shapes:
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(x), eager(x))
        reference(x)
        for (name_e, b_e), (name_o, b_o) in zip(eager.named_buffers(), ours.named_buffers()):
            assert name_e == name_o
            torch.testing.assert_close(b_o, b_e)
    assert counter.frame_count == their_counter.frame_count + delta, (counter.frame_count, their_counter.frame_count)
