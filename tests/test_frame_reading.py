"""Code that reads its own frame: `locals()`, `vars()`, `dir()` without arguments, `eval` and
`exec` with their default namespaces, `sys._getframe()`, and a callee reading its caller's
locals through `inspect`. Side by side with TorchDynamo (`language_harness.check_case`);
results must equal eager.

`locals()`, `vars()` and `dir()` are traced (the frame's locals as the trace has them). The
others run at a graph break, where the generated code first puts every local the original
has bound back into its own slot: they raised `KeyError`/`NameError` before (a local the
trace folded to a constant, or one not live after the break, was never stored there), and
they still do under TorchDynamo (asserted: `dynamo_raises`). A frame whose code names such
a function hands every local it has bound on to the rest of the frame at a break, not only
those read again.

Resume functions unbind their arguments once moved into the original slots: `locals()` in
the rest of a split frame shows the original's names only."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)

T34 = t(3, 4)


def _break():
    """A graph break (TorchDynamo's too)."""
    torch._dynamo.graph_break()


# --- locals(), vars(), dir() in the trace ------------------------------------------------------

@case(T34)
def locals_reads_a_folded_constant(x):
    a = 2
    scope = locals()
    return x * scope["a"]
@case(T34, graphs=1, ops=2)  # TorchDynamo runs the frame eagerly
def locals_twice_is_one_dict_refreshed(x):
    a = 2
    first = locals()
    b = x + a
    second = locals()
    return first is second, sorted(first), first["b"] * 2
@case(T34, graphs=1, ops=1)  # TorchDynamo runs the frame eagerly
def locals_with_cells_and_dir(x):
    scale = 3

    def inner(y):
        return y * scale
    names = dir()
    return inner(x), sorted(locals()), names
@case(T34)
def vars_without_arguments(x, *rest, **options):
    y = x + 1
    return {k: v for k, v in vars().items() if k != "y"}, y
@case(T34)
def locals_after_a_del(x):
    tmp = x * 2
    del tmp
    return x + len(locals()), "tmp" in locals()
@case(T34)
def locals_in_an_inlined_function(x):
    def helper(y, k=4):
        z = y * k
        return locals()
    scope = helper(x)
    return sorted(scope), scope["z"]
@case(T34)
def locals_unbound_name_left_out(x):
    if x.shape[0] > 10:
        never = 1  # noqa: F841
    return sorted(locals()), x + 1
@case(T34)
def locals_writes_do_not_reach_the_frame(x):
    a = 1
    locals()["a"] = 5
    return x * a
@case(T34)
def locals_in_a_loop(x):
    seen = []
    for i in range(3):
        seen.append(sorted(locals()))
        x = x + i
    return seen, x
@case(T34)
def locals_in_a_comprehension(x):
    return [sorted(locals()) for _ in range(2)], x + 1
@case(T34)
def locals_in_a_generator(x):
    def scopes():
        step = 1
        yield sorted(locals())
    return list(scopes()), x + 1


class _UsesSuper:
    def method(self, x):
        super().__init__()
        return sorted(locals()), x + 1


@case(T34)
def locals_of_a_method_using_super(x):
    return _UsesSuper().method(x)
@case(T34)
def locals_with_star_arguments_and_keywords(x):
    def inner(a, *rest, k=1, **named):
        return sorted(locals()), a * k, rest, named
    return inner(x, 1, 2, k=3, z=4)
@case(T34)
def locals_items_forwarded_as_kwargs(x):
    def combine(x, scale):
        return x * scale
    scale = 2.5
    return combine(**{k: v for k, v in locals().items() if k in ("x", "scale")})


# --- frame readers at a graph break ----------------------------------------------------------

@case(T34, graphs=1, ops=1, dynamo_raises=NameError)
def eval_of_a_dead_local(x):
    a = 2
    return x * eval("a")
@case(T34, graphs=2, ops=3, dynamo_raises=NameError)
def eval_of_live_locals(x):
    a = x + 1
    b = 3
    c = eval("a * b")
    return c + a + b
@case(T34, graphs=1, ops=1, dynamo_raises=NameError)
def exec_reads_locals(x):
    a = 2
    exec("b = a + 1")
    return x * a
@case(T34, graphs=1, ops=1, dynamo_raises=KeyError)
def getframe_f_locals(x):
    a = 2
    frame = sys._getframe()
    return x * frame.f_locals["a"]


def _peek(name):
    return inspect.currentframe().f_back.f_locals[name]


@case(T34, graphs=1, ops=1, dynamo_raises=KeyError)
def callee_reads_the_callers_locals(x):
    a = 2
    return x * _peek("a")
@case(T34, graphs=2, ops=3, dynamo_raises=KeyError)
def callee_reads_a_rebound_local(x):
    y = x * 2
    y = y + 1
    return _peek("y") - y


# --- resume functions look like the original ---------------------------------------------------

@case(T34)
def locals_after_a_break(x):
    a = x.sum()
    _break()
    return x * a, sorted(locals())
@case(T34)
def locals_after_a_break_with_a_stack_value(x):
    a = x.sum()
    out = [a, _break()]
    return out[0] * x, sorted(locals())


@case(T34)
def locals_views_returned(x):
    a = x.sum()
    _break()
    return x * a, locals().keys()


def test_enough_cases() -> None:
    assert len(CASES) >= 23, len(CASES)


@pytest.fixture(autouse=True)
def fresh():
    reset_all()
    yield
    reset_all()


@pytest.mark.parametrize(("name", "fn", "make", "spec"), params(CASES))
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)
