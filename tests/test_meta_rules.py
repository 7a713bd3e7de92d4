"""Our shape rules (`dynamo_rs._meta_rules`) against FakeTensorMode, on many random inputs.

Every case builds fake inputs (contiguous, permuted, sliced with steps, expanded, of several
dtypes), asks our rule, and when it answers compares sizes, strides, storage offset, dtype,
device, requires_grad and aliasing with what FakeTensorMode computes for the same call. The
model and language tests check the same on everything they trace (conftest turns
`verify_meta_rules` on); here the inputs are adversarial on purpose.
"""

from __future__ import annotations

import itertools
import operator
import os
import random

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import dynamo_rs
from dynamo_rs import _meta_rules, _rule_check

# Each sweep runs once in the suite; `DYNAMO_RS_META_SEEDS=20 pytest tests/test_meta_rules.py`
# runs twenty differently seeded sweeps (worth doing after changing a rule).
SEEDS = pytest.mark.parametrize("seed", range(int(os.environ.get("DYNAMO_RS_META_SEEDS", "1"))))

DTYPES = [torch.float32, torch.float32, torch.float64, torch.float16, torch.int64]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def strided(rng: random.Random, shape, dtype=torch.float32):
    """A fake tensor of `shape` in a random layout: contiguous, permuted, a stepped slice of
    something bigger, or an expansion of size-1 dimensions. Call inside the fake mode."""
    kind = rng.choice(["contiguous", "contiguous", "permuted", "sliced", "expanded", "channels_last"])
    if kind == "permuted" and len(shape) > 1:
        order = list(range(len(shape)))
        rng.shuffle(order)
        base = torch.empty([shape[d] for d in order], dtype=dtype)
        inverse = [order.index(d) for d in range(len(shape))]
        return base.permute(inverse)
    if kind == "sliced" and shape:
        steps = [rng.choice([1, 2]) for _ in shape]
        base = torch.empty([s * k for s, k in zip(shape, steps)], dtype=dtype)
        return base[tuple(slice(None, None, k) for k in steps)]
    if kind == "expanded" and shape:
        small = [1 if rng.random() < 0.4 else s for s in shape]
        return torch.empty(small, dtype=dtype).expand(*shape)
    if kind == "channels_last" and len(shape) == 4:
        return torch.empty(shape, dtype=dtype).to(memory_format=torch.channels_last)
    return torch.empty(shape, dtype=dtype)


def random_shape(rng: random.Random, ndim=None, low=1, high=4):
    ndim = rng.randint(0, 4) if ndim is None else ndim
    return [rng.randint(low, high) for _ in range(ndim)]


def broadcast_partner(rng: random.Random, shape):
    """A shape that broadcasts with `shape`: some sizes 1, maybe fewer dimensions."""
    drop = rng.randint(0, len(shape))
    return [1 if rng.random() < 0.3 else s for s in shape[drop:]]


class Tally:
    def __init__(self):
        self.answered = 0
        self.declined = 0

    def run(self, mode, target, args, kwargs=None):
        kwargs = kwargs or {}
        ours = _meta_rules.infer(mode, target, args, kwargs)
        if ours is None:
            self.declined += 1
            return
        self.answered += 1
        _rule_check.check(mode, target, args, kwargs, ours)


@pytest.fixture
def mode():
    return FakeTensorMode()


@SEEDS
def test_binary_elementwise(mode, seed):
    rng = random.Random(0 + 1000 * seed)
    tally = Tally()
    ops = [operator.add, operator.sub, operator.mul, operator.truediv, torch.add, torch.mul, "add", "mul", "div"]
    with torch.no_grad():
        for _ in range(400):
            op = rng.choice(ops)
            shape = random_shape(rng)
            with mode:
                a = strided(rng, shape, rng.choice(DTYPES))
                if rng.random() < 0.25:
                    b = rng.choice([2, 0.5, -3])
                else:
                    b = strided(rng, broadcast_partner(rng, shape), rng.choice(DTYPES))
            args = (b, a) if rng.random() < 0.3 and not isinstance(op, str) else (a, b)
            tally.run(mode, op, args)
    assert tally.answered > 300


@SEEDS
def test_binary_with_a_zero_dim_tensor_operand(mode, seed):
    """A 0-d tensor operand takes another path through FakeTensorMode than a Python number
    does: a lone dense operand's strides are kept, size-1 dimensions included."""
    rng = random.Random(7 + 1000 * seed)
    tally = Tally()
    ops = [operator.add, operator.sub, operator.mul, operator.truediv, torch.add, torch.mul, torch.div,
           "add", "mul", "div"]
    with torch.no_grad():
        # The layouts first seen wrong: permuted, dense, a size-1 dimension in the middle.
        for sizes, strides in [((1, 4, 1, 2), (8, 1, 1, 4)), ((4, 4, 1, 4), (16, 1, 1, 4))]:
            for op in ops:
                with mode:
                    a = torch.empty_strided(sizes, strides, dtype=torch.float16)
                    b = torch.empty((), dtype=torch.float32)
                tally.run(mode, op, (a, b))
        for _ in range(300):
            op = rng.choice(ops)
            with mode:
                a = strided(rng, random_shape(rng, ndim=rng.randint(1, 4)), rng.choice(DTYPES))
                b = torch.empty((), dtype=rng.choice(DTYPES))
            args = (b, a) if rng.random() < 0.3 and not isinstance(op, str) else (a, b)
            tally.run(mode, op, args)
    assert tally.answered > 150


@SEEDS
def test_comparisons_and_logical_operations(mode, seed):
    """Comparisons (a bool result) and `&`/`|`/`^` of bool tensors over random layouts and
    broadcasts, with numbers and 0-d tensors: answered when no operand would be converted."""
    rng = random.Random(11 + 1000 * seed)
    tally = Tally()
    compare = [operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
               torch.lt, torch.eq, "gt", "ne"]
    logical = [operator.and_, operator.or_, operator.xor]
    with torch.no_grad():
        for _ in range(500):
            is_logical = rng.random() < 0.35
            op = rng.choice(logical if is_logical else compare)
            dtype = torch.bool if is_logical else rng.choice(DTYPES)
            shape = random_shape(rng)
            with mode:
                a = strided(rng, shape, dtype)
                kind = rng.random()
                if kind < 0.2:
                    b = True if is_logical else rng.choice([0, 2, 0.5, -3])
                elif kind < 0.3:
                    b = torch.empty((), dtype=dtype if rng.random() < 0.8 else torch.float64)
                else:
                    b = strided(rng, broadcast_partner(rng, shape), dtype if rng.random() < 0.85 else rng.choice(DTYPES))
            args = (b, a) if rng.random() < 0.3 and not isinstance(op, str) else (a, b)
            tally.run(mode, op, args)
    assert tally.answered > 250


def test_mask_building_operations(mode):
    """What transformers' masking utilities and caches call: `.to(device=, dtype=)`,
    `new_ones(())`, a padding mask looked up at broadcast positions, an empty cache tensor and
    its concatenation, `arange`, `.T`/`.mT` — answered, and equal to FakeTensorMode."""
    tally = Tally()
    with torch.no_grad():
        with mode:
            ids = torch.empty(2, 12, dtype=torch.int64)
            mask = torch.empty(2, 12, dtype=torch.bool)
            batch = torch.empty(2, 1, 1, 1, dtype=torch.int64)
            kv = torch.empty(1, 1, 1, 12, dtype=torch.int64)
            q = torch.empty(1, 1, 12, 1, dtype=torch.int64)
            k = torch.empty(2, 12, 4, 16).transpose(1, 2)
            cache = torch.empty(2, 4, 12, 16)
            empty = torch.tensor([])
            w = torch.empty(8, 6)
            x3 = torch.empty(2, 5, 3)
        cases = [
            ("to", (ids,), {"device": torch.device("cpu"), "dtype": torch.bool}),
            ("to", (mask,), {"dtype": torch.float32}), ("to", (k,), {"dtype": torch.float16}),
            ("to", (k,), {"device": "cpu"}),
            ("new_ones", (q, ()), {"dtype": torch.bool}), ("new_zeros", (k, 2, 3), {}),
            ("new_empty", (w, [4]), {"dtype": torch.int64}),
            (operator.getitem, (mask, (batch, kv)), {}), (operator.getitem, (w, (kv[0, 0, 0, :4] % 8, q[0, 0, :4, 0] % 6)), {}),
            (torch.tensor, ([],), {"dtype": torch.float32, "device": torch.device("cpu")}),
            (torch.cat, ((empty, cache), -2), {}), (torch.cat, ([empty, cache, cache],), {"dim": 1}),
            (torch.arange, (12,), {}), (torch.arange, (3, 12, 2), {"device": "cpu"}), (torch.arange, (10, 1, -3), {}),
            (getattr, (w, "T"), {}), (getattr, (x3, "mT"), {}), (getattr, (w, "mH"), {}),
        ]
        for target, args, kwargs in cases:
            before = tally.answered
            tally.run(mode, target, args, kwargs)
            assert tally.answered == before + 1, (target, args, kwargs)
        # Left to FakeTensorMode: `.T` of other than 2 dimensions (deprecated, it warns), an
        # empty arange, float arange bounds, another device, a cat of nothing but empty tensors.
        for target, args, kwargs in [(getattr, (x3, "T"), {}), (torch.arange, (0,), {}),
                                     (torch.arange, (2.5,), {}), ("to", (ids,), {"device": "meta"}),
                                     (torch.cat, ((empty, empty),), {})]:
            assert _meta_rules.infer(mode, target, args, kwargs) is None, (target, args)


@SEEDS
def test_inplace_elementwise(mode, seed):
    rng = random.Random(1 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(200):
            op = rng.choice([operator.iadd, operator.isub, operator.imul, operator.itruediv])
            shape = random_shape(rng, ndim=rng.randint(1, 4))
            with mode:
                a = strided(rng, shape, rng.choice(DTYPES))
                b = rng.choice([2, 1.5]) if rng.random() < 0.3 else strided(rng, broadcast_partner(rng, shape), rng.choice(DTYPES))
            ours = _meta_rules.infer(mode, op, (a, b), {})
            if ours is None:
                tally.declined += 1
                continue
            tally.answered += 1
            assert ours is a
            with mode:
                assert op(a, b) is a  # and FakeTensorMode accepts the same write
    assert tally.answered > 50
    assert tally.declined > 10  # expanded targets and int tensors += floats must decline


@SEEDS
def test_unary_and_casts(mode, seed):
    rng = random.Random(2 + 1000 * seed)
    tally = Tally()
    ops = [torch.tanh, "sigmoid", torch.neg, operator.neg, F.relu, "relu", F.silu, F.hardswish, F.hardsigmoid,
           F.gelu, torch.rsqrt, "exp", torch.cos, "sin"]
    with torch.no_grad():
        for _ in range(300):
            with mode:
                x = strided(rng, random_shape(rng), rng.choice(DTYPES))
            choice = rng.random()
            if choice < 0.6:
                tally.run(mode, rng.choice(ops), (x,))
            elif choice < 0.65:
                tally.run(mode, F.gelu, (x,), {"approximate": "tanh"})
            elif choice < 0.7:
                tally.run(mode, F.leaky_relu, (x, rng.choice([0.01, 0.2, 1])), {"inplace": rng.random() < 0.3})
            elif choice < 0.8:
                tally.run(mode, rng.choice([operator.pow, "pow"]), (x, rng.choice([2, 0.5, 3.0])))
            elif choice < 0.9:
                tally.run(mode, "to", (x, rng.choice(DTYPES)))
            else:
                tally.run(mode, rng.choice(["float", "half", "double", "bfloat16"]), (x,))
    assert tally.answered > 200


def _refactored(rng: random.Random, numel: int):
    """A random shape of `numel` elements, size-1 dimensions sprinkled in."""
    sizes = []
    rest = numel
    while rest > 1 and len(sizes) < 4:
        size = rng.choice([d for d in range(1, rest + 1) if rest % d == 0])
        sizes.append(size)
        rest //= size
    sizes.append(rest)
    for _ in range(rng.randint(0, 2)):
        sizes.insert(rng.randint(0, len(sizes)), 1)
    rng.shuffle(sizes)
    return sizes


@SEEDS
def test_views_into_shapes_with_size_one_dimensions(mode, seed):
    """`view`/`reshape` into shapes with size-1 dimensions, from every layout: FakeTensorMode
    views by PrimTorch's algorithm, whose strides for size-1 dimensions differ from ATen's, and
    `reshape` copies when ATen's rule finds no view (channels-last batches of 1 reshaped to
    `(1, C, H*W)`, permuted attention heads, ...)."""
    rng = random.Random(17 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(400):
            shape = random_shape(rng, ndim=rng.randint(1, 4))
            if rng.random() < 0.5:
                shape[rng.randrange(len(shape))] = 1
            with mode:
                x = strided(rng, shape, rng.choice(DTYPES))
            sizes = _refactored(rng, x.numel())
            if rng.random() < 0.3:
                sizes[rng.randrange(len(sizes))] = -1
            target = rng.choice(["view", "reshape", torch.reshape])
            args = (x, tuple(sizes)) if target is torch.reshape or rng.random() < 0.5 else (x, *sizes)
            try:
                tally.run(mode, target, args)
            except RuntimeError:
                assert _meta_rules.infer(mode, target, args, {}) is None
    assert tally.answered > 300, (tally.answered, tally.declined)


@SEEDS
def test_chunk_and_cat_of_image_layouts(mode, seed):
    """`chunk` (split by `ceil(size / n)`) and `cat` of 4-d tensors in channels-last and
    row-major layouts, batches of 1 included: a channels-last result when every input suggests
    it (c10's rule), row-major otherwise."""
    rng = random.Random(23 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(300):
            shape = [rng.choice([1, 1, 2]), rng.randint(1, 6), rng.randint(1, 4), rng.randint(1, 4)]
            dim = rng.randrange(-4, 4)
            with mode:
                x = strided(rng, shape)
                if rng.random() < 0.5:
                    x = torch.empty(shape).to(memory_format=torch.channels_last)
            target = rng.choice(["chunk", torch.chunk])
            tally.run(mode, target, (x, rng.randint(1, 4), dim))
            with mode:
                parts = []
                for _ in range(rng.randint(1, 3)):
                    s = list(shape)
                    s[dim] = rng.randint(1, 3)
                    if rng.random() < 0.6:
                        part = torch.empty(s).to(memory_format=torch.channels_last)
                        if rng.random() < 0.3:  # a channel slice of a wider channels-last tensor
                            wide = list(s)
                            wide[1] *= 2
                            part = torch.empty(wide).to(memory_format=torch.channels_last)[:, :s[1]]
                    else:
                        part = strided(rng, s)
                    parts.append(part)
            tally.run(mode, torch.cat, (parts, dim))
    assert tally.answered > 400, (tally.answered, tally.declined)


def test_dropout_and_inplace_relu_return_the_input(mode):
    with torch.no_grad(), mode:
        x = torch.empty(3, 4)
    assert _meta_rules.infer(mode, F.dropout, (x, 0.1, False), {}) is x
    assert _meta_rules.infer(mode, F.relu, (x,), {"inplace": True}) is x
    assert _meta_rules.infer(mode, F.dropout, (x, 0.1, True), {}) is None  # training: random


@SEEDS
def test_views(mode, seed):
    rng = random.Random(3 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(400):
            shape = random_shape(rng, ndim=rng.randint(1, 4))
            with mode:
                x = strided(rng, shape, rng.choice(DTYPES))
            numel = x.numel()
            op = rng.choice(["view", "reshape", "permute", "transpose", "unsqueeze", "flatten", "expand",
                             "contiguous"])
            if op in ("view", "reshape"):
                sizes = [numel] if rng.random() < 0.3 else list(reversed(shape))
                if rng.random() < 0.5:
                    sizes[rng.randrange(len(sizes))] = -1
                args = (x, *sizes) if rng.random() < 0.5 else (x, tuple(sizes))
                target = op if rng.random() < 0.7 or op == "view" else torch.reshape
                if target is torch.reshape:
                    args = (x, tuple(sizes))
            elif op == "permute":
                dims = list(range(x.dim()))
                rng.shuffle(dims)
                target, args = rng.choice(["permute", torch.permute]), (x, dims)
            elif op == "transpose":
                target, args = rng.choice(["transpose", torch.transpose]), (x, rng.randrange(-x.dim(), x.dim()),
                                                                            rng.randrange(x.dim()))
            elif op == "unsqueeze":
                target, args = "unsqueeze", (x, rng.randint(-x.dim() - 1, x.dim()))
            elif op == "flatten":
                target, args = rng.choice(["flatten", torch.flatten]), (x, rng.randrange(x.dim()), -1)
            elif op == "expand":
                sizes = [rng.choice([s, -1]) if s != 1 else rng.choice([1, 3]) for s in shape]
                target, args = "expand", (x, *([rng.choice([1, 2])] if rng.random() < 0.3 else []), *sizes)
            else:
                target, args = "contiguous", (x,)
            try:
                tally.run(mode, target, args)
            except RuntimeError:
                # Some random views are invalid; then our rule must have declined (it runs
                # first and answers only valid calls), and FakeTensorMode raised in check.
                assert _meta_rules.infer(mode, target, args, {}) is None
    assert tally.answered > 250


@SEEDS
def test_basic_indexing_and_split(mode, seed):
    rng = random.Random(4 + 1000 * seed)
    tally = Tally()

    def random_item(size):
        kind = rng.random()
        if kind < 0.3:
            return rng.randrange(-size, size)
        if kind < 0.8:
            return slice(rng.choice([None, 0, 1, -2, -10]), rng.choice([None, 2, -1, 10]), rng.choice([None, 1, 2, 3]))
        return None

    with torch.no_grad():
        for _ in range(300):
            shape = random_shape(rng, ndim=rng.randint(1, 4), high=5)
            with mode:
                x = strided(rng, shape)
            if rng.random() < 0.75:
                items = [random_item(s) for s in shape[: rng.randint(1, len(shape))]]
                if rng.random() < 0.3:
                    items.insert(rng.randint(0, len(items)), Ellipsis)
                index = items[0] if len(items) == 1 and rng.random() < 0.5 else tuple(items)
                tally.run(mode, operator.getitem, (x, index))
            elif rng.random() < 0.3:
                tally.run(mode, rng.choice(["unbind", torch.unbind]), (x, rng.randrange(-x.dim(), x.dim())))
            else:
                dim = rng.randrange(x.dim())
                split = rng.randint(1, 3) if rng.random() < 0.6 else None
                if split is None:
                    cut = rng.randint(0, shape[dim])
                    split = [cut, shape[dim] - cut] if 0 < cut < shape[dim] else [shape[dim]]
                tally.run(mode, rng.choice(["split", torch.split]), (x, split, dim))
    assert tally.answered > 200


@SEEDS
def test_setitem_with_basic_indices(mode, seed):
    """`x[index] = value` (basic indices, numbers or tensors that broadcast, other dtypes, extra
    leading size-1 dimensions, expanded destinations, values that do not fit): the rule answers
    "no value" exactly when FakeTensorMode accepts the store, and raises nothing itself."""
    rng = random.Random(13 + 1000 * seed)
    tally = Tally()

    def random_item(size):
        kind = rng.random()
        if kind < 0.3:
            return rng.randrange(-size - 1, size + 1)  # sometimes out of range
        if kind < 0.85:
            return slice(rng.choice([None, 0, 1, -2]), rng.choice([None, 2, -1, 10]), rng.choice([None, 1, 2]))
        return rng.choice([None, Ellipsis])

    with torch.no_grad():
        for _ in range(300):
            shape = random_shape(rng, ndim=rng.randint(1, 4), high=5)
            with mode:
                x = strided(rng, shape, rng.choice(DTYPES))
            items = [random_item(s) for s in shape[: rng.randint(1, len(shape))]]
            index = items[0] if len(items) == 1 else tuple(items)
            kind = rng.random()
            if kind < 0.4:
                value = rng.choice([0, 1.5, -2, True, 2**40, float("inf")])
            else:
                try:
                    with mode:
                        view_shape = list(x[index].shape)
                except IndexError:
                    view_shape = list(shape)
                value_shape = broadcast_partner(rng, view_shape)
                if rng.random() < 0.2:
                    value_shape = [1, *value_shape]
                if rng.random() < 0.1 and value_shape:
                    value_shape[-1] += 1  # does not broadcast
                with mode:
                    value = strided(rng, value_shape, rng.choice(DTYPES))
            try:
                with mode:
                    operator.setitem(x, index, value)
                accepted = True
            except Exception:  # torch refuses the store: the rule must not answer
                accepted = False
            ours = _meta_rules.infer(mode, operator.setitem, (x, index, value), {})
            if ours is None:
                tally.declined += 1
                continue
            assert accepted, (x.shape, x.stride(), x.dtype, index, value)
            tally.run(mode, operator.setitem, (x, index, value))
    assert tally.answered > 100


@SEEDS
def test_attention_with_a_mask(mode, seed):
    """scaled_dot_product_attention with boolean and additive masks of every rank that
    broadcasts, contiguous and permuted (heads-last) queries, equal and differing head sizes:
    where torch's CPU dispatch may pick the flash kernel or the math path."""
    rng = random.Random(17 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(150):
            b, h, length, s, e, ev = (rng.choice([1, 2, 3, 5, 8]) for _ in range(6))
            dtype = rng.choice([torch.float32, torch.float64, torch.float16])
            heads_last = rng.random() < 0.5
            with mode:
                def qkv(sizes):
                    if heads_last:
                        return torch.empty(sizes[0], sizes[2], sizes[1], sizes[3], dtype=dtype).permute(0, 2, 1, 3)
                    return torch.empty(sizes, dtype=dtype)

                q, k, v = qkv((b, h, length, e)), qkv((b, h, s, e)), qkv((b, h, s, ev))
                mask_shape = rng.choice([(length, s), (h, length, s), (b, h, length, s), (1, 1, length, s),
                                         (b, 1, length, s), (1, s), (length, 1)])
                mask_dtype = rng.choice([torch.bool, dtype, torch.float32])
                mask = torch.empty(mask_shape, dtype=mask_dtype)
            kwargs = {"attn_mask": mask}
            if rng.random() < 0.2:
                kwargs["scale"] = 0.5
            tally.run(mode, F.scaled_dot_product_attention, (q, k, v), kwargs)
            # Three or five dimensions (a window dimension before the heads), no mask.
            with mode:
                extra = [rng.choice([1, 2, 3])] * rng.choice([0, 1, 2])
                q3, k3, v3 = (torch.empty(*extra, t.shape[0], t.shape[2], t.shape[1], t.shape[3],
                                          dtype=dtype).transpose(-2, -3)
                              if heads_last else torch.empty(*extra, *t.shape, dtype=dtype)
                              for t in (q, k, v))
            tally.run(mode, F.scaled_dot_product_attention, (q3, k3, v3), {"dropout_p": 0.0})
    assert tally.answered > 60


@SEEDS
def test_multi_head_attention_forward(mode, seed):
    """`F.multi_head_attention_forward` as `nn.MultiheadAttention` calls it: self- and
    cross-attention, inputs transposed from batch-first, dropout in and out of training,
    weights asked for or not."""
    rng = random.Random(19 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(60):
            length, source, batch = rng.choice([1, 2, 5]), rng.choice([1, 3, 5]), rng.choice([1, 2, 3])
            heads = rng.choice([1, 2, 4])
            e = heads * rng.choice([1, 2, 8])
            dtype = rng.choice([torch.float32, torch.float64])
            with mode:
                def activation(*sizes):
                    if rng.random() < 0.4:
                        return torch.empty(sizes[1], sizes[0], sizes[2], dtype=dtype).transpose(0, 1)
                    return torch.empty(*sizes, dtype=dtype)

                q = activation(length, batch, e)
                k = q if rng.random() < 0.5 and length == source else activation(source, batch, e)
                v = k if rng.random() < 0.7 else activation(source, batch, e)
                w_in, b_in = torch.empty(3 * e, e, dtype=dtype), torch.empty(3 * e, dtype=dtype)
                w_out, b_out = torch.empty(e, e, dtype=dtype), torch.empty(e, dtype=dtype)
            args = (q, k, v, e, heads, w_in, b_in, None, None, False, rng.choice([0.0, 0.1]), w_out, b_out)
            kwargs = {"training": rng.choice([False, True]), "need_weights": rng.choice([False, False, True])}
            tally.run(mode, F.multi_head_attention_forward, args, kwargs)
    assert tally.answered > 15


@SEEDS
def test_layers(mode, seed):
    rng = random.Random(5 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(150):
            with mode:
                # linear over 1-4 d inputs in any layout
                n_in, n_out = rng.randint(1, 6), rng.randint(1, 6)
                x = strided(rng, random_shape(rng, ndim=rng.randint(0, 3)) + [n_in])
                w = strided(rng, [n_out, n_in])
                b = strided(rng, [n_out]) if rng.random() < 0.7 else None
            tally.run(mode, F.linear, (x, w, b))
            with mode:
                m1 = strided(rng, [rng.randint(1, 5), n_in])
                m2 = strided(rng, [n_in, n_out])
                bias = strided(rng, rng.choice([[n_out], [1, n_out], [m1.shape[0], n_out]]))
            tally.run(mode, torch.addmm, (bias, m1, m2))
            with mode:
                groups = rng.choice([1, 1, 2])
                c_in, c_out = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
                k = rng.randint(1, 3)
                x = strided(rng, [rng.randint(1, 2), c_in, rng.randint(k, 7), rng.randint(k, 7)])
                w = strided(rng, [c_out, c_in // groups, k, k])
                b = torch.empty(c_out) if rng.random() < 0.5 else None
            kwargs = {"stride": rng.choice([1, 2, (1, 2)]), "padding": rng.choice([0, 1, (1, 0), "valid"]),
                      "dilation": rng.choice([1, 1, 2]), "groups": groups}
            try:
                tally.run(mode, torch.conv2d, (x, w, b), kwargs)
            except RuntimeError:
                assert _meta_rules.infer(mode, torch.conv2d, (x, w, b), kwargs) is None
            with mode:
                c = rng.randint(1, 5)
                x = strided(rng, [rng.randint(1, 3), c] + random_shape(rng, ndim=rng.randint(0, 2)))
                stats = [torch.empty(c) for _ in range(4)]
            tally.run(mode, F.batch_norm, (x, stats[0], stats[1], stats[2], stats[3], False, 0.1, 1e-5))
            with mode:
                shape = random_shape(rng, ndim=rng.randint(1, 4))
                normalized = shape[len(shape) - rng.randint(1, len(shape)):]
                x = strided(rng, shape)
                w = torch.empty(normalized) if rng.random() < 0.7 else None
            tally.run(mode, F.layer_norm, (x, normalized, w, None if w is None else torch.empty(normalized)))
            with mode:
                idx = torch.empty(random_shape(rng, ndim=rng.randint(1, 3)), dtype=torch.int64)
                table = torch.empty(10, rng.randint(1, 5))
            tally.run(mode, F.embedding, (idx, table))
            with mode:
                shape = random_shape(rng, ndim=rng.randint(1, 3))
                dim = rng.randrange(len(shape))
                parts = []
                for _ in range(rng.randint(1, 3)):
                    s = list(shape)
                    s[dim] = rng.randint(1, 3)
                    parts.append(strided(rng, s))
            tally.run(mode, torch.cat, (parts, dim))
            with mode:
                x = strided(rng, random_shape(rng, ndim=rng.randint(1, 4)))
            dims = rng.choice([None, 0, -1, (0, -1)])
            if dims is None or (isinstance(dims, tuple) and x.dim() < 2):
                tally.run(mode, "mean", (x,))
            else:
                tally.run(mode, "mean", (x, dims, rng.random() < 0.5))
            with mode:
                x = strided(rng, random_shape(rng, ndim=rng.randint(1, 4)), rng.choice(FLOAT_DTYPES))
            dims = rng.choice([None, 0, -1, (0, -1), [1]])
            if isinstance(dims, (tuple, list)) and x.dim() < 2:
                dims = 0
            order = rng.choice([2, 1, 2.0, 0.5, 3, 0, float("inf"), float("-inf"), "fro", "nuc"])
            keepdim = rng.random() < 0.5
            norm = rng.choice(["norm", torch.norm, torch.linalg.vector_norm])
            if norm is torch.linalg.vector_norm:
                order = 2 if order in ("fro", "nuc") else order
                tally.run(mode, norm, (x,), {"ord": order, "dim": dims, "keepdim": keepdim})
            else:
                tally.run(mode, norm, (x, order, dims, keepdim))
            with mode:
                x = strided(rng, [rng.randint(1, 2), rng.randint(1, 3), rng.randint(3, 9), rng.randint(3, 9)])
            tally.run(mode, F.adaptive_avg_pool2d, (x, rng.choice([1, (2, 3), (None, 2)])))
            tally.run(mode, F.max_pool2d, (x, rng.choice([2, 3]), rng.choice([None, 1, 2]), rng.choice([0, 1])))
            with mode:
                b, h, l, d = rng.randint(1, 2), rng.randint(1, 3), rng.randint(1, 5), rng.choice([4, 8])
                if rng.random() < 0.5:  # q, k, v from one projection, as in ViT
                    q, k, v = torch.empty(b, l, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
                else:
                    q, k, v = (strided(rng, [b, h, l, d]) for _ in range(3))
            kwargs = rng.choice([{}, {"is_causal": True}, {"scale": 0.5}, {"dropout_p": 0.1}])
            tally.run(mode, F.scaled_dot_product_attention, (q, k, v), kwargs)
            with mode:
                # matmul in any layout: 1-4 d operands, equal or broadcast batches.
                n, k_, p = rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 4)
                batch = random_shape(rng, ndim=rng.randint(0, 2))
                other = rng.choice([batch, broadcast_partner(rng, batch), []])
                a = strided(rng, [*batch, n, k_] if rng.random() < 0.9 else [k_])
                b = strided(rng, [*other, k_, p] if rng.random() < 0.9 else [k_])
            for target in (operator.matmul, torch.matmul, "matmul"):
                tally.run(mode, target, (a, b))
            with mode:
                a3, b3 = strided(rng, [2, n, k_]), strided(rng, [2, k_, p])
            tally.run(mode, torch.bmm, (a3, b3))
            tally.run(mode, "bmm", (a3, b3))
            with mode:
                x = strided(rng, random_shape(rng, ndim=rng.randint(1, 4)))
            dim = rng.randrange(-x.dim(), x.dim())
            tally.run(mode, F.softmax, (x, dim))
            tally.run(mode, "softmax", (x, dim))
            tally.run(mode, torch.softmax, (x,), {"dim": dim})
    assert tally.answered > 700


@SEEDS
def test_clamps_pooling_padding_and_group_norm(mode, seed):
    """hardtanh / relu6 (MobileNet's ReLU6), avg_pool2d, group_norm, constant pad, unfold and fold
    (VOLO's outlook attention) and row lookups by an index tensor, in any layout and
    with arguments torch rejects (the rules must leave those to FakeTensorMode)."""
    rng = random.Random(11 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(150):
            with mode:
                x = strided(rng, random_shape(rng), dtype=rng.choice(DTYPES))
            low, high = rng.choice([(-1.0, 1.0), (0.0, 6.0), (0, 6), (2.0, -2.0), (True, 3)])
            inplace = rng.random() < 0.3 and x.is_contiguous()
            for target, args in ((F.hardtanh, (x, low, high, inplace)), (F.relu6, (x, inplace)),
                                 (F.hardtanh, (x,))):
                try:
                    tally.run(mode, target, args)
                except (RuntimeError, ValueError):
                    assert _meta_rules.infer(mode, target, args, {}) is None
            with mode:
                x = strided(rng, [rng.randint(1, 2), rng.randint(1, 3), rng.randint(1, 9), rng.randint(1, 9)],
                            dtype=rng.choice(DTYPES))
            args = (x, rng.choice([1, 2, 3, (2, 1), (3, 2)]), rng.choice([None, 1, 2, (2, 1)]),
                    rng.choice([0, 1, (1, 0), 2]))
            kwargs = rng.choice([{}, {"count_include_pad": False}, {"ceil_mode": True}, {"divisor_override": 2}])
            try:
                tally.run(mode, F.avg_pool2d, args, kwargs)
            except RuntimeError:
                assert _meta_rules.infer(mode, F.avg_pool2d, args, kwargs) is None
            with mode:
                groups = rng.choice([1, 2, 3])
                c = groups * rng.randint(1, 3) + (1 if rng.random() < 0.1 else 0)
                x = strided(rng, [rng.randint(1, 2), c] + random_shape(rng, ndim=rng.randint(0, 2)),
                            dtype=rng.choice(DTYPES))
                w = torch.empty(c, dtype=x.dtype) if rng.random() < 0.7 else None
                b = torch.empty(c, dtype=x.dtype) if w is not None and rng.random() < 0.7 else None
            try:
                tally.run(mode, F.group_norm, (x, groups, w, b))
            except (RuntimeError, ValueError):
                assert _meta_rules.infer(mode, F.group_norm, (x, groups, w, b), {}) is None
            with mode:
                x = strided(rng, random_shape(rng, ndim=rng.randint(1, 4)), dtype=rng.choice(DTYPES))
            pads = [rng.choice([0, 1, 2, -1]) for _ in range(2 * rng.randint(1, 3))]
            kwargs = rng.choice([{}, {"value": 1.5}, {"mode": "constant", "value": 0}, {"mode": "reflect"}])
            try:
                tally.run(mode, F.pad, (x, pads), kwargs)
            except (RuntimeError, ValueError, NotImplementedError):
                assert _meta_rules.infer(mode, F.pad, (x, pads), kwargs) is None
            with mode:
                x = strided(rng, [rng.randint(1, 2), rng.randint(1, 3), rng.randint(1, 8), rng.randint(1, 8)],
                            dtype=rng.choice(DTYPES))
            geometry = {"kernel_size": rng.choice([1, 2, 3, (2, 3)]), "dilation": rng.choice([1, 1, 2]),
                        "padding": rng.choice([0, 1, (1, 0)]), "stride": rng.choice([1, 2, (2, 1)])}
            try:
                tally.run(mode, F.unfold, (x,), geometry)
            except RuntimeError:
                assert _meta_rules.infer(mode, F.unfold, (x,), geometry) is None
                continue
            with mode:
                blocks = torch.empty(0)
                try:
                    blocks = F.unfold(x, **geometry)
                except RuntimeError:
                    pass
                if rng.random() < 0.3 and blocks.dim() == 3:
                    blocks = blocks.transpose(1, 2).contiguous().transpose(1, 2)
            size = tuple(x.shape[2:]) if rng.random() < 0.8 else (x.shape[2] + 1, x.shape[3])
            try:
                tally.run(mode, F.fold, (blocks, size), geometry)
            except RuntimeError:
                assert _meta_rules.infer(mode, F.fold, (blocks, size), geometry) is None
            with mode:
                table = strided(rng, random_shape(rng, ndim=rng.randint(1, 3), low=1, high=5),
                                dtype=rng.choice(DTYPES))
                positions = strided(rng, random_shape(rng, ndim=rng.randint(1, 2), low=1, high=5),
                                    dtype=rng.choice([torch.int64, torch.int64, torch.int32, torch.bool]))
            if positions.dtype is not torch.bool:
                tally.run(mode, operator.getitem, (table, positions))
            else:
                assert _meta_rules.infer(mode, operator.getitem, (table, positions), {}) is None
    assert tally.answered > 200
    with torch.no_grad():
        with mode:
            x = torch.empty(2, 4, 8, 8)
            blocks = torch.empty(2, 36, 4)
            positions = torch.empty(5, 3, dtype=torch.int64)
        for target, args in ((F.hardtanh, (x, 0.0, 6.0)), (F.relu6, (x,)), (F.avg_pool2d, (x, 3, 2, 1)),
                             (F.group_norm, (x, 2)), (F.pad, (x, (1, 2, 0, 1))), (F.unfold, (x, 3)),
                             (F.fold, (blocks, (3, 3), 2)), (operator.getitem, (x, positions))):
            tally.run(mode, target, args)
            assert _meta_rules.infer(mode, target, args, {}) is not None, target


@SEEDS
def test_clamp_and_interpolate(mode, seed):
    """clamp with number bounds over every layout and dtype; F.interpolate (nearest,
    nearest-exact, bilinear, bicubic) by size or scale factor over contiguous, channels-last
    and permuted images, size-1 dimensions included (a one-channel attention map)."""
    rng = random.Random(11 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(400):
            with mode:
                if rng.random() < 0.5:
                    x = strided(rng, random_shape(rng, ndim=rng.randint(1, 4)), rng.choice(DTYPES))
                    low, high = rng.choice([None, 0, -1.5, 2]), rng.choice([None, 5, 3.5])
                    op = rng.choice([torch.clamp, "clamp"])
                    if rng.random() < 0.7:
                        args, kwargs = (x,), {"min": low, "max": high}
                    else:
                        args, kwargs = (x, low, high), {}
                else:
                    x = torch.empty(rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 9), rng.randint(1, 9),
                                    dtype=rng.choice([torch.float32, torch.float16]))
                    if rng.random() < 0.3:
                        x = x.to(memory_format=torch.channels_last)
                    if rng.random() < 0.1:
                        x = x.permute(0, 1, 3, 2)
                    how = rng.choice(["nearest", "bilinear", "bicubic", "nearest-exact"])
                    op, args = F.interpolate, (x,)
                    if rng.random() < 0.5:
                        size = rng.choice([rng.randint(1, 12), (rng.randint(1, 12), rng.randint(1, 12)),
                                           torch.Size([4, 6])])
                        kwargs = {"size": size, "mode": how}
                    else:
                        kwargs = {"scale_factor": rng.choice([2, 2.0, 0.5, 1.7, (2, 3), 5.0, 0.3]), "mode": how,
                                  "recompute_scale_factor": rng.choice([None, True, False])}
                    if how in ("bilinear", "bicubic"):
                        kwargs["align_corners"] = rng.choice([None, False, True])
            tally.run(mode, op, args, kwargs)
    assert tally.answered > 150


def test_matmul_of_broadcast_batches_and_any_layout(mode):
    """`a @ b` with a batched first operand: batches broadcast (or not: torch's error, and
    `bmm` never broadcasts), operands transposed or sliced — each answer checked against
    FakeTensorMode."""
    tally = Tally()
    batches_a = [(1,), (3,), (2, 3), (2, 1), (4, 2, 3)]
    batches_b = [(), (1,), (3,), (2, 3), (2, 1), (5,)]
    for ab, bb in itertools.product(batches_a, batches_b):
        for (m_, k, n), layout in itertools.product([(4, 5, 6), (1, 5, 6)], ["plain", "t", "slice"]):
            with mode:
                if layout == "t":
                    a = torch.empty(*ab, k, m_).transpose(-1, -2)
                    b = torch.empty(*bb, n, k).transpose(-1, -2)
                else:
                    cut = 3 if layout == "slice" else 0
                    a = torch.empty(*ab, m_, k + cut)[..., :k]
                    b = torch.empty(*bb, k, n + cut)[..., :n]
            for target in (operator.matmul, torch.bmm):
                try:
                    tally.run(mode, target, (a, b))
                except RuntimeError:
                    assert _meta_rules.infer(mode, target, (a, b), {}) is None
    assert tally.answered > 150, (tally.answered, tally.declined)


def test_eval_batch_norm_of_slices_and_permuted_layouts(mode):
    """Eval-mode batch norm of inputs that are not row-major: slices of the channels or of
    the last dimension of a larger tensor (a batch of one: row-major but for the leading
    stride), and every permutation of a dense layout, each answer checked against
    FakeTensorMode."""
    tally = Tally()
    with torch.no_grad():
        for n, c, h, w, d in itertools.product([1, 2], [1, 3], [1, 3], [1, 2], [0, 2]):
            shape = (n, c, h, w) + ((d,) if d else ())
            with mode:
                inputs = [torch.empty(n, c + extra, *shape[2:])[:, cut]
                          for extra in (1, 4) for cut in (slice(None, c), slice(extra, None))]
                inputs.append(torch.empty(*shape[:-1], shape[-1] + 2)[..., :shape[-1]])
                orders = itertools.permutations(range(len(shape)))
                for order in itertools.islice(orders, 0, None, 1 if len(shape) == 4 else 9):
                    dense = torch.empty(*[shape[i] for i in order])
                    inputs.append(dense.permute(*[order.index(i) for i in range(len(shape))]))
                stats = torch.empty(c)
            for x in inputs:
                tally.run(mode, F.batch_norm, (x, stats, stats, stats, stats), {"training": False})
    assert tally.answered > 300, (tally.answered, tally.declined)


@SEEDS
def test_batch_statistics_normalize_and_reshape_as(mode, seed):
    """Batch norm over the batch's own statistics (no running stats: NFNets' weight
    standardisation), F.normalize, `reshape_as`/`view_as`, in random layouts and sizes."""
    rng = random.Random(11 + 1000 * seed)
    tally = Tally()
    with torch.no_grad():
        for _ in range(150):
            with mode:
                c = rng.randint(1, 5)
                x = strided(rng, [rng.randint(1, 3), c] + random_shape(rng, ndim=rng.randint(0, 2)))
                affine = [torch.empty(c), torch.empty(c)] if rng.random() < 0.5 else [None, None]
            args = (x, None, None, *affine, True, 0.0, 1e-5)
            try:
                tally.run(mode, F.batch_norm, args)
            except (RuntimeError, ValueError):
                assert _meta_rules.infer(mode, F.batch_norm, args, {}) is None
            with mode:
                x = strided(rng, random_shape(rng, ndim=rng.randint(1, 4)))
            dim = rng.randrange(-x.dim(), x.dim())
            tally.run(mode, F.normalize, (x,), {"p": rng.choice([1.0, 2.0]), "dim": dim})
            with mode:
                shape = random_shape(rng, ndim=rng.randint(1, 4))
                x = strided(rng, shape)
                numel = 1
                for size in shape:
                    numel *= size
                other = torch.empty(rng.choice([[numel], [1, numel], [numel, 1]]))
            tally.run(mode, "reshape_as", (x, other))
            try:
                tally.run(mode, "view_as", (x, other))
            except RuntimeError:
                assert _meta_rules.infer(mode, "view_as", (x, other), {}) is None
    assert tally.answered > 150, (tally.answered, tally.declined)


def test_rules_decline_what_they_do_not_model(mode):
    with mode:
        x = torch.empty(3, 4)
        p = torch.empty(4, 4).requires_grad_(True)
        bn = [torch.empty(4) for _ in range(4)]
    # Grad mode on and an input requiring grad: the result needs autograd history.
    with torch.enable_grad():
        assert _meta_rules.infer(mode, F.linear, (x, p), {}) is None
    with torch.no_grad():
        # Training batch norm updates the running statistics.
        assert _meta_rules.infer(mode, F.batch_norm, (torch.empty(2, 4, device="meta"), *bn, True), {}) is None
        # Shapes that do not fit: FakeTensorMode raises torch's error.
        with mode:
            bias, m1, m2 = torch.empty(3, 4), torch.empty(1, 2), torch.empty(2, 4)
        assert _meta_rules.infer(mode, torch.addmm, (bias, m1, m2), {}) is None  # bias bigger than m1 @ m2
        assert _meta_rules.infer(mode, F.linear, (x, torch.empty(5, 5, device="meta")), {}) is None
        assert _meta_rules.infer(mode, "view", (x.t(), -1), {}) is None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert _meta_rules.infer(mode, F.linear, (x, torch.empty(4, 4)), {}) is None
        # A torch-function mode could change what the call does.
        with torch.device("cpu"):
            assert _meta_rules.infer(mode, operator.add, (x, x), {}) is None
        # A tensor of another mode, or a real one.
        assert _meta_rules.infer(mode, operator.add, (x, torch.ones(3, 4)), {}) is None
        assert _meta_rules.infer(mode, operator.add, (x, FakeTensorMode().from_tensor(torch.ones(3, 4))), {}) is None


def test_views_of_parameters_require_grad_with_grad_off(mode):
    """With grad mode off, ops on a parameter give results that don't require grad, but views
    of it do, as in eager."""
    param = torch.nn.Parameter(torch.randn(4, 6))
    fake = mode.from_tensor(param)
    with torch.no_grad():
        for target, args in [("view", (fake, -1)), ("transpose", (fake, 0, 1)), (operator.getitem, (fake, 0)),
                             (operator.mul, (fake, 2)), (F.relu, (fake,))]:
            ours = _meta_rules.infer(mode, target, args, {})
            assert ours is not None
            _rule_check.check(mode, target, args, {}, ours)
            eager = (getattr(param, target)(*args[1:]) if isinstance(target, str) else target(param, *args[1:]))
            assert ours.requires_grad == eager.requires_grad


def test_a_small_cnn_and_mlp_need_no_fake_tensor_mode_dispatch(monkeypatch):
    """The speed of a cold capture depends on the rules covering the common layers: every
    operation of these models is answered by a rule (none falls back to FakeTensorMode), and
    the compiled results match eager."""
    import dynamo_rs
    from dynamo_rs.testing import CompileCounter

    declined = []
    infer = _meta_rules.infer

    def counting(mode, target, args, kwargs):
        result = infer(mode, target, args, kwargs)
        if result is None:
            declined.append(target)
        return result

    monkeypatch.setattr(_meta_rules, "infer", counting)
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(inplace=True),
        torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.Hardswish(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 4),
    ).eval()
    mlp = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.GELU(),
                              torch.nn.Linear(32, 16)).eval()
    for model, x in [(cnn, torch.randn(2, 3, 16, 16)), (mlp, torch.randn(2, 5, 16))]:
        dynamo_rs.reset()
        counter = CompileCounter()
        with torch.no_grad():
            expected = model(x)
            got = dynamo_rs.compile(model, backend=counter)(x)
        torch.testing.assert_close(got, expected)
        assert counter.frame_count == 1
    assert declined == []


def test_rules_under_inference_mode_and_with_grad():
    """The same model compiled under inference mode, no_grad and with grad enabled (then the
    rules must leave ops on parameters that require grad to FakeTensorMode): results match
    eager and every rule's answer agrees with FakeTensorMode (conftest's check)."""
    import dynamo_rs
    from dynamo_rs.testing import CompileCounter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(),
                                torch.nn.Linear(8, 3)).eval()
    x = torch.randn(4, 6)
    for context in (torch.inference_mode, torch.no_grad, torch.enable_grad):
        dynamo_rs.reset()
        counter = CompileCounter()
        with context():
            expected = model(x)
            got = dynamo_rs.compile(model, backend=counter)(x)
        torch.testing.assert_close(got, expected)
        assert got.requires_grad == expected.requires_grad
        assert counter.frame_count == 1


def test_graphs_are_the_same_with_and_without_rules():
    """Switching the rules off (`config.meta_rules = False`) gives the same graph, node for
    node, with the same metadata on every node."""
    import dynamo_rs
    from dynamo_rs.testing import CompileCounter

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(1),
        torch.nn.Linear(4 * 8 * 8, 5), torch.nn.Dropout(0.1),
    ).eval()
    x = torch.randn(2, 3, 8, 8)

    def capture():
        dynamo_rs.reset()
        counter = CompileCounter()
        with torch.no_grad():
            dynamo_rs.compile(model, backend=counter)(x)
        (gm,) = counter.graphs
        return gm.code, [(n.name, tuple(v.shape), v.stride(), v.dtype, v.requires_grad)
                         for n in gm.graph.nodes
                         if isinstance(v := n.meta.get("example_value"), torch.Tensor)]

    with_rules = capture()
    dynamo_rs.config.meta_rules = False
    try:
        without = capture()
    finally:
        dynamo_rs.config.meta_rules = True
    assert with_rules == without


def _repeated_blocks(x):
    # cumprod over a transposed input: no shape rule answers it.
    return sum(torch.cumprod(x.transpose(0, 2), dim=0) * k for k in range(4))


def _repeated_views(x):
    return sum(torch.diagonal(x, 0, 1, 2) for _ in range(3))


@pytest.mark.parametrize(("fn", "dispatches"), [(_repeated_blocks, 1), (_repeated_views, 3)])
def test_repeated_calls_are_remembered_within_a_trace(monkeypatch, fn, dispatches):
    """A call met again in one trace with inputs of the same metadata takes the fake result's
    metadata from the first (checked against FakeTensorMode: verify_meta_rules is on in the
    tests); views are never remembered (their result shares the input's storage)."""
    from dynamo_rs import _capture

    calls = []
    real_call = _capture._call

    def counting(target, args, kwargs):
        calls.append(getattr(target, "__name__", target))
        return real_call(target, args, kwargs)

    monkeypatch.setattr(_capture, "_call", counting)
    dynamo_rs.reset()
    x = torch.randn(2, 3, 5)
    with torch.no_grad():
        torch.testing.assert_close(dynamo_rs.compile(fn, backend="eager")(x), fn(x))
    name = "cumprod" if fn is _repeated_blocks else "diagonal"
    assert calls.count(name) == dispatches, calls


def test_strides_seen_by_user_code_match_eager():
    """What a compiled function reads from a result's `.stride()` and `.is_contiguous()` is what
    eager gives (a wrong stride in a rule is a wrong answer, not only wrong metadata): binary
    operations over permuted and channels-last inputs with a 0-d tensor, a number or a tensor.
    One divergence is torch's own: with a Python number, FakeTensorMode (and so TorchDynamo)
    renumbers the strides of size-1 dimensions that eager keeps; there the answer must be
    TorchDynamo's and agree with eager on every other dimension."""
    from dynamo_rs.testing import CompileCounter

    def layouts_of(x, other):
        results = [x / other, x + other, x * other, torch.div(x, other), torch.add(other, x)]
        return [(r.stride(), r.is_contiguous(), r.is_contiguous(memory_format=torch.channels_last))
                for r in results], results

    def sized(layouts, x):
        return [([st for s, st in zip(x.shape, strides) if s != 1], flags) for strides, *flags in layouts]

    inputs = [
        torch.empty_strided((1, 4, 1, 2), (8, 1, 1, 4)).normal_(),
        torch.empty_strided((4, 4, 1, 4), (16, 1, 1, 4)).normal_().double(),
        torch.randn(2, 1, 3, 4).permute(3, 1, 0, 2),
        torch.randn(1, 3, 1, 5).to(memory_format=torch.channels_last),
        torch.randn(3, 4),
    ]
    others = [torch.tensor(2.0), torch.tensor(3, dtype=torch.int64), torch.tensor(0.5, dtype=torch.float64),
              torch.randn(1, 1), 2.5]
    for x in inputs:
        for half in (False, True):
            for other in others:
                x_in = x.half() if half else x
                dynamo_rs.reset()
                counter = CompileCounter()
                expected_layouts, expected = layouts_of(x_in, other)
                got_layouts, got = dynamo_rs.compile(layouts_of, backend=counter)(x_in, other)
                where = (x_in.shape, x_in.stride(), x_in.dtype, other)
                if isinstance(other, torch.Tensor) and other.dim() == 0:
                    assert got_layouts == expected_layouts, where
                else:
                    assert sized(got_layouts, x_in) == sized(expected_layouts, x_in), where
                    torch._dynamo.reset()
                    assert got_layouts == torch.compile(layouts_of, backend="eager")(x_in, other)[0], where
                for g, e in zip(got, expected):
                    torch.testing.assert_close(g, e)
                assert counter.frame_count == 1
