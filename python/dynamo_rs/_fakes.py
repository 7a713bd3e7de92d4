"""Wrapping a meta tensor as a FakeTensor of a mode, for a fraction of the constructor's cost.

Every traced operation and every graph input needs a fake tensor, and `FakeTensor(mode, meta,
device)` costs about 17 µs, most of it in Python: argument normalisation and some twenty
attribute stores, fifteen of them through the `SymNumberMemoDescriptor`s of its memos. The
object it builds is always the same: a `Tensor._make_subclass` of the meta tensor with the fake
device's dispatch keys, the throw-on-mutable-data-pointer flag, and an instance `__dict__` that
is a fixed function of (mode, device). `wrap_meta` builds exactly that in about 5 µs.

The template dict is taken from a FakeTensor made by the real constructor (per mode and
device), so any state a torch version adds is carried over; where the shortcut would not build
the same object (the constructor's debug mode, which records a traceback per tensor, or a meta
fake device, which it refuses), the real constructor runs.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig, FakeTensorMode

_make_subclass = torch.Tensor._make_subclass
_throw_on_mutable_data_ptr = torch._C._set_throw_on_mutable_data_ptr
_warn_on_mutable_data_ptr = torch._C._set_warn_deprecated_on_mutable_data_ptr

# Per mode: {device: instance-dict template}. Kept on the mode so that it dies with it.
_TEMPLATES = "_dynamo_rs_fake_templates"


def _template(mode: FakeTensorMode, device: torch.device) -> dict | None:
    templates = mode.__dict__.get(_TEMPLATES)
    if templates is None:
        templates = mode.__dict__[_TEMPLATES] = {}
    template = templates.get(device)
    if template is None and device not in templates:
        if FakeTensorConfig.debug or device.type == "meta":
            template = None
        else:
            sample = FakeTensor(mode, torch.empty(0, device="meta"), device)
            template = dict(vars(sample))
        templates[device] = template
    return template


def wrap_meta(mode: FakeTensorMode, meta: torch.Tensor, device: torch.device,
              requires_grad: bool | None = None) -> FakeTensor:
    """`FakeTensor(mode, meta, device)` (then `requires_grad_` when `requires_grad`), built
    from the (mode, device) template."""
    template = _template(mode, device)
    if template is None:
        fake = FakeTensor(mode, meta, device)
        if requires_grad:
            fake.requires_grad_(True)
        return fake
    fake = _make_subclass(FakeTensor, meta, meta.requires_grad if requires_grad is None else requires_grad,
                          dispatch_device=True, device_for_backend_keys=device)
    if mode._allow_unsafe_data_ptr_access:
        _warn_on_mutable_data_ptr(fake)
    else:
        _throw_on_mutable_data_ptr(fake)
    fake.__dict__.update(template)
    return fake
