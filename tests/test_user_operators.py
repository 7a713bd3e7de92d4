"""Operators on objects whose class defines them in Python, side by side with TorchDynamo.

`a + b` of two objects made in the trace raised "an object made while tracing used as a
Python value" and ran the frame eagerly: vector, quantity and autograd-like classes written
in Python (`Variable(a) * Variable(b)`), dataclasses compared with `<`, `-v`, `v += w`. The
methods are now inlined as Python dispatches them (left, then reflected; a subclass's
reflected method first; `NotImplemented` passes on; `!=` from `__eq__`; in-place methods
before the plain ones). Also here: `reversed(list)` over a list appended to inside the loop
(read by position, as Python's reversed iterator does), and a compiled function whose inputs
hold tensors only inside plain objects (torch.compile always traces the function it is
given)."""

from __future__ import annotations

import dataclasses
import functools
import operator

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)
T4 = t(4)
T4B = t(2, 2)


class Vec:
    def __init__(self, value):
        self.value = value

    def __add__(self, other):
        if isinstance(other, Vec):
            return Vec(self.value + other.value)
        if isinstance(other, (int, float, torch.Tensor)):
            return Vec(self.value + other)
        return NotImplemented

    def __radd__(self, other):
        return Vec(other + self.value)

    def __sub__(self, other):
        return Vec(self.value - other.value)

    def __mul__(self, other):
        if isinstance(other, Vec):
            return Vec(self.value * other.value)
        return Vec(self.value * other)

    def __rmul__(self, other):
        return Vec(other * self.value)

    def __truediv__(self, other):
        return Vec(self.value / other)

    def __matmul__(self, other):
        return Vec(self.value @ other.value)

    def __neg__(self):
        return Vec(-self.value)

    def __pos__(self):
        return self

    def __pow__(self, k):
        return Vec(self.value**k)


class Acc:
    """In-place `+=` changing itself."""

    def __init__(self, value):
        self.value = value
        self.steps = 0

    def __iadd__(self, other):
        self.value = self.value + other
        self.steps += 1
        return self


class Scaled(Vec):
    def __radd__(self, other):
        return Scaled(other.value * 10 + self.value)


class Meters:
    def __init__(self, v):
        self.v = v

    def __add__(self, other):
        if not isinstance(other, Meters):
            return NotImplemented
        return Meters(self.v + other.v)


class Feet:
    def __init__(self, v):
        self.v = v

    def __radd__(self, other):
        if isinstance(other, Meters):
            return Meters(other.v + self.v * 0.3048)
        return NotImplemented


class Ranked:
    def __init__(self, rank, value):
        self.rank, self.value = rank, value

    def __lt__(self, other):
        return self.rank < other.rank

    def __eq__(self, other):
        return isinstance(other, Ranked) and self.rank == other.rank


@dataclasses.dataclass(order=True)
class Priority:
    level: int
    name: str


class Bits:
    def __init__(self, n):
        self.n = n

    def __and__(self, o):
        return Bits(self.n & o.n)

    def __or__(self, o):
        return Bits(self.n | o.n)

    def __xor__(self, o):
        return Bits(self.n ^ o.n)

    def __lshift__(self, k):
        return Bits(self.n << k)

    def __invert__(self):
        return Bits(~self.n)


@case(T4, T4)
def add_two_objects(a, b):
    return (Vec(a) + Vec(b)).value


@case(T4, T4)
def expression_of_objects(a, b):
    x, y = Vec(a), Vec(b)
    return (x * y + x - y / 2).value


@case(T4)
def reflected_multiply_by_a_number(a):
    return (2.5 * Vec(a)).value


@case(T4, T4)
def tensor_on_the_left_uses_the_reflected_method(a, b):
    return (b + Vec(a)).value


@case(T4)
def object_plus_a_number(a):
    return (Vec(a) + 3).value


@case(T4)
def unary_minus_and_plus(a):
    v = Vec(a)
    return (-v).value + (+v).value


@case(T4)
def power(a):
    return (Vec(a) ** 2).value


@case(T4B, T4B)
def matrix_multiply(a, b):
    return (Vec(a) @ Vec(b)).value


@case(T4, T4)
def not_implemented_passes_to_the_reflected_method(a, b):
    return (Meters(a) + Feet(b)).v


@case(T4, T4)
def subclass_reflected_method_goes_first(a, b):
    return (Vec(a) + Scaled(b)).value


# TorchDynamo breaks the graph at the second `+=` (2 graphs).
@case(T4, T4, graphs=1)
def in_place_method_changes_the_object(a, b):
    acc = Acc(a)
    acc += b
    acc += b
    return acc.value * acc.steps


@case(T4, T4)
def in_place_without_its_method_uses_the_plain_one(a, b):
    v = Vec(a)
    w = v
    v += Vec(b)
    return v.value, w.value


@case(T4)
def comparison_by_rank(a):
    low, high = Ranked(1, a), Ranked(2, a * 2)
    return (high.value if low < high else low.value), (low > high)


@case(T4)
def equality_and_derived_inequality(a):
    x, y = Ranked(1, a), Ranked(1, a + 1)
    return a * (x == y) + (x != y)


@case(T4)
def dataclass_ordering(a):
    first, second = Priority(1, "b"), Priority(1, "c")
    return a * 2 if first < second else a


@case(T4)
def bit_operators(a):
    b = (Bits(12) & Bits(10)) | (Bits(1) << 4)
    return a * (b ^ Bits(3)).n + (~Bits(0)).n


@case(T4, T4)
def reduce_with_operator_add(a, b):
    return functools.reduce(operator.add, [Vec(a), Vec(b), Vec(a)]).value


@case(T4, T4)
def sum_with_an_object_start(a, b):
    return sum([Vec(a), Vec(b)], Vec(torch.zeros(4))).value


@case(T4, T4)
def existing_objects_added(a, b):
    return (_EXISTING_A + _EXISTING_B).value * a + b


_EXISTING_A = Vec(torch.ones(4))
_EXISTING_B = Vec(torch.full((4,), 2.0))


# --- reversed(list) over a list that grows inside the loop ------------------------------------
@case(T4)
def reversed_list_appended_to_in_the_loop(a):
    tape = [a, a * 2]
    out = []
    for item in reversed(tape):
        tape.append(item + 1)
        out.append(item)
    return out, len(tape)


@case(T4)
def reversed_list_shrunk_in_the_loop(a):
    items = [a, a + 1, a + 2, a + 3]
    seen = []
    for item in reversed(items):
        seen.append(item)
        items.pop()
        items.pop()
    return seen


@case(T4)
def reversed_list_item_replaced_ahead(a):
    items = [a, a + 1, a + 2]
    seen = []
    for item in reversed(items):
        items[0] = a * 10
        seen.append(item)
    return seen


@pytest.fixture(autouse=True)
def _fresh():
    reset_all()
    yield
    reset_all()


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)


# --- a compiled function whose tensors are inside plain objects --------------------------------
_tape: list = []


class Variable:
    def __init__(self, value):
        self.value = value

    def __add__(self, other):
        out = Variable(self.value + other.value)
        _tape.append(("add", self, other, out))
        return out

    def __mul__(self, other):
        out = Variable(self.value * other.value)
        _tape.append(("mul", self, other, out))
        return out


def _simple(a, b):
    return (a + b) * b


def test_function_given_objects_holding_tensors_is_traced():
    # Nothing of torch's among the frame's inputs or globals, yet it is the function given
    # to compile: traced, as torch.compile does (one graph of two operations), the tape
    # appended to as eagerly.
    a, b = Variable(torch.ones(3)), Variable(torch.full((3,), 2.0))
    _tape.clear()
    expected = _simple(a, b).value
    eager_tape = [entry[0] for entry in _tape]
    _tape.clear()
    theirs = torch._dynamo.testing.CompileCounter()
    torch.compile(_simple, backend=theirs)(a, b)
    _tape.clear()
    ours = CompileCounter()
    got = dynamo_rs.compile(_simple, backend=ours)(a, b).value
    torch.testing.assert_close(got, expected)
    assert [entry[0] for entry in _tape] == eager_tape
    assert (ours.frame_count, ours.op_count) == (theirs.frame_count, theirs.op_count) == (1, 2)
