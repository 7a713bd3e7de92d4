"""`guard_check_mode = "debug"`: every guard check is also made by a slow reference that
resolves each guarded source on its own (plain getattr, [], MRO walk; tensors field by field;
aliasing pair by pair). The suite runs in that mode (tests/conftest.py), so any disagreement
anywhere raises; here the reference is shown to see what the guard sees — it fails where
the guard fails and holds where it holds, over changes of every kind a guard covers."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs import eval_frame
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


class Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.blocks = torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.Tanh()])
        self.table = {"a": 1, "b": 2}
        self.flags = {3, 4}

    def forward(self, x, y, options):
        x = self.inner(x)
        for block in self.blocks:
            x = block(x)
        if 3 in self.flags:
            x = x + self.table["a"]
        if self.training:
            x = x * 2
        if options["mode"] == "add":
            return x + y
        return x * y


def fresh_inputs():
    return Outer().eval(), torch.randn(2, 4), torch.randn(2, 4), {"mode": "add"}


CHANGES = {
    "nothing": lambda m, x, y, o: None,
    "shape": lambda m, x, y, o: {"x": torch.randn(3, 4)},
    "dtype": lambda m, x, y, o: {"y": y.double()},
    "requires_grad": lambda m, x, y, o: {"y": y.clone().requires_grad_()},
    "stride": lambda m, x, y, o: {"x": torch.randn(4, 2).t()},
    "alias": lambda m, x, y, o: {"y": x},
    "constant in a dict": lambda m, x, y, o: o.update(mode="mul"),
    "module attribute": lambda m, x, y, o: setattr(m.inner, "scale", 3.0),
    "submodule swapped": lambda m, x, y, o: m.blocks.__setitem__(1, torch.nn.Sigmoid()),
    "container length": lambda m, x, y, o: m.blocks.append(torch.nn.ReLU()) and None,
    "dict entry": lambda m, x, y, o: m.table.__setitem__("a", 5),
    "set membership": lambda m, x, y, o: m.flags.discard(3),
    "training flag": lambda m, x, y, o: m.train() and None,
    "grad mode": lambda m, x, y, o: torch._C._set_grad_enabled(False),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_reference_agrees_with_the_guard(change) -> None:
    model, x, y, options = fresh_inputs()
    compiled = dynamo_rs.compile(model, backend=CompileCounter())
    compiled(x, y, options)
    (guard, _), = eval_frame.cache_entries(Outer.forward)
    frame = {"self": model, "x": x, "y": y, "options": options}
    try:
        replaced = CHANGES[change](model, x, y, options)
        frame.update(replaced or {})
        fast = guard.first_failure(frame)
        reference = guard.reference_first_failure(frame)
    finally:
        torch.set_grad_enabled(True)
    assert (fast is None) == (reference is None), (fast, reference)
    assert (fast is None) == (change == "nothing"), fast


def test_calls_run_both_evaluations_in_debug_mode() -> None:
    assert dynamo_rs.config.guard_check_mode == "debug"
    model, x, y, options = fresh_inputs()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y, options), model(x, y, options))
    options["mode"] = "mul"
    torch.testing.assert_close(compiled(x, y, options), model(x, y, options))
    assert counter.frame_count == 2


def test_guard_check_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="guard_check_mode"):
        dynamo_rs.config.guard_check_mode = "sometimes"
