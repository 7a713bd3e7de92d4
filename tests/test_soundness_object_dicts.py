"""Stores the frame makes into an existing object's own dicts — its `__dict__`, a module's
hook tables — read back in the same frame. The trace changes a tracker of the dict and
replays the change after the graph; reads that went to the real object (an attribute read,
the check for hooks before a module call) saw the old contents: `m.__dict__["training"] =
False` then `m.training` read True, and a hook stored into `m._forward_hooks` did not run.
Each case runs on fresh objects eagerly and compiled: results, and the objects afterwards,
must be equal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter


def times_ten(module, args, output):
    return output * 10


def add_one_to_input(module, args):
    return (args[0] + 1,)


class WithProperty:
    def __init__(self):
        self.hidden = 2.0

    @property
    def scale(self):
        return self.hidden


class Plain:
    shared = 4.0

    def __init__(self):
        self.scale = 3.0


def module_training_flag(state, x):
    state["m"][0].__dict__["training"] = False
    return state["m"](x) * state["m"][0].training


def plain_object_attribute(state, x):
    state["obj"].__dict__["scale"] = 5.0
    return x * state["obj"].scale


def plain_object_attribute_removed(state, x):
    del state["obj"].__dict__["scale"]
    return x * getattr(state["obj"], "scale", -1.0)


def class_attribute_shadowed(state, x):
    state["obj"].__dict__["shared"] = 6.0
    return x * state["obj"].shared


def property_not_shadowed(state, x):
    state["prop"].__dict__["scale"] = 9.0
    return x * state["prop"].scale


def forward_hook_stored(state, x):
    state["m"]._forward_hooks[1000] = times_ten
    y = state["m"](x)
    del state["m"]._forward_hooks[1000]
    return y


def forward_pre_hook_stored_on_a_child(state, x):
    state["m"][0]._forward_pre_hooks[1000] = add_one_to_input
    return state["m"](x)


def forward_hook_removed(state, x):
    hooks = state["hooked"]._forward_hooks
    for key in list(hooks):
        del hooks[key]
    return state["hooked"](x)


CASES = [module_training_flag, plain_object_attribute, plain_object_attribute_removed,
         class_attribute_shadowed, property_not_shadowed, forward_hook_stored,
         forward_pre_hook_stored_on_a_child, forward_hook_removed]


def fresh_state():
    torch.manual_seed(0)
    hooked = nn.Linear(3, 3)
    hooked.register_forward_hook(times_ten)
    return {"m": nn.Sequential(nn.Linear(3, 3), nn.ReLU()), "obj": Plain(),
            "prop": WithProperty(), "hooked": hooked}


def snapshot(state):
    """What a later call could observe of the objects."""
    return (
        [(type(m).__name__, m.training, sorted(map(str, m._forward_hooks)),
          sorted(map(str, m._forward_pre_hooks))) for m in state["m"].modules()],
        dict(vars(state["obj"])), dict(vars(state["prop"])),
        len(state["hooked"]._forward_hooks),
    )


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_stores_into_an_objects_dicts_are_read_back(fn):
    x = torch.randn(2, 3)
    eager_state = fresh_state()
    expected = fn(eager_state, x)
    dynamo_rs.reset()
    state = fresh_state()
    got = dynamo_rs.compile(fn, backend=CompileCounter())(state, x)
    torch.testing.assert_close(got, expected)
    assert snapshot(state) == snapshot(eager_state)


class Delegating(nn.Module):
    """A module whose `__getattr__` answers names itself before `nn.Module`'s."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def __getattr__(self, name):
        if name == "weight":
            return super().__getattr__("inner").weight
        return super().__getattr__(name)


def test_a_module_with_its_own_getattr_is_asked_after_a_table_store():
    """A parameter stored into the tables of a module whose class overrides `__getattr__`:
    reading the name runs that `__getattr__`, as eagerly (it does not find the table)."""

    def f(m, x, w):
        m._parameters["weight"] = w
        return x @ m.weight.t()

    x, w = torch.randn(2, 3), torch.randn(3, 3)
    torch.manual_seed(0)
    eager_module = Delegating()
    expected = f(eager_module, x, w)
    torch.manual_seed(0)
    module = Delegating()
    dynamo_rs.reset()
    got = dynamo_rs.compile(f, backend=CompileCounter())(module, x, w)
    torch.testing.assert_close(got, expected)
    assert module._parameters["weight"] is w
