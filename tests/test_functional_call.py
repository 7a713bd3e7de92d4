"""`torch.func.functional_call` and the stores it is made of: a module's parameters,
buffers or submodules swapped in its `_parameters`/`_buffers`/`_modules` dicts for one call
and swapped back. The module's attribute reads (`self.weight` in `forward`) and the
iteration of its children read what the trace stored — before, they read the real dicts,
which keep the old entries until the stores are replayed after the graph: a wrong result.
`functional_call` itself broke the graph (its `NamedMemberAccessor`, a pure-Python torch
helper class, was refused like torch's own internals). Side by side with TorchDynamo
(`language_harness`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)

torch.manual_seed(0)
LINEAR = nn.Linear(3, 2)
NET = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)).eval()
OTHER = nn.Linear(3, 3)
STACK = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


TIED = Tied()


class InnerStep(nn.Module):
    """One step of a MAML-style inner loop: the loss with the module's own parameters,
    then the output with adapted ones."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 3)

    def forward(self, x, y):
        params = dict(self.net.named_parameters())
        loss = functional_call(self.net, params, (x,)).pow(2).mean()
        fast = {k: v - 0.1 * v for k, v in params.items()}
        return functional_call(self.net, fast, (y,)), loss


INNER = InnerStep()


@case(t(4, 3), t(2, 3))
def replace_one_parameter(x, w):
    return functional_call(LINEAR, {"weight": w}, (x,))


@case(t(4, 3), t(2, 3), t(2))
def replace_all_parameters(x, w, b):
    return functional_call(LINEAR, {"weight": w, "bias": b}, x)


@case(t(4, 3))
def parameters_computed_in_the_frame(x):
    params = {k: v * 2 for k, v in NET.named_parameters()}
    return functional_call(NET, params, (x,))


@case(t(4, 3))
def parameters_and_buffers_strict(x):
    params = dict(NET.named_parameters())
    buffers = {k: v.clone() for k, v in NET.named_buffers()}
    return functional_call(NET, (params, buffers), (x,), strict=True)


@case(t(2, 3), t(3, 3))
def tied_weights_follow(x, w):
    return functional_call(TIED, {"a.weight": w}, (x,))


@case(t(2, 3), t(3, 3))
def tied_weights_untied(x, w):
    return functional_call(TIED, {"a.weight": w}, (x,), tie_weights=False)


@case(t(4, 3), t(2))
def keyword_arguments(x, b):
    return functional_call(LINEAR, {"bias": b}, args=(), kwargs={"input": x})


@case(t(2, 3), t(2, 3))
def inner_loop_step(x, y):
    return INNER(x, y)


@case(t(4, 3), t(2, 3))
def parameters_dict_swapped_by_hand(x, w):
    old = LINEAR._parameters["weight"]
    LINEAR._parameters["weight"] = w
    try:
        return LINEAR(x)
    finally:
        LINEAR._parameters["weight"] = old


@case(t(2, 3))
def submodule_swapped_by_hand(x):
    old = STACK._modules["0"]
    STACK._modules["0"] = OTHER
    y = STACK(x)
    STACK._modules["0"] = old
    return y + STACK(x)


@case(t(2, 3), t(3))
def buffer_swapped_by_hand(x, s):
    NET[1]._buffers["running_mean"], old = s.abs()[:1].expand(4), NET[1]._buffers["running_mean"]
    y = NET(x)
    NET[1]._buffers["running_mean"] = old
    return y


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_functional_call(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def fresh_stack():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))


@pytest.mark.parametrize("change", ["parameter", "submodule", "removed_bias"])
def test_lasting_changes_to_module_tables_are_read_back_and_kept(change):
    """A change that stays after the call: later reads in the frame see it, and the module
    ends as eagerly (compared entry by entry)."""

    replacement = nn.Linear(3, 3)

    def f(m, x):
        y = m(x)
        if change == "parameter":
            m[0]._parameters["bias"] = nn.Parameter(torch.ones(3))
        elif change == "submodule":
            m._modules["0"] = replacement
        else:
            m[2]._parameters["bias"] = None
        return y + m(x)

    x = torch.randn(2, 3)
    eager_module, compiled_module = fresh_stack(), fresh_stack()
    expected = f(eager_module, x)
    dynamo_rs.reset()
    got = dynamo_rs.compile(f, backend=CompileCounter())(compiled_module, x)
    torch.testing.assert_close(got, expected)
    assert list(eager_module.state_dict()) == list(compiled_module.state_dict())
    for (name, a), b in zip(eager_module.state_dict().items(), compiled_module.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    assert (compiled_module[0] is replacement) == (change == "submodule")


def test_gradients_through_functional_call_equal_eager():
    def f(x, w, b):
        return functional_call(LINEAR, {"weight": w, "bias": b}, (x,)).square().sum()

    x = torch.randn(4, 3)
    w1, b1 = torch.randn(2, 3, requires_grad=True), torch.randn(2, requires_grad=True)
    w2, b2 = w1.detach().clone().requires_grad_(), b1.detach().clone().requires_grad_()
    f(x, w1, b1).backward()
    dynamo_rs.reset()
    counter = CompileCounter()
    dynamo_rs.compile(f, backend=counter)(x, w2, b2).backward()
    torch.testing.assert_close(w2.grad, w1.grad)
    torch.testing.assert_close(b2.grad, b1.grad)
    assert counter.frame_count == 1
    assert LINEAR.weight.grad is None
