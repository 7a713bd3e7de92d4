"""Iterating objects whose class defines `__iter__` in Python — `nn.ParameterList`,
`nn.ParameterDict`, user collections (a generator method, `iter(self._items)`, a
`yield from`), made in the frame or passed in — side by side with TorchDynamo (one graph
each, where the frame ran eagerly before: "iterating over a ParameterList object"). Also:
a ParameterList appended to after the first call recompiles and matches eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)

T4 = t(4)
T34 = t(3, 4)


class Params(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(4, generator=g)) for _ in range(3)])
        self.pd = nn.ParameterDict({"a": nn.Parameter(torch.ones(4)), "b": nn.Parameter(torch.full((4,), 2.0))})


PARAMS = Params()


@case(T4)
def parameter_list_for(x):
    for p in PARAMS.ps:
        x = x * p
    return x


@case(T4)
def parameter_list_enumerate(x):
    out = x
    for i, p in enumerate(PARAMS.ps):
        out = out + p * i
    return out


@case(T4)
def parameter_list_zip_and_list(x):
    ps = list(PARAMS.ps)
    return [a * b + x for a, b in zip(ps, reversed(ps))]


@case(T4)
def parameter_list_sum_of_generator(x):
    return sum(p.sum() for p in PARAMS.ps) + x


@case(T4)
def parameter_dict_items(x):
    for name, p in PARAMS.pd.items():
        x = x + p if name == "a" else x * p
    return x


@case(T4)
def parameter_dict_values_and_keys(x):
    return sum(PARAMS.pd.values()) * x, sorted(PARAMS.pd.keys())


@case(T4)
def parameter_dict_for(x):
    for name in PARAMS.pd:
        x = x + PARAMS.pd[name]
    return x


class Bag:
    """A user collection iterated through a generator method."""

    def __init__(self, *items):
        self._items = list(items)

    def __iter__(self):
        for item in self._items:
            yield item


class ListIter:
    def __init__(self, *items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


class YieldFrom:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __iter__(self):
        yield from (self.a, self.b)
        yield self.a * self.b


BAG = Bag(1.0, 2.0, 3.0)


@case(T4)
def user_generator_iter_of_global(x):
    for k in BAG:
        x = x * k
    return x


@case(T4)
def user_generator_iter_made_in_frame(x):
    return [y + 1 for y in Bag(x, x * 2)]


@case(T4)
def user_iter_returning_iterator(x):
    a, b = ListIter(x.sin(), x.cos())
    return a + b


@case(T4)
def user_yield_from_iter(x):
    return tuple(YieldFrom(x, x + 1))


@case(T34)
def user_iter_in_max_and_sorted(x):
    sizes = ListIter(3, 1, 2)
    return x * max(sizes) + min(sizes), sorted(sizes)


@case(T4)
def user_iters_in_builtins(x):
    bag = Bag(x, x + 1, x * 2)
    pairs = list(zip(bag, ListIter(1, 2, 3)))
    doubled = list(map(lambda t: t * 2, bag))
    kept = list(filter(lambda t: t is not None, bag))
    return sum(bag), pairs, doubled, kept, any(ListIter(0, 1)), all(ListIter(1, 0))


@case(T4)
def parameter_list_in_builtins(x):
    return sum(PARAMS.ps) * x, sorted(p.shape[0] for p in PARAMS.ps), len(tuple(PARAMS.ps))


@pytest.fixture(autouse=True)
def fresh_caches():
    reset_all()
    yield


# `__iter__()`/`__next__()` called by name on what the trace holds: as `iter()`/`next()`
# (they were run on the real object, leaving an iterator the trace could not hand on).


@case(T4)
def range_dunder_iter_then_next(x):
    it = range(3).__iter__()
    return x + next(it) + next(it)


@case(T4)
def list_dunder_iter_and_dunder_next(x):
    it = [1, 2, 3].__iter__()
    return x + next(it) + it.__next__() * 10


@case(T4)
def tuple_of_tensors_dunder_iter(x):
    pair = (x, x + 1)
    return [v * 2 for v in pair.__iter__()]


@case(T4)
def iterator_dunder_iter_is_itself(x):
    it = iter([x, x * 2, x * 3])
    first = next(it)
    return [first] + [v + 1 for v in it.__iter__()]


@pytest.mark.parametrize(("name", "fn", "make", "spec"), params(CASES))
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)


def test_parameter_list_appended_after_compiling() -> None:
    model = Params()

    def fn(x):
        for p in model.ps:
            x = x * p
        return x

    x = torch.randn(4)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    torch.testing.assert_close(compiled(x), fn(x))
    model.ps.append(nn.Parameter(torch.full((4,), 3.0)))
    torch.testing.assert_close(compiled(x), fn(x))
    assert counter.frame_count == 2, "a fourth parameter is another graph"
    # A parameter replaced by another of the same shape is another input of the same graph.
    model.ps[0] = nn.Parameter(torch.zeros(4))
    torch.testing.assert_close(compiled(x), fn(x))
    torch.testing.assert_close(compiled(x), fn(x))
    assert counter.frame_count == 2


def test_user_iter_replaced_on_the_class_recompiles() -> None:
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def __iter__(self):
            return iter((self.a, self.b))

    pair = Pair(torch.ones(2), torch.full((2,), 3.0))

    def fn(x):
        return [x * v for v in pair]

    x = torch.randn(2)
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    torch.testing.assert_close(compiled(x), fn(x))
    Pair.__iter__ = lambda self: iter((self.b, self.a, self.b))
    torch.testing.assert_close(compiled(x), fn(x))
