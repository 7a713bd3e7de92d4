"""The fake twins of graph inputs: our fast construction for plain dense tensors must agree
with torch's general conversion (`FakeTensorMode.from_tensor`) on everything a trace or a
backend can observe, and unusual tensors must take the general path."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from dynamo_rs._capture import _plain_dense, to_fake


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
