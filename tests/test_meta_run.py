"""Operations answered by running their kernels on meta (`dynamo_rs._meta_run`) against
FakeTensorMode, over random layouts (contiguous, permuted, sliced, expanded, channels-last),
dtypes and arguments: sizes, strides, offset, dtype, device, requires_grad and aliasing must
be FakeTensorMode's (`_rule_check`); and what must stay with FakeTensorMode (data-dependent
calls, in-place forms, `out=`, tensors that need gradients) is declined."""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from dynamo_rs import _meta_rules, _rule_check
from test_meta_rules import DTYPES, Tally, random_shape, strided

SEEDS = pytest.mark.parametrize("seed", range(int(os.environ.get("DYNAMO_RS_META_SEEDS", "1"))))
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _cases(rng: random.Random):
    """(target, args, kwargs) calls of every kind the module lists, made inside the mode."""
    shape = random_shape(rng, ndim=rng.randint(1, 4))
    dim = rng.randrange(len(shape))
    x = strided(rng, shape, rng.choice(FLOATS))
    anything = strided(rng, shape, rng.choice(DTYPES))
    mask = strided(rng, shape, torch.bool)
    square = strided(rng, shape[:-2] + [rng.randint(1, 5), rng.randint(1, 5)], rng.choice(FLOATS)) \
        if len(shape) >= 2 else strided(rng, [3, 4])
    b, i, j, k = (rng.randint(1, 4) for _ in range(4))
    lhs = strided(rng, [b, i, j], torch.float32)
    rhs = strided(rng, [b, j, k], torch.float32)
    quad = strided(rng, [b, 1, i, j], torch.float32)
    yield torch.einsum, ("bij,bjk->bik", lhs, rhs), {}
    yield torch.einsum, ("bcxd,bcyd->bcxy", quad, quad), {}
    yield torch.einsum, ("bij->bji", lhs), {}  # a view of its operand
    yield torch.einsum, ("bij,bij->b", lhs, lhs), {}
    yield torch.einsum, ("bij,bjk->bik", (lhs, rhs)), {}
    for name in ("flip",):
        dims = sorted(rng.sample(range(len(shape)), rng.randint(1, len(shape))))
        yield torch.flip, (anything, dims), {}
        yield name, (anything, dims), {}
    diagonal = rng.randint(-2, 2)
    yield rng.choice([torch.tril, torch.triu]), (square,), {"diagonal": diagonal}
    yield rng.choice(["tril", "triu"]), (square, diagonal), {}
    yield rng.choice([torch.cumsum, "cumsum"]), (anything, dim), rng.choice([{}, {"dtype": torch.float64}])
    other = strided(rng, shape, x.dtype)
    yield rng.choice([torch.where, "where"]), (mask, x, other), {}
    yield torch.where, (mask, x, rng.choice([0.0, -3.4e38])), {}
    with_scalar = torch.empty((), dtype=torch.float32)
    yield torch.where, (mask, with_scalar, rng.choice([1.0, -1.0])), {}
    yield rng.choice([torch.masked_fill, "masked_fill"]), (x, mask, rng.choice([0.0, float("-inf")])), {}
    like = rng.choice([torch.full_like, torch.zeros_like, torch.ones_like, torch.empty_like])
    extra = (rng.choice([-1.0, 2]),) if like is torch.full_like else ()
    yield like, (x, *extra), rng.choice([{}, {"dtype": torch.float64}, {"memory_format": torch.contiguous_format}])
    yield rng.choice([torch.roll, "roll"]), (anything, rng.randint(-3, 3), dim), {}
    reduction = rng.choice([torch.any, torch.all, "any", "all"])
    yield reduction, (strided(rng, shape, torch.bool), *rng.choice([(), (dim,)])), {}
    for op in (torch.sum, "sum", torch.amax, "amax", torch.amin, torch.prod, torch.logsumexp, "logsumexp"):
        if op in (torch.prod, torch.logsumexp, "logsumexp"):
            yield op, (x, dim), rng.choice([{}, {"keepdim": True}])
        else:
            yield op, (x, rng.choice([dim, [dim]])), rng.choice([{}, {"keepdim": True}])
    yield rng.choice([torch.var, torch.std, "var", "std"]), (x.float(), dim), rng.choice([{}, {"correction": 0}])
    yield torch.stack, ([x, strided(rng, shape, x.dtype)],), {"dim": rng.randint(0, len(shape))}
    yield rng.choice([torch.minimum, torch.maximum, "minimum", "maximum"]), (x, strided(rng, shape, x.dtype)), {}
    yield rng.choice([torch.lerp, "lerp"]), (x, strided(rng, shape, x.dtype), 0.5), {}
    yield torch.addcmul, (x, strided(rng, shape, x.dtype), strided(rng, shape, x.dtype)), {"value": 0.5}
    yield rng.choice([torch.log_softmax, F.log_softmax, "log_softmax"]), (x, dim), {}
    for unary in [torch.abs, torch.sign, torch.log, torch.log1p, torch.expm1, torch.erf, torch.floor,
                  torch.ceil, torch.round, torch.trunc, torch.square, torch.reciprocal, torch.tan,
                  torch.atan, torch.sinh, torch.cosh, F.softplus, F.elu, F.mish, F.logsigmoid,
                  "abs", "sign", "log", "erf", "floor", "square", "reciprocal", "clamp_min"]:
        yield unary, (x, 0.0) if unary == "clamp_min" else (x,), {}
    yield rng.choice(["type_as"]), (anything, x), {}
    yield rng.choice(["bool", "int", "long"]), (anything,), {}
    yield "repeat", (x, *[rng.randint(1, 2) for _ in range(len(shape) + rng.randint(0, 1))]), {}
    yield "expand_as", (strided(rng, [1] * len(shape), x.dtype), x), {}
    yield "narrow", (x, dim, 0, shape[dim]), {}
    yield "movedim", (x, dim, 0), {}
    yield "squeeze", (x, *rng.choice([(), (dim,)])), {}
    yield "norm", (x.float(),), rng.choice([{}, {"dim": dim}, {"p": 1, "dim": dim, "keepdim": True}])
    if len(shape) >= 2:
        yield "diagonal", (x,), {}
        yield "swapaxes", (x, 0, len(shape) - 1), {}
    if len(shape) == 4:
        yield F.pixel_shuffle, (strided(rng, [shape[0], 4 * shape[1], shape[2], shape[3]]), 2), {}
        yield F.glu, (strided(rng, shape[:3] + [2 * shape[3]]),), {}
    yield "as_strided", (x, x.shape, x.stride()), {}
    yield torch.baddbmm, (strided(rng, [b, i, k]), lhs, rhs), {}
    yield torch.outer, (strided(rng, [i]), strided(rng, [k])), {}


def _sweep(rng: random.Random, make_cases, rounds: int):
    """Runs `rounds` batches of `make_cases(rng)` through the rules, each checked against
    FakeTensorMode; returns the tally, the operations met and those answered at least once."""
    tally = Tally()
    targets, answered = set(), set()
    with torch.no_grad():
        for _ in range(rounds):
            mode = FakeTensorMode()
            with mode:
                cases = list(make_cases(rng))
            for target, args, kwargs in cases:
                name = target if isinstance(target, str) else target.__name__
                targets.add(name)
                before = tally.answered
                tally.run(mode, target, args, kwargs)
                if tally.answered > before:
                    answered.add(name)
    assert not _rule_check.mismatches, _rule_check.mismatches[:5]
    return tally, targets, answered


@SEEDS
def test_every_listed_operation_matches_fake_tensor_mode(seed):
    tally, targets, answered = _sweep(random.Random(3 + 1000 * seed), _cases, 60)
    # Every operation is answered for some layouts (size-1 dimensions are often declined).
    assert len(targets) > 60 and answered == targets, targets - answered
    assert tally.answered > 0.4 * (tally.answered + tally.declined), (tally.answered, tally.declined)


def _layer_cases(rng: random.Random):
    """Layers whose own rule declines some layouts (or dtypes), run on meta instead; batch
    sizes of 1 and size-1 dimensions often."""
    def r(low=1, high=4):
        return rng.randint(low, high)

    b, c, h, w, length = r(1, 2), r(), r(2, 6), r(2, 6), r()
    x4 = strided(rng, [b, c, h, w], rng.choice(FLOATS[:2]))
    yield F.layer_norm, (strided(rng, [b, length, c]), [c], torch.empty(c), torch.empty(c)), {}
    yield F.layer_norm, (x4, [w]), {}
    yield F.batch_norm, (x4, torch.empty(c, dtype=x4.dtype), torch.empty(c, dtype=x4.dtype)), {}
    yield F.adaptive_avg_pool2d, (x4, rng.choice([1, (1, 1), 2])), {}
    yield F.avg_pool2d, (x4, 2), rng.choice([{}, {"stride": 1}, {"ceil_mode": True}])
    yield F.max_pool2d, (x4, 2), rng.choice([{}, {"stride": 1, "padding": 1}, {"ceil_mode": True}])
    yield torch.roll, (x4,), {"shifts": (1, -1), "dims": (2, 3)}
    yield torch.matmul, (strided(rng, [b, length, c]), strided(rng, [c, r()])), {}
    yield F.group_norm, (x4, 1), {}
    yield torch.repeat_interleave, (x4, 2), {"dim": rng.randrange(4)}
    yield "mean", (x4, rng.choice([-1, (2, 3), 1])), rng.choice([{}, {"keepdim": True}])
    yield "expand_as", (strided(rng, [b, c, 1, 1], x4.dtype), x4), {}
    yield torch.swapaxes, (x4, 1, 2), {}
    yield "clone", (x4,), {}
    yield F.unfold, (x4, 2), {}
    yield F.pad, (x4, rng.choice([(1, 1), (0, 0, -1, 1), (2, -1)])), {}


@SEEDS
def test_layers_their_rules_decline_match_fake_tensor_mode(seed):
    _, targets, answered = _sweep(random.Random(5 + 1000 * seed), _layer_cases, 80)
    assert answered == targets, targets - answered


def test_what_stays_with_fake_tensor_mode():
    mode = FakeTensorMode()
    with mode:
        x = torch.empty(3, 4)
        mask = torch.empty(3, 4, dtype=torch.bool)
        grad = torch.empty(3, 4, requires_grad=True)
        out = torch.empty(3, 4)
    declined = [
        (torch.where, (mask,), {}),  # nonzero: data-dependent
        ("where", (mask,), {}),
        (torch.cumsum, (x, 0), {"out": out}),
        (torch.full_like, (x, 1.0), {"device": "cpu"}),
        ("masked_fill_", (x, mask, 0.0), {}),
        (torch.flip, (grad, [0]), {}),  # an autograd graph to record
    ]
    with torch.enable_grad():
        for target, args, kwargs in declined:
            assert _meta_rules.infer(mode, target, args, kwargs) is None, target
    # A symbolic size or a tensor of another fake mode: declined too.
    other = FakeTensorMode()
    with other:
        y = torch.empty(3, 4)
    assert _meta_rules.infer(mode, torch.flip, (y, [0]), {}) is None


def test_bad_input_raises_torchs_own_error():
    """A call the kernels reject is left to FakeTensorMode, which raises as eager does."""
    mode = FakeTensorMode()
    with mode:
        a, b = torch.empty(2, 3, 4), torch.empty(2, 5, 6)
    assert _meta_rules.infer(mode, torch.einsum, ("bij,bjk->bik", a, b), {}) is None
    with pytest.raises(RuntimeError), mode:
        torch.einsum("bij,bjk->bik", a, b)


def _constants(mode):
    """Constant fakes (FakeTensorMode's `constant`) of several dtypes, made by FakeTensorMode."""
    with mode:
        return [torch.tensor(3), torch.tensor(2.5), torch.tensor(True), torch.tensor(-4, dtype=torch.int32),
                torch.tensor(1.5, dtype=torch.float16), torch.div(512, 256, rounding_mode="trunc")]


def test_tensors_of_python_numbers_are_constants_as_in_fake_tensor_mode():
    tally = Tally()
    mode = FakeTensorMode()
    for data, kwargs in [(3, {}), (2.5, {}), (True, {}), ([], {}), ([[1.0]], {}), ([1, 2, 3], {}),
                         ((4, 5.5), {}), (7, {"dtype": torch.float64}), ([], {"dtype": torch.int64})]:
        tally.run(mode, torch.tensor, (data,), kwargs)
    assert tally.answered == 9 and not _rule_check.mismatches


def test_arithmetic_on_constants_matches_fake_tensor_mode():
    """Constant propagation: every pairing of constants and numbers under every arithmetic
    operation gives FakeTensorMode's result, value included (`_rule_check` compares it)."""
    import operator

    mode = FakeTensorMode()
    constants = _constants(mode)
    numbers = [1, 3, 0.5, -2, True]
    binary = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
              torch.add, torch.sub, torch.mul, torch.div, torch.floor_divide, torch.remainder,
              "add", "sub", "mul", "div", "remainder"]
    calls = [(operator.neg, (a,), {}) for a in constants if a.dtype != torch.bool]
    for op in binary:
        for a in constants:
            for b in [*numbers, *constants]:
                calls.append((op, (a, b), {}))
                if not isinstance(op, str):
                    calls.append((op, (b, a), {}))
    # Torch functions of numbers only make constants too.
    calls += [(torch.div, (512, 256), {"rounding_mode": "trunc"}), (torch.div, (7, 2), {}),
              (torch.div, (7, 2), {"rounding_mode": "floor"}), (torch.add, (3, 4), {}), (torch.mul, (2.5, 4), {})]
    answered = 0
    with torch.no_grad():
        for op, args, kwargs in calls:
            ours = _meta_rules.infer(mode, op, args, kwargs)
            if ours is not None:
                answered += 1
                _rule_check.check(mode, op, args, kwargs, ours)
                continue
            # Declined only where torch refuses the call (bool subtraction, a bool divisor).
            with pytest.raises((RuntimeError, NotImplementedError, ZeroDivisionError)), mode:
                getattr(args[0], op)(*args[1:], **kwargs) if isinstance(op, str) else op(*args, **kwargs)
    assert not _rule_check.mismatches, _rule_check.mismatches[:3]
    assert answered > 0.9 * len(calls)


def test_constant_sizes_are_read_as_their_values():
    tally = Tally()
    mode = FakeTensorMode()
    with mode:
        n = torch.div(512, 256, rounding_mode="trunc")  # 2
        x = torch.empty(8, 512, 16)
        y = torch.empty(4, 1)
    with torch.no_grad():
        tally.run(mode, "view", (x, 8, n, 256, 16))
        tally.run(mode, "reshape", (x, n, -1, 16))
        tally.run(mode, torch.reshape, (x, (n, -1)))
        tally.run(mode, "new_zeros", (x, (8, n, 3)))
        tally.run(mode, "new_ones", (x, [n, n]))
        tally.run(mode, "expand", (y, 4, n))
        tally.run(mode, "repeat", (x, n, 1, 1))
    assert tally.answered == 7 and not _rule_check.mismatches


def test_constants_in_a_compiled_function_match_eager_and_torchdynamo():
    import torch._dynamo
    import torch._dynamo.testing

    import dynamo_rs
    from dynamo_rs.testing import CompileCounter

    def fn(x, window: int):
        chunks = torch.div(x.shape[1], window, rounding_mode="trunc")
        scale = torch.tensor(x.shape[-1]) ** -0.5
        halves = x.view(x.shape[0], chunks, window, -1) * scale
        count = chunks - 1
        out = halves.new_zeros((x.shape[0], count, 3))
        return halves.sum(2), out, x.reshape(chunks, -1).mean() / torch.tensor(2.0)

    x = torch.randn(2, 8, 6)
    expected = fn(x, 4)
    ours, theirs = CompileCounter(), torch._dynamo.testing.CompileCounter()
    dynamo_rs.reset()
    got = dynamo_rs.compile(fn, backend=ours)(x, 4)
    torch._dynamo.reset()
    torch.compile(fn, backend=theirs)(x, 4)
    for e, g in zip(expected, got):
        assert torch.allclose(e, g)
    assert ours.frame_count == theirs.frame_count


def _constant_written_through_a_view(x, k):
    c = torch.tensor(2)
    v = c.view(1)
    v.add_(1)  # a constant written by a constant: still known (3)
    return x.view(-1, c) * 2


def _constant_written_by_a_tensor(x, k):
    c = torch.tensor(2)
    v = c.view(1)
    v.add_(k)  # written by a value the trace does not know: no longer a constant
    return x.view(-1, c) * 2


def _constant_from_arithmetic_written(x, k):
    c = torch.tensor(4) // 2
    c.mul_(3)
    return x.reshape(c, -1) + 1


@pytest.mark.parametrize("fn", [_constant_written_through_a_view, _constant_written_by_a_tensor,
                                _constant_from_arithmetic_written])
def test_constants_changed_in_place_match_eager(fn):
    import dynamo_rs

    x, k = torch.randn(12), torch.tensor([1])
    expected = fn(x, k)
    dynamo_rs.reset()
    got = dynamo_rs.compile(fn, backend="eager")(x, k)
    assert got.shape == expected.shape and torch.equal(got, expected)
