"""`tensor.grad` in traced code — reading it broke the graph, setting it ran the whole frame
eagerly. Gradient clipping (`clip_grad_norm_`, `clip_grad_value_`), gradient norms for
logging, manual SGD steps (`p -= lr * p.grad`) and `zero_grad` written by hand
(`p.grad = None`) now capture as TorchDynamo captures them: a gradient of a tensor the frame
was given is read through the source `p.grad` (a graph input, or a guarded None), a tensor
the trace made has none, and stores are replayed after the graph and read back until then.
Side by side with TorchDynamo (`language_harness`), then soundness cases against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all

CASES: list = []
case = case_registrar(CASES)


def trained():
    """A small net after one backward pass: every parameter has a gradient."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    m(torch.randn(4, 3)).pow(2).sum().backward()
    return m


def fresh():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))


def x43():
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(3))


def grads(m):
    return [None if p.grad is None else p.grad.clone() for p in m.parameters()]


@case(trained, x43)
def manual_sgd_step(m, x):
    with torch.no_grad():
        for p in m.parameters():
            p -= 0.1 * p.grad
    return m(x), [p.detach().clone() for p in m.parameters()]


@case(trained, x43)
def manual_sgd_through_data(m, x):
    for p in m.parameters():
        p.data.add_(p.grad.data, alpha=-0.1)
    return m(x)


@case(trained, x43)
def gradient_norm_for_logging(m, x):
    total = 0.0
    for p in m.parameters():
        if p.grad is not None:
            total = total + p.grad.norm() ** 2
    return total ** 0.5


@case(fresh, x43)
def no_gradients_yet(m, x):
    return [p.grad is None for p in m.parameters()], m(x)


@case(trained, x43)
def zero_grad_by_hand(m, x):
    for p in m.parameters():
        p.grad = None
    return m(x), [p.grad is None for p in m.parameters()]


@case(trained, x43)
def gradients_set_to_zeros(m, x):
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    return m(x), grads(m)


@case(trained, x43)
def gradients_scaled_in_place(m, x):
    for p in m.parameters():
        p.grad.mul_(0.5)
    return grads(m)


@case(trained, x43)
def clip_grad_value(m, x):
    torch.nn.utils.clip_grad_value_(m.parameters(), 0.01)
    return grads(m)


@case(trained, x43)
def clip_grad_norm(m, x):
    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
    return norm, grads(m)


@case(trained, x43, ops=3)  # TorchDynamo records the delete as a `__delattr__` node too
def delete_a_gradient(m, x):
    del m[0].weight.grad
    return m[0].weight.grad is None, m(x)


@case(lambda: x43()[0].requires_grad_(True))
def computed_tensor_has_none(x):
    y = x * 2
    return y.detach().grad is None, x.detach().grad is None, y + 1


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_tensor_grad(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def _read(p):
    return p * 2 if p.grad is None else p * 2 + p.grad


def test_a_gradient_that_appears_recompiles():
    reset_all()
    p = torch.randn(3, requires_grad=True)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(_read, backend=counter)
    torch.testing.assert_close(compiled(p), _read(p))
    p.grad = torch.ones(3)
    torch.testing.assert_close(compiled(p), _read(p))
    p.grad = torch.full((3,), 5.0)  # a new gradient of the same kind: the same graph
    torch.testing.assert_close(compiled(p), _read(p))
    p.grad = None
    torch.testing.assert_close(compiled(p), _read(p))
    assert counter.frame_count == 2


def _store_then_read(p, g):
    p.grad = g * 3
    p.grad.add_(1)
    return p.grad.sum()


def test_a_stored_gradient_is_read_back_and_kept():
    reset_all()
    p, q = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    g = torch.randn(3)
    got = dynamo_rs.compile(_store_then_read, backend=CompileCounter())(p, g)
    expected = _store_then_read(q, g)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(p.grad, q.grad)


def _wrong_size(p):
    p.grad = torch.zeros(5)
    return p + 1


def test_a_gradient_of_another_size_raises_as_eagerly():
    reset_all()
    p = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="size"):
        _wrong_size(p)
    with pytest.raises(RuntimeError, match="size"):
        dynamo_rs.compile(_wrong_size, backend=CompileCounter())(p)


def _train_step(model, x, lr):
    loss = model(x).pow(2).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
            p.grad = None
    return loss.detach()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_hand_written_training_step_matches_eager(backend):
    """Forward, backward (a graph break), clipping, a manual step and zeroing: losses and
    parameters after three steps equal eager's."""
    reset_all()
    model, twin = fresh(), fresh()
    x = x43()
    compiled = dynamo_rs.compile(_train_step, backend=backend)
    for _ in range(3):
        torch.testing.assert_close(compiled(model, x, 0.1), _train_step(twin, x, 0.1))
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q)
        assert p.grad is None and q.grad is None
