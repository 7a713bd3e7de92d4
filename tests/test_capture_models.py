"""Real models: each is captured in one graph with about as many operations as TorchDynamo
captures, gives the eager result, reuses its compiled code for new inputs of the same shape,
and runs through inductor."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from models import build, tensors_of

VISION = ["resnet18", "mobilenet_v3_small", "vit_tiny_patch16_224", "convnext_atto"]
TRANSFORMERS = ["gpt2", "bert", "llama"]


def check_model(name: str) -> None:
    model, inputs = build(name)
    dynamo_rs.reset()
    torch._dynamo.reset()
    ours, theirs = CompileCounter(), torch._dynamo.testing.CompileCounter()
    with torch.no_grad():
        expected = model(*inputs)
        compiled = dynamo_rs.compile(model, backend=ours)
        got = compiled(*inputs)
        torch.compile(model, backend=theirs)(*inputs)
    # One graph, and no frame (the model's or one our generated code calls, like a
    # transformers ModelOutput constructor rebuilding the result) fell back to eager.
    assert ours.frame_count == 1
    assert compiled._dynamo_rs_converter.failures == []
    assert abs(ours.op_count - theirs.op_count) <= 0.1 * theirs.op_count, (ours.op_count, theirs.op_count)
    for e, g in zip(tensors_of(expected), tensors_of(got)):
        torch.testing.assert_close(g, e)
    fresh = tuple(torch.randn_like(t) if t.is_floating_point() else torch.randint_like(t, 0, 1000) for t in inputs)
    with torch.no_grad():
        again = dynamo_rs.compile(model, backend=ours)(*fresh)
        for e, g in zip(tensors_of(model(*fresh)), tensors_of(again)):
            torch.testing.assert_close(g, e)
    assert ours.frame_count == 1, "new inputs of the same shape must hit the cache"


@pytest.mark.parametrize("name", VISION)
def test_vision_models_in_one_graph(name: str) -> None:
    check_model(name)


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_models_in_one_graph(name: str) -> None:
    check_model(name)


@pytest.mark.parametrize("name", VISION + TRANSFORMERS)
def test_models_with_inductor(name: str) -> None:
    model, inputs = build(name)
    dynamo_rs.reset()
    with torch.no_grad():
        expected = model(*inputs)
        got = dynamo_rs.compile(model, backend="inductor")(*inputs)
    for e, g in zip(tensors_of(expected), tensors_of(got)):
        torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3)


def test_bare_sequential_is_compiled() -> None:
    # nn.Sequential.forward lives in torch's own files, which the hook otherwise skips.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[layer for _ in range(16) for layer in (torch.nn.Linear(8, 8), torch.nn.ReLU())]).eval()
    x = torch.randn(4, 8)
    dynamo_rs.reset()
    torch._dynamo.reset()
    ours, theirs = CompileCounter(), torch._dynamo.testing.CompileCounter()
    with torch.no_grad():
        torch.testing.assert_close(dynamo_rs.compile(model, backend=ours)(x), model(x))
        torch.compile(model, backend=theirs)(x)
    assert (ours.frame_count, ours.op_count) == (theirs.frame_count, theirs.op_count) == (1, 32)


def test_forced_interception_is_forgotten_on_reset_and_restored_by_the_compiled_module() -> None:
    # Compiling a Sequential intercepts torch's Sequential.forward; after `reset()` a raw hook
    # that skips torch must not see it, and the compiled module still compiles on its next call.
    from dynamo_rs import eval_frame

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(4, 8)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    with torch.no_grad():
        compiled(x)
    assert counter.frame_count == 1
    dynamo_rs.reset()

    seen = []

    def callback(frame, cache_size):
        seen.append(frame.f_code)
        return None

    eval_frame.set_eval_frame(callback)
    try:
        with torch.no_grad():
            model(x)
    finally:
        eval_frame.set_eval_frame(None)
    assert type(model).forward.__code__ not in seen

    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 2
