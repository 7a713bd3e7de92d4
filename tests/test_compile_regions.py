"""`torch.compiler.nested_compile_region` inside compiled code: each call of a region is one
`torch.ops.higher_order.invoke_subgraph` node calling a subgraph, as under TorchDynamo (see
`ops_compile_region`). Each case runs eagerly, under torch.compile and under
dynamo_rs.compile (on the counting `eager` backend and on `aot_eager`, which traces through
the operator), forward and backward: values and gradients equal eager's, graphs and
operations TorchDynamo's."""

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


@torch.compiler.nested_compile_region
def _sin_plus_one(x):
    return x.sin() + 1


@torch.compiler.nested_compile_region
def _block(x, scale):
    return LIN(x).relu() * scale + W


@torch.compiler.nested_compile_region
def _pair(x, y):
    return x * y, (x - y).tanh()


@torch.compiler.nested_compile_region
def _passes_one_through(x):
    return x, x.exp()


@case
def one_region_called_twice(x):
    return _sin_plus_one(x) + _sin_plus_one(x * 2)


@case
def region_with_a_module_a_global_and_a_number(x):
    return _block(_block(x, 0.5), 2.0).sum(-1)


@case
def region_returning_a_tuple(x):
    a, b = _pair(x, x.cos())
    return a + b


def region_returning_its_input(x):
    same, e = _passes_one_through(x * 3)
    return same * e + _passes_one_through(x)[1]


@case
def region_keyword_arguments(x):
    return _block(x, scale=3.0)


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return self.lin(x).sigmoid() * x


_LAYERS = nn.ModuleList([_Layer(), _Layer()])


@case
def region_as_a_module_forward(x):
    for layer in _LAYERS:
        x = layer(x)
    return x


def step(fn, seed=1):
    x = torch.randn(3, 4, requires_grad=True, generator=torch.Generator().manual_seed(seed))
    for p in [*LIN.parameters(), *_LAYERS.parameters()]:
        p.grad = None
    out = fn(x)
    out.sum().backward()
    return out.detach(), x.grad, LIN.weight.grad, _LAYERS[0].lin.weight.grad


def assert_same(got, expected):
    for g, e in zip(got, expected, strict=True):
        if e is None:
            assert g is None
        else:
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", CASES)
def test_region_as_eager(fn, backend) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch._dynamo.testing.CompileCounterWithBackend(backend)
        step(torch.compile(fn, backend=theirs))
        ours = torch._dynamo.testing.CompileCounterWithBackend(backend)
        compiled = dynamo_rs.compile(fn, backend=ours)
        for seed in (1, 2):
            assert_same(step(compiled, seed), step(fn, seed))
    assert ours.frame_count == theirs.frame_count == 1
    assert ours.op_count == theirs.op_count
    assert not compiled._dynamo_rs_converter.breaks
    assert not compiled._dynamo_rs_converter.failures


def test_identical_calls_share_one_subgraph_named_as_its_identifier() -> None:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    dynamo_rs.compile(one_region_called_twice, backend=backend)(torch.randn(3))
    (gm,) = graphs
    calls = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 2
    names = [n.args[0].target for n in calls]
    assert [n.args[1] for n in calls] == names
    assert len(set(names)) == 1
    assert [name for name, _ in gm.named_children()] == names[:1]


def test_region_changing_a_tensor_it_was_given_runs_as_eagerly() -> None:
    @torch.compiler.nested_compile_region
    def bump(t):
        t.add_(1)
        return t * 2

    def fn(x):
        return bump(x) + 1

    x, y = torch.ones(3), torch.ones(3)
    expected = fn(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = dynamo_rs.compile(fn, backend="eager")(y)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(y, x)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_region_returning_its_input_as_eager(backend) -> None:
    # TorchDynamo refuses a region whose result aliases its input (an error); the tensor it
    # passes through stays the caller's own here, the rest is the region's operator.
    ours = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = dynamo_rs.compile(region_returning_its_input, backend=ours)
    for seed in (1, 2):
        assert_same(step(compiled, seed), step(region_returning_its_input, seed))
    assert ours.frame_count == 1
    assert not compiled._dynamo_rs_converter.breaks


def test_regions_called_once_are_inlined_as_under_torchdynamo() -> None:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    dynamo_rs.compile(region_with_a_module_a_global_and_a_number, backend=backend)(torch.randn(3, 4))
    # Two calls with different numbers: two different subgraphs, each called once.
    (gm,) = graphs
    assert not any(n.target is torch.ops.higher_order.invoke_subgraph for n in gm.graph.nodes)
    assert not list(gm.named_children())
    torch.testing.assert_close(gm(torch.ones(3, 4), *[p for p in (LIN.weight, LIN.bias, W)])[0],
                               region_with_a_module_a_global_and_a_number(torch.ones(3, 4)))
