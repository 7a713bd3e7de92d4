"""The metadata of every tensor a graph reads is guarded, not only the frame's arguments:
parameters and buffers keep their identity when their data is replaced in place
(`p.data = ...`, `requires_grad_`, `resize_`, `as_strided_`, `Module.half()`), and no
version counter records it. Each change below must recompile on the next call and give
eager's result; an unrelated call must not recompile. Each is tried on a parameter and on a
buffer, read directly and through a submodule, with the frame's own argument unchanged.
"""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield


class Scale(torch.nn.Module):
    """Reads its tensor in ways that work for any dtype and shape: a change of either must
    not make eager raise, only give another result."""

    def __init__(self, kind: str):
        super().__init__()
        value = torch.arange(1.0, 10.0).reshape(3, 3).clone()  # not a view of the arange
        if kind == "parameter":
            self.t = torch.nn.Parameter(value)
        else:
            self.register_buffer("t", value)

    def forward(self, x):
        t = self.t
        # Stride-dependent: flattening a transposed tensor gives another order.
        flat = t.reshape(-1)[:3].to(x.dtype)
        return x * t.sum().to(x.dtype) + flat.sum() + t.dim() + t.requires_grad + t.stride(0)


class Outer(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.inner = Scale(kind)

    def forward(self, x):
        return self.inner(x) * 2


def _data(m):
    return m.inner.t if isinstance(m, Outer) else m.t


def _set_data(m, new):
    t = _data(m)
    with torch.no_grad():
        t.data = new


def _in_place(change):
    def apply(m):
        with torch.no_grad():
            change(_data(m))

    return apply


# Replacing the data keeps the tensor object (parameters and buffers alike).
CHANGES = {
    "dtype": lambda m: _set_data(m, _data(m).data.double()),
    "shape": lambda m: _set_data(m, torch.ones(2, 5)),
    "ndim": lambda m: _set_data(m, torch.ones(9)),
    "stride": lambda m: _set_data(m, _data(m).data.t().contiguous().t()),
    "half()": lambda m: m.half(),
}
# Changing the metadata in place: buffers only (a parameter that requires grad refuses it;
# through `.data` the change is made to another tensor object, which the graph does not read).
IN_PLACE = {
    "resize_": _in_place(lambda t: t.resize_(2, 2)),
    "as_strided_": _in_place(lambda t: t.as_strided_((3,), (4,))),
    "transpose_": _in_place(lambda t: t.t_()),
    "unsqueeze_": _in_place(lambda t: t.unsqueeze_(0)),
    "set_": _in_place(lambda t: t.set_(torch.ones(4, 1))),
}


@pytest.mark.parametrize("nested", [False, True], ids=["direct", "submodule"])
@pytest.mark.parametrize(
    "change, kind",
    [(c, k) for c in CHANGES for k in ("parameter", "buffer")] + [(c, "buffer") for c in IN_PLACE],
)
def test_metadata_change_recompiles(change, kind, nested):
    make = (lambda: Outer(kind)) if nested else (lambda: Scale(kind))
    model, reference = make(), make()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    x = torch.ones(2)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), reference(x))
        torch.testing.assert_close(compiled(x), reference(x))
        assert counter.frame_count == 1, "an identical call must not recompile"
        apply = CHANGES.get(change) or IN_PLACE[change]
        apply(model)
        apply(reference)
        expected = reference(x.to(_data(reference).dtype) if change == "half()" else x)
        got = compiled(x.to(_data(model).dtype) if change == "half()" else x)
    torch.testing.assert_close(got, expected)
    assert counter.frame_count == 2


@pytest.mark.parametrize("nested", [False, True], ids=["direct", "submodule"])
def test_requires_grad_change_of_a_parameter_recompiles(nested):
    make = (lambda: Outer("parameter")) if nested else (lambda: Scale("parameter"))
    model, reference = make(), make()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), reference(x))
    _data(model).requires_grad_(False)
    _data(reference).requires_grad_(False)
    torch.testing.assert_close(compiled(x), reference(x))
    assert counter.frame_count == 2


def test_inference_mode_recompiles_and_matches_eager():
    model, reference = Scale("parameter"), Scale("parameter")
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), reference(x))
    with torch.inference_mode():
        y = torch.ones(2)
        got, expected = compiled(y), reference(y)
        assert got.is_inference() == expected.is_inference()
    torch.testing.assert_close(got, expected)
    assert counter.frame_count == 2


def test_many_parameters_unchanged_do_not_recompile():
    """The check of many reached tensors remembers their addresses (to know they are still
    distinct without comparing every pair): a model called again and again, and one whose
    parameter was replaced by another of the same metadata, keep one graph."""
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(40)])
    reference = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(40)])
    reference.load_state_dict(model.state_dict())
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(5):
            torch.testing.assert_close(compiled(x), reference(x))
        assert counter.frame_count == 1
        model[7].weight = torch.nn.Parameter(torch.ones(4, 4))
        reference[7].weight = torch.nn.Parameter(torch.ones(4, 4))
        torch.testing.assert_close(compiled(x), reference(x))
        torch.testing.assert_close(compiled(x), reference(x))
    assert counter.frame_count == 1
