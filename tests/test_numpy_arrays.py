"""NumPy code on tensors (`x.numpy()`, `np.*` on the arrays, operators, methods, indexing,
`torch.from_numpy` back), traced through `torch._numpy` as TorchDynamo does — side by side
with it (`language_harness.check_case`: results equal eager, graph and op counts equal
TorchDynamo's). Then what must stay eager: the data read in Python, arrays changed in place
(which share the tensor's memory, as in eager), and a tensor's own aliasing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

pytestmark = pytest.mark.usefixtures("reset_compilers")

CASES: list = []
case = case_registrar(CASES)

T34 = t(3, 4)
T44 = t(4, 4)
T6 = t(6)


# --- functions and ufuncs ----------------------------------------------------------------------

@case(T34)
def ufuncs_and_back_to_torch(x):
    a = x.numpy()
    return torch.from_numpy(np.sin(a) * 2 + np.exp(a / 4)) + 1
@case(T34)
def reductions_with_axes(x):
    a = x.numpy()
    return a.sum(axis=0), np.mean(a, axis=1, keepdims=True), a.max(), np.argmax(a, axis=1)
@case(T34)
def two_array_functions(x):
    a, b = x.numpy(), (x * 2).numpy()
    return np.maximum(a, b) - np.minimum(a, 0.5), np.where(a > 0, a, b)
@case(T34)
def clip_abs_sqrt(x):
    a = x.numpy()
    return np.sqrt(np.abs(np.clip(a, -1.0, 1.0)))
@case(T44)
def matmul_einsum_norm(x):
    a = x.numpy()
    return a @ a.T, np.einsum("ij,jk->ik", a, a), np.linalg.norm(a, axis=1)
@case(T34)
def concatenate_stack_split(x):
    a = x.numpy()
    left, right = np.split(a, 2, axis=1)
    return np.concatenate([left, right * 2], axis=0), np.stack((left, right)).shape
@case(T6)
def cumsum_diff_sort(x):
    a = x.numpy()
    return np.cumsum(a), np.diff(a), np.sort(a)


# --- methods, attributes, operators, indexing -------------------------------------------------

# TorchDynamo does not trace `ndarray.dtype` (it runs these two frames eagerly): ours make one
# graph, of view_as and one node per array operation.
@case(T34, graphs=1, ops=7)  # view_as, reshape, transpose, astype, .T, copy, flatten
def methods_reshape_transpose_astype(x):
    a = x.numpy()
    return a.reshape(4, 3).transpose(), a.astype(np.float64).dtype, a.T.copy(), a.flatten()
@case(T34, graphs=1, ops=4)  # view_as, mul, add, add: the attributes are known sizes
def attributes_shape_dtype_ndim(x):
    a = x.numpy()
    return x * a.shape[1] + a.ndim + a.size, a.dtype == np.float32, len(a), isinstance(a, np.ndarray)
@case(T34)
def operators(x):
    a = x.numpy()
    return -a, a ** 2, a // 0.5, a % 1.0, (a > 0) & (a < 1), 2 - a
@case(T34)
def indexing(x):
    a = x.numpy()
    return a[1], a[:, 2], a[1:, ::2], a[..., None], a[0, 1]
@case(T34)
def integer_arrays_promote_as_numpy(x):
    # (`n / 4` of an int array is float32 in torch._numpy, under TorchDynamo too; NumPy's
    # is float64.)
    n = (x * 10).int().numpy()
    return n // 3, n * 2.5, n + 2, n.astype(np.float64) / 4
@case(T34)
def arrays_made_from_constants_and_arrays(x):
    a = x.numpy()
    return a + np.ones_like(a), np.zeros_like(a) - a, np.full_like(a, 2.0) * a


# --- arrays going places ------------------------------------------------------------------------

@case(T34)
def array_returned(x):
    return (x + 1).numpy()
@case(T34)
def arrays_in_a_list(x):
    a = x.numpy()
    return [a * i for i in range(3)]
@case(T34)
def array_through_a_helper(x):
    def normalise(v):
        return (v - v.mean()) / (v.std() + 1e-5)
    return torch.as_tensor(normalise(x.numpy())).relu()
@case(T34)
def torch_tensor_of_an_array_with_dtype(x):
    counts = torch.tensor(np.arange(4), dtype=torch.float32)
    return counts + x[:, 0].sum()
@case(T34)
def torch_tensor_copies_the_array(x):
    a = x.numpy() * 2
    t = torch.tensor(a)
    t.add_(1)
    return torch.from_numpy(a), t
@case(T34)
def as_tensor_of_an_array_with_dtype_and_device(x):
    return torch.as_tensor(np.cos(x.numpy()), dtype=torch.float64, device="cpu")
@case(T34)
def tensor_ops_after_numpy(x):
    y = torch.from_numpy(np.tanh(x.numpy()))
    return y.softmax(-1) @ x.T



# --- arrays made from tensors changed in place: one node each, the tensor changed with them ----

@case(T34)
def in_place_operator_changes_the_tensor(x):
    a = x.numpy()
    a += 1
    return torch.from_numpy(a) * 2, x
@case(T34)
def item_assignment_on_a_copy(x):
    a = x.numpy().copy()
    a[0] = 5
    a[1:] *= 2
    return torch.from_numpy(a), x
@case(T34)
def masked_assignment(x):
    a = (x * 2).numpy()
    a[a > 0] = 0
    return a
@case(T34)
def in_place_through_a_view_of_the_array(x):
    a = x.numpy()
    b = a[:, :2]
    b -= 1
    return x * 1, b
@case(T34)
def in_place_square_and_power(x):
    a = x.numpy().copy()
    a *= a
    a **= 2
    return a.sum()
@case(T34)
def in_place_on_an_integer_array(x):
    a = (x * 10).numpy().astype(np.int64)
    a //= 3
    a %= 4
    return a


# --- arrays given to the frame: traced over torch.as_tensor(array), as TorchDynamo does -------
def arr(*shape, dtype=np.float64):
    """A maker of a seeded random NumPy array."""
    def make():
        return np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    return make


@case(arr(3, 4))
def array_argument_ufuncs(a):
    return np.sin(a) * 2 + np.exp(a / 4)
@case(arr(3, 4), T34)
def array_and_tensor_arguments(a, x):
    return x + torch.from_numpy(np.tanh(a)).float()
@case(arr(3, 4, dtype=np.float32))
def array_argument_reductions_and_shape(a):
    return a.sum(axis=0), a.mean(), a.shape, len(a), a.ndim
@case(arr(4, 4), arr(4, 4))
def two_array_arguments(a, b):
    return a @ b.T + np.maximum(a, b)
@case(lambda: np.arange(12).reshape(3, 4))
def integer_array_argument(a):
    return a * 2 + a.T.sum(axis=1)[:, None].T[0, :3].sum()
@case(lambda: [np.ones(3), np.arange(3.0)])
def arrays_in_a_list_argument(arrays):
    return sum(np.cos(a) for a in arrays)
@case(arr(3, 4))
def array_argument_returned_and_indexed(a):
    return a, a[1:, ::2] * 3
@case(arr(3, 4), arr(3, 4))
def operator_functions_on_arrays(a, b):
    # The operator module's functions, as values (`op(a, b)`), as the operators.
    import operator
    ops = (operator.add, operator.mul, operator.truediv, operator.lt, operator.pow)
    return [op(a, b) for op in ops] + [operator.neg(a), operator.matmul(a, b.T)]
@case(lambda: __import__("operator").sub, arr(3, 4), arr(3, 4))
def operator_function_passed_in(op, a, b):
    return op(a, b) * 2
@case(arr(3, 4), arr(3, 4))
def lists_and_tuples_of_arrays_concatenated(a, b):
    # Python's `+`/`*` on containers that hold arrays: concatenation, not NumPy's.
    pair = [a + b] + [a * b]
    return pair + [a], (a,) * 2 + (b,), len(pair * 3)

@pytest.fixture(autouse=True)
def fresh_caches():
    reset_all()
    yield


def test_enough_cases() -> None:
    assert len(CASES) >= 24


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)


# --- what stays eager ------------------------------------------------------------------------


def compiled(fn):
    counter = CompileCounter()
    return dynamo_rs.compile(fn, backend=counter), counter


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_array_changed_in_place_changes_its_tensor(backend, capsys) -> None:
    def fn(x):
        a = x.numpy()
        a += 1
        print("between")
        a[0] = 5.0
        return x * 2, a.sum()

    x_eager, x_compiled = torch.zeros(3), torch.zeros(3)
    expected = fn(x_eager)
    got = dynamo_rs.compile(fn, backend=backend)(x_compiled)
    torch.testing.assert_close(x_compiled, x_eager)
    torch.testing.assert_close(got[0], expected[0])
    assert float(got[1]) == float(expected[1])


def test_the_array_sees_a_later_change_to_its_tensor() -> None:
    def fn(x):
        a = x.numpy()
        x.mul_(3)
        return torch.from_numpy(a + 0)

    compiled_fn, _ = compiled(fn)
    x_eager, x_compiled = torch.ones(3), torch.ones(3)
    torch.testing.assert_close(compiled_fn(x_compiled), fn(x_eager))
    torch.testing.assert_close(x_compiled, x_eager)


def test_values_read_in_python_break_the_graph() -> None:
    def fn(x):
        a = x.numpy()
        if (a > 0).any():
            return torch.from_numpy(a * 2)
        return x.tolist(), a.tolist()

    compiled_fn, _ = compiled(fn)
    for x in (torch.randn(4), -torch.ones(4)):
        got, expected = compiled_fn(x), fn(x)
        if isinstance(expected, torch.Tensor):
            torch.testing.assert_close(got, expected)
        else:
            assert got == expected


def test_boolean_masks_and_random_numbers_stay_eager() -> None:
    def fn(x):
        a = x.numpy()
        picked = a[a > 0]
        noise = np.random.default_rng(0).standard_normal(3)
        return picked.sum() + noise.sum()

    compiled_fn, _ = compiled(fn)
    x = torch.tensor([1.0, -2.0, 3.0])
    np.testing.assert_allclose(compiled_fn(x), fn(x), rtol=1e-6)


def test_numpy_of_a_tensor_that_requires_grad_raises_as_in_eager() -> None:
    def fn(x):
        return x.numpy() * 2

    compiled_fn, _ = compiled(fn)
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        fn(x)
    with pytest.raises(RuntimeError, match="requires grad"):
        compiled_fn(x)


def test_new_shapes_and_dtypes_are_right() -> None:
    """A new dtype recompiles; a new size makes the sizes symbolic (automatic dynamic shapes),
    and later sizes reuse that graph, `a.shape`, `len(a)` and `a.size` read symbolically."""

    def fn(x):
        a = x.numpy()
        return np.sin(a).sum(axis=0) * 2, a.shape[0] + len(a), a.size, a.ndim, a.shape

    compiled_fn, counter = compiled(fn)
    for x in (torch.randn(3, 4), torch.randn(3, 4, dtype=torch.float64),
              torch.arange(12).reshape(3, 4), torch.randn(5, 4)):
        got, expected = compiled_fn(x), fn(x)
        assert np.asarray(got[0]).dtype == np.asarray(expected[0]).dtype
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)  # float32 sums
        assert got[1:] == expected[1:]
    compiled_after_new_size = counter.frame_count
    for rows in (7, 2, 9):
        x = torch.randn(rows, 4)
        got, expected = compiled_fn(x), fn(x)
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)  # float32 sums
        assert got[1:] == expected[1:] and type(got[4]) is tuple
    assert counter.frame_count == compiled_after_new_size


def test_numpy_functions_writing_into_an_array_stay_eager() -> None:
    def fn(x):
        a = x.numpy()
        np.copyto(a, 2.0)
        np.fill_diagonal(a, -1.0)
        return x + 1

    compiled_fn, _ = compiled(fn)
    x_eager, x_compiled = torch.zeros(3, 3), torch.zeros(3, 3)
    torch.testing.assert_close(compiled_fn(x_compiled), fn(x_eager))
    torch.testing.assert_close(x_compiled, x_eager)



def test_a_new_array_of_the_same_kind_reuses_the_graph() -> None:
    """Arrays given to the frame are guarded by type, dtype, sizes and strides — not by which
    array it is: a new array (or the same one changed in place, which the graph reads through
    the tensor sharing its memory) reuses the graph; another dtype compiles again; a NumPy
    subclass or an array torch cannot take runs as it is."""

    def fn(a, t):
        return t + torch.from_numpy(np.sin(a) * 2)

    compiled_fn, counter = compiled(fn)
    t = torch.zeros(3, dtype=torch.float64)
    a = np.ones(3)
    for value in (a, np.zeros(3), np.full(3, 2.0)):
        torch.testing.assert_close(compiled_fn(value, t), fn(value, t))
    a[0] = 5.0
    torch.testing.assert_close(compiled_fn(a, t), fn(a, t))
    assert counter.frame_count == 1
    torch.testing.assert_close(compiled_fn(np.ones(3, dtype=np.float32), t), fn(np.ones(3, dtype=np.float32), t))
    assert counter.frame_count == 2
    for odd in (np.arange(3.0)[::-1], np.ma.masked_array(np.ones(3)), np.array([1, 2, 3], dtype=np.uint32)):
        torch.testing.assert_close(compiled_fn(odd, t), fn(odd, t))


def test_an_array_argument_handed_back_is_the_same_array() -> None:
    def fn(a, x):
        y = x * 2
        print("", end="")  # a graph break with the array live
        return a, y + torch.from_numpy(a)

    compiled_fn, _ = compiled(fn)
    a, x = np.ones(3), torch.ones(3, dtype=torch.float64)
    got = compiled_fn(a, x)
    assert got[0] is a
    torch.testing.assert_close(got[1], fn(a, x)[1])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_array_given_to_the_frame_changed_in_place(backend) -> None:
    """An array the frame is given changed in place (`a *= 2`, `a[0] = v`): the graph
    breaks there — another input may share its memory with no storage in common (a tensor
    and its `.numpy()`), which AOTAutograd cannot see; TorchDynamo's graph reads the tensor
    stale then. The array and the tensor end as eagerly, whichever is read."""
    def fn(a, x):
        a *= 2
        a[0] = 7.0
        return x * 1, a + 1

    for share in (False, True):
        x_eager, x_compiled = torch.ones(3), torch.ones(3)
        a_eager = x_eager.numpy() if share else np.ones(3, dtype=np.float32)
        a_compiled = x_compiled.numpy() if share else np.ones(3, dtype=np.float32)
        expected = fn(a_eager, x_eager)
        got = dynamo_rs.compile(fn, backend=backend)(a_compiled, x_compiled)
        torch.testing.assert_close(got[0], expected[0])
        np.testing.assert_allclose(got[1], expected[1])
        np.testing.assert_allclose(a_compiled, a_eager)
        torch.testing.assert_close(x_compiled, x_eager)
        dynamo_rs.reset()


def _mutate_tensor_read_array(a, x):
    x.add_(1)
    return a * 2


def _read_array_mutate_tensor(a, x):
    b = a + 0
    x.mul_(3)
    return b, a * 1


class _Holder:
    pass


def _mutate_then_read_an_attribute_array(h, x):
    x.add_(1)
    return h.arr * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [_mutate_tensor_read_array, _read_array_mutate_tensor,
                                _mutate_then_read_an_attribute_array], ids=lambda f: f.__name__)
def test_a_tensor_and_its_array_given_together(fn, backend) -> None:
    """A tensor and an array over its memory (`x.numpy()`) given to one frame, the tensor
    changed in place: `torch.as_tensor(array)` has a storage of its own, so AOTAutograd
    sees two unrelated inputs and read the array stale (a wrong result, TorchDynamo's too).
    The graph breaks at the change (or at the array read after it): the values are eager's."""
    def args():
        x = torch.ones(3)
        if fn is _mutate_then_read_an_attribute_array:
            h = _Holder()
            h.arr = x.numpy()
            return h, x
        return x.numpy(), x

    expected_args, got_args = args(), args()
    expected = fn(*expected_args)
    got = dynamo_rs.compile(fn, backend=backend)(*got_args)
    for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                    got if isinstance(got, tuple) else (got,)):
        np.testing.assert_allclose(g, e)
    torch.testing.assert_close(got_args[1], expected_args[1])
