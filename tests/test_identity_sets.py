"""Sets the trace makes that hold objects compared by identity — modules, plain instances —
without tying the compiled code to those objects. `Module.named_modules()`, `modules()`,
`parameters()`, `children()` keep a `memo` set of the modules they visited; a function given
a module (a training step, an EMA update, a regulariser) was compiled again for every new
module of the same architecture, and ran eagerly after the recompile limit, where
TorchDynamo reuses its graph. What `in`, `add`, `discard` and `len` answer depends only on
which of the objects are one object, and that is what is guarded now; iterating such a set,
popping from it or handing it on sees the objects themselves, and guards their identity."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


@case(net, t(2, 3))
def parameters_of_a_module_argument(m, x):
    return m(x) + sum(p.sum() for p in m.parameters())


@case(net, t(2, 3))
def named_parameters_of_a_module_argument(m, x):
    return m(x) * len([n for n, _ in m.named_parameters()])


@case(net, t(2, 3))
def modules_and_children(m, x):
    return m(x) + len(list(m.modules())) + len(list(m.children()))


@case(net, t(2, 3))
def named_modules_names(m, x):
    return m(x), [name for name, _ in m.named_modules()]


@case(net, t(2, 3))
def buffers_of_a_module_argument(m, x):
    return m(x) + len(list(m.buffers()))


@case(net, net, t(2, 3))
def ema_of_two_module_arguments(ema, model, x):
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
    return ema(x)


@case(net, t(2, 3))
def seen_set_of_modules(m, x):
    seen = set()
    out = x
    for layer in [m[0], m[1], m[0]]:
        if layer in seen:
            continue
        seen.add(layer)
        out = out + layer.__class__.__name__.__len__()
    return out, len(seen)


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_identity_sets(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


# Soundness: the same code called with objects arranged differently (one object twice,
# then two objects) must answer as eagerly, compiling again where the answer changes.

def _one_or_two(p, q, x):
    s = {p}
    return x + 1, q in s, len({p, q})


def _add_discard(p, q, x):
    s = set()
    s.add(p)
    s.add(q)
    s.discard(p)
    return x + len(s), p in s, q in s


def _comprehension(ms, x):
    return x + len({m for m in ms})


def _constants_beside(p, x):
    s = {"a", 1, p}
    return x + len(s), p in s, "a" in s


def _iterated(p, q, x):
    out = x
    for m in {p, q}:
        out = m(out)
    return out


def _returned(p, q, x):
    return x + 1, {p, q}


def _popped(p, x):
    return {p}.pop()(x)


def _union(p, q, x):
    s = {p} | {q}
    return x + len(s), p in s


def _lin():
    return nn.Linear(2, 2)


@pytest.mark.parametrize("fn,arrangements", [
    (_one_or_two, ["aa", "ab", "bb", "ba"]),
    (_add_discard, ["ab", "aa", "ba", "bb"]),
    (_constants_beside, ["a", "b"]),
    (_iterated, ["ab", "ba", "aa"]),
    (_returned, ["ab", "ba", "aa"]),
    (_popped, ["a", "b"]),
    (_union, ["ab", "aa", "ba"]),
], ids=lambda v: v.__name__ if callable(v) else "-".join(v))
def test_answers_follow_the_arrangement(fn, arrangements):
    reset_all()
    torch.manual_seed(0)
    objects = {"a": _lin(), "b": _lin()}
    x = torch.randn(2)
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    for arrangement in arrangements:
        args = [objects[k] for k in arrangement]
        expected, got = fn(*args, x), compiled(*args, x)
        if isinstance(expected, torch.Tensor):
            expected, got = (expected,), (got,)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:], arrangement


def test_a_list_of_modules_arranged_differently():
    reset_all()
    a, b = _lin(), _lin()
    x = torch.randn(2)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(_comprehension, backend=counter)
    for ms in ([a, b, a], [a, a, a], [b, a, b], [_lin(), _lin(), _lin()], [b, b, b]):
        torch.testing.assert_close(compiled(ms, x), _comprehension(ms, x))
    # Three arrangements: one object first and last, one object three times, three objects.
    assert counter.frame_count == 3


def test_new_modules_reuse_the_graph():
    """The family's point: a function given a new module of the same architecture on every
    call compiles once (it compiled per module, and ran eagerly after the 8th)."""
    reset_all()
    counter = CompileCounter()

    def regularised(m, x):
        return m(x).sum() + 1e-3 * sum(p.pow(2).sum() for p in m.parameters())

    compiled = dynamo_rs.compile(regularised, backend=counter)
    x = torch.randn(2, 3)
    for _ in range(10):
        m = net()
        torch.testing.assert_close(compiled(m, x), regularised(m, x))
    assert counter.frame_count == 1
