"""The soundness battery: for every kind of guard check, a program whose compiled code
depends on it; after the first compile, (1) changing the guarded thing must recompile and give
eager's result, (2) changing something next to it that the code does not depend on must
reuse the compiled code and still give eager's result. Each case also shows the check kind
is in the guard (`describe()`), so the case tests the kind it names."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

import dynamo_rs
from dynamo_rs import eval_frame
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)


@dataclass
class Case:
    """`make()` builds fresh state: (function, args). `guarded(args)` and `unrelated(args)`
    change it in place or return new args. `check` is a phrase of the guard's description
    that names the kind."""

    fn: Callable
    make: Callable[[], tuple]
    guarded: Callable[[list], Any]
    unrelated: Callable[[list], Any]
    check: str
    # Frames counted after the guarded change: 2 (one recompile), more where the change makes
    # the new compile split at a graph break (a module call with backward hooks runs eagerly).
    frames_after: int = 2


class Config:
    def __init__(self) -> None:
        self.scale = 2
        self.name = "x"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.ReLU()])
        self.table = {"a": 1, "b": 2}
        self.flags = {1, 2}
        self.gain = 3
        self.unused = 0

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x * self.gain + self.table["a"] + (2 in self.flags)


def by_value(x, cfg):
    return x * cfg.scale


def by_length(x, items):
    total = x
    for item in items:
        total = total + item
    return total


def by_keys(x, table):
    out = x
    for key in table:
        out = out + len(key)
    return out


def by_membership(x, names):
    return x + 1 if "relu" in names else x - 1


def by_hasattr(x, cfg):
    return (x * 2 if hasattr(cfg, "extra") else x) + 1


class Holder(torch.nn.Module):
    """A module the hasattr cases ask about `extra`, which it does not have."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("scale", torch.ones(3))


class Lazy:
    """`extra` is a property that raises AttributeError until `ready` is set."""

    ready = False

    @property
    def extra(self):
        if not self.ready:
            raise AttributeError("extra")
        return 1


def fresh_class_instance():
    return type("Fresh", (Config,), {})()


def by_type(x, holder):
    return x * holder.scale


def tensor_math(x, y):
    return (x @ y.t()).relu()


def in_place(x, y):
    x.add_(1)
    return x + y


def grad_dependent(x, w):
    return (x * w).sum()


def dtype_dependent(x):
    return x + torch.ones(3)


def module_call(model, x):
    return model(x)


def grad_through_module(model, x):
    out = model(x).sum()
    (grad,) = torch.autograd.grad(out, x)
    return grad


def class_method(x, obj):
    return obj.apply(x)


class Applier:
    def apply(self, x):
        return x + 1


def doubled(x):
    return x * 2


def tripled(x):
    return x * 3


DOUBLED_CODE = doubled.__code__


def calls_global_function(x):
    return doubled(x) + 1


MODULE = types.ModuleType("battery_globals")
MODULE.LIMIT = 3
sys.modules["battery_globals"] = MODULE


def reads_module_global(x):
    import battery_globals

    return x * battery_globals.LIMIT


def _swap(args, index, value):
    args = list(args)
    args[index] = value
    return args


CASES = {
    "Equals (attribute value)": Case(
        by_value, lambda: (torch.ones(3), Config()),
        lambda a: setattr(a[1], "scale", 5), lambda a: setattr(a[1], "name", "y"), "== 2"),
    "Len (list length)": Case(
        by_length, lambda: (torch.ones(3), [1, 2]),
        lambda a: a[1].append(3), lambda a: None, "has length 2"),
    "Keys (dict keys)": Case(
        by_keys, lambda: (torch.ones(3), {"a": torch.ones(3), "bb": torch.ones(3)}),
        lambda a: a[1].update(ccc=torch.ones(3)), lambda a: a[1].update(a=torch.zeros(3)),
        "has keys"),
    "Contains (set membership)": Case(
        by_membership, lambda: (torch.ones(3), frozenset({"relu", "gelu"})),
        lambda a: _swap(a, 1, frozenset({"gelu"})), lambda a: _swap(a, 1, frozenset({"gelu", "relu"})),
        "frozenset"),
    "HasAttr (missing attribute)": Case(
        by_hasattr, lambda: (torch.ones(3), Config()),
        lambda a: setattr(a[1], "extra", 1), lambda a: setattr(a[1], "other", 1),
        "has no attribute 'extra'"),
    "HasAttr (module gets a buffer)": Case(
        by_hasattr, lambda: (torch.ones(3), Holder()),
        lambda a: a[1].register_buffer("extra", torch.ones(1)),
        lambda a: a[1].register_buffer("other", torch.ones(1)), "has no attribute 'extra'"),
    "HasAttr (module gets a parameter)": Case(
        by_hasattr, lambda: (torch.ones(3), Holder()),
        lambda a: a[1].register_parameter("extra", torch.nn.Parameter(torch.ones(1))),
        lambda a: a[1].register_parameter("other", torch.nn.Parameter(torch.ones(1))),
        "has no attribute 'extra'"),
    "HasAttr (module gets a submodule)": Case(
        by_hasattr, lambda: (torch.ones(3), Holder()),
        lambda a: a[1].add_module("extra", torch.nn.ReLU()),
        lambda a: a[1].add_module("other", torch.nn.ReLU()), "has no attribute 'extra'"),
    "HasAttr (class gets the attribute)": Case(
        by_hasattr, lambda: (torch.ones(3), fresh_class_instance()),
        lambda a: setattr(type(a[1]), "extra", 1), lambda a: setattr(type(a[1]), "other", 1),
        "has no attribute 'extra'"),
    "HasAttr (property starts answering)": Case(
        by_hasattr, lambda: (torch.ones(3), Lazy()),
        lambda a: setattr(a[1], "ready", True), lambda a: setattr(a[1], "other", 1),
        "has no attribute 'extra'"),
    "Type (object's class)": Case(
        by_type, lambda: (torch.ones(3), Config()),
        lambda a: _swap(a, 1, types.SimpleNamespace(scale=2)), lambda a: _swap(a, 1, Config()),
        "has type Config"),
    "Tensor (shape)": Case(
        tensor_math, lambda: (torch.randn(2, 3), torch.randn(4, 3)),
        lambda a: _swap(a, 0, torch.randn(5, 3)), lambda a: _swap(a, 0, torch.randn(2, 3)),
        "tensor matches"),
    "Tensor (dtype)": Case(
        tensor_math, lambda: (torch.randn(2, 3), torch.randn(4, 3)),
        lambda a: [a[0].double(), a[1].double()], lambda a: None, "tensor matches"),
    "Tensor (stride)": Case(
        tensor_math, lambda: (torch.randn(2, 3), torch.randn(4, 3)),
        lambda a: _swap(a, 1, torch.randn(3, 4).t()), lambda a: None, "tensor matches"),
    "Tensor (requires_grad)": Case(
        grad_dependent, lambda: (torch.randn(3), torch.randn(3)),
        lambda a: _swap(a, 1, a[1].clone().requires_grad_()), lambda a: None, "tensor matches"),
    "Alias (distinct tensors become one)": Case(
        in_place, lambda: (torch.ones(3), torch.ones(3)),
        lambda a: _swap(a, 1, a[0]), lambda a: _swap(a, 1, torch.ones(3)), "tensor matches"),
    "Module structure (_modules)": Case(
        module_call, lambda: (Net(), torch.randn(2, 3)),
        lambda a: a[0].layers.append(torch.nn.Tanh()), lambda a: setattr(a[0], "unused", 5),
        "_modules"),
    "Module constant attribute": Case(
        module_call, lambda: (Net(), torch.randn(2, 3)),
        lambda a: setattr(a[0], "gain", 4), lambda a: setattr(a[0], "unused", 5), "== 3"),
    "Dict item": Case(
        module_call, lambda: (Net(), torch.randn(2, 3)),
        lambda a: a[0].table.__setitem__("a", 9), lambda a: setattr(a[0], "table", {"a": 1, "b": 2}),
        "== 1"),
    "Id (submodule swapped for another class)": Case(
        module_call, lambda: (Net(), torch.randn(2, 3)),
        lambda a: a[0].layers.__setitem__(1, torch.nn.Tanh()),
        lambda a: a[0].layers.__setitem__(1, torch.nn.ReLU()), "has type ReLU"),
    "ClassAttr (method patched on the class)": Case(
        class_method, lambda: (torch.ones(3), Applier()),
        lambda a: setattr(Applier, "apply", lambda self, x: x - 1),
        lambda a: setattr(Applier, "other", 1), "getattr_static"),
    "InstanceDictLacks (method shadowed on the instance)": Case(
        class_method, lambda: (torch.ones(3), Applier()),
        lambda a: setattr(a[1], "apply", lambda x: x * 5),
        lambda a: setattr(a[1], "other", 1), "has no instance attribute 'apply'"),
    "ModuleCall (module forward set on the instance)": Case(
        module_call, lambda: (Net(), torch.randn(2, 3)),
        lambda a: setattr(a[0].layers[0], "forward", lambda x: x - 1),
        lambda a: setattr(a[0].layers[0], "other", 1), "no forward of its own"),
    "Id (code of a called function replaced)": Case(
        calls_global_function, lambda: (torch.ones(3),),
        lambda a: setattr(doubled, "__code__", tripled.__code__),
        lambda a: setattr(doubled, "other", 1), "__code__"),
    "Id (code of an inlined method replaced)": Case(
        class_method, lambda: (torch.ones(3), Applier()),
        lambda a: setattr(Applier.apply, "__code__", (lambda self, x: x - 1).__code__),
        lambda a: setattr(Applier.apply, "other", 1), "__code__"),
    "ModuleCall (forward hook on a submodule)": Case(
        module_call, lambda: (Net(), torch.randn(2, 3)),
        lambda a: a[0].layers[0].register_forward_hook(lambda m, i, o: o * 10),
        lambda a: a[0].layers[0].register_buffer("other", torch.ones(1)), "has no hooks"),
    "ModuleCall (forward pre-hook)": Case(
        module_call, lambda: (Net(), torch.randn(2, 3)),
        lambda a: a[0].layers[0].register_forward_pre_hook(lambda m, i: (i[0] * 3,)),
        lambda a: setattr(a[0].layers[0], "other", 1), "has no hooks"),
    "ModuleCall (full backward hook)": Case(
        grad_through_module, lambda: (Net(), torch.randn(2, 3, requires_grad=True)),
        lambda a: a[0].layers[0].register_full_backward_hook(lambda m, gi, go: (gi[0] * 0,)),
        lambda a: setattr(a[0].layers[0], "other", 1), "has no hooks", frames_after=3),
    "ModuleCall (backward pre-hook)": Case(
        grad_through_module, lambda: (Net(), torch.randn(2, 3, requires_grad=True)),
        lambda a: a[0].layers[0].register_full_backward_pre_hook(lambda m, go: (go[0] * 5,)),
        lambda a: setattr(a[0].layers[0], "other", 1), "has no hooks", frames_after=3),
    "Id (module global through sys.modules)": Case(
        reads_module_global, lambda: (torch.ones(3),),
        lambda a: setattr(MODULE, "LIMIT", 7), lambda a: setattr(MODULE, "OTHER", 7), "LIMIT"),
    "Global state (grad mode)": Case(
        grad_dependent, lambda: (torch.randn(3), torch.randn(3, requires_grad=True)),
        lambda a: torch.set_grad_enabled(False), lambda a: None, "torch.is_grad_enabled()"),
    "Global state (default dtype)": Case(
        dtype_dependent, lambda: (torch.randn(3, dtype=torch.float64),),
        lambda a: torch.set_default_dtype(torch.float64), lambda a: None, "global torch state"),
}


def _call(fn, args):
    out = fn(*args)
    return out.detach() if isinstance(out, torch.Tensor) else out


@pytest.mark.parametrize("which", ["guarded", "unrelated"])
@pytest.mark.parametrize("name", list(CASES))
def test_guard_kind(name, which, monkeypatch) -> None:
    case = CASES[name]
    monkeypatch.setattr(Applier, "apply", Applier.apply)
    monkeypatch.setattr(MODULE, "LIMIT", 3)
    monkeypatch.setattr(doubled, "__code__", DOUBLED_CODE)
    monkeypatch.setattr(Applier.apply, "__code__", Applier.apply.__code__)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(case.fn, backend=counter)
    # Both sides get equal state: the same seed for everything random.
    torch.manual_seed(0)
    eager_args = list(case.make())
    torch.manual_seed(0)
    compiled_args = list(case.make())
    # Three calls before the change: the later ones pass the guard, which then remembers what
    # it read (`guard_frozen`), so the change is met by the remembered fast path too.
    for _ in range(3):
        torch.testing.assert_close(_call(compiled, compiled_args), _call(case.fn, eager_args))
    assert counter.frame_count == 1
    code = case.fn.__code__
    described = "\n".join(line for guard, _ in eval_frame.cache_entries(code)
                          for line in guard.describe())
    if name.startswith(("Module", "Dict", "Id (sub")) or "module forward" in name:
        described += "\n".join(line for guard, _ in eval_frame.cache_entries(Net.forward)
                               for line in guard.describe())
    assert case.check in described, described

    change = case.guarded if which == "guarded" else case.unrelated
    torch.manual_seed(1)
    new_eager = change(eager_args)
    torch.manual_seed(1)
    new_compiled = change(compiled_args)
    if isinstance(new_eager, list):
        eager_args, compiled_args = new_eager, new_compiled
    expected = _call(case.fn, eager_args)
    actual = _call(compiled, compiled_args)
    torch.testing.assert_close(actual, expected)
    if which == "guarded":
        assert counter.frame_count == case.frames_after, "the change must recompile"
    else:
        assert counter.frame_count == 1, "an unrelated change must not recompile"
