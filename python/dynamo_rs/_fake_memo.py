"""Fake results remembered within one frame's trace: an operation met again with inputs of
the same metadata (a model's repeated blocks: 12 identical `multi_head_attention_forward`
calls in a ViT, 9 ms each through FakeTensorMode) gets new fake tensors of the metadata the
first call produced, instead of another trip through FakeTensorMode.

Only where the answer is a function of what the key holds:
- inputs: fake tensors the shape rules could describe (`_meta_rules._plain`: plain strided
  fakes of this mode, static sizes, no constant value), keyed by sizes, strides, offset,
  dtype, device and which inputs share storage; everything else a constant of a few immutable
  types (or a tuple/list of them), keyed by type and value. Anything else (a generator, an
  object) makes the call not rememberable.
- context: no autocast, no torch-function mode, no autograd graph (`_plain_context`), and
  the grad mode;
- results: a fake tensor, or a tuple of fake tensors and Nones, each tensor plain, not
  requiring grad, with storage of its own (not an input's, not another result's) at offset 0
  — so views, in-place operations and `out=` are never remembered.

The memo lives on the FakeTensorMode (one per frame): each capture starts cold. With
`config.verify_meta_rules` every remembered answer is checked against FakeTensorMode."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from dynamo_rs import _meta_rules
from dynamo_rs._fakes import wrap_meta

_CONSTANT_TYPES = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.memory_format,
                   torch.layout)


def _key_of(mode: FakeTensorMode, target, args, kwargs):
    storages: list = []
    tensors: list = []
    parts: list = []

    def add(value) -> bool:
        if type(value) is FakeTensor or type(value) is torch.nn.Parameter:
            if type(value) is not FakeTensor or not _meta_rules._plain(mode, value):
                return False
            storage = value.untyped_storage()._cdata
            shared = storages.index(storage) if storage in storages else -1
            storages.append(storage)
            tensors.append(value)
            parts.append(("T", tuple(value.shape), value.stride(), value.storage_offset(),
                          value.dtype, value.device, shared))
            return True
        if isinstance(value, _CONSTANT_TYPES):
            parts.append((type(value), value))
            return True
        if type(value) in (tuple, list, torch.Size):
            parts.append((type(value), len(value)))
            return all(add(item) for item in value)
        return False

    try:
        hash(target)
    except TypeError:
        return None, None
    for arg in args:
        if not add(arg):
            return None, None
    for name in sorted(kwargs):
        parts.append(name)
        if not add(kwargs[name]):
            return None, None
    if not _meta_rules._plain_context(tensors):
        return None, None
    return (target, torch.is_grad_enabled(), tuple(parts)), tensors


def lookup(mode: FakeTensorMode, target, args, kwargs):
    """(key, remembered result made anew or None); the key's first item is None when the
    call is not rememberable. The key goes to `remember` with the result."""
    key = _key_of(mode, target, args, kwargs)
    if key[0] is None:
        return key, None
    memo = mode.__dict__.get("dynamo_rs_memo")
    if memo is None or key[0] not in memo:
        return key, None
    is_tuple, layouts = memo[key[0]]
    made = tuple(None if layout is None else
                 wrap_meta(mode, torch.empty_strided(layout[0], layout[1], dtype=layout[2], device="meta"),
                           layout[3])
                 for layout in layouts)
    return key, (made if is_tuple else made[0])


def remember(mode: FakeTensorMode, key, result) -> None:
    """Records `result` under `key` (from `lookup`) when it is rememberable (see the module
    doc)."""
    key, tensors = key
    if key is None:
        return
    results = result if type(result) is tuple else (result,)
    storages = {t.untyped_storage()._cdata for t in tensors}
    layouts = []
    for r in results:
        if r is None and type(result) is tuple:
            layouts.append(None)
            continue
        if type(r) is not FakeTensor or not _meta_rules._plain(mode, r) or r.requires_grad:
            return
        storage = r.untyped_storage()._cdata
        if storage in storages or r.storage_offset() != 0:
            return
        storages.add(storage)
        layouts.append((tuple(r.shape), r.stride(), r.dtype, r.device))
    if not any(layout is not None for layout in layouts):
        return
    mode.__dict__.setdefault("dynamo_rs_memo", {})[key] = (type(result) is tuple, layouts)
