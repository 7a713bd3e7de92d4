"""Modules of user classes made in `forward` (transformers' `ACT2FN[name]` makes a
`GELUActivation()` on every lookup): the construction is traced on a stand-in, then made for
real at trace time, so the compiled code no longer makes the module on each call. That is
right only when making it changes nothing else and what it holds follows from guarded values.
Each test changes one of those things between calls and compares with eager; the cases where
the construction must stay in eager code check that it still runs once per call."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo_rs
from dynamo_rs.testing import CompileCounter

pytestmark = pytest.mark.usefixtures("reset_compilers")


def compiled(fn):
    counter = CompileCounter()
    return dynamo_rs.compile(fn, backend=counter), counter


CONFIG = {"act": "gelu", "scale": 2.0}
MADE: list = []
TABLE = [1.0]


class ConfiguredAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = F.gelu if CONFIG["act"] == "gelu" else F.relu
        self.scale = CONFIG["scale"]

    def forward(self, x):
        return self.act(x) * self.scale


class CountedAct(nn.Module):
    def __init__(self):
        super().__init__()
        MADE.append(type(self).__name__)  # an effect outside the new module

    def forward(self, x):
        return x * len(MADE)


class HoldsTable(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = TABLE  # a mutable object: its contents are not guarded through the module

    def forward(self, x):
        return x * self.table[0]


class Replaceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 1.0

    def forward(self, x):
        return x + self.k


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x):
        return x + self.offset


class WithLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x)


class Checked(nn.Module):
    def __init__(self, n):
        super().__init__()
        if n < 0:
            raise ValueError("n must not be negative")
        self.n = n

    def forward(self, x):
        return x * self.n


class CustomSetattr(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 2.0

    def __setattr__(self, name, value):
        MADE.append(name)
        super().__setattr__(name, value)

    def forward(self, x):
        return x * self.k


def test_a_user_module_made_in_forward_is_one_graph() -> None:
    def fn(x):
        return ConfiguredAct()(x) + 1

    compiled_fn, counter = compiled(fn)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled_fn(x), fn(x))
    torch.testing.assert_close(compiled_fn(x), fn(x))
    assert (counter.frame_count, counter.op_count) == (1, 3)


def test_a_changed_global_read_by_init_recompiles() -> None:
    def fn(x):
        return ConfiguredAct()(x)

    compiled_fn, counter = compiled(fn)
    x = torch.randn(3, 4)
    try:
        for act, scale in [("gelu", 2.0), ("relu", 2.0), ("relu", 0.5), ("gelu", 2.0)]:
            CONFIG.update(act=act, scale=scale)
            torch.testing.assert_close(compiled_fn(x), fn(x))
    finally:
        CONFIG.update(act="gelu", scale=2.0)
    assert counter.frame_count >= 3


def test_init_with_an_effect_elsewhere_runs_every_call() -> None:
    def fn(x):
        return CountedAct()(x)

    compiled_fn, _ = compiled(fn)
    x = torch.ones(2)
    MADE.clear()
    eager = [fn(x) for _ in range(3)]
    MADE.clear()
    got = [compiled_fn(x) for _ in range(3)]
    assert MADE == ["CountedAct"] * 3
    for e, g in zip(eager, got):
        torch.testing.assert_close(g, e)


def test_a_mutable_object_kept_by_the_module_is_read_each_call() -> None:
    def fn(x):
        return HoldsTable()(x)

    compiled_fn, _ = compiled(fn)
    x = torch.ones(2)
    try:
        for value in (1.0, 3.0, -2.0):
            TABLE[0] = value
            torch.testing.assert_close(compiled_fn(x), fn(x))
    finally:
        TABLE[0] = 1.0


def test_a_replaced_init_recompiles() -> None:
    def fn(x):
        return Replaceable()(x)

    compiled_fn, _ = compiled(fn)
    x = torch.zeros(2)
    original = Replaceable.__init__
    torch.testing.assert_close(compiled_fn(x), fn(x))

    def other_init(self):
        nn.Module.__init__(self)
        self.k = 5.0

    Replaceable.__init__ = other_init
    try:
        torch.testing.assert_close(compiled_fn(x), fn(x))
        assert compiled_fn(x)[0].item() == 5.0
        # The code replaced in place, the function kept.
        other_init.__code__ = (lambda self: (nn.Module.__init__(self), setattr(self, "k", 7.0))
                               and None).__code__
        torch.testing.assert_close(compiled_fn(x), fn(x))
    finally:
        Replaceable.__init__ = original


@pytest.mark.parametrize("cls", [WithBuffer, WithLayer], ids=["buffer", "layer"])
def test_modules_with_state_run_as_eager(cls) -> None:
    def fn(x):
        torch.manual_seed(0)
        return cls()(x)

    compiled_fn, _ = compiled(fn)
    x = torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(compiled_fn(x), fn(x))
        # The generator is where eager leaves it.
        torch.testing.assert_close(torch.rand(2), (torch.manual_seed(0), cls(), torch.rand(2))[2])


def test_init_raising_is_caught_as_in_eager() -> None:
    def fn(x, n):
        try:
            return Checked(n)(x)
        except ValueError:
            return x - 1

    compiled_fn, _ = compiled(fn)
    x = torch.randn(3)
    for n in (2, -1, 3):
        torch.testing.assert_close(compiled_fn(x, n), fn(x, n))


def test_a_class_with_its_own_setattr_runs_it_every_call() -> None:
    def fn(x):
        return CustomSetattr()(x)

    compiled_fn, _ = compiled(fn)
    x = torch.ones(2)
    MADE.clear()
    for _ in range(2):
        torch.testing.assert_close(compiled_fn(x), fn(x))
    assert MADE.count("k") == 4  # twice per call pair: compiled and eager


def test_a_module_registration_hook_sees_every_construction() -> None:
    seen = []

    def hook(module, name, submodule):
        seen.append(name)

    class WithChild(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x)

    def fn(x):
        return WithChild()(x)

    compiled_fn, _ = compiled(fn)
    x = torch.randn(3)
    handle = nn.modules.module.register_module_module_registration_hook(hook)
    try:
        for _ in range(2):
            torch.testing.assert_close(compiled_fn(x), fn(x))
    finally:
        handle.remove()
    assert seen == ["act"] * 4


def test_the_module_is_private_to_the_trace() -> None:
    """A module made in the frame and returned (or stored) leaves the trace: the frame still
    hands back a module of its own, a new one per call, as eager."""

    def fn(x):
        m = ConfiguredAct()
        return m(x), m

    compiled_fn, _ = compiled(fn)
    x = torch.randn(3)
    (y1, m1), (y2, m2) = compiled_fn(x), compiled_fn(x)
    torch.testing.assert_close(y1, fn(x)[0])
    assert isinstance(m1, ConfiguredAct) and m1 is not m2


@pytest.mark.parametrize("make", [ConfiguredAct, lambda: nn.Softmax(dim=-1)],
                         ids=["user class", "torch.nn"])
def test_a_module_live_at_a_graph_break_is_made_again(make, capsys) -> None:
    def fn(x):
        m = make()
        alias = m
        y = m(x) + 1
        print("break")
        return alias(y), m, alias

    compiled_fn, counter = compiled(fn)
    x = torch.randn(3)
    seen = []
    for _ in range(2):
        got, expected = compiled_fn(x), fn(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] is got[2] and type(got[1]) is type(expected[1])
        seen.append(got[1])
    assert seen[0] is not seen[1]  # a new module per call, as in eager
    assert counter.frame_count == 2


def test_a_module_changed_after_it_was_made_is_not_made_again() -> None:
    def fn(x):
        m = ConfiguredAct()
        m.scale = 7.0
        return m

    compiled_fn, _ = compiled(fn)
    x = torch.randn(3)
    got = compiled_fn(x)
    assert got.scale == 7.0 and got is not compiled_fn(x)
    torch.testing.assert_close(got(x), fn(x)(x))


class KeepsFunction(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class KeepsOwnMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = self.double

    def double(self, x):
        return x * 2

    def forward(self, x):
        return self.act(x)


def _user_activation(x):
    return x + 1


def test_functions_kept_by_the_module_follow_code_changes() -> None:
    """A Python function kept as an attribute (read without a guard through the module) is not
    taken as fixed; the module's own method is guarded through its class, code included."""

    def keeps_function(x):
        return KeepsFunction(_user_activation)(x)

    def keeps_torch_function(x):
        return KeepsFunction(F.relu)(x)

    def keeps_own_method(x):
        return KeepsOwnMethod()(x)

    x = torch.randn(3)
    compiled_fns = [compiled(f)[0] for f in (keeps_function, keeps_torch_function, keeps_own_method)]
    for fn, compiled_fn in zip((keeps_function, keeps_torch_function, keeps_own_method), compiled_fns):
        torch.testing.assert_close(compiled_fn(x), fn(x))
    original_code = _user_activation.__code__
    original_double = KeepsOwnMethod.double.__code__
    try:
        _user_activation.__code__ = (lambda x: x - 10).__code__
        KeepsOwnMethod.double.__code__ = (lambda self, x: x * -3).__code__
        for fn, compiled_fn in zip((keeps_function, keeps_torch_function, keeps_own_method),
                                   compiled_fns):
            torch.testing.assert_close(compiled_fn(x), fn(x))
    finally:
        _user_activation.__code__ = original_code
        KeepsOwnMethod.double.__code__ = original_double
