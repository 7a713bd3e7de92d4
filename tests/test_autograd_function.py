"""User-defined `torch.autograd.Function`s called with inputs that need gradients: the graph
calls `apply` itself, so the user's forward and backward run as they do eagerly (the custom
backward is used, not autograd's derivative of forward), with every backend; a forward that
changes Python state or a tensor in place is not put in a graph (it would run once more per
call) and the frame splits there. Compared with eager, and with TorchDynamo's graph count."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs


@pytest.fixture(autouse=True)
def fresh(reset_compilers):
    yield


class ScaledGrad(torch.autograd.Function):
    """Forward is x * k; backward deliberately returns 10 * k * grad (not the derivative):
    a compiled result with autograd's own derivative would differ."""

    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.k * 10, None


class SavedSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y * (1 - y)


class TwoOutputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y, x + y

    @staticmethod
    def backward(ctx, ga, gb):
        x, y = ctx.saved_tensors
        return ga * y + gb, ga * x + gb


class SeparateSetup(torch.autograd.Function):
    @staticmethod
    def forward(x, scale):
        return x.exp() * scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out * 2, None  # again not the true derivative


class NonDifferentiableIndex(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        index = x.argmax(-1)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(x)
        return x.relu(), index

    @staticmethod
    def backward(ctx, grad, _):
        (x,) = ctx.saved_tensors
        return grad * (x > 0)


CALLS: list = []


class Logging(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        CALLS.append("forward")
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class InPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(2)

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class MaskedSoftmax(torch.autograd.Function):
    """transformers' DeBERTa `XSoftmax`: an attribute on ctx, and an in-place change of a
    tensor forward made itself (which once made the frame run eagerly)."""

    @staticmethod
    def forward(ctx, x, mask, dim):
        ctx.dim = dim
        rmask = ~(mask.to(torch.bool))
        output = x.masked_fill(rmask, torch.tensor(torch.finfo(x.dtype).min))
        output = torch.softmax(output, ctx.dim)
        output.masked_fill_(rmask, 0)
        ctx.save_for_backward(output, rmask)
        return output

    @staticmethod
    def backward(ctx, grad):
        output, rmask = ctx.saved_tensors
        return torch._softmax_backward_data(grad, output, ctx.dim, output.dtype), None, None


def masked_softmax(x, w):
    h = x @ w
    return (MaskedSoftmax.apply(h, h > 0, 1) * torch.arange(3.0)).sum()


def scaled(x, w):
    return ScaledGrad.apply(x @ w, 3.0).sum()


def sigmoid_chain(x, w):
    return SavedSigmoid.apply(x @ w).pow(2).sum()


def two_outputs(x, w):
    a, b = TwoOutputs.apply(x @ w, w.sum(0))
    return (a * b).sum()


def separate_setup(x, w):
    return SeparateSetup.apply(x @ w, 0.5).sum()


def non_differentiable(x, w):
    out, index = NonDifferentiableIndex.apply(x @ w)
    return out.sum() + index.float().sum()


def nested_in_a_module_method(x, w):
    layer = torch.nn.Linear(3, 3)
    torch.nn.init.constant_(layer.weight, 0.5)
    torch.nn.init.zeros_(layer.bias)
    return SavedSigmoid.apply(layer(ScaledGrad.apply(x @ w, 2.0))).sum()


CASES = [scaled, sigmoid_chain, two_outputs, separate_setup, non_differentiable, masked_softmax]


def loss_and_grad(fn, x, w):
    w = w.detach().requires_grad_(True)
    loss = fn(x, w)
    (grad,) = torch.autograd.grad(loss, w)
    return loss.detach(), grad


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_custom_backward_runs_as_eagerly(fn, backend) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(4, 5), torch.randn(5, 3)
    expected = loss_and_grad(fn, x, w)
    theirs = torch._dynamo.testing.CompileCounterWithBackend(backend)
    torch.compile(fn, backend=theirs)(x, w.requires_grad_(True))
    ours = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = dynamo_rs.compile(fn, backend=ours)
    for _ in range(2):
        got = loss_and_grad(compiled, x, w)
        torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-4)
    assert ours.frame_count == theirs.frame_count == 1


def test_without_gradients_forward_is_inlined() -> None:
    ours = torch._dynamo.testing.CompileCounter()
    x, w = torch.randn(4, 5), torch.randn(5, 3)
    got = dynamo_rs.compile(sigmoid_chain, backend=ours)(x, w)
    torch.testing.assert_close(got, sigmoid_chain(x, w))
    graph = ours.graphs[0] if hasattr(ours, "graphs") else None
    assert ours.frame_count == 1
    del graph


def test_forward_that_changes_python_state_runs_once_per_call() -> None:
    def fn(x, w):
        return Logging.apply(x @ w).sum()

    x, w = torch.randn(4, 5), torch.randn(5, 3, requires_grad=True)
    CALLS.clear()
    expected = loss_and_grad(fn, x, w)
    eager_calls = len(CALLS)
    CALLS.clear()
    compiled = dynamo_rs.compile(fn, backend="eager")
    got = loss_and_grad(compiled, x, w)
    assert len(CALLS) == eager_calls == 1
    torch.testing.assert_close(got[1], expected[1])


def test_forward_that_changes_its_input_in_place_gives_eager_results() -> None:
    def fn(x, w):
        h = x @ w
        return InPlace.apply(h).sum()

    x, w = torch.randn(4, 5), torch.randn(5, 3)
    expected = loss_and_grad(fn, x, w)
    got = loss_and_grad(dynamo_rs.compile(fn, backend="eager"), x, w)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])


def test_module_made_in_forward_around_custom_functions() -> None:
    x, w = torch.randn(4, 5), torch.randn(5, 3)
    expected = loss_and_grad(nested_in_a_module_method, x, w)
    got = loss_and_grad(dynamo_rs.compile(nested_in_a_module_method, backend="aot_eager"), x, w)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])


def test_forward_changing_its_own_tensors_in_place_stays_in_the_graph() -> None:
    x, w = torch.randn(4, 5), torch.randn(5, 3, requires_grad=True)
    explained = dynamo_rs.explain(masked_softmax)(x, w)
    assert explained.graph_count == 1
    assert explained.break_reasons == []
