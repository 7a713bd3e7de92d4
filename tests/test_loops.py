"""`torch._higher_order_ops.while_loop` and `scan` inside compiled code: each function becomes
a subgraph of one `torch.ops.higher_order.while_loop` / `scan` node, as under TorchDynamo (see
`ops_loops`). Each case runs eagerly, under torch.compile and under dynamo_rs.compile (on the
counting `eager` backend, which runs the operator as it is, and on `aot_eager`, which traces
through it): values equal eager's, graphs and operations TorchDynamo's, no graph break.

The functions are traced over stand-ins for the values that change from step to step: a
function that also reads the loop's initial tensor through a closure must read that tensor
on every step, not the step's value (the case `closure_reads_the_initial_value`). What torch
refuses or TorchDynamo does not capture in one graph breaks the graph at the call, which
then runs as eagerly: the result stays eager's."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import dynamo_rs
from operator_harness import check_against_torchdynamo, flat_values

pytestmark = [pytest.mark.usefixtures("reset_compilers"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

torch.manual_seed(0)
LIN = nn.Linear(4, 4)
W = torch.randn(4)
CASES = []


def case(fn):
    CASES.append(pytest.param(fn, id=fn.__name__))
    return fn


# --- while_loop ------------------------------------------------------------------------------

@case
def counter_and_tensor(x):
    return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2 + 1), (torch.tensor(0), x))


@case
def data_dependent_trip_count(x):
    def cond(y):
        return y.abs().sum() < 100

    def body(y):
        return (y * 1.5 + 0.5,)

    return while_loop(cond, body, (x,))


@case
def no_iteration(x):
    return while_loop(lambda i, y: i > 5, lambda i, y: (i + 1, y.sin()), (torch.tensor(0), x))


@case
def body_reads_a_global_and_a_module(x):
    def body(i, y):
        return i + 1, LIN(y).tanh() + W

    return while_loop(lambda i, y: i < 4, body, (torch.tensor(0), x))


@case
def closure_reads_the_initial_value(x):
    # `x` through the closure is the initial value on every step; `y` is the step's.
    x0 = x.clone()

    def body(i, y):
        return i + 1, y * 0.5 + x0

    return while_loop(lambda i, y: i < 3, body, (torch.tensor(0), x0 * 1))


@case
def condition_reads_a_computed_tensor(x):
    limit = x.abs().sum() * 4

    def cond(y):
        return y.abs().sum() < limit

    return while_loop(cond, lambda y: (y * 2,), (x + 0.1,))


@case
def work_before_and_after(x):
    y = x.relu() + 0.1
    i, z = while_loop(lambda i, z: i < 2, lambda i, z: (i + 1, z.cos()), (torch.tensor(0), y))
    return z.sum() + i


# --- scan ------------------------------------------------------------------------------------

@case
def cumulative_sum(x):
    def add(carry, row):
        nxt = carry + row
        return nxt, nxt.clone()

    return scan(add, torch.zeros(4), x)


@case
def two_carries_two_outputs(x):
    def step(carry, row):
        total, product = carry
        return (total + row, product * row.sigmoid()), ((total * row).sin(), row.relu())

    return scan(step, (torch.zeros(4), torch.ones(4)), x)


@case
def reversed_scan(x):
    def add(carry, row):
        return carry * 0.5 + row, carry.tanh()

    return scan(add, torch.zeros(4), x, reverse=True)


@case
def scan_over_dim_1(x):
    def add(carry, column):
        return carry + column, carry.cos()

    return scan(add, torch.zeros(x.shape[0]), x, dim=1)


@case
def scan_with_a_module_and_a_closure(x):
    bias = x.mean(0)

    def step(h, row):
        h = LIN(h + row).tanh() + bias
        return h, h * 2

    return scan(step, torch.zeros(4), x)


@case
def scan_over_two_sequences(x):
    def step(carry, rows):
        a, b = rows
        return carry + a * b, carry - a

    return scan(step, torch.zeros(4), (x, x.flip(0)))


def run(fn, seed=1):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return fn(x)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", CASES)
def test_loop_as_eager(fn, backend) -> None:
    ours, theirs, compiled = check_against_torchdynamo(fn, lambda f, seed: run(f, seed), backend)
    assert ours.frame_count == theirs.frame_count == 1
    assert not compiled._dynamo_rs_converter.breaks


def test_one_operator_node_with_subgraphs() -> None:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        dynamo_rs.compile(closure_reads_the_initial_value, backend=backend)(torch.randn(5, 4))
    (gm,) = graphs
    loops = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.while_loop]
    assert len(loops) == 1
    cond_fn, body_fn, carried, additional = loops[0].args
    # The closure's tensor is an additional input, apart from the carried step value.
    assert len(carried) == 2 and len(additional) == 1
    assert additional[0] is not carried[1]
    assert {cond_fn.target, body_fn.target} <= {n for n, _ in gm.named_children()}
    body = getattr(gm, body_fn.target)
    assert len([n for n in body.graph.nodes if n.op == "placeholder"]) == 3


def closure_reads_the_carried_tensor(x):
    def body(i, y):
        return i + 1, y * 0.5 + x

    return while_loop(lambda i, y: i < 3, body, (torch.tensor(0), x))


def same_tensor_carried_twice(x):
    def body(i, a, b):
        return i + 1, a + 1, b * 2

    return while_loop(lambda i, a, b: i < 3, body, (torch.tensor(0), x, x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [closure_reads_the_carried_tensor, same_tensor_carried_twice])
def test_one_tensor_given_twice_runs_as_eagerly(fn, backend) -> None:
    # TorchDynamo captures these, and AOTAutograd then refuses the aliased inputs of its
    # graph (BackendCompilerFailed); the capture leaves the call to run as eagerly.
    compiled = dynamo_rs.compile(fn, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in (1, 2):
            for g, e in zip(flat_values(run(compiled, seed)), flat_values(run(fn, seed)), strict=True):
                torch.testing.assert_close(g, e)
    assert not compiled._dynamo_rs_converter.failures


def _breaks(fn, *args):
    compiled = dynamo_rs.compile(fn, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(*args)
    return got, compiled._dynamo_rs_converter.breaks


def test_body_returning_its_input_breaks_and_raises_as_eagerly() -> None:
    def fn(x):
        return while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, y), (torch.tensor(0), x))

    with pytest.raises(Exception) as expected:
        fn(torch.randn(3))
    with pytest.raises(expected.type):
        dynamo_rs.compile(fn, backend="eager")(torch.randn(3))


@pytest.mark.parametrize("kind", ["int carry", "needs grad", "changes a closure tensor",
                                  "draws random numbers", "shape changes"])
def test_what_torch_or_the_capture_refuses_runs_as_eagerly(kind) -> None:
    box = [torch.zeros(3)]

    def fn(x):
        if kind == "int carry":
            return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2), (0, x))
        if kind == "changes a closure tensor":
            def body(i, y):
                box[0].add_(1)
                return i + 1, y * 2
            return while_loop(lambda i, y: i < 3, body, (torch.tensor(0), x))
        if kind == "draws random numbers":
            return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y + torch.rand(3)),
                              (torch.tensor(0), x))
        if kind == "shape changes":
            return scan(lambda c, r: (torch.cat([c, r])[:3], r * 2), torch.zeros(3), x.view(1, 3))
        return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2), (torch.tensor(0), x))

    x = torch.randn(3, requires_grad=kind == "needs grad")
    torch.manual_seed(0)
    box[0] = torch.zeros(3)
    try:
        expected = fn(x)
    except Exception as err:  # noqa: BLE001 - torch refuses it eagerly too: the same error
        with pytest.raises(type(err)):
            dynamo_rs.compile(fn, backend="eager")(x)
        return
    expected_box = box[0].clone()
    torch.manual_seed(0)
    box[0] = torch.zeros(3)
    got, breaks = _breaks(fn, x)
    for g, e in zip(flat_values(got), flat_values(expected), strict=True):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(box[0], expected_box)
