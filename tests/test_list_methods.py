"""`list.remove` in traced code — it broke the graph wherever it was called (a common way
to drop a name from a list of keys, a module from a list of candidates). Now the first item
that is or equals the value goes, found by Python's own `list.index` on the values; a value
not there raises `ValueError` the code may catch; a list the frame was given is changed in
place (replayed after the graph). Lists of tensors still break the graph (a tensor's `==`
is elementwise). Side by side with TorchDynamo (`language_harness`)."""

from __future__ import annotations

import pytest
import torch

from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


@case(t(3))
def remove_a_name(x):
    keys = ["q", "k", "v", "k"]
    keys.remove("k")
    return x * len(keys), keys


@case(t(3))
def remove_equal_across_types(x):
    values = [2, 1.0, True, 1]
    values.remove(1)
    return x + len(values), values


@case(t(3))
def remove_missing_caught(x):
    values = [1, 2]
    try:
        values.remove(5)
    except ValueError:
        return x - 1, values
    return x, values


@case(lambda: ["a", "b", "c"], t(3))
def remove_from_a_list_given_to_the_frame(names, x):
    names.remove("b")
    return x * len(names), names


@case(t(3))
def remove_in_a_loop(x):
    pending = [0, 1, 2, 3, 4]
    out = x
    for i in [1, 3]:
        pending.remove(i)
        out = out + len(pending)
    return out, pending


@case(t(3), t(3))
def remove_the_first_tensor(x, y):
    tensors = [x, y]
    tensors.remove(x)
    return tensors[0] * 2


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_list_methods(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)
