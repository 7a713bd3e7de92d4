"""Attributes of functions the frame makes: `functools.wraps` inside a function (it reads
the wrapped function's `__name__`, `__doc__`, `__dict__`, ... and sets them on the wrapper,
with `__wrapped__`), decorators that mark functions (`fn.is_hook = True`), annotations.
Reading or storing any attribute of such a function broke the graph (`pytree.tree_map_only`
among others). Now modelled, and set again on a function handed back after the graph. Side
by side with TorchDynamo (`language_harness`)."""

from __future__ import annotations

import functools

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


def doubled(fn):
    @functools.wraps(fn)
    def inner(*args):
        return fn(*args) * 2

    return inner


def existing_helper(v):
    """Adds one."""
    return v + 1


existing_helper.scale = 3.0


@case(t(3))
def wraps_a_function_made_here(x):
    @doubled
    def g(v):
        "doc of g"
        return v + 1

    return g(x), g.__name__, g.__qualname__, g.__doc__, g.__wrapped__(x)


@case(t(3))
def wraps_an_existing_function(x):
    g = doubled(existing_helper)
    return g(x) * g.scale, g.__name__, g.__doc__, g.__module__


@case(t(3))
def attributes_set_read_and_deleted(x):
    def f(v):
        return v * 2

    f.tag = "hook"
    f.weight = 0.5
    found = hasattr(f, "tag"), hasattr(f, "missing")
    del f.weight
    return f(x) * len(f.tag), found, hasattr(f, "weight"), sorted(f.__dict__)


@case(t(3))
def functions_marked_by_a_decorator(x):
    def mark(fn):
        fn.is_hook = True
        return fn

    @mark
    def first(v):
        return v + 1

    def second(v):
        return v * 3

    out = x
    for fn in [first, second]:
        if getattr(fn, "is_hook", False):
            out = fn(out)
    return out


@case(t(3))
def annotations_read(x):
    def f(v: torch.Tensor, k: int = 2) -> torch.Tensor:
        return v * k

    def g(v):
        return v

    return f(x), f.__annotations__["k"] is int, len(g.__annotations__), f.__defaults__


@case(t(3))
def missing_attribute_caught(x):
    f = lambda v: v  # noqa: E731
    try:
        return f.missing
    except AttributeError:
        return x * 3


@case(t(3))
def names_renamed(x):
    def f(v):
        return v - 1

    f.__name__ = "renamed"
    f.__qualname__ = "Outer.renamed"
    f.__doc__ = "new doc"
    return f(x), f.__name__, f.__qualname__, f.__doc__


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_function_attributes(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_a_wrapped_function_handed_back_keeps_its_attributes():
    def f(x):
        @doubled
        def g(v: torch.Tensor):
            "doc of g"
            return v + 1

        g.tag = "kept"
        return g, x * 2

    x = torch.randn(3)
    expected, _ = f(x)
    dynamo_rs.reset()
    counter = CompileCounter()
    got, _ = dynamo_rs.compile(f, backend=counter)(x)
    for attr in ["__name__", "__qualname__", "__doc__", "__module__", "tag"]:
        assert getattr(got, attr) == getattr(expected, attr), attr
    assert got.__wrapped__.__annotations__ == expected.__wrapped__.__annotations__
    assert set(got.__dict__) == set(expected.__dict__)
    torch.testing.assert_close(got(x), expected(x))
    assert counter.frame_count == 1
