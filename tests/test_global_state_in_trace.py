"""Torch's global settings that a frame changes (`torch.use_deterministic_algorithms`,
`torch.set_default_dtype`, `torch.set_float32_matmul_precision`): the trace runs the setter
for real, and the graph runs it again at its place in the program. The code of the graph
before that place, and any frame run eagerly, must see the state as the frame found it — the
trace's change is put back. A recording function allowed in the graph shows what the graph
saw when it ran."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import dynamo_rs
from dynamo_rs.testing import CompileCounter

seen: list = []


@torch._dynamo.allow_in_graph
def record_state(x):
    # Called on fake tensors while tracing too: only calls on real tensors count.
    if not isinstance(x, torch._subclasses.FakeTensor):
        seen.append(_state())
    return x


def _state():
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.get_default_dtype(), torch.get_float32_matmul_precision())


@pytest.fixture(autouse=True)
def _keep_global_state():
    before = _state()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.set_default_dtype(before[2])
    torch.set_float32_matmul_precision(before[3])


def deterministic_on(x):
    record_state(x)
    torch.use_deterministic_algorithms(True, warn_only=True)
    return record_state(x + 1), torch.are_deterministic_algorithms_enabled()


def deterministic_off_then_break(x):
    record_state(x)
    torch.use_deterministic_algorithms(False)
    y = record_state(x * 2)
    print("a graph break")
    return y + 1, torch.are_deterministic_algorithms_enabled()


def default_dtype_float64(x):
    record_state(x)
    torch.set_default_dtype(torch.float64)
    return torch.ones(2) + x, torch.get_default_dtype()


def default_dtype_set_and_put_back_across_break(x):
    record_state(x)
    torch.set_default_dtype(torch.float64)
    y = torch.ones(2) + x
    print("a graph break")
    record_state(x)
    torch.set_default_dtype(torch.float32)
    return y, torch.zeros(2), torch.get_default_dtype()


def matmul_precision_high(x):
    record_state(x)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    return x @ x, before, torch.get_float32_matmul_precision()


def reads_then_sets_both(x):
    record_state(x)
    was = (torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype())
    torch.use_deterministic_algorithms(not was[0])
    torch.set_default_dtype(torch.float64 if was[1] is torch.float32 else torch.float32)
    return record_state(x.sum()), was


FRAMES = [deterministic_on, deterministic_off_then_break, default_dtype_float64,
          default_dtype_set_and_put_back_across_break, matmul_precision_high,
          reads_then_sets_both]
STARTS = [(False, False, torch.float32, "highest"), (True, True, torch.float32, "highest"),
          (False, False, torch.float64, "medium")]


def _set(state):
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])
    torch.set_default_dtype(state[2])
    torch.set_float32_matmul_precision(state[3])


def _run(fn, start, calls, x):
    results = []
    for _ in range(calls):
        _set(start)
        seen.clear()
        out = fn(x)
        results.append((out, list(seen), _state()))
    return results


@pytest.mark.parametrize("start", STARTS, ids=["plain", "deterministic", "float64"])
@pytest.mark.parametrize("fn", FRAMES, ids=lambda f: f.__name__)
def test_compiled_frame_sees_and_leaves_the_state_as_eager(fn, start):
    x = torch.ones(2, 2) if fn is matmul_precision_high else torch.ones(2)
    expected = _run(fn, start, 3, x)
    dynamo_rs.reset()
    counter = CompileCounter()
    got = _run(dynamo_rs.compile(fn, backend=counter), start, 3, x)
    assert counter.frame_count >= 1
    for (e_out, e_seen, e_after), (g_out, g_seen, g_after) in zip(expected, got):
        # What the graph saw at each recording point, and the state the call left.
        assert g_seen == e_seen
        assert g_after == e_after
        torch.testing.assert_close(g_out[0], e_out[0])
        assert g_out[0].dtype == e_out[0].dtype
        for e, g in zip(e_out[1:], g_out[1:]):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(g, e)
                assert g.dtype == e.dtype
            else:
                assert g == e


def test_a_frame_that_runs_eagerly_after_tracing_starts_from_the_state_it_was_called_in():
    # fullgraph=True on a frame that cannot be one graph raises after tracing began; the
    # setter the trace ran must not stay in force.
    def fn(x):
        torch.use_deterministic_algorithms(True)
        torch.set_default_dtype(torch.float64)
        print("a graph break")
        return x + 1

    _set(STARTS[0])
    with pytest.raises(Exception):
        dynamo_rs.compile(fn, backend="eager", fullgraph=True)(torch.ones(2))
    assert _state() == STARTS[0]
