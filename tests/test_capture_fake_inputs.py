"""The fake twins of graph inputs: our fast construction for plain dense tensors must agree
with torch's general conversion (`FakeTensorMode.from_tensor`) on everything a trace or a
backend can observe, and unusual tensors must take the general path."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig, FakeTensorMode

from dynamo_rs._capture import _plain_dense, to_fake
from dynamo_rs._fakes import wrap_meta


def observed(t: torch.Tensor) -> dict:
    return {
        "type": type(t).__name__, "shape": tuple(t.shape), "stride": t.stride(),
        "offset": t.storage_offset(), "dtype": t.dtype, "device": t.device,
        "requires_grad": t.requires_grad, "is_leaf": t.is_leaf, "layout": t.layout,
        "is_param": getattr(t, "_is_param", False), "keys": str(torch._C._dispatch_keys(t)),
        "storage_bytes": t.untyped_storage().nbytes(),
        "contiguous": t.is_contiguous(),
        "channels_last": t.is_contiguous(memory_format=torch.channels_last),
    }


def cases():
    base = torch.randn(4, 6)
    yield "contiguous", torch.randn(3, 5), True
    yield "parameter", torch.nn.Parameter(torch.randn(3, 5)), True
    yield "frozen parameter", torch.nn.Parameter(torch.randn(3, 5), requires_grad=False), True
    yield "requires grad leaf", torch.randn(3, 5, requires_grad=True), True
    yield "int64", torch.arange(12).reshape(3, 4).clone(), True
    yield "bool", torch.ones(2, 3, dtype=torch.bool), True
    yield "half", torch.randn(2, 3).half(), True
    yield "column-major (own storage)", torch.empty_strided((3, 5), (1, 3)).normal_(), True
    yield "storage larger than needed", torch.randn(20)[:0].new_empty(0).set_(torch.randn(20).untyped_storage(), 0, (3, 4), (4, 1)), False
    yield "channels_last", torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), True
    yield "view", base[1:], False
    yield "view at offset 0", base[:2], False
    yield "non-leaf", torch.randn(3, requires_grad=True) * 2, False
    yield "0-dim", torch.tensor(3), False
    yield "empty", torch.empty(0, 3), False
    yield "conj", torch.randn(3, dtype=torch.complex64).conj(), False
    yield "subclass", torch.randn(3).as_subclass(Sub), False


class Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("name,tensor,fast", list(cases()), ids=[c[0] for c in cases()])
def test_fake_input_matches_torch_conversion(name, tensor, fast):
    assert _plain_dense(tensor) == fast
    ours = to_fake(FakeTensorMode(), tensor)
    theirs = FakeTensorMode().from_tensor(tensor, static_shapes=True)
    assert observed(ours) == observed(theirs)


def test_same_tensor_one_fake_and_shared_storage_aliases():
    mode = FakeTensorMode()
    w = torch.nn.Parameter(torch.randn(4, 4))
    assert to_fake(mode, w) is to_fake(mode, w)
    # Two plain tensors over one storage: the second must alias the first's fake storage or
    # at least not be built as an independent fast fake with the wrong storage size.
    a = torch.randn(16)
    b = torch.empty(0).set_(a.untyped_storage(), 0, (4, 4), (4, 1))
    fa, fb = to_fake(mode, a), to_fake(mode, b)
    assert observed(fb) == observed(FakeTensorMode().from_tensor(b, static_shapes=True))
    assert fa.shape == (16,) and fb.shape == (4, 4)


def test_view_of_fast_base_aliases_it():
    mode = FakeTensorMode()
    base = torch.randn(4, 6)
    fake_base = to_fake(mode, base)
    fake_view = to_fake(mode, base[1:])
    assert fake_view._base is fake_base


def test_real_models_inputs_agree():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    mode, reference = FakeTensorMode(), FakeTensorMode()
    tensors = list(model.parameters()) + list(model.buffers())
    assert sum(_plain_dense(t) for t in tensors) >= len(tensors) - 20  # num_batches_tracked are 0-dim
    for t in tensors:
        assert observed(to_fake(mode, t)) == observed(reference.from_tensor(t, static_shapes=True))


def _constructed(mode, meta, device, requires_grad=None):
    fake = FakeTensor(mode, meta, device)
    if requires_grad:
        fake.requires_grad_(True)
    return fake


@pytest.mark.parametrize("shape,stride,dtype,requires_grad", [
    ((3, 5), (5, 1), torch.float32, None),
    ((3, 5), (1, 3), torch.float64, True),
    ((2, 3, 4, 5), (60, 1, 15, 3), torch.bfloat16, False),
    ((7,), (1,), torch.int64, None),
    ((), (), torch.bool, None),
])
def test_wrapped_meta_is_the_constructors_fake(shape, stride, dtype, requires_grad):
    """`wrap_meta` builds, from a template, the object `FakeTensor(mode, meta, device)` builds:
    the same instance state, dispatch keys, flags, and the same behaviour under the mode."""
    mode = FakeTensorMode()
    ours = wrap_meta(mode, torch.empty_strided(shape, stride, dtype=dtype, device="meta"),
                     torch.device("cpu"), requires_grad)
    theirs = _constructed(mode, torch.empty_strided(shape, stride, dtype=dtype, device="meta"),
                          torch.device("cpu"), requires_grad)
    assert vars(ours) == vars(theirs)
    assert observed(ours) == observed(theirs)
    assert ours.fake_mode is mode and ours.constant is None and ours.item_memo is None
    with mode:
        assert observed(ours * 2) == observed(theirs * 2)


def test_wrapped_meta_per_mode_and_in_debug_mode(monkeypatch):
    first, second = FakeTensorMode(), FakeTensorMode()
    meta = torch.empty(2, 3, device="meta")
    assert wrap_meta(first, meta, torch.device("cpu")).fake_mode is first
    assert wrap_meta(second, meta, torch.device("cpu")).fake_mode is second
    # The constructor's debug mode records a traceback per fake tensor: the template (made
    # without it) would leave that out, so the constructor runs.
    monkeypatch.setattr(FakeTensorConfig, "debug", True)
    debugged = wrap_meta(FakeTensorMode(), meta, torch.device("cpu"))
    assert hasattr(debugged, "_debug_trace")
