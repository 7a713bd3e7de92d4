"""NumPy scalars in tensor code (`x / np.sqrt(d)`, `x * np.float32(0.5)`, `x.reshape(np.int64(3),
-1)`): in the graph they are the Python numbers they hold (FX would write `np.float64(...)`, a
name the graph's code does not have — the compiled call raised `NameError`). Compared with
eager for values and dtypes over tensor dtypes × scalar types, and reached as globals,
arguments and results of NumPy functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


SCALARS = {
    "float64": np.float64(2.5), "float32": np.float32(-0.5), "float16": np.float16(1.5),
    "int64": np.int64(3), "int32": np.int32(-2), "uint8": np.uint8(4), "bool": np.bool_(True),
}
DTYPES = [torch.float32, torch.float16, torch.int32, torch.int64, torch.bool]


def _tensor(dtype):
    if dtype is torch.bool:
        return torch.tensor([True, False, True, True])
    return (torch.arange(4) + 1).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scalar", list(SCALARS))
def test_scalar_in_arithmetic_matches_eager(scalar, dtype) -> None:
    value = SCALARS[scalar]

    def fn(x, s):
        return x * s, x + s, torch.add(x, s), torch.full((2,), s) + 0

    x = _tensor(dtype)
    try:
        expected = fn(x, value)
    except RuntimeError:
        pytest.skip("eager refuses this combination")
    # (`numpy.bool_` is no Python bool to torch: `full` makes a float tensor of it. It stays
    # out of the graph: a break, still eager's result.)
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    actual = compiled(x, value)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e)


GLOBAL_SCALE = np.sqrt(16.0)
GLOBAL_ROWS = np.int64(2)


def scaled_by_global(x):
    return x / GLOBAL_SCALE + np.pi


def scaled_by_numpy_call(x):
    return x / np.sqrt(x.shape[-1])


def reshaped_by_global(x):
    return x.reshape(GLOBAL_ROWS, -1).sum(0)


def clamped(x):
    return torch.clamp(x, min=np.float32(-0.5), max=np.float64(0.5))


def powered(x):
    return x.pow(np.float64(2.0)) * np.float32(3.0)


@pytest.mark.parametrize("fn", [scaled_by_global, scaled_by_numpy_call, reshaped_by_global, clamped,
                                powered], ids=lambda f: f.__name__)
def test_numpy_scalar_in_one_graph(fn) -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(2):
        x = torch.randn(4, 6)
        expected, actual = fn(x), compiled(x)
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected)
    assert counter.frame_count == 1


@pytest.mark.parametrize("scalar", list(SCALARS))
def test_numpy_scalar_arguments_are_guarded_by_value(scalar) -> None:
    """A NumPy number given to the frame is a constant guarded by its type and value, as
    TorchDynamo guards it: a new object with the same value reuses the graph (identity guards
    recompiled on every call); another value or a Python number of the same value compiles
    again; Python arithmetic on it (`a % b`) is folded, not a graph break."""
    value = SCALARS[scalar]

    def f(x, a, b):
        return x + (a % b if not isinstance(b, np.bool_) else a * b), type(b).__name__

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    x = torch.arange(4.0)
    for b in [value, type(value)(value), type(value)(value), value.item()]:
        expected = f(x, 7, b)
        got = compiled(x, 7, b)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1]
    assert counter.frame_count == 2  # the NumPy number, then the Python one
