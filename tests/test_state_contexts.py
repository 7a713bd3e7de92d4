"""`with torch.inference_mode(...)` and `with sdpa_kernel(...)` inside compiled code (and
`@torch.inference_mode()` on a method): the graph enters and leaves them with a pair of nodes,
as it does autocast (`tests/test_autocast.py`), instead of breaking the graph at the call.
Each case runs eagerly, with dynamo_rs.compile and with torch.compile: values, whether
results need gradients or are inference tensors, the grad mode seen inside and left behind
must equal eager's; graph counts TorchDynamo's (op counts too, for inference mode: the same
nodes); a graph break inside a block (nested in `no_grad`, or with another block inside)
splits the frame as TorchDynamo does."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import dynamo_rs
from dynamo_rs.testing import CompileCounter

pytestmark = pytest.mark.usefixtures("reset_compilers")

CASES = []


def case(graphs, ops="dynamo"):
    def register(fn):
        CASES.append(pytest.param(fn, graphs, ops, id=fn.__name__))
        return fn

    return register


def observed(value):
    """What a result is, as far as these contexts can change it."""
    if isinstance(value, torch.Tensor):
        return (value.detach().clone(), value.dtype, value.requires_grad, value.is_inference())
    if isinstance(value, tuple):
        return tuple(observed(v) for v in value)
    return value


def assert_same(got, expected):
    if isinstance(expected, tuple) and expected and isinstance(expected[0], torch.Tensor):
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:]
    elif isinstance(expected, tuple):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
    else:
        assert got == expected


def global_state():
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled())


@case(graphs=1)
def inference_block(x):
    with torch.inference_mode():
        y = x * 2
        g = torch.is_grad_enabled()
    return y + 1, y, g


@case(graphs=1)
def inference_false_inside_true(x):
    with torch.inference_mode():
        a = x * 2
        with torch.inference_mode(False):
            b = x * 3
            g = torch.is_grad_enabled()
        c = a + 1
    return a, b, c, g


@case(graphs=1)
def inference_inside_no_grad(x):
    with torch.no_grad():
        with torch.inference_mode():
            y = x.sin()
        z = x * 2
    return y, z, torch.is_grad_enabled()


# Ours asks `torch.is_inference_mode_enabled()` outside the block when the graph runs (the
# answer depends on the caller; TorchDynamo folds it): one node more.
@case(graphs=2, ops=None)
def graph_break_inside_inference(x):
    y = x + 1
    with torch.inference_mode():
        z = y * 2
        print("inside")
        w = z + torch.is_grad_enabled()
    return w + y, torch.is_grad_enabled(), torch.is_inference_mode_enabled()


# Ours leaves out grad-mode nodes that change nothing: fewer nodes.
@case(graphs=2, ops="at_most")
def graph_break_inside_inference_inside_no_grad(x):
    with torch.no_grad():
        with torch.inference_mode():
            z = x * 2
            print("inside")
            w = z + 1
        g = torch.is_grad_enabled()
        v = x * 3
    return w, v, g, torch.is_grad_enabled()


class WithInferenceStats(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @torch.inference_mode()
    def stats(self, x):
        return self.lin(x).mean()

    def forward(self, x):
        return self.lin(x) - self.stats(x)


DECORATED = WithInferenceStats()


@case(graphs=1)
def inference_mode_decorator(x):
    return DECORATED(x)


# sdpa_kernel: our two nodes (entering, and restoring the backends found when the graph runs)
# where TorchDynamo makes one node per backend name and restores the backends found when it
# traced: the op counts differ by design.
@case(graphs=1, ops=None)
def sdpa_kernel_one_backend(x):
    q = x[None, None]
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, q, q)


@case(graphs=1, ops=None)
def sdpa_kernel_list_causal(x):
    q = x[None, None]
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]):
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    return a + 1, torch.backends.cuda.math_sdp_enabled()


@case(graphs=2, ops=None)
def graph_break_inside_sdpa_kernel(x):
    q = x[None, None]
    with sdpa_kernel(SDPBackend.MATH, set_priority=True):
        a = F.scaled_dot_product_attention(q, q, q)
        print("inside")
        b = F.scaled_dot_product_attention(q * 2, q, q)
    return a + b


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("fn,graphs,ops", CASES)
def test_state_context_as_eager(fn, graphs, ops, requires_grad, capsys) -> None:
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0),
                    requires_grad=requires_grad)
    before = global_state()
    expected = observed(fn(x))
    theirs = torch._dynamo.testing.CompileCounter()
    torch.compile(fn, backend=theirs)(x)
    assert global_state() == before
    ours = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=ours)
    for _ in range(2):
        assert_same(observed(compiled(x)), expected)
        assert global_state() == before
    assert ours.frame_count == theirs.frame_count == graphs
    if ops == "dynamo":
        assert ours.op_count == theirs.op_count
    elif ops == "at_most":
        assert ours.op_count <= theirs.op_count
    assert not compiled._dynamo_rs_converter.failures


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_inference_block_on_compiling_backends(backend) -> None:
    lin = nn.Linear(4, 4)

    def fn(x):
        h = lin(x)
        with torch.inference_mode():
            stats = lin(x).mean()
        return (h - stats).sum()

    x = torch.randn(3, 4)
    expected = fn(x)
    expected.backward()
    grads = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad()
    compiled = dynamo_rs.compile(fn, backend=backend)
    got = compiled(x)
    torch.testing.assert_close(got, expected)
    got.backward()
    for p, g in zip(lin.parameters(), grads):
        torch.testing.assert_close(p.grad, g)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_sdpa_kernel_restores_the_backends_enabled_when_it_runs() -> None:
    """The backends put back on leaving are those enabled when the graph runs: a change of
    torch's global flags between calls is not undone by the second call."""
    def fn(x):
        q = x[None, None]
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, q, q)

    compiled = dynamo_rs.compile(fn, backend="eager")
    x = torch.randn(4, 4)
    torch.testing.assert_close(compiled(x), fn(x))
    flash = torch.backends.cuda.flash_sdp_enabled()
    try:
        torch.backends.cuda.enable_flash_sdp(not flash)
        torch.testing.assert_close(compiled(x), fn(x))
        assert torch.backends.cuda.flash_sdp_enabled() == (not flash)
    finally:
        torch.backends.cuda.enable_flash_sdp(flash)


def test_grad_mode_blocks_split_by_requested_breaks_make_no_empty_graph() -> None:
    """A break right inside `with torch.set_grad_enabled(False)` leaves a graph whose only
    nodes are grad-mode switches that change nothing: no graph is compiled for it, as under
    TorchDynamo (it counted as one)."""

    def f(x):
        before = torch.is_grad_enabled()
        with torch.set_grad_enabled(False):
            torch._dynamo.graph_break()
            with torch.set_grad_enabled(True):
                x = torch.mul(x, 5)
                torch._dynamo.graph_break()
                x = torch.sqrt(x)
                assert torch.is_grad_enabled()
            assert not torch.is_grad_enabled()
        assert torch.is_grad_enabled() == before
        return x

    counts = []
    for compile_fn, counter in ((dynamo_rs.compile, CompileCounter()),
                                (torch.compile, torch._dynamo.testing.CompileCounter())):
        dynamo_rs.reset()
        torch._dynamo.reset()
        compiled = compile_fn(f, backend=counter)
        for _ in range(3):
            x = torch.rand(3, requires_grad=True)
            got = compiled(x)
            torch.testing.assert_close(got, f(x))
            assert got.requires_grad == f(x).requires_grad
        counts.append(counter.frame_count)
    assert counts[0] == counts[1]
