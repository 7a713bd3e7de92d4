"""What the trace reads of its inputs and of torch's state, answered as Python answers it:
one tensor reached through several sources is one object (`is`, one graph input), and the
dispatch-mode stack reads as when the graph runs (nn.MultiheadAttention's fast-path check).
Each case runs eagerly and compiled and compares."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


# --- torch's dispatch-mode stack ----------------------------------------------------------------
# Fake tensors run under our FakeTensorMode while tracing; a query of the dispatch stack must
# answer as when the graph runs (nn.MultiheadAttention's fast-path check reads it), and a
# frame called under a dispatch mode of the user's runs as it is.


class _PassThroughMode(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def reads_dispatch_stack(x):
    modes = torch.utils._python_dispatch._get_current_dispatch_mode_stack()
    return x + torch._C._len_torch_dispatch_stack() + len(modes)


def test_dispatch_stack_reads_as_when_the_graph_runs() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(reads_dispatch_stack, backend=counter)
    x = torch.zeros(2)
    torch.testing.assert_close(compiled(x), reads_dispatch_stack(x))
    with _PassThroughMode():
        expected = reads_dispatch_stack(x)
        torch.testing.assert_close(compiled(x), expected)
    torch.testing.assert_close(compiled(x), reads_dispatch_stack(x))
    # One entry, made outside the mode (the mode's own __torch_dispatch__ is compiled too).
    assert len(dynamo_rs._native.cache_entries(reads_dispatch_stack.__code__)) == 1


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_multihead_attention_in_one_graph_as_torchdynamo(need_weights, grad) -> None:
    # The fast-path check reads the dispatch stack; the slow path (as under TorchDynamo)
    # returns (output, None) without weights.
    import torch._dynamo.testing

    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    theirs = torch._dynamo.testing.CompileCounter()
    counter = CompileCounter()
    with torch.set_grad_enabled(grad):
        expected = mha(x, x, x, need_weights=need_weights)
        torch.compile(mha, backend=theirs)(x, x, x, need_weights=need_weights)
        got = dynamo_rs.compile(mha, backend=counter)(x, x, x, need_weights=need_weights)
    torch.testing.assert_close(got, expected)
    assert (counter.frame_count, counter.op_count) == (theirs.frame_count, theirs.op_count)


# --- one tensor reached through several sources: one graph input, `is` as in Python ----------


def picks_by_identity(a, b):
    return a + 1 if a is b else a - 1


def identity_through_a_list(xs, y):
    return xs[0] * 2 if xs[1] is y else xs[0] * 3


class _HoldsWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, v):
        return v * 2 if v is self.w else v + self.w


def test_same_tensor_as_two_arguments_is_one_object() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(picks_by_identity, backend=counter)
    x, other = torch.zeros(2), torch.zeros(2)
    for a, b in [(x, x), (x, other), (x, x), (other, other), (other, x)]:
        torch.testing.assert_close(compiled(a, b), picks_by_identity(a, b))
    assert counter.frame_count == 2  # one entry for aliased arguments, one for distinct
    assert len(counter.graphs[0].graph.find_nodes(op="placeholder")) == 1


def test_identity_through_containers_and_attributes() -> None:
    x, y = torch.ones(2), torch.ones(2)
    compiled = dynamo_rs.compile(identity_through_a_list, backend="eager")
    for xs, b in [([x, y], y), ([x, y], x), ([x, x], x)]:
        torch.testing.assert_close(compiled(xs, b), identity_through_a_list(xs, b))
    module = _HoldsWeight()
    compiled_module = dynamo_rs.compile(module, backend="eager")
    with torch.no_grad():
        for v in (module.w, torch.ones(3)):
            torch.testing.assert_close(compiled_module(v), module(v))


# --- iterators that exist outside the trace ------------------------------------------------
# A generator or iterator handed to the frame must be advanced when the compiled code runs,
# as many times as eagerly — never while tracing (found by the fuzzer: `sum(gen)` evaluated on
# the real generator at trace time left it exhausted for the run).


def _logged(values, log):
    for v in values:
        log.append(v)
        yield v


def _sum_of(x, it):
    return x * sum(it)


def _next_of(x, it):
    first = next(it)
    return x + first, it


def _max_of(x, it):
    return x - max(it, default=0)


@pytest.mark.parametrize("fn", [_sum_of, _next_of, _max_of], ids=lambda f: f.__name__)
@pytest.mark.parametrize("make", [lambda vals, log: _logged(vals, log),
                                  lambda vals, log: iter(list(vals))], ids=["generator", "iterator"])
def test_an_iterator_from_outside_is_advanced_only_at_run_time(fn, make) -> None:
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    for vals in ([1, 2], [3, 4, 5], [6]):
        log_e, log_c = [], []
        it_e, it_c = make(vals, log_e), make(vals, log_c)
        expected, got = fn(torch.ones(2), it_e), compiled(torch.ones(2), it_c)
        if isinstance(expected, tuple):
            expected, got = expected[0], got[0]
        torch.testing.assert_close(got, expected)
        assert log_c == log_e
        assert list(it_c) == list(it_e)  # what is left of each


def test_the_same_iterator_called_twice_is_advanced_each_time() -> None:
    compiled = dynamo_rs.compile(_next_of, backend=CompileCounter())
    it_e, it_c = iter([1, 2, 3, 4]), iter([1, 2, 3, 4])
    for _ in range(3):
        expected, got = _next_of(torch.ones(2), it_e)[0], compiled(torch.ones(2), it_c)[0]
        torch.testing.assert_close(got, expected)
    assert list(it_c) == list(it_e)


def _sum_then_break(x, gen):
    total = sum(gen)
    print("break")
    return x * total


def test_an_iterator_consumed_before_a_graph_break() -> None:
    compiled = dynamo_rs.compile(_sum_then_break, backend=CompileCounter())
    for vals in ([1, 2], [5]):
        log_e, log_c = [], []
        expected = _sum_then_break(torch.ones(2), _logged(vals, log_e))
        got = compiled(torch.ones(2), _logged(vals, log_c))
        torch.testing.assert_close(got, expected)
        assert log_c == log_e
