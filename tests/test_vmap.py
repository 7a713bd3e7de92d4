"""`torch.vmap` / `torch.func.vmap` inside compiled code, captured as TorchDynamo captures it
(see `ops_functorch`): the functorch primitives torch's own vmap calls are graph nodes, the
vmapped function's operations run on batched fake tensors while tracing. Each case runs
eagerly, under torch.compile and under dynamo_rs.compile (counting `eager` backend, and
`aot_eager`, which traces through the primitives): values equal eager's, graphs and
operations TorchDynamo's, and no functorch level is left entered after the call.

Families: in_dims/out_dims (ints, None, tuples, nested structures), keyword arguments,
nested vmap, closures over tensors computed before, modules (`functional_call` over stacked
parameters: model ensembling), chunk_size, randomness, in-place operations, vmap over a torch
function directly, a new batch size (a dynamic batch dimension), and what torch refuses
inside vmap or a graph break inside the vmapped function (run as eagerly, state left
clean)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

import dynamo_rs
from operator_harness import assert_same_values, check_against_torchdynamo, seeded_inputs

pytestmark = [pytest.mark.usefixtures("reset_compilers"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

torch.manual_seed(0)
W = torch.randn(5, 4)
_MODELS = [nn.Linear(4, 3) for _ in range(5)]
_PARAMS, _BUFFERS = stack_module_state(_MODELS)
_BASE = copy.deepcopy(_MODELS[0]).to("meta")
CASES = []


def case(*shapes):
    def register(fn):
        CASES.append(pytest.param(fn, shapes, id=fn.__name__))
        return fn

    return register


@case((3, 4), (3, 4))
def batched_dot(x, y):
    return vmap(torch.dot)(x, y)


@case((3, 4))
def lambda_over_dim_1(x):
    return vmap(lambda a: a.sin() + 1, in_dims=1)(x)


@case((5, 3, 4))
def matmul_with_unbatched_weight(x):
    return vmap(lambda a, w: a @ w.T, in_dims=(0, None))(x, W)


@case((3, 4), (4, 3))
def tuple_in_and_out_dims(x, y):
    return vmap(lambda a, b: (a + b, a * b), in_dims=(0, 1), out_dims=(0, 1))(x, y)


@case((3, 4))
def keyword_argument_not_batched(x):
    return vmap(lambda a, scale=2.0: a * scale)(x, scale=3.0)


@case((3, 2, 4), (3, 4, 5))
def dict_input(x, y):
    return vmap(lambda d: d["a"] @ d["b"])({"a": x, "b": y})


@case((3, 4, 5))
def nested_vmap(x):
    return vmap(vmap(lambda a: a.cos() * 2))(x)


@case((3, 4))
def closure_over_a_computed_tensor(x):
    y = x.sum(0) * 2
    return vmap(lambda a: a + y)(x).relu()


@case((2, 4))
def ensemble_of_modules(x):
    def model(params, buffers, inp):
        return functional_call(_BASE, (params, buffers), (inp,))

    return vmap(model, in_dims=(0, 0, None))(_PARAMS, _BUFFERS, x)


@case((5, 4))
def chunked(x):
    return vmap(lambda a: a.sum(0), chunk_size=2)(x)


@case((3, 4))
def in_place_on_a_copy(x):
    return vmap(lambda a: a.add_(1))(x.clone())


@case((3, 4, 5))
def a_torch_function_directly(x):
    return vmap(F.softmax, in_dims=(0, None))(x, -1)


@case((3, 2, 4))
def linear_then_work_after(x):
    return vmap(F.linear, in_dims=(0, None))(x, W).relu().sum()


@case((3, 2))
def an_output_not_batched(x):
    return vmap(lambda a: (a * 2, torch.ones(2)), out_dims=(0, None))(x)


@case((4, 6))
def unbatched_output_expanded(x):
    return vmap(lambda a: torch.ones(2) * 3, randomness="same")(x)


def _no_transform_left() -> None:
    assert torch._C._functorch.peek_interpreter_stack() is None


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize(("fn", "shapes"), CASES)
def test_vmap_as_eager(fn, shapes, backend) -> None:
    ours, theirs, compiled = check_against_torchdynamo(
        fn, lambda f, seed: f(*seeded_inputs(shapes, seed)), backend, _no_transform_left)
    assert ours.frame_count == theirs.frame_count == 1
    assert not compiled._dynamo_rs_converter.breaks


def test_a_new_batch_size_compiles_a_dynamic_batch() -> None:
    counter = torch._dynamo.testing.CompileCounter()

    def fn(x):
        # The unbatched `ones` is expanded to the batch size: a graph made for another
        # batch size would give the wrong number of rows.
        return vmap(lambda a: a.sin() + torch.ones(4))(x)

    compiled = dynamo_rs.compile(fn, backend=counter)
    for n in (3, 5, 7, 2):
        x = torch.randn(n, 4)
        assert_same_values(compiled(x), fn(x))
        _no_transform_left()
    assert counter.frame_count == 2  # static, then the batch dimension dynamic
    assert not compiled._dynamo_rs_converter.breaks


def test_graph_break_inside_the_vmapped_function_runs_the_call_as_eagerly(capsys) -> None:
    def fn(x):
        y = x * 2

        def inner(a):
            print("inside")
            return a.exp()

        return vmap(inner)(y) + 1

    compiled = dynamo_rs.compile(fn, backend="eager")
    x = torch.randn(3, 4)
    assert_same_values(compiled(x), fn(x))
    _no_transform_left()
    assert "inside" in capsys.readouterr().out
    assert compiled._dynamo_rs_converter.breaks


@pytest.mark.parametrize("body", ["raise", "item", "boolean mask"])
def test_errors_inside_vmap_reach_the_caller_as_eagerly(body) -> None:
    def fn(x):
        def inner(a):
            if body == "raise":
                raise ValueError("boom")
            if body == "item":
                return a.sum().item()
            return a[a > 0].sum()

        return vmap(inner)(x)

    with pytest.raises(Exception) as expected:
        fn(torch.randn(3, 4))
    _no_transform_left()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(expected.type):
            dynamo_rs.compile(fn, backend="eager")(torch.randn(3, 4))
    _no_transform_left()


def test_called_inside_an_eager_vmap_the_frame_runs_as_it_is() -> None:
    # A compiled function called by an eager vmap sees batched tensors: it runs as it is,
    # and a later call outside any transform compiles.
    counter = torch._dynamo.testing.CompileCounter()
    inner = dynamo_rs.compile(lambda a: vmap(torch.sin)(a) * 2, backend=counter)
    x = torch.randn(2, 3, 4)
    assert_same_values(vmap(inner)(x), vmap(lambda a: vmap(torch.sin)(a) * 2)(x))
    _no_transform_left()
    assert counter.frame_count == 0
    assert_same_values(inner(x[0]), torch.sin(x[0]) * 2)
    assert counter.frame_count == 1
