"""Every backend in torch's registry that runs on CPU works under dynamo_rs as under
torch.compile: the same outputs and gradients as eager, static and with symbolic sizes, and
the same errors for the registry's failing test backends (issue 12)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import dynamo_rs
from dynamo_rs.testing import CompileCounter

# All CPU backends of torch's registry except the minifier helpers, the TorchScript ones
# (deprecated; they print warnings) and those needing other hardware or packages.
CPU_BACKENDS = [
    "eager",
    "eager_debug",
    "eager_noexcept",
    "pre_dispatch_eager",
    "aot_eager",
    "aot_eager_decomp_partition",
    "aot_eager_decomp_partition_crossref",
    "aot_eager_default_partitioner",
    "invoke_subgraph",
    "inductor",
]


@pytest.fixture(autouse=True)
def fresh(reset_compilers):
    yield


def step(x, w, b):
    h = torch.nn.functional.linear(x, w, b).relu()
    return h.softmax(-1).sum(0) + x.sin().mean()


def run(front, backend, dynamic, sizes=(4, 6)):
    torch.manual_seed(0)
    w = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    fn = front(step, backend=backend, dynamic=dynamic)
    results = []
    for n in sizes:
        x = torch.randn(n, 5, requires_grad=True)
        out = fn(x, w, b)
        out.sum().backward()
        results.append((out.detach(), x.grad, w.grad.clone(), b.grad.clone()))
        w.grad = b.grad = None
    return results


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_registry_backend_gives_eager_results_and_gradients(backend, dynamic) -> None:
    expected = run(lambda f, **_: f, None, None)
    ours = run(dynamo_rs.compile, backend, dynamic)
    theirs = run(torch.compile, backend, dynamic)
    for e, o, t in zip(expected, ours, theirs):
        for a, b, c in zip(e, o, t):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(c, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "mode, options",
    [("default", None), ("max-autotune-no-cudagraphs", None), (None, {"epilogue_fusion": False})],
)
def test_inductor_mode_and_options(mode, options) -> None:
    x = torch.randn(8, 5)
    w, b = torch.randn(3, 5), torch.randn(3)
    fn = dynamo_rs.compile(step, mode=mode, options=options)
    torch.testing.assert_close(fn(x, w, b), step(x, w, b))


def with_relu(x):
    return torch.relu(x * 2) + 1


def test_failing_registry_backends_fail_as_under_torch_compile() -> None:
    x = torch.randn(4)
    # Fails while compiling a graph with a relu: BackendCompilerFailed from both.
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="ReluCompileError"):
        torch.compile(with_relu, backend="relu_compile_error_TESTING_ONLY")(x)
    with pytest.raises(dynamo_rs.BackendCompilerFailed, match="backend relu_compile_error_TESTING_ONLY raised ReluCompileError while compiling with_relu"):
        dynamo_rs.compile(with_relu, backend="relu_compile_error_TESTING_ONLY")(x)
    # Compiles, then fails when the graph runs: the error reaches the caller unchanged.
    with pytest.raises(Exception) as theirs:
        torch.compile(with_relu, backend="relu_runtime_error_TESTING_ONLY")(x)
    with pytest.raises(Exception) as ours:
        dynamo_rs.compile(with_relu, backend="relu_runtime_error_TESTING_ONLY")(x)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_one_graph_per_backend_and_frame() -> None:
    counter = CompileCounter()
    fn = dynamo_rs.compile(with_relu, backend=counter)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(fn(x), with_relu(x))
    assert counter.frame_count == 1


def test_code_inductor_generates_is_never_traced(caplog) -> None:
    """A backward pass run inside a compiled function calls Inductor's generated code
    (`Runner.call` of a module under its cache directory): torch's own code, run as it is —
    tracing it failed and fell back with a warning per frame."""
    import logging

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())

    def step(m, x):
        loss = m(x).square().mean()
        loss.backward()
        return loss

    compiled_step = dynamo_rs.compile(step, backend="inductor")
    x = torch.randn(3, 4)
    with caplog.at_level(logging.WARNING, logger="dynamo_rs"):
        for _ in range(2):
            torch.testing.assert_close(compiled_step(model, x), step(reference, x))
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert not [r for r in caplog.records if "could not compile" in r.getMessage()], caplog.text


def test_profiler_ranges_are_transparent() -> None:
    """`with torch.autograd.profiler.record_function(name)` (optimizers' `step` wrapper opens
    one) is traced through: one graph, eager's result."""
    from dynamo_rs.testing import CompileCounter

    def ranged(x):
        with torch.autograd.profiler.record_function("block"):
            y = x.sin() * 2
        with torch.profiler.record_function("other"):
            return y + 1

    counter = CompileCounter()
    x = torch.randn(5)
    torch.testing.assert_close(dynamo_rs.compile(ranged, backend=counter)(x), ranged(x))
    assert counter.frame_count == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_backward_inside_a_compiled_function_breaks_the_graph(backend) -> None:
    """`loss.backward()` (and the other tensor methods that act outside the graph: hooks,
    retain_grad, storage) is a graph break, as under TorchDynamo: as a graph node it failed in
    every AOTAutograd backend."""

    def step(w, x):
        loss = (w * x).sin().sum()
        loss.backward()
        kept = (w * 2).sum()
        return loss.detach(), kept

    explained = dynamo_rs.explain(step)(torch.randn(3, requires_grad=True), torch.randn(3))
    assert explained.graph_break_count == 1
    for _ in range(2):
        torch.manual_seed(0)
        w_eager, x = torch.randn(3, requires_grad=True), torch.randn(3)
        w_compiled = w_eager.detach().clone().requires_grad_()
        expected = step(w_eager, x)
        got = dynamo_rs.compile(step, backend=backend)(w_compiled, x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(w_compiled.grad, w_eager.grad)


def _gradient_penalty(layer, x):
    x = x.detach().requires_grad_()
    y = layer(x).sum()
    (grad,) = torch.autograd.grad(y, x, create_graph=True)
    return y, (grad.norm() - 1) ** 2


def _gradient_penalty_attribute(layer, x):
    x = x.detach()
    x.requires_grad = True
    y = layer(x).sum()
    (grad,) = torch.autograd.grad(y, x)
    return y, grad


@pytest.mark.parametrize("fn", [_gradient_penalty, _gradient_penalty_attribute])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_gradients_with_respect_to_a_tensor_made_a_leaf(fn, backend) -> None:
    """`x.detach().requires_grad_()` then `torch.autograd.grad(y, x)` (a gradient penalty):
    the graph breaks where the leaf is made, so `y` is computed from it by autograd as in
    eager (a compiled graph's outputs are not differentiable with respect to a tensor the
    graph itself made a leaf: AOTAutograd raised)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 1)
    x = torch.randn(4, 3)
    expected = fn(layer, x)
    got = dynamo_rs.compile(fn, backend=backend)(layer, x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
