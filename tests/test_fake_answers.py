"""What the trace may learn from a fake tensor while tracing. A tensor method whose answer is
not a tensor was run on the fake and its answer kept as a constant — right for metadata the
guards fix (dtype, sizes, strides), wrong for answers about the fake itself: `x.__hash__()`
(the fake's identity), `x.__repr__()`/`__str__()`/`__format__()` (`"FakeTensor(...)"`),
`x.is_set_to(x)` (the fake's storage), `x.storage_offset()` (not guarded, so a call with
another offset reused the answer), `x.__sizeof__()`, `x._use_count()`. Those now break the
graph so the real tensor answers; metadata answers leave no graph node. Also here: the
`torch._check*` family on conditions known while tracing (no node for a true one; a false
one raises torch's error, which traced code may catch), `x.__iter__()`, `nbytes`/`itemsize`,
and attributes a user set on a tensor (`p.scale = 2.0`). Side by side with TorchDynamo
(`language_harness`), plus sequences of calls against eager where guards matter."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


# --- answers about the fake itself: the real tensor answers -------------------------------


@case(t(3, 3), graphs=1, ops=1)
def hash_of_the_tensor(x):
    # TorchDynamo runs this frame eagerly; we break at `__hash__` and resume.
    return x + 1, x.__hash__() == hash(x)


@case(t(3, 3))
def repr_of_the_tensor(x):
    return x + 1, x.__repr__()


@case(t(3, 3))
def str_of_the_tensor(x):
    return x + 1, x.__str__()


@case(t(3, 3))
def format_of_the_tensor(x):
    return x + 1, x.__format__("")


@case(t(3, 3))
def is_set_to_itself(x):
    return x + x.is_set_to(x)


@case(t(3, 3), t(3, 3))
def is_set_to_another(x, y):
    return x + x.is_set_to(y)


@case(t(3, 3))
def size_in_memory(x):
    return x + 1, x.__sizeof__() > 0


@case(t(4, 3))
def offset_of_a_slice(x):
    return x[1:] * 2 + x[1:].storage_offset()


# --- metadata the guards fix: constants, no node ------------------------------------------


@case(t(3))
def type_string(x):
    return x + len(x.type())


@case(t(3), t(3), graphs=1, ops=2)  # TorchDynamo breaks at Tensor.is_same_size
def same_size(x, y):
    return x + torch.is_same_size(x, y) + x.is_same_size(y)


@case(t(2, 3), graphs=1, ops=4)  # the four additions; TorchDynamo breaks at two of the queries
def layout_flags(x):
    return x + x.is_conj() + x.is_neg() + x.dense_dim() + len(x.dim_order())


@case(t(2, 3), graphs=1, ops=2)  # the two additions; TorchDynamo records the products too
def bytes_of_the_tensor(x):
    return x + x.nbytes + x.itemsize


# The tensor made from a constant and the addition (TorchDynamo drops the unused tensor here).
@case(lambda: torch.tensor(3), graphs=1, ops=2)
def value_of_a_constant_tensor(x):
    return x + torch.tensor(4).__index__()


# --- torch._check and its kin on conditions known while tracing ---------------------------


@case(t(4))
def check_without_message(x):
    torch._check(x.shape[0] > 3)
    return x + 1


@case(t(4))
def check_with_a_lambda_message(x):
    torch._check(x.shape[0] > 3, lambda: "too small")
    return x + 1


@case(t(4), ops=1)  # TorchDynamo records `_check_is_size` of a known size as a node
def check_index_and_value(x):
    torch._check_index(x.shape[0] == 4, lambda: "index")
    torch._check_value(x.dim() == 1)
    torch._check_is_size(x.shape[0])
    return x * 2


@case(t(4))
def failed_check_caught(x):
    try:
        torch._check(x.shape[0] > 10, lambda: "needs more than ten")
    except RuntimeError as e:
        return x - len(str(e))
    return x


@case(t(4))
def failed_check_value_caught(x):
    try:
        torch._check_value(x.shape[0] == 3)
    except ValueError:
        return x - 1
    return x + 1


# --- iteration and user attributes -----------------------------------------------------------


@case(t(5, 3))
def iterate_through_dunder_iter(x):
    it = x.__iter__()
    for row in it:
        row.add_(1.0)
    return row, x


@case(t(4, 2))
def comprehension_over_dunder_iter(x):
    return [r * i for i, r in enumerate(x.__iter__())]


def _add_one(z):
    return z + 1


SCALED = torch.nn.Parameter(torch.ones(2))
SCALED.add_one = _add_one
SCALED.scale = 3.0


@case(t(2))
def attributes_set_on_a_parameter(x):
    return SCALED.add_one(SCALED) + x * SCALED.scale


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_side_by_side(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_failed_check_raises_as_eagerly():
    def f(x):
        torch._check(x.shape[0] > 10, lambda: "needs more than ten")
        return x + 1

    dynamo_rs.reset()
    with pytest.raises(RuntimeError, match="needs more than ten"):
        dynamo_rs.compile(f, backend="eager")(torch.randn(4))


def test_storage_offset_of_an_argument_follows_the_argument():
    def f(x):
        return x + x.storage_offset()

    dynamo_rs.reset()
    base = torch.zeros(5, 3)
    compiled = dynamo_rs.compile(f, backend="eager")
    for view in (base[1:4], base[:3], base[2:], base[1:4]):
        torch.testing.assert_close(compiled(view), f(view))


def test_user_attribute_on_a_tensor_is_guarded():
    p = torch.nn.Parameter(torch.ones(2))
    p.scale = 2.0

    def f(x):
        return x * p.scale

    dynamo_rs.reset()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), f(x))
    p.scale = 5.0
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 2
    del p.scale
    with pytest.raises(AttributeError):
        compiled(x)


@pytest.mark.parametrize("message", [None, "too small", lambda: "too small"],
                         ids=["none", "string", "function"])
def test_check_on_a_dynamic_size_is_checked_when_the_graph_runs(message):
    def f(x):
        torch._check(x.shape[0] > 3, message)
        return x + 1

    dynamo_rs.reset()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    for n in (4, 6, 9):
        x = torch.randn(n)
        torch._dynamo.maybe_mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), f(x))
    # One graph for every size, holding the check (a message given as a function cannot be
    # a graph argument: the check keeps torch's default message).
    assert counter.frame_count == 1
    assert any(n.target is torch._check for n in counter.graphs[0].graph.nodes)
    small = torch.randn(5)[:2]
    with pytest.raises(RuntimeError):
        f(small)
    with pytest.raises(RuntimeError):
        compiled(small)
