"""The module `compile` returns behaves as torch.compile's `OptimizedModule`: attributes set,
deleted and read through it are the wrapped module's, so the compiled `forward` sees them
(setting one on the wrapper alone gave the old result), and `training`, `len()` and truth
follow the wrapped module. Each case runs the same steps on torch.compile's wrapper and on
ours, compiled with a counting backend, and compares every observation and output."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale = 2.0
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x):
        y = self.lin(x) * self.scale + self.shift
        if getattr(self, "extra", None) is not None:
            y = y + self.extra
        return y


def _set_float(wrapper, x):
    wrapper.scale = 3.5
    return [wrapper(x), wrapper.scale]


def _set_buffer(wrapper, x):
    wrapper.shift = torch.full((3,), 5.0)  # replaces the registered buffer
    return [wrapper(x), sorted(name for name, _ in wrapper.named_buffers())]


def _set_submodule(wrapper, x):
    torch.manual_seed(1)
    wrapper.lin = torch.nn.Linear(3, 3)
    return [wrapper(x), sorted(name for name, _ in wrapper.named_parameters())]


def _set_then_delete(wrapper, x):
    wrapper.extra = torch.full((3,), 7.0)
    first = wrapper(x)
    del wrapper.extra
    return [first, wrapper(x), hasattr(wrapper, "extra")]


def _training_follows(wrapper, x):
    seen = [wrapper.training]
    wrapper.eval()
    seen.append(wrapper.training)
    wrapper._orig_mod.train()  # the wrapped module changed directly
    seen.append(wrapper.training)
    wrapper.training = False
    seen.append(wrapper._orig_mod.training)
    return seen + [wrapper(x)]


def _state_dict_keys(wrapper, x):
    wrapper.scale = 1.5
    return [sorted(wrapper.state_dict()), wrapper(x)]


STEPS = {"set_float": _set_float, "set_buffer": _set_buffer, "set_submodule": _set_submodule,
         "set_then_delete": _set_then_delete, "training_follows": _training_follows,
         "state_dict_keys": _state_dict_keys}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.allclose(a, b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", sorted(STEPS))
def test_attributes_go_to_the_wrapped_module(name):
    step = STEPS[name]

    def observe(compile_, counter):
        torch.manual_seed(0)
        model = Scaled()
        wrapper = compile_(model, backend=counter)
        x = torch.randn(2, 3)
        return [wrapper(x)] + step(wrapper, x), model

    torch._dynamo.reset()
    theirs, their_model = observe(torch.compile, torch._dynamo.testing.CompileCounter())
    torch._dynamo.reset()
    dynamo_rs.reset()
    ours, our_model = observe(dynamo_rs.compile, CompileCounter())
    # Eager: the same steps on the bare module (the outputs must not depend on the wrapper).
    torch.manual_seed(0)
    bare = Scaled()
    x = torch.randn(2, 3)
    assert _same(ours[0], bare(x))
    assert _same(ours, theirs), (ours, theirs)
    assert our_model.scale == their_model.scale
    assert hasattr(our_model, "extra") == hasattr(their_model, "extra")


def test_outputs_after_setattr_equal_eager():
    torch.manual_seed(0)
    model = Scaled()
    wrapper = dynamo_rs.compile(model, backend="eager")
    x = torch.randn(2, 3)
    wrapper(x)
    for scale in (0.5, -1.0, 4.0):
        wrapper.scale = scale
        torch.testing.assert_close(wrapper(x), model(x))
        assert model.scale == scale


@pytest.mark.parametrize("layers", [0, 2])
def test_length_and_truth_follow_the_wrapped_module(layers):
    seq = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(layers)])
    ours = dynamo_rs.compile(seq, backend="eager")
    torch._dynamo.reset()
    theirs = torch.compile(seq, backend="eager")
    assert len(ours) == len(theirs) == len(seq)
    assert bool(ours) == bool(seq)
    # A module that is not a container is true, as the module itself is.
    assert bool(dynamo_rs.compile(torch.nn.Linear(2, 2), backend="eager"))
    with pytest.raises(TypeError):
        len(dynamo_rs.compile(torch.nn.Linear(2, 2), backend="eager"))
