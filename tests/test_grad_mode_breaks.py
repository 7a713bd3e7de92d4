"""Grad-mode blocks split by a graph break, on backends that differentiate (AOTAutograd).

A resume function called inside a `no_grad` block that ends the block returned in another
grad mode than it was entered in; AOTAutograd compiles a graph for the mode it is entered
in, so the switch inside was lost: what followed needed no gradients (`backward()` raised)
and grad mode stayed off after the call. Every graph now leaves grad mode as it found it and
the generated code sets the mode the frame returns in. Each case runs eagerly and compiled,
and compares the outputs, which of them need gradients, the grad mode after the call and the
gradients after `backward()`."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs


def _break():
    torch._dynamo.graph_break()


def break_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        _break()
        z = y + 1
    return z, (z * x).sum(), (x * x).sum()


def break_inside_no_grad_then_more_work(x):
    with torch.no_grad():
        y = x.sin()
        _break()
    w = (y * x).exp()
    return w.sum(), y


def break_inside_enable_grad_under_no_grad(x):
    with torch.no_grad():
        a = x * 3
        with torch.enable_grad():
            b = (x * a).sum()
            _break()
            c = b * 2
        d = a + 1
    return c, d


def break_inside_set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        y = x.cos()
        _break()
        y = y * 4
    return (y * x).sum(), y


def two_breaks_in_and_after_the_block(x):
    with torch.no_grad():
        y = x + 1
        _break()
        y = y * 2
    z = (y * x).sum()
    _break()
    return z * 3, y


def made_a_leaf_inside_no_grad(x):
    with torch.no_grad():
        leaf = torch.ones(2, requires_grad=True)
    return leaf, (leaf * x).sum()


CASES = [break_inside_no_grad, break_inside_no_grad_then_more_work,
         break_inside_enable_grad_under_no_grad, break_inside_set_grad_enabled_false,
         two_breaks_in_and_after_the_block, made_a_leaf_inside_no_grad]


def _observe(fn, x):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    mode_after = torch.is_grad_enabled()
    torch.set_grad_enabled(True)
    facts = [(t.detach().clone(), t.requires_grad) for t in out]
    loss = sum(t.sum() for t in out if t.requires_grad)
    if torch.is_tensor(loss):
        loss.backward()
    return facts, mode_after, None if x.grad is None else x.grad.clone()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_grad_mode_blocks_split_by_breaks(fn, backend):
    x = torch.tensor([0.5, -1.5])
    expected = _observe(fn, x)
    dynamo_rs.reset()
    compiled = dynamo_rs.compile(fn, backend=backend)
    for _ in range(2):  # tracing, then the cached entries
        facts, mode_after, grad = _observe(compiled, x)
        for (ev, er), (gv, gr) in zip(expected[0], facts, strict=True):
            torch.testing.assert_close(gv, ev)
            assert gr == er
        assert mode_after == expected[1]
        assert (grad is None) == (expected[2] is None)
        if grad is not None:
            torch.testing.assert_close(grad, expected[2])


def test_inductor_keeps_the_mode_a_resume_function_returns_in():
    fn = break_inside_no_grad
    x = torch.tensor([0.5, -1.5])
    expected = _observe(fn, x)
    dynamo_rs.reset()
    facts, mode_after, grad = _observe(dynamo_rs.compile(fn, backend="inductor"), x)
    assert [r for _, r in facts] == [r for _, r in expected[0]]
    assert mode_after is True
    torch.testing.assert_close(grad, expected[2])
