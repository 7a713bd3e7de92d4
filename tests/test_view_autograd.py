"""Views and in-place operations that record autograd (fuzzer seed 773984): a view of a
tensor that does not require grad, then an in-place operation with an operand that does, on
the base or on the view. Eager autograd links the two — both now require grad, neither is a
leaf — so `requires_grad` read in the frame must follow. Fast fake
views (storage shared, no autograd link) got them wrong (the other tensor stayed a leaf not
requiring grad); with grad mode on, views are made through autograd. Compared with eager for
every kind of view the shape rules make and several in-place operations."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs

W = torch.randn(3, requires_grad=True)

VIEWS = {
    "view": lambda b: b.view(2, 3),
    "reshape": lambda b: b.reshape(-1),
    "transpose": lambda b: b.transpose(0, 1),
    "t": lambda b: b.t(),
    "permute": lambda b: b.permute(1, 0),
    "getitem row": lambda b: b[0],
    "getitem slice": lambda b: b[:, 1:],
    "select": lambda b: b.select(0, 1),
    "narrow": lambda b: b.narrow(0, 0, 1),
    "unsqueeze": lambda b: b.unsqueeze(0),
    "flatten": lambda b: b.flatten(),
    "expand": lambda b: b[:1].expand(2, 3),
    "split": lambda b: b.split(1)[0],
    "chunk": lambda b: b.chunk(2, 1)[0],
    "unbind": lambda b: b.unbind(0)[1],
    "swapaxes": lambda b: b.swapaxes(0, 1),
    "movedim": lambda b: b.movedim(0, 1),
    "diagonal": lambda b: b.diagonal(),
}

# In-place operations with an operand requiring grad, on the base (the view then follows).
ON_BASE = {
    "copy_": lambda b: b.copy_(b * W),
    "mul_": lambda b: b.mul_(W),
    "setitem": lambda b: b.__setitem__((slice(None), 0), W[0]),
}


def facts(*tensors):
    # Read in the trace: constants of the fake tensors (`is_leaf`, `grad_fn` would break the
    # graph and be read from real tensors).
    return tuple(t.requires_grad for t in tensors)


def outcome(fn, x):
    """What `fn(x)` gives, or the type of error it raises (eager raises on reading a
    multi-output view, `split`'s or `unbind`'s, after its base changed in place)."""
    try:
        return fn(x)
    except RuntimeError as err:
        return type(err)


def run(fn):
    want = outcome(fn, torch.randn(2, 3))
    dynamo_rs.reset()
    got = outcome(dynamo_rs.compile(fn, backend="eager"), torch.randn(2, 3))
    return want, got


def assert_as_eager(fn, x) -> None:
    """`fn(x)` compiled gives what it gives eagerly: a tuple of Python values and tensors."""
    want = fn(x)
    dynamo_rs.reset()
    got = dynamo_rs.compile(fn, backend="eager")(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w


# The base: a tensor the frame was given, or one it made.
BASES = {"input": lambda x: x, "made in the frame": lambda x: x.clone()}


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("op", sorted(ON_BASE))
def test_in_place_on_the_base_shows_through_the_view(view, op, base) -> None:
    make_base = BASES[base]

    def fn(x):
        base = make_base(x)
        v = VIEWS[view](base)
        ON_BASE[op](base)
        return facts(base, v), (v * 1).requires_grad

    want, got = run(fn)
    assert got == want


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_in_place_on_the_view_shows_through_the_base(view, base) -> None:
    if view in ("expand", "split", "chunk", "unbind"):
        pytest.skip("eager raises for in-place on these views (checked below)")
    make_base = BASES[base]

    def fn(x):
        base = make_base(x)
        v = VIEWS[view](base)
        v.add_(W.sum())
        return facts(base, v), (base + 1).requires_grad

    want, got = run(fn)
    assert got == want


@pytest.mark.parametrize("view", ["split", "unbind", "chunk"])
def test_in_place_on_a_multi_output_view_raises_as_eager(view) -> None:
    def fn(x):
        base = x.clone()
        v = VIEWS[view](base)
        v.mul_(W.sum())
        return v

    with pytest.raises(RuntimeError):
        fn(torch.randn(2, 3))
    dynamo_rs.reset()
    with pytest.raises(RuntimeError):
        dynamo_rs.compile(fn, backend="eager")(torch.randn(2, 3))


def test_buffer_filled_by_slices_requires_grad() -> None:
    """The everyday form: an output buffer filled slice by slice from a layer."""
    linear = torch.nn.Linear(3, 3)

    def fn(x):
        out = torch.zeros(4, 3)
        out[:2] = linear(x)
        out[2:] = x
        return out.requires_grad, out.is_leaf, out * 2

    assert_as_eager(fn, torch.randn(2, 3))


def test_views_under_no_grad_are_unchanged() -> None:
    def fn(x):
        base = x.clone()
        v = base.t()
        base.mul_(2)
        return v.requires_grad, v * 1

    with torch.no_grad():
        assert_as_eager(fn, torch.ones(2, 3))


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("view", ["view", "transpose", "getitem slice", "split", "expand"])
def test_is_view_answers_as_eager(view, grad) -> None:
    def fn(x):
        v = VIEWS[view](x.clone())
        return v._is_view(), x.clone()._is_view(), v * 2

    with torch.set_grad_enabled(grad):
        assert_as_eager(fn, torch.randn(2, 3))


def _made_under_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
    return y.is_inference(), x.is_inference(), (y + 1).requires_grad


def _viewed_under_inference_mode(x):
    with torch.inference_mode():
        y = x.view(3, 2)
    return y.is_inference(), y * 2


@pytest.mark.parametrize("fn", [_made_under_inference_mode, _viewed_under_inference_mode])
def test_is_inference_answers_as_eager(fn) -> None:
    """Inference-mode state is the same kind of autograd state: fakes are not inference
    tensors, so the real tensor answers."""
    assert_as_eager(fn, torch.randn(2, 3))


def _add_in_place(t):
    t.add_(W.sum())


def _augmented_add(t):
    t += W.sum()


def _set_item(t):
    t[0] = W.sum()


CHANGES = {"add_": _add_in_place, "+=": _augmented_add, "setitem": _set_item}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("view", ["view", "transpose", "getitem slice", "unsqueeze", "swapaxes"])
@pytest.mark.parametrize("where", ["on the base", "on the view"])
@pytest.mark.parametrize("base_made", ["in no_grad", "before no_grad"])
def test_views_made_with_grad_off_then_changed_with_grad_on(view, where, base_made, change) -> None:
    """Views made with grad mode off have no autograd link in the trace; an in-place
    operation recording autograd on their storage later breaks the graph there, and the rest
    runs on real tensors (eager raises for some of these: then both raise)."""
    def fn(x):
        base = x.clone() if base_made == "before no_grad" else None
        with torch.no_grad():
            if base is None:
                base = x.clone()
            v = VIEWS[view](base)
        CHANGES[change](base if where == "on the base" else v)
        # (Using `v` in an operation now raises in eager: "a view was created in no_grad
        # mode and its base ... modified inplace with grad mode enabled".)
        return v.requires_grad, base.requires_grad

    want, got = run(fn)
    assert got == want
