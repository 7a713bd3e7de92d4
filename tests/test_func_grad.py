"""`torch.func.grad` and what torch builds on it (`grad_and_value`, `vjp`, `jacrev`,
per-sample gradients with `vmap(grad(...))`), and forward mode (`jvp`, `jacfwd`, `hessian`) inside compiled code, captured as
TorchDynamo captures them (see `ops_functorch`): the primitives of torch's implementation
are graph nodes, the function's operations run on gradient-tracking fake tensors while
tracing. Each case runs eagerly, under torch.compile and under dynamo_rs.compile (counting
`eager` backend, and `aot_eager`): values equal eager's, graphs and operations TorchDynamo's,
and the switches the transform makes are left as found after every call."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp, vmap

import dynamo_rs
from operator_harness import assert_same_values, check_against_torchdynamo, seeded_inputs

pytestmark = [pytest.mark.usefixtures("reset_compilers"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
PARAMS = {k: v.detach() for k, v in MODEL.named_parameters()}
CASES = []


def case(*shapes):
    def register(fn):
        CASES.append(pytest.param(fn, shapes, id=fn.__name__))
        return fn

    return register


@case((5,))
def grad_of_a_scalar_function(x):
    return grad(lambda a: a.sin().sum())(x)


@case((5,), (5,))
def grad_over_two_arguments(x, y):
    return grad(lambda a, b: (a * b.exp()).sum(), argnums=(0, 1))(x, y)


@case((5,))
def grad_with_aux(x):
    return grad(lambda a: ((a ** 2).sum(), a.mean()), has_aux=True)(x)


@case((5,))
def grad_and_value_of_a_function(x):
    return grad_and_value(lambda a: a.cos().sum())(x)


@case((5,))
def closure_over_a_computed_tensor(x):
    w = x.abs() + 1
    return grad(lambda a: (a * w).tanh().sum())(x) * 2


@case((3,), (3,))
def vjp_of_a_function(x, v):
    out, pullback = vjp(torch.sin, x)
    return out, pullback(v)


@case((3,))
def jacobian_by_reverse_mode(x):
    return jacrev(lambda a: a.sin() * a.sum())(x)


@case((3,), (3,))
def jvp_of_a_function(x, v):
    return jvp(lambda a: a.sin() * a.sum(), (x,), (v,))


@case((3,))
def jacobian_by_forward_mode(x):
    return jacfwd(lambda a: a.cos() * a.sum())(x)


@case((2, 3), (2, 3))
def jvp_under_vmap(x, v):
    return vmap(lambda a, b: jvp(torch.sin, (a,), (b,)))(x, v)


@case((3,))
def hessian_of_a_function(x):
    return hessian(lambda a: (a ** 3).sum())(x)


@case((6, 4), (6,))
def per_sample_gradients(x, target):
    def loss(params, sample, label):
        out = functional_call(MODEL, params, (sample.unsqueeze(0),))
        return F.mse_loss(out.sum(-1), label.unsqueeze(0))

    return vmap(grad(loss), in_dims=(None, 0, 0))(PARAMS, x, target)


@case((5,))
def grad_of_grad(x):
    return grad(grad(lambda a: a.sin().sum() if a.dim() == 0 else a.sin().sum()))(x.sum())


def _state_as_found() -> None:
    assert torch._C._functorch.peek_interpreter_stack() is None
    assert not torch._C._functorch.get_inplace_requires_grad_allowed()
    assert torch._C._autograd._saved_tensors_hooks_is_enabled()
    assert torch._C._is_fwd_grad_enabled()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize(("fn", "shapes"), CASES)
def test_transform_as_eager(fn, shapes, backend) -> None:
    ours, theirs, _ = check_against_torchdynamo(
        fn, lambda f, seed: f(*seeded_inputs(shapes, seed)), backend, _state_as_found)
    assert ours.frame_count == theirs.frame_count


@pytest.mark.parametrize("transform", ["grad", "vjp", "jvp", "jacfwd", "hessian"])
def test_graph_break_inside_the_transform_runs_the_call_as_eagerly(transform, capsys) -> None:
    def loss(a):
        print("inside")
        return a.exp().sum()

    def fn(x):
        y = x * 2
        if transform == "grad":
            out = grad(loss)(y)
        elif transform == "vjp":
            out = vjp(loss, y)[1](torch.tensor(1.0))
        elif transform == "jvp":
            out = jvp(loss, (y,), (torch.ones_like(y),))
        elif transform == "jacfwd":
            out = jacfwd(loss)(y)
        else:
            out = hessian(loss)(y)
        return out

    compiled = dynamo_rs.compile(fn, backend="eager")
    x = torch.randn(4)
    assert_same_values(compiled(x), fn(x))
    _state_as_found()
    assert "inside" in capsys.readouterr().out


def test_errors_inside_grad_reach_the_caller_as_eagerly() -> None:
    def fn(x):
        return grad(lambda a: a * 2)(x)  # not a scalar: torch raises

    with pytest.raises(RuntimeError) as expected:
        fn(torch.randn(3))
    _state_as_found()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="scalar"):
            dynamo_rs.compile(fn, backend="eager")(torch.randn(3))
    assert "scalar" in str(expected.value)
    _state_as_found()


def test_called_with_saved_tensor_hooks_disabled_the_frame_runs_as_it_is() -> None:
    # The graph of `grad` disables and re-enables the hooks as it found them: a graph made
    # inside `disable_saved_tensors_hooks` would leave them disabled when called outside.
    counter = torch._dynamo.testing.CompileCounter()
    compiled = dynamo_rs.compile(grad_of_a_scalar_function, backend=counter)
    x = torch.randn(5)
    with torch.autograd.graph.disable_saved_tensors_hooks("off"):
        assert_same_values(compiled(x), grad_of_a_scalar_function(x))
    assert counter.frame_count == 0
    assert_same_values(compiled(x), grad_of_a_scalar_function(x))
    _state_as_found()
    assert counter.frame_count == 1
