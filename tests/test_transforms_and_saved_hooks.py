"""functorch transforms (`torch.func.grad`, `vmap`, ...) and saved-tensor hooks around and
inside compiled code, against eager.

Two bugs this guards against: a transform called inside a compiled function had its level
pushed for real while tracing (`_grad_increment_nesting` run as a graph function on fakes)
and never popped when the trace then broke — every later autograd.Function without
`setup_context` raised in plain eager code; and frames entered inside a transform were
compiled with the transform's wrapper tensors as inputs, which `aot_eager` and `inductor`
cannot take (a crash where eager runs). Saved-tensor hooks were called on fake tensors
while tracing a frame entered inside their block."""

from __future__ import annotations

import pytest
import torch
import torch._C._functorch as functorch_c

import dynamo_rs

BACKENDS = ["eager", "aot_eager"]


class ReluFn(torch.autograd.Function):
    """An autograd.Function without `setup_context`: raises inside a functorch transform, so
    it tells whether a transform level was left pushed."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x > 0)


def _no_state_left():
    assert functorch_c.peek_interpreter_stack() is None
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    ReluFn.apply(torch.randn(3))  # raises if a transform level leaked


def _sq_sin_sum(r):
    return (r.sin() ** 2).sum()


TRANSFORM_CALLS = {
    "grad": lambda x: torch.func.grad(_sq_sin_sum)(x),
    "grad_lambda": lambda x: torch.func.grad(lambda r: (r ** 2).sum())(x),
    "grad_and_value": lambda x: torch.func.grad_and_value(_sq_sin_sum)(x)[0],
    "vmap": lambda x: torch.func.vmap(lambda r: r.sum() * r + r.exp())(x),
    "vmap_in_dims": lambda x: torch.vmap(torch.mul, in_dims=(0, None))(x, x[0]),
    "nested_vmap": lambda x: torch.vmap(torch.vmap(torch.sin))(x),
    "vmap_of_grad": lambda x: torch.vmap(torch.func.grad(_sq_sin_sum))(x),
    "jacrev": lambda x: torch.func.jacrev(torch.sin)(x[0]),
    "jacfwd": lambda x: torch.func.jacfwd(torch.sin)(x[0]),
    "hessian": lambda x: torch.func.hessian(_sq_sin_sum)(x[0]),
    "jvp": lambda x: torch.func.jvp(torch.sin, (x,), (torch.ones_like(x),))[1],
    "vjp": lambda x: torch.func.vjp(torch.sin, x)[1](torch.ones_like(x))[0],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TRANSFORM_CALLS))
def test_transform_inside_a_compiled_function(name, backend):
    call = TRANSFORM_CALLS[name]

    def fn(x):
        y = x * 2
        return call(y) + 1, y.cos()

    x = torch.randn(4, 4)
    expected = fn(x)
    dynamo_rs.reset()
    compiled = dynamo_rs.compile(fn, backend=backend)
    for _ in range(2):
        got = compiled(x)
        _no_state_left()
        torch.testing.assert_close(got, expected)


def test_functional_call_inside_a_compiled_function():
    model = torch.nn.Linear(4, 4)
    params = {k: v.detach() * 2 for k, v in model.named_parameters()}

    def fn(p, x):
        return torch.func.functional_call(model, p, (x,)).relu()

    x = torch.randn(3, 4)
    expected = fn(params, x)
    for backend in BACKENDS:
        dynamo_rs.reset()
        got = dynamo_rs.compile(fn, backend=backend)(params, x)
        _no_state_left()
        torch.testing.assert_close(got, expected)
    # The module's own parameters are back in place.
    torch.testing.assert_close(model(x), torch.nn.functional.linear(x, model.weight, model.bias))


def _loss(r):
    return (r.sin() * 2).sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compiled_first", [True, False], ids=["entry_made_outside", "first_call_inside"])
def test_compiled_function_called_inside_a_transform(backend, compiled_first):
    x = torch.randn(4, 4)
    dynamo_rs.reset()
    compiled = dynamo_rs.compile(_loss, backend=backend)
    if compiled_first:
        torch.testing.assert_close(compiled(x), _loss(x))
    torch.testing.assert_close(torch.func.grad(compiled)(x), torch.func.grad(_loss)(x))
    torch.testing.assert_close(torch.vmap(compiled)(x), torch.vmap(_loss)(x))
    torch.testing.assert_close(torch.func.jacrev(compiled)(x), torch.func.jacrev(_loss)(x))
    _no_state_left()
    # Outside the transforms it still compiles and runs as before.
    torch.testing.assert_close(compiled(x), _loss(x))




def _recording_pack(seen: list):
    """A saved-tensor pack hook recording each saved tensor's shape in `seen`; it must never
    be handed a fake tensor (as it would be if a frame were traced inside its block)."""

    def pack(t):
        assert not isinstance(t, torch._subclasses.FakeTensor)
        seen.append(tuple(t.shape))
        return t

    return pack


@pytest.mark.parametrize("graph_break_inside", [False, True])
def test_saved_tensor_hooks_block_inside_a_compiled_function(graph_break_inside):
    """The hooks run as often, on the same tensors, as in eager: never on fakes while
    tracing."""
    seen: list = []
    pack = _recording_pack(seen)

    def unpack(t):
        return t

    def fn(x):
        x = x.detach().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            y = x.sin() * x
            if graph_break_inside:
                torch._dynamo.graph_break()
            z = (y * y).sum()
        z.backward()
        return x.grad

    x = torch.randn(3, 2)
    expected = fn(x)
    expected_seen, seen[:] = list(seen), []
    dynamo_rs.reset()
    got = dynamo_rs.compile(fn, backend="eager")(x)
    torch.testing.assert_close(got, expected)
    assert sorted(seen) == sorted(expected_seen)
    _no_state_left()


def test_compiled_function_called_inside_saved_tensor_hooks():
    seen: list = []
    pack = _recording_pack(seen)

    def fn(x):
        return (x.sin() * x).sum()

    x = torch.randn(5, requires_grad=True)
    dynamo_rs.reset()
    compiled = dynamo_rs.compile(fn, backend="eager")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(x)
    loss.backward()
    assert seen, "the hooks ran"
    torch.testing.assert_close(x.grad, (x.sin() + x * x.cos()).detach())
    _no_state_left()
