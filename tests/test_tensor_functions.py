"""torch functions on traced values that are not one plain graph operation, side by side with
TorchDynamo (`language_harness`): metadata queries (`torch.numel`, `torch.is_floating_point`,
`torch.is_complex`, `torch.is_tensor`) answered while tracing with no node left in the graph;
tensors built from Python lists holding traced tensors, NumPy values or numbers
(`torch.tensor([x[0], 2.0])`, `torch.LongTensor([a[0], a[2]])`) recorded as one graph
operation instead of a graph break; `torch._dynamo.disallow_in_graph`; `id()` of a module;
an `autograd.Function` instantiated before `.apply`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


# --- metadata queries: constants, no node ----------------------------------------------------

@case(t(3), t(3))
def is_floating_point_branch(a, b):
    x = a + 1.0
    if torch.is_floating_point(b):
        x = x + b
    return x + 2.0


@case(t(3), lambda: torch.arange(3))
def is_floating_point_of_an_int_tensor(a, b):
    return a * 2 if torch.is_floating_point(b) else a - b


@case(t(2, 3))
def numel_as_function_and_method(a): return a + a.numel() + torch.numel(a)


@case(t(3), lambda: torch.ones(3, dtype=torch.complex64))
def is_complex_of_both(a, c): return a + torch.is_complex(c) + torch.is_complex(a)


@case(t(3))
def is_tensor_of_tensor_and_number(a):
    x = a + 1.0
    if torch.is_tensor(a):
        x = x * 2
    if torch.is_tensor(3):
        x = x * 100
    return x


# TorchDynamo breaks the graph at `Tensor.is_signed()`; ours answers it from the dtype.
@case(lambda: torch.arange(4), graphs=1)
def is_signed_of_int_tensors(a):
    return a + a.is_signed() + a.to(torch.uint8).is_signed()


# --- tensors from lists with traced items ----------------------------------------------------

@case(lambda: torch.arange(4.0))
def tensor_of_tensor_items(x): return torch.tensor([x[0], x[2]]) * x[:2]


@case(lambda: torch.arange(4.0))
def tensor_of_items_and_numbers(x): return torch.tensor([x[0], 2.0]) + x[:2]


@case(lambda: torch.arange(4.0))
def nested_tensor_with_dtype(x):
    return torch.tensor([[x[0], 1], [2, x[1]]], dtype=torch.float64)


@case(lambda: torch.arange(4))
def tensor_data_keyword(x): return torch.tensor(data=(x[1], x[3]), dtype=torch.float32) + 1


# TorchDynamo records `stack` then `LongTensor` of it; ours one `tensor` of the items.
ONE_OP_FEWER = dict(ops=lambda theirs: theirs - 1)


@case(lambda: torch.arange(4), **ONE_OP_FEWER)
def long_tensor_of_items(x): return torch.LongTensor([x[0], x[2]]) * 3


@case(lambda: torch.arange(4), **ONE_OP_FEWER)
def long_tensor_of_numpy_items(x):
    a = x.numpy()
    return torch.LongTensor([a[0], a[2]]) + 1


def _numpy_made_in_frame():
    x = np.array([1, 2, 3, 4, 5, 6], dtype=np.int64)
    y = list((x[0], x[2], x[4]))
    return torch.LongTensor(y)


@case(**ONE_OP_FEWER)
def long_tensor_of_numpy_made_in_frame(): return _numpy_made_in_frame()


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


# --- the rest: compared with eager and with TorchDynamo's graph counts -------------------------

def _float_tensor_of_items(x): return torch.FloatTensor([x[1], 7]) - x[:2]
def _legacy_tensor_of_items(x): return torch.Tensor([x[3], x[0]]) / 2
def _numpy_makers():
    a = np.zeros(3, dtype=np.float32) + np.arange(3)
    return torch.from_numpy(np.array([[1, 2], [3, 4]]) @ np.ones((2, 1))), torch.from_numpy(a)


@pytest.mark.parametrize("fn", [_float_tensor_of_items, _legacy_tensor_of_items])
def test_float_legacy_constructors_of_items(fn) -> None:
    # TorchDynamo raises here (its fake run of `FloatTensor(list)` fails); ours one graph.
    counter = CompileCounter()
    x = torch.arange(4.0)
    torch.testing.assert_close(dynamo_rs.compile(fn, backend=counter)(x), fn(x))
    assert counter.frame_count == 1


def test_long_tensor_of_float_items_raises_as_eagerly() -> None:
    # A float tensor item for an integer tensor is an error eagerly; not turned into a cast.
    def fn(x):
        return torch.LongTensor([x[1], x[2]])

    x = torch.arange(4.0)
    with pytest.raises(TypeError) as eager:
        fn(x)
    with pytest.raises(TypeError) as compiled:
        dynamo_rs.compile(fn, backend=CompileCounter())(x)
    assert str(compiled.value) == str(eager.value)


def test_numpy_arrays_made_from_constants() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(_numpy_makers, backend=counter)
    first, second = compiled(), compiled()
    for got in (first, second):
        for g, e in zip(got, _numpy_makers()):
            torch.testing.assert_close(g, e)
    assert first[1] is not second[1]  # a new array each call
    theirs = torch._dynamo.testing.CompileCounter()
    torch.compile(_numpy_makers, backend=theirs)()
    assert counter.frame_count == theirs.frame_count == 1


def test_disallow_in_graph_breaks_the_graph_at_the_call() -> None:
    def fn(a):
        x = torch.add(a, 1)
        x = torch.add(x, 1)
        x = torch.sub(x, 1)
        x = torch.add(x, 1)
        return torch.add(x, 1)

    torch._dynamo.disallow_in_graph(torch.sub)
    try:
        reset_all()
        ours = CompileCounter()
        a = torch.randn(10)
        torch.testing.assert_close(dynamo_rs.compile(fn, backend=ours)(a), fn(a))
        theirs = torch._dynamo.testing.CompileCounter()
        torch.compile(fn, backend=theirs)(a)
    finally:
        torch._dynamo.allow_in_graph(torch.sub)
    assert (ours.frame_count, ours.op_count) == (theirs.frame_count, theirs.op_count) == (2, 4)
    reset_all()
    counter = CompileCounter()
    dynamo_rs.compile(fn, backend=counter)(a)
    assert counter.frame_count == 1  # allowed again


class _Registry(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scales = {}

    def forward(self, x):
        key = id(self.lin)
        scale = self.scales.get(key, 1.0)
        return self.lin(x) * scale + (id(self) == key)


def test_id_of_a_module_is_a_guarded_constant() -> None:
    model = _Registry()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x), model(x))
    model.scales[id(model.lin)] = 3.0
    torch.testing.assert_close(compiled(x), model(x))
    model.lin = nn.Linear(3, 3)  # another object: another id
    torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 3


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v):
        return v + v

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def test_autograd_function_instance_apply() -> None:
    def fn(x):
        return _Double().apply(x) * 3

    counter = CompileCounter()
    x = torch.randn(4, requires_grad=True)
    got = dynamo_rs.compile(fn, backend=counter, fullgraph=True)(x)
    expected = fn(x)
    torch.testing.assert_close(got, expected)
    (g_got,) = torch.autograd.grad(got.sum(), x)
    (g_expected,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(g_got, g_expected)
    assert counter.frame_count == 1


def test_shape_env_queries_answer_as_torch_compile() -> None:
    """`statically_known_true` and its kin ask what the compiler knows about a size: for a
    dynamic size they answer from the ShapeEnv (False here, whatever the size's value), as
    under torch.compile — evaluating their Python body on the specialised size answered as
    for a static one (True, taking the other branch)."""
    from torch.fx.experimental.symbolic_shapes import has_static_value, statically_known_true

    def f(x):
        if statically_known_true(x.shape[0] > 9):
            return x * 100
        torch._check(x.shape[0] >= 10)
        return x + statically_known_true(x.shape[0] > 9) + 10 * has_static_value(x.shape[0])

    results = []
    for compile_fn in (dynamo_rs.compile, torch.compile):
        reset_all()
        x = torch.zeros(10)
        torch._dynamo.mark_dynamic(x, 0)
        results.append(compile_fn(f, backend="eager", fullgraph=True)(x))
    torch.testing.assert_close(results[0], results[1])
    torch.testing.assert_close(results[0], torch.ones(10))
    # Static sizes: known, so both answer as eagerly.
    reset_all()
    torch.testing.assert_close(dynamo_rs.compile(f, backend="eager")(torch.zeros(12)), f(torch.zeros(12)))
