"""Bad input gets a clear error; a failure of ours while compiling runs the frame eagerly (or, with
fullgraph=True, raises with the user's file and line); a failing backend raises
BackendCompilerFailed as under torch.compile; user exceptions stay the same."""

from __future__ import annotations

import logging
import re

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield


def test_compile_rejects_non_callables() -> None:
    with pytest.raises(TypeError, match="callable or an nn.Module, not int"):
        dynamo_rs.compile(42)


def test_unknown_backend_lists_the_available_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; available: .*aot_eager.*eager"):
        dynamo_rs.compile(lambda x: x, backend="nope")


def test_backend_names_resolve_through_torch_registry() -> None:
    fn = dynamo_rs.compile(lambda x: x.sin() * 2, backend="aot_eager")
    x = torch.randn(3)
    torch.testing.assert_close(fn(x), x.sin() * 2)


def failing_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


def body(x):
    return x.cos() + 1


@pytest.fixture
def suppress_errors():
    """Sets config.suppress_errors for one test and puts the default back."""
    saved = dynamo_rs.config.suppress_errors

    def set_(value):
        dynamo_rs.config.suppress_errors = value

    yield set_
    dynamo_rs.config.suppress_errors = saved


def returns_an_int(gm, example_inputs):
    return 3


def test_backend_error_raises_as_under_torch_compile() -> None:
    # By default a backend that raises is the user's error, not a reason to run eagerly:
    # torch.compile raises BackendCompilerFailed, and so do we, naming the backend, the
    # original error and the user's function, with the original error as the cause.
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="backend exploded"):
        torch.compile(body, backend=failing_backend)(torch.randn(3))
    fn = dynamo_rs.compile(body, backend=failing_backend)
    for _ in range(2):  # not remembered as uncompilable: the next call tries again
        with pytest.raises(dynamo_rs.BackendCompilerFailed) as info:
            fn(torch.randn(3))
        message = str(info.value)
        assert "failing_backend" in message and "RuntimeError: backend exploded" in message
        assert re.search(r"body \(.*test_capture_errors.py:\d+\)", message)
        assert isinstance(info.value.__cause__, RuntimeError)


def test_backend_error_with_suppress_errors_runs_the_frame_eagerly(caplog, suppress_errors) -> None:
    suppress_errors(True)
    fn = dynamo_rs.compile(body, backend=failing_backend)
    x = torch.randn(3)
    with caplog.at_level(logging.WARNING, logger="dynamo_rs"):
        torch.testing.assert_close(fn(x), body(x))
    message = caplog.text
    assert "backend exploded" in message and "RuntimeError" in message
    assert "test_capture_errors.py" in message and "body" in message


def test_backend_error_raises_with_fullgraph(suppress_errors) -> None:
    for setting in (None, True, False):
        suppress_errors(setting)
        dynamo_rs.reset()
        fn = dynamo_rs.compile(body, backend=failing_backend, fullgraph=True)
        with pytest.raises(dynamo_rs.BackendCompilerFailed, match=r"backend exploded.*body \(.*test_capture_errors.py:\d+\)"):
            fn(torch.randn(3))


def test_backend_returning_a_non_callable_is_an_error_at_compile_time(suppress_errors) -> None:
    fn = dynamo_rs.compile(body, backend=returns_an_int)
    with pytest.raises(dynamo_rs.BackendCompilerFailed, match=r"returns_an_int returned 3 \(int\), which is not callable, while compiling body \(.*test_capture_errors.py:\d+\)"):
        fn(torch.randn(3))
    suppress_errors(True)
    x = torch.randn(3)
    torch.testing.assert_close(fn(x), body(x))


def test_suppress_errors_takes_none_true_false(suppress_errors) -> None:
    assert dynamo_rs.config.suppress_errors is None
    suppress_errors(1)
    assert dynamo_rs.config.suppress_errors is True
    suppress_errors(0)
    assert dynamo_rs.config.suppress_errors is False


def data_dependent(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def data_dependent_in_loop(x):
    # A branch on a tensor inside a loop: not split at (the resume function would call
    # itself once per iteration), so the whole frame runs eagerly.
    for _ in range(2):
        if x.sum() > 0:
            x = x + 1
    return x


def test_unsupported_code_runs_eagerly_with_one_log_line(caplog) -> None:
    counter = CompileCounter()
    fn = dynamo_rs.compile(data_dependent_in_loop, backend=counter)
    x = torch.ones(3)
    with caplog.at_level(logging.WARNING, logger="dynamo_rs"):
        for _ in range(3):
            torch.testing.assert_close(fn(x), data_dependent_in_loop(x))
    records = [r for r in caplog.records if r.name == "dynamo_rs"]
    assert len(records) == 1, "one message, then the frame is not retried"
    assert "branch on a tensor's value" in records[0].getMessage()
    assert "test_capture_errors.py" in records[0].getMessage()
    assert counter.frame_count == 0


def test_unsupported_code_raises_with_fullgraph() -> None:
    fn = dynamo_rs.compile(data_dependent, backend=CompileCounter(), fullgraph=True)
    with pytest.raises(dynamo_rs.Unsupported, match=r"data_dependent \(.*test_capture_errors.py:\d+\)"):
        fn(torch.ones(3))


class Raises(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] != 4:
            raise ValueError(f"expected 4 rows, got {x.shape[0]}")
        return x * 2


def test_exceptions_from_forward_keep_their_type() -> None:
    model = Raises()
    compiled = dynamo_rs.compile(model, backend=CompileCounter())
    with pytest.raises(ValueError, match="expected 4 rows, got 3"):
        model(torch.ones(3))
    with pytest.raises(ValueError, match="expected 4 rows, got 3"):
        compiled(torch.ones(3))
    torch.testing.assert_close(compiled(torch.ones(4)), torch.ones(4) * 2)


def test_errors_from_torch_ops_keep_their_type() -> None:
    def bad_matmul(x, y):
        return x @ y

    compiled = dynamo_rs.compile(bad_matmul, backend=CompileCounter())
    a, b = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(RuntimeError) as eager:
        bad_matmul(a, b)
    with pytest.raises(RuntimeError) as ours:
        compiled(a, b)
    assert str(ours.value) == str(eager.value)


def _takes_two(a, b, /, *, scale):
    return (a + b) * scale


@pytest.mark.parametrize("call", [
    lambda x: _takes_two(x, x, x, scale=1.0),   # too many positional arguments
    lambda x: _takes_two(x, scale=1.0),         # a missing positional argument
    lambda x: _takes_two(x, b=x, scale=1.0),    # a positional-only one passed by name
    lambda x: _takes_two(x, x),                 # a missing keyword-only argument
    lambda x: _takes_two(x, x, scale=1.0, z=2),  # an unexpected keyword
], ids=["too-many", "missing", "posonly-by-name", "missing-kwonly", "unexpected"])
def test_calls_that_do_not_fit_raise_the_eager_type_error(call) -> None:
    x = torch.ones(2)
    with pytest.raises(TypeError) as eager:
        call(x)
    with pytest.raises(TypeError) as ours:
        dynamo_rs.compile(call, backend=CompileCounter())(x)
    assert str(ours.value) == str(eager.value)


def test_disable_flag_returns_the_function() -> None:
    fn = lambda x: x  # noqa: E731
    assert dynamo_rs.compile(fn, disable=True) is fn


def test_decorator_form() -> None:
    @dynamo_rs.compile(backend=CompileCounter())
    def f(x):
        return x + 1

    torch.testing.assert_close(f(torch.zeros(2)), torch.ones(2))


# The backend meets a limit of fake tensors (`exceptions_allowed_to_be_fallback`): under
# torch.compile a graph break — the frame runs eagerly, an error only with fullgraph=True —
# not BackendCompilerFailed. The family's usual member: `x[mask] = v` with a boolean mask in
# a graph that is differentiated (AOTAutograd's backward needs `grad[mask]`, whose size
# depends on the data); whatever raises it, the backend's own check or ours.
def masked_assignment(x, mask, v):
    y = x * 2
    y[mask] = v
    return y.sum()


def masked_assignment_after_a_break(x, mask, v):
    x = x + 1
    print("", end="")
    return masked_assignment(x, mask, v) * 3


def masked_assignment_before_a_break(x, mask, v):
    y = x * 2
    y[mask] = v
    print("", end="")
    return y.sum() * 3


def raises_a_fake_tensor_limit(gm, example_inputs):
    """A backend that cannot take item assignments, as AOTAutograd's backward cannot."""
    import operator

    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    if any(node.target is operator.setitem for node in gm.graph.nodes):
        raise DynamicOutputShapeException(torch.ops.aten.nonzero.default)
    return gm.forward


def _masked_inputs():
    torch.manual_seed(0)
    x = torch.randn(6, 4, requires_grad=True)
    mask = torch.rand(6) > 0.5
    v = torch.randn(4, requires_grad=True)
    return x, mask, v


def _result_and_grads(fn):
    x, mask, v = _masked_inputs()
    out = fn(x, mask, v)
    out.backward()
    return out.detach(), x.grad, v.grad


@pytest.mark.parametrize("fn", [masked_assignment, masked_assignment_after_a_break,
                                masked_assignment_before_a_break])
@pytest.mark.parametrize("backend", ["aot_eager", raises_a_fake_tensor_limit])
def test_a_fake_tensor_limit_in_the_backend_is_a_graph_break(fn, backend, suppress_errors) -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    expected = _result_and_grads(fn)
    theirs = CompileCounterWithBackend(backend) if isinstance(backend, str) else backend
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.testing.assert_close(_result_and_grads(torch.compile(fn, backend=theirs)), expected)
    assert any("Backend compiler exception" in k for k in torch._dynamo.utils.counters["unimplemented"])
    torch._dynamo.reset()
    for setting in (None, False):  # not the backend's failure, whatever suppress_errors says
        suppress_errors(setting)
        dynamo_rs.reset()
        compiled = dynamo_rs.compile(fn, backend=backend)
        for _ in range(2):
            torch.testing.assert_close(_result_and_grads(compiled), expected)
        # The frames holding the assignment run eagerly (after a break: the resume
        # function, then `masked_assignment` called from it), saying why.
        failures = compiled._dynamo_rs_converter.failures
        assert failures and all("GB0023" in why for _, why in failures), failures
    dynamo_rs.reset()
    with pytest.raises(dynamo_rs.Unsupported, match=r"DynamicOutputShapeException.*GB0023.*masked_assignment \(.*test_capture_errors.py:\d+\)"):
        dynamo_rs.compile(masked_assignment, backend=backend, fullgraph=True)(*_masked_inputs())


def test_a_boolean_mask_assignment_without_gradients_stays_in_the_graph() -> None:
    # No backward to trace: AOTAutograd takes `x[mask] = v` (wav2vec2's `x[~mask] = 0` in
    # eval), one graph under both front ends.
    from torch._dynamo.testing import CompileCounterWithBackend

    x, mask, v = (t.detach() for t in _masked_inputs())
    expected = masked_assignment(x, mask, v)
    theirs, ours = CompileCounterWithBackend("aot_eager"), CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(masked_assignment, backend=theirs)(x, mask, v), expected)
    torch._dynamo.reset()
    torch.testing.assert_close(dynamo_rs.compile(masked_assignment, backend=ours)(x, mask, v), expected)
    assert ours.frame_count == theirs.frame_count == 1
