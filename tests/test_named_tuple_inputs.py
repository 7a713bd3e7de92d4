"""Named tuples given to a compiled function (a batch, a model's output handed to a loss, a
`torch.max(x, dim)` result) are traced as tuples that know their class and field names, as
TorchDynamo traces them: unpacking, iteration, `len`, `sum`, indexing and slicing, field
access, `hasattr`, `_replace`/`_asdict`, methods and properties of subclasses. Classes that
change what a tuple does (their own `__getitem__`, `__iter__`, `__eq__`, a property over a
field, instance attributes) stay objects, read through their own code. Side by side with
TorchDynamo (`language_harness`), then guards: another value, another class, another
length."""

from __future__ import annotations

import collections
import typing

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)

Triple = collections.namedtuple("Triple", "a b c")
Pair = collections.namedtuple("Pair", ["x", "y"], defaults=[None])


class Batch(typing.NamedTuple):
    inputs: torch.Tensor
    target: torch.Tensor
    scale: float = 2.0


class Box(collections.namedtuple("Box", "lo hi")):
    __slots__ = ()

    @property
    def width(self):
        return self.hi - self.lo

    def center(self):
        return (self.lo + self.hi) / 2


class Reversed(collections.namedtuple("Reversed", "a b")):
    """Indexing of its own: not a plain tuple."""
    __slots__ = ()

    def __getitem__(self, i):
        return tuple.__getitem__(self, 1 - i)


class Shadowed(collections.namedtuple("Shadowed", "a b")):
    """A property over a field."""
    __slots__ = ()

    @property
    def a(self):
        return tuple.__getitem__(self, 1) * 10


class WithDict(collections.namedtuple("WithDict", "a b")):
    """Instances keep a `__dict__` (no `__slots__`)."""


def triple():
    return Triple(*(t(3)() + i for i in range(3)))


def with_extra():
    v = WithDict(t(3)(), t(2, 3)())
    v.extra = 3.0
    return v


@case(triple)
def unpack(p):
    a, b, c = p
    return a + b * c


@case(triple)
def unpack_then_hasattr(p):
    a, b, c = p
    if hasattr(p, "b"):
        b = p.b + 1
    if hasattr(p, "missing"):
        b = b * 100
    return a + b + p[2]


@case(triple)
def fields_and_items(p): return p.a * p[1] - p[-1]


@case(triple)
def iterate(p):
    out = 0
    for v in p:
        out = out + v.sin()
    return out


@case(triple)
def sum_len_and_slices(p): return sum(p) * len(p) + sum(p[1:]) - p[:2][0]


# TorchDynamo records `torch.stack(p)` on a named tuple as a node building the tuple in the
# graph, then `stack` of it; ours stacks the items: one op fewer.
@case(triple, ops=lambda theirs: theirs - 1)
def star_args(p): return torch.stack([*p]) + torch.stack(p).mean(0)


@case(triple)
def in_a_comprehension(p): return [v * i for i, v in enumerate(p)]


@case(triple)
def replace_and_asdict(p):
    q = p._replace(b=p.a * 2)
    d = q._asdict()
    return q, d["b"] + d["c"]


@case(triple)
def returned_as_it_is(p): return p


@case(triple)
def rebuilt_with_new_items(p): return Triple(p.c, p.b, p.a + 1)


@case(triple)
def class_queries(p):
    return p.a + (1 if isinstance(p, Triple) else 2) + (3 if type(p) is Triple else 4) \
        + (5 if isinstance(p, tuple) else 6) + len(Triple._fields)


@case(lambda: Pair(t(2, 2)()))
def default_field(p): return p.x + (0 if p.y is None else p.y)


@case(lambda: Batch(t(4, 3)(), t(4, 3)()))
def typing_named_tuple(b): return ((b.inputs - b.target) ** 2).mean() * b.scale


@case(lambda: Box(t(3)(), t(3)() + 2))
def subclass_property_and_method(b): return b.width * b.center() + b.lo


@case(lambda: Reversed(t(3)(), t(2, 3)()))
def own_getitem_is_used(r): return r[0] + r[1].sum() + r.a


# An object: its property runs when the frame is entered, giving the graph its value as an
# input (TorchDynamo inlines the getter: one op more).
@case(lambda: Shadowed(t(3)(), t(3)() + 1), ops=lambda theirs: theirs - 1)
def property_over_a_field(s): return s.a + s.b


@case(with_extra)
def instance_attributes(v): return v.a * v.extra + v[1]


@case(lambda: torch.max(t(3, 4)(), dim=1))
def return_types_given(m):
    values, indices = m
    return values * 2 + indices + m.values.sum()


@case(lambda: Triple(Pair(t(3)(), t(3)()), t(3)(), (t(3)(), 4)))
def nested(p):
    (x, y), b, (c, n) = p
    return x + y * b + c * n + p.a.y


@case(lambda: {"batch": triple(), "step": 3})
def inside_a_dict(d):
    a, b, c = d["batch"]
    return (a + b + c) * d["step"]


@case(triple)
def graph_break_keeps_it(p):
    a = p.a + 1
    print("break", end="")
    return a * p.b + p[2]


# TorchDynamo's `hasattr` runs the property's getter, leaving a dead `sub` in its graph.
@case(lambda: t(3)(), ops=lambda theirs: theirs - 1)
def made_in_the_trace_with_property(x):
    b = Box(x, x * 3)
    return b.width + b.center() + (1 if hasattr(b, "width") else 0)


@case(t(3), lambda: [t(3)()])
def hasattr_of_plain_containers(x, items):
    return x + hasattr(x, "shape") + hasattr((x,), "count") + hasattr(items, "append") \
        + hasattr((x,), "append")


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_guards_follow_the_values():
    def f(p):
        last = p[-1]
        return p[0] * last if last is not None else p[0] + len(p)

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    x = torch.randn(3)
    for value in [Pair(x, x), Pair(x, 2.0), Pair(x), (x, x), Pair(x, x), Triple(x, x, x),
                  Pair(x + 1, 3.0)]:
        expected = f(value)
        torch.testing.assert_close(compiled(value), expected)
    # Another class, another length or None in a field read: each a guard that fails.
    assert 2 <= counter.frame_count <= 6


def test_int_field_becomes_dynamic_as_an_int_argument():
    def f(p):
        return p.x * p.y

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    x = torch.randn(3)
    for n in [1, 2, 3, 4, 5]:
        torch.testing.assert_close(compiled(Pair(x, n)), x * n)
    theirs = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    reference = torch.compile(f, backend=theirs)
    for n in [1, 2, 3, 4, 5]:
        reference(Pair(x, n))
    assert counter.frame_count == theirs.frame_count


def test_an_attribute_set_on_the_instance_later_recompiles():
    def f(v):
        return v.a * 2 + (v.extra if hasattr(v, "extra") else 0)

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    x = torch.randn(3)
    plain = WithDict(x, x)
    torch.testing.assert_close(compiled(plain), f(plain))
    plain.extra = 5.0
    torch.testing.assert_close(compiled(plain), f(plain))
    torch.testing.assert_close(compiled(WithDict(x, x)), f(WithDict(x, x)))
