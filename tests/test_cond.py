"""`torch.cond(pred, true_fn, false_fn, operands)` inside compiled code: with a tensor
predicate both functions become subgraphs of one `torch.ops.higher_order.cond` node, as under
TorchDynamo (see `ops_cond`); with a constant one the chosen function runs. Each case runs
eagerly, under torch.compile and under dynamo_rs.compile (on the counting `eager` backend,
which runs the operation as it is, and on `aot_eager`, which traces through it): values and
gradients equal eager's, graphs and operations TorchDynamo's.

A `torch.cond` that torch refuses (branches returning their input, or tensors of different
sizes) raises eagerly — torch.cond compiles itself with TorchDynamo — and must raise the same
under dynamo_rs, however often it is called: TorchDynamo's frame evaluator then runs over
ours, and before the fix the two handed frames to each other (a crash, or a resume function
made of a resume function without end)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn

import dynamo_rs

pytestmark = [pytest.mark.usefixtures("reset_compilers"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

torch.manual_seed(0)
LIN = nn.Linear(4, 4)
W = torch.randn(4)
CASES = []


def case(fn):
    CASES.append(pytest.param(fn, id=fn.__name__))
    return fn


@case
def lambdas_reading_a_global(x):
    return torch.cond(x.sum() > 0, lambda t: (t * W).sin(), lambda t: t - W, (x,)) + 1


@case
def a_module_in_each_branch(x):
    return torch.cond(x.mean() > 0, lambda t: LIN(t), lambda t: LIN(t * 2).relu(), (x,)).sum()


@case
def tuple_of_outputs_two_operands(x):
    a, b = torch.cond(x[0, 0] > 0, lambda t, u: (t + u, t * u),
                      lambda t, u: (t - u, t / (u.abs() + 1)), (x, x * 2))
    return a * b


@case
def constant_predicate(x):
    return torch.cond(True, lambda t: t * 2, lambda t: t * 3, (x,))


@case
def nested_functions_and_a_list(x):
    def yes(t):
        return t.cos()

    def no(t):
        return t.sin()

    return torch.cond(x.sum() < 0, yes, no, [x])


@case
def closure_over_a_computed_tensor(x):
    y = x * 3
    return torch.cond(x.sum() > 0, lambda t: t + y, lambda t: t - y, (x,))


@case
def keyword_operands(x):
    return torch.cond(pred=x.sum() > 0, true_fn=lambda t: t.exp(), false_fn=lambda t: t.neg(),
                      operands=(x,))


def step(fn, x_seed=1):
    x = torch.randn(3, 4, requires_grad=True, generator=torch.Generator().manual_seed(x_seed))
    LIN.weight.grad = None
    out = fn(x)
    out.sum().backward()
    return out.detach(), x.grad, LIN.weight.grad


def assert_same(got, expected):
    for g, e in zip(got, expected, strict=True):
        if e is None:
            assert g is None
        else:
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", CASES)
def test_cond_as_eager(fn, backend) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch._dynamo.testing.CompileCounterWithBackend(backend)
        step(torch.compile(fn, backend=theirs))
        ours = torch._dynamo.testing.CompileCounterWithBackend(backend)
        compiled = dynamo_rs.compile(fn, backend=ours)
        for seed in (1, 2, 3):  # both branches taken
            assert_same(step(compiled, seed), step(fn, seed))
    assert ours.frame_count == theirs.frame_count == 1
    assert ours.op_count == theirs.op_count
    assert not compiled._dynamo_rs_converter.breaks
    assert not compiled._dynamo_rs_converter.failures


def test_cond_graph_holds_both_branches() -> None:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    dynamo_rs.compile(lambdas_reading_a_global, backend=backend)(torch.randn(3, 4))
    (gm,) = graphs
    (cond,) = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    true_gm, false_gm = (getattr(gm, n.target) for n in cond.args[1:3])
    # Both subgraphs take the same inputs: the operand and the global read by one side.
    for sub in (true_gm, false_gm):
        assert len([n for n in sub.graph.nodes if n.op == "placeholder"]) == 2


def returns_its_operand(x):
    return torch.cond(x.sum() > 0, lambda t: t, lambda t: t * 2, (x,))


def branches_of_different_sizes(x):
    return torch.cond(x.sum() > 0, lambda t: t.sum(0), lambda t: t, (x,))


@pytest.mark.parametrize("fn", [returns_its_operand, branches_of_different_sizes])
def test_a_cond_torch_refuses_raises_as_eagerly_every_time(fn) -> None:
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(Exception) as eager:
        fn(x)
    compiled = dynamo_rs.compile(fn, backend="eager")
    for _ in range(3):
        with pytest.raises(type(eager.value)):
            compiled(x)
    # And the front end still works afterwards (no frame compiled twice, nothing left on).
    good = dynamo_rs.compile(closure_over_a_computed_tensor, backend="eager")
    for seed in (1, 2):
        assert_same(step(good, seed), step(closure_over_a_computed_tensor, seed))
    assert not good._dynamo_rs_converter.breaks


def test_torch_compiled_function_called_from_compiled_code() -> None:
    """A `torch.compile`d function called (at a graph break) from code we compiled runs under
    TorchDynamo alone, after TorchDynamo has left its evaluator installed."""
    inner = torch.compile(lambda t: t.sin() + 1, backend="eager")
    inner(torch.randn(3))

    def outer(x):
        y = x * 2
        print("a graph break")
        return inner(y) + 1

    compiled = dynamo_rs.compile(outer, backend="eager")
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), (x * 2).sin() + 2)
