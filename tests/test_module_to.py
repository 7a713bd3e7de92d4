"""`module.to(...)` called in `forward` on a module that already has that dtype and device
(transformers' Switch Transformers router: `self.classifier = self.classifier.to(self.dtype)` on
every call), and a submodule stored back into its own slot: nothing changes, so the trace goes on
in the same graph. When something would change (a parameter of another dtype, a gradient, a new
layer, torch's `__future__` switches), the call is traced as before or the guard sends the call
to a new compile — outputs and module state equal eager's either way."""

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


class Router(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.classifier = torch.nn.Linear(4, 3)
        self.register_buffer("offset", torch.zeros(3))

    def forward(self, x):
        x = x.to(torch.float32)
        self.classifier = self.classifier.to(torch.float32)
        return self.classifier(x).softmax(-1) + self.offset


class CastsItself(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def forward(self, x):
        model = self.to(x.dtype)
        return model.inner(x) * 2


class ToDevice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.lin = self.lin.to("cpu", dtype=torch.float32)
        return self.lin(x).relu()


class StoresBack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.lin = self.lin
        return self.lin(x)


class Shorthands(torch.nn.Module):
    """`float()`, `cpu()` and `double()` on modules already so."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4).double()

    def forward(self, x):
        a = self.a.float().cpu()
        b = self.b.double()
        return a(x) + b(x.double()).float()


CASES = {"router casts its classifier": Router, "module casts itself": CastsItself,
         "to a device and dtype": ToDevice, "submodule stored back": StoresBack,
         "float(), cpu(), double()": Shorthands}


@pytest.mark.parametrize("name", list(CASES))
def test_unchanging_to_stays_in_the_graph(name) -> None:
    torch.manual_seed(0)
    eager = CASES[name]()
    ours, theirs = copy.deepcopy(eager), copy.deepcopy(eager)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(ours, backend=counter)
    their_counter = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(theirs, backend=their_counter)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 4)
            torch.testing.assert_close(compiled(x), eager(x))
            reference(x)
    assert counter.frame_count == 1, counter.frame_count
    assert counter.frame_count == their_counter.frame_count
    # TorchDynamo's graph keeps `Module.to`'s conversions (no-ops here) as nodes.
    assert counter.op_count <= their_counter.op_count, (counter.op_count, their_counter.op_count)


class FloatsItself(CastsItself):
    def forward(self, x):
        return self.float().inner(x) * 2


def _state(module):
    return [(n, t.dtype, t.clone()) for n, t in module.state_dict().items()]


def _same_state(a, b) -> None:
    for (na, da, ta), (nb, db, tb) in zip(_state(a), _state(b)):
        assert (na, da) == (nb, db)
        torch.testing.assert_close(ta, tb)


@pytest.mark.parametrize("change", ["a parameter in float64", "a new layer", "a gradient",
                                    "overwrite on conversion"])
@pytest.mark.parametrize("cast", ["to", "float"])
def test_a_change_that_to_would_undo_is_seen(change, cast) -> None:
    """After the first compile, something `Module.to` would act on changes: the next call
    does what eager does (here, converting back), and the modules end in the same state."""
    torch.manual_seed(0)
    eager = CastsItself() if cast == "to" else FloatsItself()
    ours = copy.deepcopy(eager)
    compiled = dynamo_rs.compile(ours, backend=CompileCounter())
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), eager(x))
    future = torch.__future__.get_overwrite_module_params_on_conversion()
    layer = torch.nn.Linear(2, 2).double()
    try:
        for module in (eager, ours):
            if change == "a parameter in float64":
                module.inner[0].weight.data = module.inner[0].weight.data.double()
            elif change == "a new layer":
                module.inner.append(copy.deepcopy(layer))
            elif change == "a gradient":
                module.inner[2].weight.grad = torch.ones(2, 4)
        if change == "overwrite on conversion":
            torch.__future__.set_overwrite_module_params_on_conversion(True)
        before = [p for p in eager.parameters()], [p for p in ours.parameters()]
        torch.testing.assert_close(compiled(x), eager(x))
        _same_state(ours, eager)
        # The same parameter objects kept (or replaced) on both sides.
        kept_eager = [a is b for a, b in zip(before[0], eager.parameters())]
        kept_ours = [a is b for a, b in zip(before[1], ours.parameters())]
        assert kept_ours == kept_eager
        if change == "a gradient":
            assert ours.inner[2].weight.grad.dtype == eager.inner[2].weight.grad.dtype
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(future)
