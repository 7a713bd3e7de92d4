"""Dicts that existed before the call keyed by parameters the frame was given —
per-parameter settings (`{p: lr}`), an optimizer's `state` read by the user's code — looked
up with `d[p]`, `p in d` and `d.get(p)`. They ran the whole frame eagerly (the keys guard
compares keys by `==`). A tensor key is found by identity, so the parameter's identity is
guarded (it lives as long as its model) and each value is read through the source
`d[<parameter>]`; a new dict with the same keys reuses the graph. Side by side with
TorchDynamo (`language_harness`), then soundness cases against eager."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all

torch.manual_seed(0)
MODEL = nn.Linear(3, 4)
X = torch.randn(2, 3)
OPTIMIZER = torch.optim.Adam(MODEL.parameters(), lr=0.01)
MODEL(X).sum().backward()
OPTIMIZER.step()

CASES: list = []
case = case_registrar(CASES)


@case(lambda: MODEL, lambda: {MODEL.weight: 0.1, MODEL.bias: 0.5}, X)
def per_parameter_scale(m, scales, x):
    out = m(x)
    for p in m.parameters():
        out = out + scales[p] * p.sum()
    return out


@case(lambda: MODEL, lambda: {MODEL.weight: 1}, X)
def membership(m, marked, x):
    return [p in marked for p in m.parameters()], m(x)


@case(lambda: MODEL, lambda: {MODEL.bias: 1.5}, X)
def get_with_a_default(m, scales, x):
    return sum(scales.get(p, 2.0) for p in m.parameters()) * x


@case(lambda: MODEL, lambda: collections.OrderedDict([(MODEL.weight, "decay"), (MODEL.bias, "none")]), X)
def ordered_dict_of_groups(m, groups, x):
    out = x
    for p in m.parameters():
        if groups[p] == "decay":
            out = out + p.norm()
    return out


@case(OPTIMIZER, X)
def optimizer_state_read(opt, x):
    p = opt.param_groups[0]["params"][0]
    state = opt.state[p]
    return x + state["exp_avg"].sum() + state["step"]


@case(lambda: MODEL, lambda: {MODEL.weight: torch.ones(4, 3)}, X)
def tensor_values(m, masks, x):
    return m(x) + (m.weight * masks.get(m.weight, 0)).sum()


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_existing_tensor_keyed_dicts(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def _lookup(d, p, x):
    if p in d:
        return x + d[p]
    return x - d.get(p, 1)


def _parameters():
    return nn.Parameter(torch.ones(1)), nn.Parameter(torch.ones(1))


def test_answers_follow_the_keys_and_values():
    reset_all()
    a, b = _parameters()
    x = torch.arange(3.0)
    compiled = dynamo_rs.compile(_lookup, backend=CompileCounter())
    with torch.no_grad():
        for d, p in [({a: 5.0}, a), ({a: 5.0}, b), ({b: 7.0}, b), ({b: 7.0}, a),
                     ({a: 6.0}, a), ({a: torch.tensor(3.0)}, a), ({a: 2.0, b: 3.0}, b)]:
            torch.testing.assert_close(compiled(d, p, x), _lookup(d, p, x))
        assert not dynamo_rs.explain(_lookup)({a: 5.0}, a, x).eager_frames


def _changed_through_lookup(d, p, x):
    d[p].add_(1)
    return x + d[p].sum()


def test_a_value_changed_in_place_is_the_dicts():
    reset_all()
    a, _ = _parameters()
    ours, theirs = {a: torch.zeros(3)}, {a: torch.zeros(3)}
    x = torch.arange(3.0)
    got = dynamo_rs.compile(_changed_through_lookup, backend=CompileCounter())(ours, a, x)
    torch.testing.assert_close(got, _changed_through_lookup(theirs, a, x))
    torch.testing.assert_close(ours[a], theirs[a])


def _len_and_lookup(d, p, x):
    return x * len(d) + d[p]


def test_other_uses_of_the_dict_guard_its_identity():
    reset_all()
    a, b = _parameters()
    x = torch.arange(3.0)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(_len_and_lookup, backend=counter)
    for d in [{a: 1.0}, {a: 1.0, b: 2.0}, {a: 4.0}]:
        torch.testing.assert_close(compiled(d, a, x), _len_and_lookup(d, a, x))
