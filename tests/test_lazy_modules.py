"""Lazy modules (`nn.LazyLinear`, `nn.LazyConv2d`, `nn.LazyBatchNorm1d`, ...) called by a
compiled model before they have parameters. Their first call makes them from the input's
shape (a forward pre-hook); tracing that hook read the uninitialised parameters and the
frame ran eagerly — and stayed eager on every later call. Now the parameters are made when
the trace reaches the call, on the real module from the arguments' shapes, exactly as the
first eager call makes them (same random draws, in the same order), and the module is
traced as the one it became. Compared with eager (outputs, parameters) and TorchDynamo
(graphs, operations)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
from torch import nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU())
        self.fc = nn.LazyLinear(3)

    def forward(self, x):
        return self.fc(self.body(x).flatten(1))


MODELS = {
    "sequential_of_lazy_linears": (
        lambda: nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2)),
        lambda: torch.randn(2, 3)),
    "lazy_module_compiled_itself": (lambda: nn.LazyLinear(5), lambda: torch.randn(3, 7)),
    "conv_batchnorm_linear_in_a_user_module": (Head, lambda: torch.randn(2, 3, 6, 6)),
    "lazy_batchnorm_1d": (
        lambda: nn.Sequential(nn.Linear(3, 4), nn.LazyBatchNorm1d()).eval(),
        lambda: torch.randn(5, 3)),
}


def build(make_model):
    torch.manual_seed(0)
    return make_model()


@pytest.mark.parametrize("name", list(MODELS))
def test_lazy_module_initialised_in_the_trace(name):
    make_model, make_input = MODELS[name]
    torch.manual_seed(1)
    inputs = [make_input() for _ in range(3)]

    eager = build(make_model)
    expected = [eager(x) for x in inputs]

    dynamo_rs.reset()
    ours = CompileCounter()
    model = build(make_model)
    compiled = dynamo_rs.compile(model, backend=ours)
    got = [compiled(x) for x in inputs]

    torch._dynamo.reset()
    theirs = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(build(make_model), backend=theirs)
    for x in inputs:
        reference(x)

    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
    # The same parameters (the same random draws) and the same classes as eagerly.
    assert [type(m) for m in model.modules()] == [type(m) for m in eager.modules()]
    for (key, a), b in zip(eager.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(b, a, msg=key)
    assert (ours.frame_count, ours.op_count) == (theirs.frame_count, theirs.op_count)


def test_an_uncalled_lazy_module_of_the_same_class_stays_lazy_and_is_guarded():
    """Two LazyLinears, the second called only when a flag is set: the first call makes
    only the first one's parameters; setting the flag later recompiles and makes the
    second's, as eagerly."""

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.LazyLinear(3)
            self.b = nn.LazyLinear(3)
            self.use_b = False

        def forward(self, x):
            y = self.a(x)
            return self.b(y) if self.use_b else y

    x = torch.randn(2, 4)

    def run(call, model):
        torch.manual_seed(2)
        first = call(x)
        lazy_after_first = isinstance(model.b, nn.LazyLinear)
        model.use_b = True
        return first, call(x), lazy_after_first

    eager = build(Branchy)
    expected = run(eager, eager)
    dynamo_rs.reset()
    counter = CompileCounter()
    model = build(Branchy)
    got = run(dynamo_rs.compile(model, backend=counter), model)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
    assert got[2] and expected[2]
    assert type(model.b) is nn.Linear
    torch.testing.assert_close(model.b.weight, eager.b.weight)
    assert counter.frame_count == 2
