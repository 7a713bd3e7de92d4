"""TorchDynamo's directives inside compiled code: functions disabled with
`torch.compiler.disable` / `torch._dynamo.disable` (the call breaks the graph and runs as it
is, nothing it calls compiled; non-recursive: only its own frame), `torch._dynamo.graph_break()`
and `torch.compiler.is_dynamo_compiling()` — side by side with TorchDynamo's graph counts and
eager's results."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from test_graph_breaks import run_cases, t

pytestmark = pytest.mark.usefixtures("reset_compilers")


def _helper_of_disabled(t):
    return t * 3


@torch.compiler.disable
def _disabled(t):
    # Runs as it is: neither this frame nor the helper it calls is compiled.
    return _helper_of_disabled(t) + 1


@torch._dynamo.disable
def _disabled_by_dynamo(t):
    return t.exp() * 2


@torch._dynamo.disable(recursive=False)
def _disabled_here_only(t):
    return _helper_of_disabled(t) - 1


class _WithDisabledMethod(torch.nn.Module):
    @torch.compiler.disable
    def side(self, t):
        return t.relu() * 2

    def forward(self, x):
        return self.side(x.sin()).cos()


class _ForwardDisabledHereOnly(torch.nn.Module):
    @torch._dynamo.disable(recursive=False)
    def forward(self, x):
        return _helper_of_disabled(x).sum() + 1


class _ForwardDisabled(torch.nn.Module):
    @torch.compiler.disable
    def forward(self, x):
        return x.sin().sum()


class _MethodDisabledHereOnly(torch.nn.Module):
    @torch.compiler.disable(recursive=False)
    def side(self, t):
        return _helper_of_disabled(t) * 2

    def forward(self, x):
        return self.side(x.sin()).cos()


class _OwnsDisabledLayers(torch.nn.Module):
    """Submodules whose `forward` is disabled, called from a compiled parent: the call breaks
    the graph (they were traced through before — the disable ignored)."""

    def __init__(self) -> None:
        super().__init__()
        self.here_only = _ForwardDisabledHereOnly()
        self.whole = _ForwardDisabled()

    def forward(self, x):
        return self.here_only(x.cos()) + self.whole(x * 2)


def calls_disabled(x):
    return _disabled(x.sin()).cos()


def calls_disabled_by_dynamo(x):
    y = _disabled_by_dynamo(x + 1)
    return y * x


def calls_disabled_here_only(x):
    return _disabled_here_only(x.sin()).cos()


def calls_disabled_twice(x):
    a = _disabled(x)
    b = _disabled(a.sin())
    return a + b


def branches_on_dynamo_compiling(x):
    if torch.compiler.is_dynamo_compiling():
        return x + 100
    return x


def requested_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos() + x


def requested_break_in_a_helper(x):
    def helper(t):
        t = t * 2
        torch._dynamo.graph_break()
        return t + 1

    return helper(x.relu()).sum()


def requested_breaks_in_a_loop(x):
    for i in range(3):
        x = x * (i + 1)
        torch._dynamo.graph_break()
    return x


CASES = {
    "requested break": (requested_break, [(t(3),)], 0),
    "requested break in an inlined helper": (requested_break_in_a_helper, [(t(3),)], 0),
    "requested breaks in a loop": (requested_breaks_in_a_loop, [(t(3),)], 0),
    "a disabled function": (calls_disabled, [(t(3),)], 0),
    "a function disabled by torch._dynamo.disable": (calls_disabled_by_dynamo, [(t(3),)], 0),
    "a function disabled non-recursively": (calls_disabled_here_only, [(t(3),)], 0),
    "a disabled function called twice": (calls_disabled_twice, [(t(3),)], 0),
    "a disabled method": (_WithDisabledMethod(), [(t(3),)], 0),
    "a method disabled non-recursively": (_MethodDisabledHereOnly(), [(t(3),)], 0),
    "submodules whose forward is disabled": (_OwnsDisabledLayers(), [(t(3),)], 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_disabled_call(name) -> None:
    fn, calls, delta = CASES[name]
    run_cases(fn, calls, graphs_delta=delta, explain_delta=delta)


def test_disabled_functions_and_what_they_call_are_never_compiled() -> None:
    """`torch.compiler.disable` means the function — and, recursively, what it calls — runs
    uncompiled: no cache entry for either code object after compiled calls."""
    from dynamo_rs import eval_frame

    compiled = dynamo_rs.compile(calls_disabled, backend=CompileCounter())
    x = t(3)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), calls_disabled(x))
    assert eval_frame.cache_entries(_helper_of_disabled.__code__) == []
    assert eval_frame.cache_entries(_disabled.__wrapped__.__code__) == []
    # Non-recursive: the function's own frame is left alone, what it calls is compiled.
    compiled = dynamo_rs.compile(calls_disabled_here_only, backend=CompileCounter())
    torch.testing.assert_close(compiled(x), calls_disabled_here_only(x))
    assert eval_frame.cache_entries(_disabled_here_only._torchdynamo_orig_callable.__code__) == []


class _DisabledForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    @torch.compiler.disable
    def forward(self, x):
        return self.linear(x.sin()).cos()


def test_a_compiled_module_whose_forward_is_disabled_compiles_nothing() -> None:
    """`dynamo_rs.compile(module)` whose `forward` is disabled runs it as it is (TorchDynamo
    compiles nothing either) — and compiling it does not switch the disable wrapper, whose
    code every disabled function shares, back on for other disabled functions."""
    from dynamo_rs import eval_frame

    module = _DisabledForward()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(module, backend=counter)
    x = t(2, 3)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), module(x))
    assert counter.frame_count == 0
    assert eval_frame.cache_entries(_DisabledForward.forward.__wrapped__.__code__) == []
    other = dynamo_rs.compile(calls_disabled, backend=CompileCounter())
    torch.testing.assert_close(other(x), calls_disabled(x))
    assert eval_frame.cache_entries(_disabled.__wrapped__.__code__) == []


def _targets(graphs) -> list:
    return [node.target for gm in graphs for node in gm.graph.nodes if node.op.startswith("call")]


@pytest.mark.parametrize("disable", ["torch", "dynamo_rs"])
def test_a_forward_disabled_non_recursively_is_not_traced(disable) -> None:
    """Its own operations are never in a graph, whether the module is compiled itself or
    called from a compiled parent; what it calls is compiled."""
    from dynamo_rs import eval_frame

    directive = torch.compiler.disable if disable == "torch" else dynamo_rs.disable

    class Layer(torch.nn.Module):
        @directive(recursive=False)
        def forward(self, x):
            return torch.add(_helper_of_disabled(x), 1).sum()

    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    layer = Layer()
    x = t(3)

    def parent(v):
        return layer(v) * 2

    for compiled, eager in ((dynamo_rs.compile(layer, backend=backend), layer),
                            (dynamo_rs.compile(parent, backend=backend), parent)):
        dynamo_rs.reset()
        for _ in range(2):
            torch.testing.assert_close(compiled(x), eager(x))
    assert graphs  # the helper's graph and the parent's
    assert torch.add not in _targets(graphs) and "sum" not in _targets(graphs)
    # What it calls is compiled on its own.
    assert eval_frame.cache_entries(_helper_of_disabled.__code__) != []


def test_dynamo_rs_disable_takes_torch_arguments() -> None:
    @dynamo_rs.disable(reason="has side effects")
    def recursive(x):
        return _helper_of_disabled(x)

    @dynamo_rs.disable(recursive=False, reason="only this frame")
    def here_only(x):
        return _helper_of_disabled(x) + 1

    def caller(x):
        return recursive(x.sin()) + here_only(x.cos())

    counter = CompileCounter()
    compiled = dynamo_rs.compile(caller, backend=counter)
    x = t(3)
    torch.testing.assert_close(compiled(x), caller(x))
    assert here_only.__wrapped__ is not None and here_only._torchdynamo_disable_recursive is False


def test_is_dynamo_compiling_is_true_in_the_trace() -> None:
    """`torch.compiler.is_dynamo_compiling()` answers True while tracing, as under
    TorchDynamo (the compiled function takes the branch TorchDynamo takes)."""
    compiled = dynamo_rs.compile(branches_on_dynamo_compiling, backend=CompileCounter())
    reference = torch.compile(branches_on_dynamo_compiling, backend="eager")
    x = t(3)
    torch.testing.assert_close(compiled(x), reference(x))
    torch.testing.assert_close(compiled(x), x + 100)
