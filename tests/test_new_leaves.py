"""Tensors that need gradients made inside the compiled frame: `torch.ones(2,
requires_grad=True)` and the other factories, `x.new_ones(..., requires_grad=True)`,
`requires_grad_()` on a new tensor, `nn.Parameter(...)`. Made as graph nodes, AOTAutograd
handed them back as tensors that need no gradient (and a product with one needed none
either: `backward()` raised "element 0 of tensors does not require grad"). They are made
eagerly after the graph, as TorchDynamo breaks the graph there. Each case runs eagerly and
compiled (`eager` and `aot_eager`), compares values, `requires_grad`, `is_leaf` and — after
`backward()` of the last result — the gradients of every leaf returned, and counts graphs
against TorchDynamo's."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter


def factory_ones(x):
    leaf = torch.ones(2, requires_grad=True)
    return leaf, leaf * x


def factory_tensor(x):
    leaf = torch.tensor([1.0, 2.0], requires_grad=True)
    return leaf, (leaf * x).sum()


def factory_full(x):
    leaf = torch.full((2,), 3.0, requires_grad=True)
    return leaf, (leaf * x).sum()


def factory_like(x):
    leaf = torch.zeros_like(x, requires_grad=True)
    return leaf, (leaf + x).exp().sum()


def factory_random(x):
    return (torch.randn(2, requires_grad=True) * x,)


def factory_under_no_grad(x):
    with torch.no_grad():
        leaf = torch.ones(2, requires_grad=True)
    return leaf, (leaf * x).sum()


def new_method(x):
    leaf = x.new_ones(2, requires_grad=True)
    return leaf, (leaf * x).sum()


def requires_grad_method(x):
    leaf = torch.ones(2).requires_grad_()
    return leaf, (leaf * x).sum()


def requires_grad_attribute(x):
    leaf = torch.ones(2)
    leaf.requires_grad = True
    return leaf, (leaf * x).sum()


def parameter_made_here(x):
    leaf = torch.nn.Parameter(torch.ones(2))
    return leaf, (leaf * x).sum()


def detached_copy_made_a_leaf(x):
    leaf = (x * 2).detach().requires_grad_()
    return leaf, (leaf * 3).sum()


def leaf_used_in_a_larger_graph(x):
    y = x.sin() * 2
    weight = torch.ones(2, 2, requires_grad=True)
    z = (weight @ y).relu()
    return weight, z.sum() + y.sum()


def explicit_false_stays_in_the_graph(x):
    return (torch.ones(2, requires_grad=False) * x,)


def requires_grad_false_on_a_detached_copy(x):
    # Asks for what the tensor already is: nothing changes, no break (as TorchDynamo).
    y = x.clone().detach().requires_grad_(False)
    return (y * 2,)


def requires_grad_keyword_false_on_an_input(x):
    return (x.requires_grad_(requires_grad=False) * 3,)


def requires_grad_true_on_a_tensor_that_needs_it(x):
    leaf = torch.ones(2, requires_grad=True)
    y = (leaf * x).requires_grad_(True)
    return leaf, y.sum()


def leaf_made_under_no_grad_stays_inside(x):
    # transformers' MRA without its kernel: a leaf made with grad mode off, used with it
    # off — in the graph, as TorchDynamo does.
    with torch.no_grad():
        leaf = torch.zeros_like(x).requires_grad_()
        y = leaf * 2 + x
    return (y + 1,)


def leaf_made_under_no_grad_returned(x):
    with torch.no_grad():
        leaf = torch.zeros_like(x).requires_grad_()
        y = leaf + x
    return leaf, y


def leaf_made_under_no_grad_used_with_grad_on(x):
    with torch.no_grad():
        leaf = torch.ones_like(x).requires_grad_()
        y = leaf * x
    return leaf, y + (leaf * 3).sum()


CASES = [leaf_made_under_no_grad_stays_inside, leaf_made_under_no_grad_returned,
         leaf_made_under_no_grad_used_with_grad_on, requires_grad_false_on_a_detached_copy, requires_grad_keyword_false_on_an_input,
         requires_grad_true_on_a_tensor_that_needs_it, factory_ones, factory_tensor, factory_full, factory_like, factory_random,
         factory_under_no_grad, new_method, requires_grad_method, requires_grad_attribute,
         parameter_made_here, detached_copy_made_a_leaf, leaf_used_in_a_larger_graph,
         explicit_false_stays_in_the_graph]


def _observe(fn, x):
    torch.manual_seed(0)
    out = fn(x)
    facts = [(t.detach().clone(), t.requires_grad, t.is_leaf) for t in out]
    if out[-1].requires_grad:
        out[-1].sum().backward()
    grads = [t.grad.clone() if t.is_leaf and t.grad is not None else None for t in out]
    return facts, grads


def _same(expected, got) -> None:
    (e_facts, e_grads), (g_facts, g_grads) = expected, got
    for (ev, er, el), (gv, gr, gl) in zip(e_facts, g_facts, strict=True):
        torch.testing.assert_close(gv, ev)
        assert (gr, gl) == (er, el)
    for eg, gg in zip(e_grads, g_grads, strict=True):
        assert (eg is None) == (gg is None)
        if eg is not None:
            torch.testing.assert_close(gg, eg)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_new_leaves_match_eager(fn, backend):
    x = torch.ones(2) * 1.5
    expected = _observe(fn, x)
    dynamo_rs.reset()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter if backend == "eager" else backend)
    _same(expected, _observe(compiled, x))
    _same(expected, _observe(compiled, x))  # the cached entry too
    if backend == "eager":
        torch._dynamo.reset()
        theirs = torch._dynamo.testing.CompileCounter()
        torch.compile(fn, backend=theirs)(x)
        assert counter.frame_count <= max(theirs.frame_count, 1)
