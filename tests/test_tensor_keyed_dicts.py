"""Dicts the frame makes keyed by tensors — `{p: i for i, p in enumerate(params)}`,
`state[t] = ...`, `torch.func.functional_call`'s tied-tensor maps. A tensor hashes by its
identity, so the trace keys such a dict by a stand-in object per tensor tracker (the one sets
of tensors use) and hands the tensor back wherever Python would: iteration, `popitem`, the
dict rebuilt after the graph. Before, the first tensor used as a key broke the graph.
Side by side with TorchDynamo (`language_harness`)."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


@case(t(3), t(4))
def literal_lookup(x, y):
    d = {x: 1, y: 2}
    return x * d[x] + y.sum() * d[y]


@case(t(3), t(3))
def store_then_lookup(x, y):
    d = {}
    d[x] = y.sin()
    d[y] = x.cos()
    return d[x] + d[y], len(d)


@case(t(3), t(3))
def comprehension_then_items(x, y):
    d = {k: i for i, k in enumerate([x, y, x + 1])}
    out = torch.zeros(3)
    for k, v in d.items():
        out = out + k * v
    return out, len(d), [k.sum() for k in d.keys()]


@case(t(3), t(3))
def get_setdefault_pop_and_membership(x, y):
    d = dict(zip([x, y], [3, 4]))
    found = d.get(x, 0) + d.get(x + 1, 10)
    d.setdefault(y, 7)
    d.setdefault(x * 3, 9)
    popped = d.pop(x)
    return x * found, popped, len(d), x in d, y in d, (x + 1) in d, y not in d.keys()


@case(t(3), t(2))
def fromkeys_then_del(x, y):
    d = dict.fromkeys([x, y, x], 0)
    del d[x]
    return len(d), [k + 1 for k in d]


@case(t(3), t(3))
def live_across_a_graph_break(x, y):
    d = {x: x.sin(), y: y.cos()}
    print("a graph break")
    return d[x] + d[y]


@case(t(3), t(3))
def ordered_dict_reordered(x, y):
    d = collections.OrderedDict()
    d[x] = 1
    d[y] = 2
    d.move_to_end(x)
    k, v = d.popitem(last=False)
    return [key * value for key, value in d.items()], k * v


@case(t(3), t(3))
def defaultdict_of_lists(x, y):
    d = collections.defaultdict(list)
    d[x].append(x.sin())
    d[x].append(x.cos())
    d[y].append(y)
    return [sum(v) for v in d.values()], len(d[x])


@case(t(3), t(3))
def update_and_unpack(x, y):
    d = {x: 1}
    d.update({y: 2})
    e = {**d, x + 1: 3}
    return len(e), [k * v for k, v in e.items()]


@case(t(3), t(3), gap="a KeyError would hold the tensor: the frame runs eagerly, where "
                       "TorchDynamo catches it in the graph")
def missing_key_caught(x, y):
    d = {x: 1}
    try:
        return d[y] * x
    except KeyError:
        return x - 1


class ParamIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x):
        index = {p: i for i, p in enumerate(self.parameters())}
        scale = {p: torch.full_like(p, float(i)) for p, i in index.items()}
        return self.b(self.a(x)) * index[self.b.bias] + scale[self.a.bias]


PARAM_INDEX = ParamIndex()


@case(t(2, 3))
def parameters_as_keys(x):
    return PARAM_INDEX(x)


@case(t(3), t(3))
def tensors_deduplicated_by_identity(x, y):
    seen = {}
    for t_ in [x, y, x, y, x]:
        seen[t_] = seen.get(t_, 0) + 1
    return [k * n for k, n in seen.items()]


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_tensor_keyed_dict(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_returned_dict_is_keyed_by_the_same_tensors():
    """The dict handed back after the graph holds the caller's tensors and the graph's
    outputs as keys — the same objects, as eagerly."""

    def f(x, y):
        d = {x: "x", y * 2: "y2"}
        d[y] = "y"
        return d, y * 2

    dynamo_rs.reset()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    for _ in range(2):
        x, y = torch.randn(3), torch.randn(3)
        d, doubled = compiled(x, y)
        keys = list(d)
        assert keys[0] is x and keys[2] is y
        assert list(d.values()) == ["x", "y2", "y"]
        torch.testing.assert_close(keys[1], doubled)
    assert counter.frame_count == 1


def test_a_tensor_key_in_a_keyword_unpacking_is_an_error_as_eagerly():
    def f(x):
        return dict(**{x: 1})

    x = torch.randn(2)
    with pytest.raises(TypeError):
        f(x)
    dynamo_rs.reset()
    with pytest.raises(TypeError):
        dynamo_rs.compile(f, backend=CompileCounter())(x)
