"""Operations that change the sizes or strides of a tensor the frame was given: in-place view
methods (`x.t_()`, `x.unsqueeze_(0)`, `x.as_strided_(...)`, ...) and `out=` tensors an
operation resizes (`torch.cosh(x, out=y)` with `y` of another size). In the graph they are a
change of a graph input's metadata, which AOTAutograd and Inductor do not carry out: the
compiled call raised at the next use ("expected size 2==3", "The size of tensor a (4) must
match"). They break the graph, as under TorchDynamo, and run on the real tensor; on tensors
the trace made they stay graph operations. Each case runs eagerly and compiled with
`eager`, `aot_eager` and `inductor`, and compares the results and the input's sizes,
strides and values afterwards."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


@case(t(2, 3))
def t_then_scale(x):
    return x.t_().mul_(2)


@case(t(2, 3))
def transpose_then_scale(x):
    return x.transpose_(0, 1).mul_(2)


@case(t(2, 3))
def unsqueeze_then_scale(x):
    return x.unsqueeze_(0).mul_(2)


@case(t(1, 2, 3))
def squeeze_then_scale(x):
    return x.squeeze_().mul_(2)


@case(t(2, 3))
def swapaxes_then_scale(x):
    return x.swapaxes_(0, 1).mul_(2)


@case(lambda: torch.zeros(2, 3))
def as_strided_then_scale(x):
    return x.as_strided_((3, 2), (2, 1)).mul_(2)


@case(t(2, 3))
def t_then_used(x):
    y = x + 1
    x.t_()
    return y, x * 2, x.shape


@case(t(2, 3), graphs=1, ops=3)  # an intermediate's metadata: in the graph
def in_place_view_of_an_intermediate(x):
    y = x * 3
    y.t_()
    return y * 2


@case(t(2, 3), lambda: torch.rand(4))
def out_resized(x, y):
    return torch.cosh(x, out=y) + 1, y


@case(t(2, 3), t(2, 3))
def out_of_the_right_size(x, y):
    return torch.cosh(x, out=y) + 1, y


@case(lambda: torch.empty(0), lambda: torch.ones(3, 3), lambda: torch.ones(3))
def matrix_vector_into_an_empty_out(a, b, c):
    torch.mv(b, c, out=a)
    return a


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_side_by_side(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def _same(expected, got):
    if isinstance(expected, torch.Tensor):
        return expected.shape == got.shape and torch.allclose(expected, got)
    if isinstance(expected, (tuple, list)):
        return len(expected) == len(got) and all(_same(e, g) for e, g in zip(expected, got))
    return expected == got


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", ["t_then_used", "unsqueeze_then_scale",
                                  "as_strided_then_scale", "out_resized",
                                  "matrix_vector_into_an_empty_out"])
def test_backends_see_the_change(name, backend):
    fn, make = next((c[1], c[2]) for c in CASES if c[0] == name)
    dynamo_rs.reset()
    theirs, ours = make(), make()
    expected = fn(*theirs)
    got = dynamo_rs.compile(fn, backend=backend)(*ours)
    assert _same(expected, got)
    for a, b in zip(theirs, ours):
        assert (a.shape, a.stride()) == (b.shape, b.stride())
        torch.testing.assert_close(a, b)
