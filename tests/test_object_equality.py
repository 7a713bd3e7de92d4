"""`==` and `!=` between objects made in the trace whose class keeps `object`'s equality,
and between them and constants: identity, as Python falls back to it (`node == None`,
`a != b` over instances of a plain class) — these broke the graph at each comparison.
Classes with a Python `__eq__` (dataclasses, user operators) keep theirs
(`test_user_operators.py`). Side by side with TorchDynamo (`language_harness`)."""

from __future__ import annotations

import pytest
import torch

from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


class Node:
    def __init__(self, value):
        self.value = value


class Marker:
    pass


@case(t(4))
def instance_against_none(x):
    n = Node(x)
    if n == None:  # noqa: E711 - the comparison under test
        return x
    if n != None:  # noqa: E711
        return x + 1
    return x - 1


@case(t(4))
def two_instances(x):
    a, b = Node(x), Node(x)
    return x * (1 + (a == b) + 2 * (a != b) + 4 * (a == a) + 8 * (b != b))


@case(t(4))
def instance_against_numbers_and_strings(x):
    m = Marker()
    return x + (m == 0) + (m != "m") * 2 + (0 == m) * 4 + ("m" != m) * 8


@case(t(4))
def in_a_list_of_instances(x):
    nodes = [Node(x), Node(x * 2)]
    first = nodes[0]
    picked = [n.value for n in nodes if n == first]
    others = [n.value for n in nodes if n != first]
    return picked[0] + others[0]


@case(t(4))
def membership_of_an_instance(x):
    a, b = Node(x), Node(x)
    nodes = [a, Node(x)]
    return x + (a in nodes) + 2 * (b in nodes) + 4 * (b not in nodes)


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)
