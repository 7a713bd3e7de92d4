"""Our shape rules for symbolic sizes (`dynamo_rs._symbolic_rules`) against FakeTensorMode.

Each case makes fake inputs with symbolic sizes in a fresh ShapeEnv (row-major, transposed,
sliced, and sizes derived by a strided convolution, which may be 1), runs one operation
through `_capture.run_fake` — our rule where one answers — and, with `verify_meta_rules`
on (conftest), the same call through FakeTensorMode: sizes and strides must be the same
sympy expressions, and FakeTensorMode must not need a guard the rule did not record. The
sweep also checks that the rules answer the row-major cases at all (a rule that always
declined would pass the comparison).
"""

from __future__ import annotations

import operator
import os
import random

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from dynamo_rs import _capture, _meta_rules, _rule_check, _symbolic_rules

SEEDS = pytest.mark.parametrize("seed", range(int(os.environ.get("DYNAMO_RS_META_SEEDS", "1"))))


class Symbolic:
    """A fresh ShapeEnv and fake mode marked symbolic, as a dynamic trace makes them."""

    def __init__(self) -> None:
        self.env = ShapeEnv()
        self.mode = FakeTensorMode(shape_env=self.env)
        self.mode.dynamo_rs_symbolic = True

    def fake(self, *shape, dynamic=None, dtype=torch.float32):
        """A fake of a random tensor of `shape`, the dimensions in `dynamic` (all but the
        last by default) symbolic. Call outside `under` (inside it the "real" tensor would
        itself be fake, and static)."""
        dynamic = range(len(shape) - 1) if dynamic is None else dynamic
        context = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC if d in dynamic else DimDynamic.STATIC for d in range(len(shape))])
        real = torch.randn(*shape).to(dtype) if dtype.is_floating_point else torch.randint(0, 5, shape)
        return self.mode.from_tensor(real, symbolic_context=context)

    def static(self, *shape, dtype=torch.float32):
        return self.mode.from_tensor(torch.randn(*shape).to(dtype), static_shapes=True)

    def run(self, target, *args, **kwargs):
        """The operation through `run_fake` (rule, then verified against FakeTensorMode);
        returns (result, whether a symbolic rule answered). Under no_grad, as inference
        traces run: with grad mode on, views are left to FakeTensorMode (autograd links
        them to their base; see `test_views_with_grad_mode_on_are_left_to_fake_tensor_mode`)."""
        with torch.no_grad():
            answered = _symbolic_rules.infer(self.mode, target, args, kwargs) is not None
            return _capture.run_fake(self.mode, target, args, kwargs), answered

    def under(self, fn):
        """`fn()` through FakeTensorMode itself (to make layouts: views, derived sizes)."""
        from torch._dispatch.python import enable_python_dispatcher

        with self.mode, enable_python_dispatcher():
            return fn()


def test_rules_agree_on_row_major_inputs() -> None:
    """Every rule on row-major inputs with symbolic batch and sequence sizes: answered, and
    the same as FakeTensorMode (the verification raises otherwise)."""
    s = Symbolic()
    x = s.fake(3, 5, 8)
    w, b = s.static(6, 8), s.static(6)
    cases = [
        (F.relu, (x,), {}), (torch.tanh, (x,), {}), ("neg", (x,), {}), (F.gelu, (x,), {}),
        (F.dropout, (x,), {"p": 0.1, "training": False}), (operator.add, (x, x), {}),
        (operator.mul, (x, 2.0), {}), (operator.truediv, (x, s.static(8)), {}),
        (F.layer_norm, (x, (8,), s.static(8), s.static(8)), {}), (F.softmax, (x, -1), {}),
        (F.linear, (x, w, b), {}), ("view", (x, x.shape[0], x.shape[1], 2, 4), {}),
        ("view", (x, -1, 8), {}), ("reshape", (x, x.shape[0], -1), {}), ("transpose", (x, 0, 1), {}),
        ("permute", (x, 2, 0, 1), {}), ("contiguous", (x,), {}), ("split", (x, 3, 2), {}),
        (operator.pow, (x, 2.0), {}), ("unsqueeze", (x, 1), {}), (torch.cat, ([x, x], 1), {}),
        (operator.getitem, (x, (Ellipsis, slice(None, 4))), {}), ("float", (x,), {}),
        ("to", (x, torch.float64), {}), ("mean", (x, -1), {"keepdim": True}),
        (F.embedding, (s.fake(3, 5, dynamic=(0, 1), dtype=torch.int64), s.static(10, 8)), {}),
        (torch.addmm, (b, s.fake(7, 8), s.static(8, 6)), {}),
    ]
    for target, args, kwargs in cases:
        _, answered = s.run(target, *args, **kwargs)
        assert answered, target
    assert not _rule_check.mismatches


def test_views_with_grad_mode_on_are_left_to_fake_tensor_mode() -> None:
    """A view made by a rule shares storage but is no autograd view of its base; with grad
    mode on an in-place operation could link them later, so FakeTensorMode (through
    autograd) makes it. Results that are not views are still answered."""
    s = Symbolic()
    x = s.fake(3, 5, 8)
    assert torch.is_grad_enabled()
    for target, args in [("view", (x, -1, 8)), ("transpose", (x, 0, 1)), ("split", (x, 3, 2)),
                         (operator.getitem, (x, (Ellipsis, slice(None, 4))))]:
        assert _symbolic_rules.infer(s.mode, target, args, {}) is None, target
        result = _capture.run_fake(s.mode, target, args, {})
        assert all(r._is_view() for r in (result if isinstance(result, tuple) else (result,))), target
    assert _symbolic_rules.infer(s.mode, torch.tanh, (x,), {}) is not None


def test_images_through_convolutions() -> None:
    """A resnet stem and block with a symbolic batch and image size: the strided
    convolution's output size may be 1, so the first batch norm after it records that it is
    not (as torch's own decomposition does), and everything after is answered by rules."""
    s = Symbolic()
    x = s.fake(2, 3, 32, 32, dynamic=(0, 2, 3))
    conv1, conv2 = s.static(8, 3, 7, 7), s.static(8, 8, 3, 3)
    stats = [s.static(8) for _ in range(4)]
    y, answered = s.run(F.conv2d, x, conv1, None, 2, 3)
    assert answered
    guards = len(s.env.guards)
    y, answered = s.run(F.batch_norm, y, *stats[:2], *stats[2:], False)
    assert answered and len(s.env.guards) > guards  # `Ne(size, 1)` recorded by the rule
    y, _ = s.run(F.relu, y, inplace=True)
    y, answered = s.run(F.max_pool2d, y, 3, 2, 1)
    assert answered
    z, _ = s.run(F.conv2d, y, conv2, None, 1, 1)
    z, _ = s.run(F.batch_norm, z, *stats[:2], *stats[2:], False)
    z, answered = s.run(operator.iadd, z, y)
    assert answered
    pooled, answered = s.run(F.adaptive_avg_pool2d, z, 1)
    assert answered
    flat, answered = s.run("flatten", pooled, 1)
    assert answered
    assert not _rule_check.mismatches


def test_attention_layouts() -> None:
    """GPT-2's and Llama's layouts: heads split out of a slice of a fused projection,
    transposed, halves of the head dimension rotated, an empty cache concatenated."""
    s = Symbolic()
    qkv = s.fake(2, 6, 48)
    q, k, v = s.run("split", qkv, 16, 2)[0]
    heads, answered = s.run("view", q, q.shape[0], q.shape[1], 4, 4)
    assert answered
    heads, _ = s.run("transpose", heads, 1, 2)
    first, answered = s.run(operator.getitem, heads, (Ellipsis, slice(None, 2)))
    second, _ = s.run(operator.getitem, heads, (Ellipsis, slice(2, None)))
    assert answered
    rotated, answered = s.run(torch.cat, [s.run("neg", second)[0], first], -1)
    assert answered
    cos = s.under(lambda: torch.empty(1, 1, heads.shape[2], 4))
    mixed, _ = s.run(operator.mul, heads, cos)  # transposed heads: FakeTensorMode's
    summed, answered = s.run(operator.add, mixed, rotated)
    cache = s.static(0)
    s.run(torch.cat, [cache, summed], -2)
    merged, _ = s.run("transpose", summed, 1, 2)
    s.run("reshape", merged, merged.shape[0], merged.shape[1], -1)
    assert not _rule_check.mismatches


UNARY = [F.relu, torch.tanh, torch.sigmoid, "neg", torch.exp, F.silu]
BINARY = [operator.add, operator.sub, operator.mul, operator.truediv]


def _layout(s: Symbolic, rng: random.Random, shape, dynamic):
    """A fake of `shape` (symbolic in `dynamic`) row-major, transposed or sliced."""
    kind = rng.choice(["row-major", "row-major", "transposed", "sliced"])
    if kind == "transposed" and len(shape) > 1:
        a, b = rng.sample(range(len(shape)), 2)
        swapped = list(shape)
        swapped[a], swapped[b] = swapped[b], swapped[a]
        moved = [b if d == a else a if d == b else d for d in dynamic]
        base = s.fake(*swapped, dynamic=moved)  # outside the mode: `fake` makes a real tensor
        return s.under(lambda: base.transpose(a, b))
    if kind == "sliced":
        wide = list(shape)
        wide[-1] *= 2
        base = s.fake(*wide, dynamic=dynamic)
        return s.under(lambda: base[..., :shape[-1]])
    return s.fake(*shape, dynamic=dynamic)


@SEEDS
def test_random_elementwise_and_views(seed) -> None:
    """Random layouts (row-major, transposed, sliced) and broadcasts through the elementwise
    and view rules; every answer verified against FakeTensorMode."""
    rng = random.Random(7000 + seed)
    answered_any = 0
    for _ in range(60):
        s = Symbolic()
        ndim = rng.randint(1, 4)
        shape = [rng.randint(2, 5) for _ in range(ndim)]
        dynamic = [d for d in range(ndim) if rng.random() < 0.6]
        x = _layout(s, rng, shape, dynamic)
        choice = rng.random()
        if choice < 0.3:
            answered_any += s.run(rng.choice(UNARY), x)[1]
        elif choice < 0.7:
            if rng.random() < 0.5:
                other = rng.choice([2.0, 3, -1.5])
            else:
                other = s.under(lambda: torch.empty([1 if rng.random() < 0.4 else x.shape[d]
                                                     for d in range(rng.randint(0, ndim) and ndim)] or [1]))
            answered_any += s.run(rng.choice(BINARY), x, other)[1]
        elif choice < 0.85:
            d0, d1 = rng.randrange(ndim), rng.randrange(ndim)
            answered_any += s.run("transpose", x, d0, d1)[1]
        else:
            answered_any += s.run("reshape", x, -1)[1]
    assert answered_any > 10
    assert not _rule_check.mismatches


def test_transposed_and_permuted_symbolic_operands() -> None:
    """Elementwise operations over transposed symbolic layouts: torch orders the dimensions
    by stride with comparisons that may record guards (`Ne(s1, 5)`). The rules take the same
    steps and answer only where the ShapeEnv settles every comparison without a guard (an
    earlier mirror of that ordering answered by structure instead, missed guards and crashed
    comparing `1` with `s1`); every answer is verified against FakeTensorMode."""
    s = Symbolic()
    base = s.fake(4, 5, dynamic=(0, 1))
    x = s.under(lambda: base.transpose(0, 1))
    cube = s.fake(3, 4, 5, dynamic=(0, 1, 2))
    y = s.under(lambda: cube.permute(2, 0, 1))
    answered = 0
    for target, args in ((torch.relu, (x,)), (torch.sigmoid, (x,)), (operator.add, (x, x)),
                         (torch.tanh, (y,)), (operator.mul, (y, 2.0)), (operator.add, (y, y))):
        answered += s.run(target, *args)[1]
    assert answered == 6
    assert not _rule_check.mismatches


@SEEDS
def test_mixed_static_and_symbolic_strides_are_decided_or_left_to_torch(seed) -> None:
    """A transposed operand with a static stride next to a symbolic one (`5` against `s1`):
    whether `s1 < 5` is not known, so torch would record a guard; the rules must either
    record nothing and agree with FakeTensorMode, or decline. Over many mixed layouts, every
    answer is verified (sizes, strides and recorded guards)."""
    rng = random.Random(99 + seed)
    answered = 0
    for _ in range(80):
        s = Symbolic()
        ndim = rng.randint(2, 4)
        shape = [rng.randint(2, 7) for _ in range(ndim)]
        dynamic = [d for d in range(ndim) if rng.random() < 0.5]
        x = _layout(s, rng, shape, dynamic)
        y = _layout(s, rng, shape, dynamic)
        a, b = rng.sample(range(ndim), 2)
        keep = [d for d in range(ndim) if rng.random() < 0.5]
        # Operands over the same symbols as `x`, in other layouts and broadcast shapes.
        related = s.under(lambda: [x, x.contiguous(), x.transpose(a, b).contiguous().transpose(a, b),
                                   x.sum(keep, keepdim=True) if keep else x, x.sum(0), x[..., :1]])
        z = rng.choice(related)
        for target, args in ((operator.add, (x, y)), (operator.mul, (x, 2.0)), (torch.exp, (x,)),
                             (operator.sub, (y, x)), (operator.mul, (x, z)), (operator.add, (z, x)),
                             (operator.truediv, (z, 3.0)), ("neg", (z,))):
            answered += s.run(target, *args)[1]
    assert answered > 200
    assert not _rule_check.mismatches


def test_a_size_that_is_not_known_to_be_other_than_one_is_left_to_torch() -> None:
    """Right after a strided convolution nothing is known of its output size: elementwise
    rules (whose answer would differ for a size of 1) leave it to FakeTensorMode."""
    s = Symbolic()
    x = s.fake(2, 3, 16, 16, dynamic=(0, 2, 3))
    y = s.under(lambda: F.conv2d(x, torch.empty(4, 3, 3, 3), stride=2))
    assert _symbolic_rules.infer(s.mode, F.relu, (y,), {}) is None
    assert _symbolic_rules.infer(s.mode, "view", (y, -1), {}) is None


def test_size_one_dimensions_added_or_dropped() -> None:
    """Reshapes of a row-major tensor that only add or drop size-1 dimensions — timm's
    Sequencer blocks, `(h, w, c) -> (1, h, w, -1)` and `(1, h, w, c) -> (-1, w, c)` with the
    sizes handed over as ints: answered by the rule, row-major, verified against
    FakeTensorMode (which takes 10-100 ms over each through its reshape algorithm)."""
    s = Symbolic()
    x = s.fake(5, 6, 7, dynamic=[0, 1, 2])
    h, w = x.shape[0], x.shape[1]
    for shape in [(1, h, w, -1), (h, 1, w, -1), (h, w, -1, 1), (1, h, 1, w, -1)]:
        y, answered = s.run("reshape", x, *shape)
        assert answered, shape
        back, answered = s.run("reshape", y, -1, w, y.shape[-1] if shape[-1] == -1 else y.shape[-2])
        assert answered, shape
    batch = s.fake(1, 5, 6, 8, dynamic=[1, 2])
    flat, answered = s.run("reshape", batch, -1, batch.shape[2], 8)
    assert answered
    # Not only size-1 changes: left to the general rules or FakeTensorMode, still right.
    s.run("reshape", x, 1, -1, x.shape[2])
    # Other layouts: transposed (Sequencer's column LSTM), sliced, a size-1 dimension kept.
    for layout in [s.under(lambda: s.fake(6, 5, 7, dynamic=[0, 1, 2]).transpose(0, 1)),
                   s.under(lambda: s.fake(5, 6, 14, dynamic=[0, 1])[..., :7]),
                   s.under(lambda: s.fake(5, 1, 7, dynamic=[0]).expand(5, 1, 7))]:
        h, w = layout.shape[0], layout.shape[1]
        for shape in [(1, h, w, -1), (h, 1, w, -1), (h, w, -1, 1), (1, 1, h, w, layout.shape[2])]:
            _, answered = s.run("reshape", layout, *shape)
            assert answered, (layout.shape, layout.stride(), shape)
    assert not _rule_check.mismatches


def test_sizes_torch_reshapes_with_guards_of_its_own_are_left_to_it() -> None:
    """Families met in timm and torchvision under `dynamic=True`, where torch's view or
    reshape divides sizes (tokens back into an image), pads to a window multiple (`Mod`),
    pads "same" (`Max`) or takes a square root of a size: the rules decline or agree, and
    FakeTensorMode records nothing the rule did not (the verification raises otherwise)."""
    s = Symbolic()
    image = s.fake(1, 8, 16, 16, dynamic=(2, 3))
    features = s.under(lambda: F.conv2d(image, torch.empty(8, 8, 3, 3), stride=2, padding=1))
    h, w = features.shape[2], features.shape[3]
    tokens = s.under(lambda: features.flatten(2).transpose(1, 2))          # (1, h*w, 8)
    s.run("reshape", tokens, 1, h, w, 8)                                  # tokens -> image
    s.run("view", s.under(lambda: tokens.contiguous()), 1, h, w, 8)
    windowed = s.under(lambda: F.pad(features, (0, (7 - w % 7) % 7, 0, (7 - h % 7) % 7)))
    hp, wp = windowed.shape[2], windowed.shape[3]
    assert not _symbolic_rules._tame(hp)
    s.run("view", windowed, 1, 8, hp // 7, 7, wp // 7, 7)
    s.run(F.relu, windowed)
    same = s.under(lambda: F.pad(image, (0, max(0, 2 - image.shape[3] % 2), 0, max(0, 2 - image.shape[2] % 2))))
    stats = [s.static(8) for _ in range(4)]
    s.run(F.batch_norm, same, *stats[:2], *stats[2:], False)
    side = s.under(lambda: torch.sym_int(torch.sym_sqrt(tokens.shape[1])))
    s.run("reshape", s.under(lambda: tokens.contiguous()), 1, side, side, 8)
    assert not _rule_check.mismatches


def test_a_square_split_into_its_sides_is_left_to_torch() -> None:
    """`(1, s*s, c) -> (1, s, s, c)` with `s` a symbol (DaViT's window size passed as an
    int): torch's view divides (`(s**2)//s`), so the rule declines; `(b*t, c) -> (b, t, c)`
    (GPT-2's Conv1D) divides exactly and is answered."""
    s = Symbolic()
    side = s.fake(5, 3, dynamic=(0,)).shape[0]
    square = s.under(lambda: torch.empty(1, side * side, 4))
    assert _symbolic_rules.infer(s.mode, "view", (square, 1, side, side, 4), {}) is None
    s.run("view", square, 1, side, side, 4)
    x = s.fake(3, 5, 8, dynamic=(0, 1))
    flat = s.under(lambda: torch.empty(x.shape[0] * x.shape[1], 8))
    _, answered = s.run("view", flat, x.shape[0], x.shape[1], 8)
    assert answered
    assert not _rule_check.mismatches


def test_channels_last_results_over_derived_sizes() -> None:
    """A channels-last activation whose sizes are divisions of symbols (a strided stem's
    output, as in ConvNeXt) through elementwise operations: torch lays some results out with
    `Max(1, size)` and keeps `size` in others, so the rules must agree with each (or
    decline); found by a dynamic=True zoo sweep (`gelu` in timm's convnext_atto)."""
    s = Symbolic()
    base = s.fake(1, 8, 12, 12, dynamic=(2, 3))
    shape = s.under(lambda: base[:, :, ::4, ::4].shape)
    x = s.under(lambda: torch.empty(shape, memory_format=torch.channels_last))
    y = s.under(lambda: torch.empty_permuted(shape, (0, 2, 3, 1)))
    for t in (x, y):
        for target, args in ((F.gelu, (t,)), ("neg", (t,)), (torch.exp, (t,)), (F.relu, (t,)),
                             (operator.mul, (t, 2.0)), (operator.add, (t, t)), (operator.add, (t, x))):
            s.run(target, *args)
    assert not _rule_check.mismatches


def test_permuted_images_and_batch_of_one() -> None:
    """ConvNeXt's and Sequencer's layouts with a batch of 1 and symbolic image sizes: a
    layer norm and linear layers over an NCHW image permuted to channels-last (torch
    normalises a row-major copy), linear layers over 4-d and 5-d row-major activations, and
    reshapes that fold the batch of 1 into a permuted row (the size-1 dimension's stride
    does not matter) — answered by rules and equal to FakeTensorMode; reshapes that must copy
    are left to it."""
    s = Symbolic()
    image = s.fake(1, 16, 6, 5, dynamic=(2, 3))
    rows = s.fake(1, 6, 5, 16, dynamic=(1, 2))
    w, b = s.static(24, 16), s.static(24)
    nhwc = s.under(lambda: image.permute(0, 2, 3, 1))
    by_rows = s.under(lambda: image.permute(0, 2, 1, 3))     # (1, h, 16, w)
    by_columns = s.under(lambda: rows.permute(0, 2, 1, 3))   # (1, w, h, 16)
    h, w_ = nhwc.shape[1], nhwc.shape[2]
    answered = [
        (F.layer_norm, (nhwc, (16,), s.static(16), s.static(16), 1e-6)),
        (F.linear, (rows, w, b)),
        (F.linear, (s.fake(2, 6, 5, 16, dynamic=(0, 1, 2)), w, b)),
        (F.linear, (s.fake(1, 2, 6, 5, 16, dynamic=(2, 3)), w, b)),
        ("reshape", (by_rows, -1, 16, by_rows.shape[3])),
        ("reshape", (by_rows, by_rows.shape[1], 16, by_rows.shape[3])),
        ("reshape", (by_columns, -1, by_columns.shape[2], 16)),
        ("view", (by_columns, by_columns.shape[1], by_columns.shape[2], 16)),
    ]
    for target, args in answered:
        _, ok = s.run(target, *args)
        assert ok, (target, [getattr(a, "shape", a) for a in args])
    for target, args in [("reshape", (by_rows, by_rows.shape[1], -1)), ("reshape", (nhwc, -1, w_)),
                         (F.linear, (nhwc, w, b)), (F.layer_norm, (nhwc, (h, w_, 16)))]:
        s.run(target, *args)
    assert not _rule_check.mismatches


def _expr(n):
    return n.node.expr if isinstance(n, torch.SymInt) else n


def _int_symbol(s: Symbolic, value: int, name: str):
    """A symbolic int argument as automatic dynamic makes one: any int, no range."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    return s.env.create_unspecified_symint_and_symbol(value, ConstantSource(name), DimDynamic.DYNAMIC)


def test_interpolate_to_symbolic_sizes() -> None:
    """`F.interpolate` to sizes that are SymInts (Mask R-CNN's `paste_mask_in_image` resizes
    each detected mask to `max(int(box width), 1)`), by integer scale factors of symbolic
    sizes, from static inputs of every layout (an expanded mask, channels-last, one channel)
    and row-major symbolic ones: answered by the rule, with the guard torch's decomposition
    records that a `Max(1, w)` size is not 1 — verified against FakeTensorMode, which may
    record no guard the rule did not."""
    s = Symbolic()
    h, w = _int_symbol(s, 21, "h"), _int_symbol(s, 9, "w")
    mh, mw = torch.sym_max(h, 1), torch.sym_max(w, 1)
    mask = s.static(1, 28, 28)
    expanded = s.under(lambda: mask.expand((1, 1, -1, -1)))
    channels_last = s.under(lambda: torch.empty(2, 3, 10, 12, memory_format=torch.channels_last))
    one_channel = s.static(2, 1, 10, 12)
    image = s.fake(2, 3, 10, 12, dynamic=(0, 2, 3))
    answered = []
    for x in (expanded, channels_last, one_channel):
        for mode, corners in (("bilinear", False), ("bilinear", True), ("nearest", None)):
            for size in ((mh, mw), (mh, 3)) + ((mh, 1),) * (x is not channels_last):
                result, by_rule = s.run(F.interpolate, x, size=size, mode=mode, align_corners=corners)
                assert [_expr(n) for n in result.shape[2:]] == [_expr(n) for n in size]
                answered.append((by_rule, mode, corners, size, x.shape, x.stride()))
    for mode in ("bilinear", "nearest"):
        for kwargs in ({"size": (2 * image.shape[2], image.shape[3])}, {"scale_factor": 2},
                       {"scale_factor": (2.0, 3)}):
            _, by_rule = s.run(F.interpolate, image, mode=mode, **kwargs)
            answered.append((by_rule, mode, kwargs))
    assert all(a[0] for a in answered), [a for a in answered if not a[0]]
    assert not _rule_check.mismatches


def test_interpolate_cases_left_to_torch() -> None:
    """Resizes the rule does not describe go to FakeTensorMode: a fractional scale factor
    (`floor` of a symbolic product), antialiasing, other modes, a channels-last result with
    a size-1 dimension, and sizes that may be 0 or negative (an int argument as it is)."""
    s = Symbolic()
    h = _int_symbol(s, 7, "h")
    image = s.fake(2, 3, 10, 12, dynamic=(0, 2, 3))
    channels_last = s.under(lambda: torch.empty(2, 3, 10, 12, memory_format=torch.channels_last))
    cases = [
        (image, {"scale_factor": 1.5, "mode": "bilinear"}),
        (channels_last, {"size": (torch.sym_max(h, 1), 5), "mode": "bilinear", "antialias": True}),
        (channels_last, {"size": (torch.sym_max(h, 1), 5), "mode": "bicubic"}),
        (channels_last, {"size": (torch.sym_max(h, 1), 1), "mode": "nearest"}),
        (channels_last, {"size": (h - 10, 5), "mode": "nearest"}),
        (channels_last, {"size": (h, 5), "mode": "nearest"}),
    ]
    for x, kwargs in cases:
        assert _symbolic_rules.infer(s.mode, F.interpolate, (x,), kwargs) is None, kwargs


def test_verification_flags_a_rule_that_leaves_out_a_guard(monkeypatch) -> None:
    """The verification judges FakeTensorMode's guards by what the ShapeEnv knew before it
    ran (each new guard would otherwise imply itself): a rule that gives the right sizes but
    leaves out the guard torch records is reported."""
    s = Symbolic()
    h, w = _int_symbol(s, 21, "h"), _int_symbol(s, 9, "w")
    size = (torch.sym_max(h, 1), torch.sym_max(w, 1))
    static = s.static(1, 28, 28)
    mask = s.under(lambda: static.expand((1, 1, -1, -1)))

    def forgetful(mode, args, kwargs):
        out = (1, 1, *size)
        return _meta_rules._new(mode, args[0], out, _symbolic_rules._row_major(out))

    monkeypatch.setitem(_symbolic_rules.RULES, F.interpolate, forgetful)
    monkeypatch.setattr(_rule_check, "mismatches", [])
    with pytest.raises(AssertionError, match="recorded guards the rule did not"):
        s.run(F.interpolate, mask, size=size, mode="bilinear", align_corners=False)


def _equalities(s: Symbolic) -> set:
    """The symbols the ShapeEnv has replaced (by another symbol or a number)."""
    return set(s.env.replacements)


@SEEDS
def test_sizes_of_separate_symbols_with_equal_values_are_unified_as_torch_does(seed) -> None:
    """A frame compiled again with automatic dynamic shapes gets a symbol per size of each
    input (as under TorchDynamo): two tensors of equal sizes have different symbols, and the
    first operation relating them records their equality (`Eq(s5, s36)`) through
    FakeTensorMode, 10–50 ms each. The rules record that same equality and answer:
    elementwise operations over every layout (and broadcast 1s), `cat`, `layer_norm` and
    `conv2d` over a symbolic channel count (specialised), `linear` with a symbolic or summed
    in-features.
    Verified against FakeTensorMode (sizes, strides, and no guard the rule did not record)."""
    rng = random.Random(7 + seed)
    answered = total = 0
    for _ in range(40):
        s = Symbolic()
        ndim = rng.randint(1, 4)
        shape = [rng.randint(2, 7) for _ in range(ndim)]
        everything = range(ndim)
        x = _layout(s, rng, shape, everything)
        other = list(shape)
        if ndim > 1 and rng.random() < 0.3:
            other[rng.randrange(ndim)] = 1  # a static 1 broadcasts
        y = _layout(s, rng, other, [d for d in everything if other[d] != 1])
        for target, args in ((operator.add, (x, y)), (operator.mul, (y, x)), (operator.sub, (x, y))):
            total += 1
            answered += s.run(target, *args)[1]
        assert not _rule_check.mismatches
    assert answered >= total * 3 // 4, (answered, total)

    s = Symbolic()
    a, b = s.fake(2, 6, 5, 8, dynamic=(1, 2, 3)), s.fake(2, 6, 5, 4, dynamic=(1, 2, 3))
    out, answered = s.run(torch.cat, [a, b], -1)
    assert answered and out.shape[1] is not None and not _rule_check.mismatches
    assert len(_equalities(s)) == 2  # the sizes at 1 and 2 made one

    # Joined with a permuted half (Sequencer: a vertical and a horizontal RNN's outputs):
    # torch's channels-last test on the symbolic strides, settled without guards.
    s = Symbolic()
    a = s.fake(1, 6, 5, 8, dynamic=(1, 2, 3))
    base = s.fake(1, 5, 6, 4, dynamic=(1, 2, 3))
    b = s.under(lambda: base.permute(0, 2, 1, 3))
    out, answered = s.run(torch.cat, [a, b], -1)
    assert answered and not _rule_check.mismatches

    s = Symbolic()
    x = s.fake(2, 5, 384, dynamic=(0, 1, 2))
    out, answered = s.run(F.layer_norm, x, [384], s.static(384), s.static(384))
    assert answered and out.shape[-1] == 384 and not _rule_check.mismatches

    s = Symbolic()
    image = s.fake(2, 6, 5, 5, dynamic=(0, 1, 2, 3))  # channels symbolic, as the weight's
    out, answered = s.run(F.conv2d, image, s.static(4, 6, 1, 1), s.static(4))
    assert answered and not _rule_check.mismatches

    s = Symbolic()
    left, right = s.fake(3, 10, dynamic=(0, 1)), s.fake(3, 6, dynamic=(0, 1))
    joined = s.under(lambda: torch.cat([left, right], -1))  # in-features s1 + s3
    weight = s.static(7, 16)
    out, answered = s.run(F.linear, joined, weight)
    assert answered and not _rule_check.mismatches


def test_views_to_int_arguments_of_the_same_values_unify_them() -> None:
    """A resume function gets `B, H, W` (taken from a tensor's shape before the break) as
    int arguments of their own symbols, and tensors whose sizes are other symbols:
    `v.reshape(B, W, H, -1)` and `x.reshape(-1, H, C)` pair each given size with the input
    size at its place, as torch's view does, recording the equalities it records; pairs
    whose values differ, or a size torch would split or merge, are left alone."""
    s = Symbolic()
    v = s.fake(6, 4, 10, dynamic=(0, 1, 2))
    w, h = _int_symbol(s, 6, "w"), _int_symbol(s, 4, "h")
    out, answered = s.run("reshape", v, 1, w, h, -1)
    assert answered and not _rule_check.mismatches
    assert out.shape[0] == 1 and out.shape[-1] is not None

    s = Symbolic()
    base = s.fake(1, 4, 6, 10, dynamic=(1, 2, 3))
    x = s.under(lambda: base.permute(0, 2, 1, 3))  # (1, W, H, C), not row-major
    h, c = _int_symbol(s, 4, "h"), _int_symbol(s, 10, "c")
    out, answered = s.run("reshape", x, -1, h, c)
    assert not _rule_check.mismatches

    s = Symbolic()
    x = s.fake(1, 6, 4, 10, dynamic=(1, 2, 3))
    h, c = _int_symbol(s, 4, "h"), _int_symbol(s, 10, "c")
    out, answered = s.run("reshape", x, -1, h, c)
    assert answered and not _rule_check.mismatches

    # Values that do not pair up: nothing recorded by the rule, FakeTensorMode answers.
    s = Symbolic()
    v = s.fake(6, 4, 10, dynamic=(0, 1, 2))
    a, b = _int_symbol(s, 3, "a"), _int_symbol(s, 8, "b")
    assert _symbolic_rules.infer(s.mode, "reshape", (v, a, b, -1), {}) is None
    assert not s.env.guards
    # A merge of two symbolic sizes into one int argument: torch's walk merges them, it does
    # not compare pairs.
    s = Symbolic()
    v = s.fake(6, 4, 10, dynamic=(0, 1, 2))
    n = _int_symbol(s, 24, "n")
    _symbolic_rules.infer(s.mode, "reshape", (v, n, -1), {})
    assert not s.env.replacements


def test_unification_needs_equal_values_and_a_size_not_one() -> None:
    """Sizes of different values are not unified (the operation would fail in eager: left to
    FakeTensorMode to report); right after a strided convolution (a size that may be 1)
    against an int argument, nothing is known to exclude broadcasting: left to torch."""
    s = Symbolic()
    x, y = s.fake(4, 5, dynamic=(0, 1)), s.fake(4, 6, dynamic=(0, 1))
    assert _symbolic_rules.infer(s.mode, operator.add, (x, y), {}) is None
    assert not s.env.guards
    s = Symbolic()
    img = s.fake(1, 3, 16, 16, dynamic=(2, 3))
    y = s.under(lambda: F.conv2d(img, torch.empty(4, 3, 3, 3), stride=2))
    n = _int_symbol(s, 7, "n")
    guards = len(s.env.guards)
    assert _symbolic_rules.infer(s.mode, "reshape", (y, 1, 4, n, -1), {}) is None
    assert len(s.env.guards) == guards


@SEEDS
def test_cat_of_permuted_symbolic_images(seed) -> None:
    """`cat` lays its result out by whether its inputs suggest channels-last; on symbolic
    strides the rule asks torch's own test with every comparison settled by what the
    ShapeEnv knows (else declines). Random permutations of 4-d symbolic tensors, joined
    along random dimensions, each answer verified against FakeTensorMode."""
    import itertools

    rng = random.Random(31 + seed)
    orders = list(itertools.permutations(range(4)))
    answered = 0
    for _ in range(30):
        s = Symbolic()
        sizes = [1 if rng.random() < 0.2 else rng.randint(2, 6) for _ in range(4)]
        dim = rng.randrange(4)
        parts = []
        for _ in range(2):
            order = rng.choice(orders)
            base = s.fake(*[sizes[d] for d in order], dynamic=[i for i, d in enumerate(order) if sizes[d] != 1])
            inverse = [order.index(d) for d in range(4)]
            parts.append(s.under(lambda base=base, inverse=inverse: base.permute(*inverse)))
        answered += s.run(torch.cat, parts, dim)[1]
        assert not _rule_check.mismatches
    assert answered > 0


def test_attention_masks_over_a_symbolic_length() -> None:
    """The masks transformers build for a symbolic sequence length: positions indexed with
    None into broadcastable shapes, compared (`kv_idx <= q_idx`), and-ed with a padding
    mask of its own symbols, compared with numbers and a 0-d tensor — answered by the rules
    (a bool result broadcast by structure, or by the equality torch records), each verified
    against FakeTensorMode."""
    s = Symbolic()
    ids = s.fake(7, dynamic=(0,), dtype=torch.int64)
    q, answered = s.run(operator.getitem, ids, (None, None, slice(None), None))
    assert answered and tuple(q.shape)[:2] == (1, 1)
    kv, answered = s.run(operator.getitem, ids, (None, None, None, slice(None)))
    assert answered
    causal, answered = s.run(operator.le, kv, q)
    assert answered and causal.dtype == torch.bool
    padding = s.fake(2, 7, dynamic=(1,), dtype=torch.int64)
    wide, answered = s.run(operator.getitem, padding, (slice(None), None, None, slice(None)))
    assert answered
    flags, answered = s.run(operator.ne, wide, 0)
    assert answered
    both, answered = s.run(operator.and_, causal, flags)
    assert answered and both.dim() == 4
    _, answered = s.run(torch.eq, ids, ids)
    assert answered
    scalar = s.under(lambda: torch.tensor(True))
    _, answered = s.run(operator.and_, scalar, both)
    assert not _rule_check.mismatches
    # Mixed dtypes (a conversion) and a layout that is not row-major: left to torch.
    floats = s.fake(7, dynamic=(0,))
    assert _symbolic_rules.infer(s.mode, operator.lt, (ids, floats), {}) is None
    base = s.fake(7, 5, dynamic=(0,))
    transposed = s.under(lambda: base.t())
    assert _symbolic_rules.infer(s.mode, operator.gt, (transposed, 0.5), {}) is None
    assert not _rule_check.mismatches


def test_indexing_with_new_dimensions_over_symbolic_layouts() -> None:
    """`x[None]`, `x[:, None]`, `x[..., None]`, `x[None, :, 1:3]` on row-major, transposed
    and sliced symbolic tensors: a view whose new dimensions get `unsqueeze`'s strides,
    verified against FakeTensorMode."""
    rng = random.Random(5)
    answered = 0
    for _ in range(20):
        s = Symbolic()
        x = _layout(s, rng, [rng.randint(4, 7) for _ in range(3)], (0, 1))
        for index in ((None,), (slice(None), None), (Ellipsis, None), (None, slice(None), None),
                      (None, Ellipsis, slice(1, 3)), (slice(None), None, slice(None), None)):
            answered += s.run(operator.getitem, x, index)[1]
        assert not _rule_check.mismatches
    assert answered > 60


def test_masked_attention_over_a_symbolic_length() -> None:
    """`scaled_dot_product_attention` with a bool or additive mask broadcasting to
    (B, H, L, S) and a row-major query: a row-major result (both CPU paths agree), verified
    against FakeTensorMode; a transposed query with a 4-d mask is left to it."""
    for dtype in (torch.bool, torch.float32):
        s = Symbolic()
        q, k, v = (s.fake(2, 4, 7, 16, dynamic=(2,)) for _ in range(3))
        k = s.under(lambda k=k: k.view(2, 4, -1, 16))
        mask = s.fake(2, 1, 7, 7, dynamic=(2, 3), dtype=torch.float32 if dtype.is_floating_point else torch.int64)
        if dtype is torch.bool:
            mask = s.under(lambda mask=mask: mask != 0)
        out, answered = s.run(F.scaled_dot_product_attention, q, k, v, attn_mask=mask)
        assert answered and not _rule_check.mismatches
    s = Symbolic()
    base = s.fake(2, 7, 4, 16, dynamic=(1,))
    q = s.under(lambda: base.transpose(1, 2))
    k, v = s.fake(2, 4, 7, 16, dynamic=(2,)), s.fake(2, 4, 7, 16, dynamic=(2,))
    mask = s.fake(2, 1, 7, 7, dynamic=(2, 3), dtype=torch.int64)
    mask = s.under(lambda: mask != 0)
    assert _symbolic_rules.infer(s.mode, F.scaled_dot_product_attention, (q, k, v), {"attn_mask": mask}) is None


def test_indexing_every_dimension_by_position_grids() -> None:
    """`mask[batch_idx, kv_idx]` with integer index tensors broadcasting to a 4-d grid over
    a symbolic length (transformers' padding mask): a fresh row-major result of the grid's
    shape, verified against FakeTensorMode; a bool index (a mask) is left to it."""
    s = Symbolic()
    mask = s.fake(2, 7, dynamic=(1,), dtype=torch.int64)
    batch = s.under(lambda: torch.arange(2)[:, None, None, None])
    positions = s.fake(7, dynamic=(0,), dtype=torch.int64)
    kv = s.under(lambda: positions[None, None, None, :])
    out, answered = s.run(operator.getitem, mask, (batch, kv))
    assert answered and out.dim() == 4 and not _rule_check.mismatches
    flags = s.under(lambda: mask != 0)
    assert _symbolic_rules.infer(s.mode, operator.getitem, (mask, (flags,)), {}) is None


@SEEDS
def test_expand_over_symbolic_layouts(seed) -> None:
    """`x.expand(...)` of symbolic tensors in every layout: size-1 dimensions widened (to
    static and symbolic sizes), new leading dimensions (of 1 and more), -1 kept, a size
    given again as another symbol of its value — verified against FakeTensorMode."""
    rng = random.Random(11 + seed)
    answered = 0
    for _ in range(40):
        s = Symbolic()
        ndim = rng.randint(1, 3)
        shape = [1 if rng.random() < 0.4 else rng.randint(2, 6) for _ in range(ndim)]
        x = _layout(s, rng, shape, [d for d in range(ndim) if shape[d] != 1])
        other = s.fake(*[rng.randint(2, 6) for _ in range(ndim)], dynamic=range(ndim))
        target = []
        for d, n in enumerate(shape):
            if n == 1:
                target.append(rng.choice([1, 3, other.shape[d], -1]))
            else:
                target.append(rng.choice([-1, x.shape[d]]))
        lead = [rng.choice([1, 2, other.shape[0]]) for _ in range(rng.randint(0, 2))]
        answered += s.run("expand", x, *lead, *target)[1]
        assert not _rule_check.mismatches
    assert answered > 20


def test_positions_over_a_symbolic_length() -> None:
    """`torch.arange(n)` of a symbolic length (an input's size): a fresh int64 vector of n
    elements, verified against FakeTensorMode; other starts and steps are left to it."""
    s = Symbolic()
    x = s.fake(2, 7, dynamic=(1,))
    n = x.shape[1]
    out, answered = s.run(torch.arange, n)
    assert answered and out.dtype == torch.int64 and not _rule_check.mismatches
    out, answered = s.run(torch.arange, 0, n)
    assert answered and not _rule_check.mismatches
    assert _symbolic_rules.infer(s.mode, torch.arange, (1, n), {}) is None
