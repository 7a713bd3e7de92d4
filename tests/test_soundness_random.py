"""Random draws happen in eager's order: a generator, `map` or `filter` run ahead of its
consumer must not draw random numbers Python would draw later (or never), or every later
draw shifts. Each case runs eagerly and compiled from the same seed and compares."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


def genexpr_then_next(x):
    gen = (torch.randn(3) for _ in range(3))
    first = next(gen)
    return first + torch.randn(3) + x


def map_then_next(x):
    draws = map(lambda _: torch.rand(3), range(3))
    return next(iter(draws)) + torch.rand(3) + x


def all_stops_early(x):
    ok = all(torch.rand(()) < 2.0 for _ in range(3)) if x.sum() > 100 else True
    return x + torch.rand(3) if ok else x


def generator_function_then_next(x):
    def noise():
        for _ in range(3):
            yield torch.randn(3)

    return next(noise()) + torch.randn(3) + x


def dropout_in_genexpr_training(x):
    return sum(F.dropout(x * i, 0.5, training=True) for i in range(3)) + torch.rand(3)


CASES = [genexpr_then_next, map_then_next, all_stops_early, generator_function_then_next,
         dropout_in_genexpr_training]


@pytest.mark.parametrize("fn", CASES, ids=[c.__name__ for c in CASES])
def test_random_draws_in_eager_order(fn) -> None:
    x = torch.zeros(3)
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    for seed in (0, 1):
        torch.manual_seed(seed)
        expected = fn(x)
        after_eager = torch.rand(2)
        torch.manual_seed(seed)
        got = compiled(x)
        after_compiled = torch.rand(2)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(after_compiled, after_eager)


def eval_dropout_in_genexpr(x):
    return sum(F.dropout(x * i, 0.5, training=False) for i in range(3))


def test_dropout_off_still_runs_ahead() -> None:
    """Dropout with training=False draws nothing: the generator expression is still traced."""
    counter = CompileCounter()
    x = torch.randn(3)
    torch.testing.assert_close(dynamo_rs.compile(eval_dropout_in_genexpr, backend=counter)(x),
                               eval_dropout_in_genexpr(x))
    assert counter.frame_count == 1
