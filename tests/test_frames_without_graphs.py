"""Frames whose trace leaves nothing for a graph — grad-mode switches that change nothing
(`with torch.enable_grad():` with grad already on, `torch.set_grad_enabled(True)`), stores of
inputs into containers, inputs handed back — compile to code that runs no graph, as under
TorchDynamo. A frame returning after only such switches used to fail inside the capture
("a graph with operations was not compiled", GB0021) and run eagerly, logging a warning."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


def _enable_grad_noop(x):
    with torch.enable_grad():
        y = x
    return y


def _enable_grad_store(x, d):
    with torch.enable_grad():
        d["k"] = x
    return d


def _set_grad_noop(x):
    torch.set_grad_enabled(True)
    return x


def _nested_noop(x):
    with torch.no_grad():
        with torch.enable_grad():
            pass
    return [x]


def _store_only(x, box):
    box.append(x)
    return None


@pytest.mark.parametrize("fn", [_enable_grad_noop, _enable_grad_store, _set_grad_noop,
                                _nested_noop, _store_only], ids=lambda f: f.__name__)
def test_compiled_without_a_graph(fn):
    dynamo_rs.reset()

    def args():
        x = torch.arange(3.0)
        return (x, {}) if fn is _enable_grad_store else (x, []) if fn is _store_only else (x,)

    expected_args, got_args = args(), args()
    expected = fn(*expected_args)
    counter = CompileCounter()
    got = dynamo_rs.compile(fn, backend=counter)(*got_args)
    assert type(got) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert got is got_args[0]
    assert counter.frame_count == 0
    assert torch.is_grad_enabled()
    for e, g in zip(expected_args[1:], got_args[1:]):
        assert type(e) is type(g) and len(e) == len(g)
    report = dynamo_rs.explain(fn)(*args())
    assert not report.eager_frames, report.eager_frames


# Frames whose trace is nothing but grad-mode switches that do change the mode: no graph,
# the generated code sets the mode they end in. The mode after the call must be eager's.

def _turn_grad_off(x):
    torch.set_grad_enabled(False)
    return x


def _turn_grad_on(x):
    torch.set_grad_enabled(True)
    return x


def _item_inside_no_grad(x):
    with torch.no_grad():
        y = (x * 2).sum()
        return y.item()  # a graph break: the rest leaves the block with nothing computed


def _print_inside_no_grad(x):
    with torch.no_grad():
        y = x + 1
        print("a graph break")
    return y


@pytest.mark.parametrize("grad_on", [True, False], ids=["grad_on", "grad_off"])
@pytest.mark.parametrize("fn", [_turn_grad_off, _turn_grad_on, _item_inside_no_grad,
                                _print_inside_no_grad], ids=lambda f: f.__name__)
def test_the_mode_after_the_call_is_eagers(fn, grad_on):
    dynamo_rs.reset()
    x = torch.arange(3.0, requires_grad=True)
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    try:
        for _ in range(2):
            torch.set_grad_enabled(grad_on)
            expected = fn(x)
            expected_mode = torch.is_grad_enabled()
            torch.set_grad_enabled(grad_on)
            got = compiled(x)
            assert torch.is_grad_enabled() == expected_mode
            if isinstance(expected, torch.Tensor):
                torch.testing.assert_close(got, expected)
                assert got.requires_grad == expected.requires_grad
            else:
                assert got == expected
    finally:
        torch.set_grad_enabled(True)


def test_no_graph_after_a_break_that_only_leaves_a_block():
    """TorchDynamo's graphs: the computation before `.item()`, nothing after it."""
    dynamo_rs.reset()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(_item_inside_no_grad, backend=counter)
    x = torch.arange(3.0)
    assert compiled(x) == _item_inside_no_grad(x)
    assert counter.frame_count == 1
