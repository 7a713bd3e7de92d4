"""`assert` on a tensor's value (`assert x[0] == 3, "message"`, `assert (x >= 0).all()`):
checked when the graph runs, as TorchDynamo rewrites it (`torch._assert_async`), instead of
a graph break on the tensor's truth. An assert whose message is computed (an f-string) is
code to run and still breaks the graph, as under TorchDynamo; asserts on values known
while tracing leave nothing in the graph. Side by side with TorchDynamo
(`language_harness`)."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all

CASES: list = []
case = case_registrar(CASES)


def three_four_five():
    return torch.tensor([3.0, 4.0, 5.0])


@case(three_four_five)
def assert_with_a_message(x):
    b = x.sin()
    assert x[0] == 3, "First dim need to be 3"
    return x.cos() + b


@case(three_four_five)
def assert_without_a_message(x):
    b = x.sin()
    assert (x > 0).all()
    return x.cos() + b


@case(three_four_five)
def asserts_known_while_tracing(x):
    b = x.sin()
    assert True
    assert x.dtype == torch.float32
    assert x.shape[0] == 3, "three"
    return x.cos() + b


@case(three_four_five)
def assert_with_a_computed_message(x):
    assert x.max() < 9, f"invalid max {x.max()}"
    return x.sin()


@case(three_four_five)
def assert_inside_an_inlined_helper(x):
    def check(t):
        assert t.sum() > 0, "positive"
        return t * 2

    return check(x) + 1


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_a_failing_assert_still_raises() -> None:
    reset_all()

    def fn(x):
        assert x[0] == 3, "First dim need to be 3"
        return x + 1

    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    assert torch.equal(compiled(three_four_five()), fn(three_four_five()))
    with pytest.raises((AssertionError, RuntimeError)):
        compiled(torch.tensor([5.0, 6.0, 7.0]))
