"""`tensor.data` in traced code — it broke the graph at every read. It is the tensor's data
without its autograd history: an alias of the same storage that does not require grad, so
in-place changes made through it (weight clipping, EMA updates, `p.data.zero_()`) reach the
tensor. A `_get_data_attr` node in the graph, as TorchDynamo records it. Side by side with
TorchDynamo (`language_harness`); the tensors changed through `.data` are returned, so
their values after the call are compared with eager's too."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


def leaf(*shape):
    make = t(*shape)
    return lambda: make().requires_grad_(True)


def linear():
    torch.manual_seed(0)
    return nn.Linear(3, 4)


@case(leaf(3))
def read_data(x):
    y = x.data * 2
    return y, y.requires_grad, x.data.requires_grad


@case(t(3))
def change_through_data(x):
    d = x.data
    d.add_(1)
    return x * 2, x


@case(leaf(3))
def change_a_leaf_through_data(x):
    x.data.mul_(0.5)
    return x.detach() + 1


@case(linear, t(2, 3))
def weight_data_in_a_product(m, x):
    return x @ m.weight.data.t()


@case(linear, t(2, 3))
def scale_a_weight_then_call(m, x):
    m.weight.data.mul_(0.5)
    return m(x), m.weight.detach()


@case(linear, t(2, 3))
def clip_every_parameter(m, x):
    for p in m.parameters():
        p.data.clamp_(-0.1, 0.1)
    return m(x), m.weight.detach(), m.bias.detach()


@case(linear, linear, t(2, 3))
def ema_update(ema, model, x):
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.data.mul_(0.9).add_(p.data, alpha=0.1)
    return ema(x), ema.weight.detach()


@case(linear, linear, t(2, 3))
def copy_weights_across(target, source, x):
    target.weight.data.copy_(source.weight.data)
    return target(x), target.weight.detach()


@case(t(3))
def data_of_a_computed_tensor(x):
    z = x * 2
    return z.data + 1


@case(t(4))
def zero_through_data(x):
    y = x + 1
    x.data.zero_()
    return y, x


@case(t(2, 3))
def data_clone_and_shape(x):
    c = x.data.clone()
    return c.sum(), x.data.shape, x.data.dtype


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_tensor_data(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def _train_step(model, x):
    # WGAN-style weight clipping before the step's forward and backward.
    for p in model.parameters():
        p.data.clamp_(-0.05, 0.05)
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_clipping_in_a_training_step_matches_eager(backend):
    """Parameters changed through `.data` before a forward and backward: the loss, the
    parameters and every gradient equal eager's, with AOTAutograd too."""
    reset_all()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    twin = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(5, 3)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(_train_step, backend=counter if backend == "eager" else backend)
    for _ in range(2):
        expected = _train_step(twin, x)
        got = compiled(model, x)
        torch.testing.assert_close(got, expected)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, msg=name)
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    if backend == "eager":
        assert counter.frame_count == 1
