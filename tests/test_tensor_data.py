"""`tensor.data` in traced code — it broke the graph at every read. It is the tensor's data
without its autograd history: an alias of the same storage that does not require grad, so
in-place changes made through it (weight clipping, EMA updates, `p.data.zero_()`) reach the
tensor. A `_get_data_attr` node in the graph, as TorchDynamo records it. Side by side with
TorchDynamo (`language_harness`); the tensors changed through `.data` are returned, so
their values after the call are compared with eager's too.

`tensor.data = other` swaps the tensor's data for another tensor's (weight clipping written
the old way, manual optimiser steps): one `aten.shallow_copy_data_` node with grad mode off
around it, as TorchDynamo records it, for a tensor the frame was given; the graph breaks
where TorchDynamo's does (a tensor made in the trace, another dtype, a tensor that requires
grad given data of other sizes)."""

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


def linear_with_grads():
    m = linear()
    for p in m.parameters():
        p.grad = torch.full_like(p, 0.5)
    return m


@case(t(3), t(3))
def set_data_of_an_input(x, y):
    x.data = y * 2
    return x + 1, x


@case(t(3), t(5))
def set_data_of_other_sizes(x, y):
    x.data = y
    return x.sum(), x.shape, x


@case(t(2, 3))
def set_data_to_a_transpose(x):
    x.data = x.t()
    return x.shape, x.stride(), x * 1


@case(leaf(4))
def clamp_a_leaf_through_set_data(x):
    x.data = x.data.clamp(-0.5, 0.5)
    return x * 2, x.detach()


# TorchDynamo also compiles an empty graph before the break (it returns its two inputs).
@case(leaf(3), t(5), graphs=1)
def set_data_of_a_leaf_to_other_sizes(x, y):
    x.data = y
    return x.detach() + 1


@case(linear, t(2, 3))
def clamp_a_weight_through_set_data(m, x):
    m.weight.data = m.weight.data.clamp(-0.1, 0.1)
    return m(x), m.weight.detach()


@case(linear_with_grads, t(2, 3))
def manual_sgd_step_through_set_data(m, x):
    for p in m.parameters():
        p.data = p.data - 0.1 * p.grad
    return m(x), m.weight.detach(), m.bias.detach()


@case(t(3), t(3))
def alias_sees_the_new_data(x, y):
    z = x
    x.data = y + 1
    return z * 1, z is x


@case(t(3), t(3))
def new_data_shares_storage(x, y):
    x.data = y
    y.add_(1)
    return x + 0, y


@case(t(3), t(3))
def read_before_and_after_set_data(x, y):
    a = x * 2
    x.data = y
    return a + x, x


@case(t(3), t(3))
def set_data_inside_no_grad(x, y):
    with torch.no_grad():
        x.data = y * 2
    return x + 1


@case(t(3), t(3))
def set_data_then_graph_break(x, y):
    x.data = y * 2
    torch._dynamo.graph_break()
    return x + 1, x


@case(t(3), t(3))
def set_data_of_a_computed_tensor(x, y):
    z = x * 2
    z.data = y
    return z + 1


@case(t(3), t(3))
def set_data_to_another_dtype(x, y):
    x.data = y.double()
    return x + 1


@case(t(3), t(3))
def setattr_data(x, y):
    setattr(x, "data", y - 1)
    return x * 3


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


def _model_and_twin():
    """A small model, an equal copy for the eager run, an input and a graph counter."""
    reset_all()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    twin = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    twin.load_state_dict(model.state_dict())
    return model, twin, torch.randn(5, 3), CompileCounter()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_clipping_in_a_training_step_matches_eager(backend):
    """Parameters changed through `.data` before a forward and backward: the loss, the
    parameters and every gradient equal eager's, with AOTAutograd too."""
    model, twin, x, counter = _model_and_twin()
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


def _sgd(model, x, lr):
    loss = model(x).pow(2).mean()
    for p in model.parameters():
        p.data = p.data - lr * p.grad
    return loss


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_manual_sgd_through_set_data_matches_eager(backend):
    """Training steps whose update is `p.data = p.data - lr * p.grad`: the losses, the
    parameters after three steps and the gradients equal eager's, with AOTAutograd too (the
    parameters are graph inputs that require grad, their data swapped in the graph)."""
    model, twin, x, counter = _model_and_twin()
    compiled = dynamo_rs.compile(_sgd, backend=counter if backend == "eager" else backend)
    for _ in range(3):
        for m in (model, twin):
            m.zero_grad()
            m(x).sum().backward()
        expected = _sgd(twin, x, 0.1)
        got = compiled(model, x, 0.1)
        torch.testing.assert_close(got, expected)
        expected.backward()
        got.backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, msg=name)
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    if backend == "eager":
        assert counter.frame_count == 1


def _swap(x, y):
    x.data = y * 2
    return x.sum() + y.shape[0]


def test_set_data_with_dynamic_sizes_matches_eager():
    """Inputs of new sizes on every call, compiled with `dynamic=True`: one graph, the
    tensor's new data (and sizes) equal eager's after every call."""
    reset_all()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(_swap, backend=counter, dynamic=True)
    for n in (3, 5, 7):
        x, y = torch.randn(n), torch.randn(n + 1)
        x2, y2 = x.clone(), y.clone()
        torch.testing.assert_close(compiled(x, y), _swap(x2, y2))
        torch.testing.assert_close(x, x2)
    assert counter.frame_count == 1
