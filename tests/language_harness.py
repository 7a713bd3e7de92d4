"""The side-by-side harness of the language test modules: each case runs eagerly, with
dynamo_rs.compile and with torch.compile (TorchDynamo), both with a counting backend, in the
same process. The compiled result must equal the eager one; our number of graphs must be
TorchDynamo's (or what the case says), and our number of operations TorchDynamo's unless the
case states its own count because the two legitimately differ."""

from __future__ import annotations

import collections
from typing import Callable

import numpy as np
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter

Case = tuple[str, Callable, Callable, dict]


def case_registrar(cases: list[Case]):
    """A decorator `case(*make_args, graphs=, ops=, expect=, gap=, recompiles=, dynamo_raises=)`
    that appends to `cases` (`recompiles=True`: TorchDynamo is called twice too, as we are;
    `dynamo_raises=Error`: TorchDynamo's result is that wrong error, and the case gives its
    own counts);
    `make_args` are values or callables building fresh arguments per run. `gap="why"` marks
    a case we do not capture as TorchDynamo does yet: a strict expected failure, so the day it
    passes the mark must go."""

    def case(*make_args, graphs="dynamo", ops="dynamo", **extra):
        def register(fn):
            cases.append((fn.__name__, fn,
                          lambda: tuple(a() if callable(a) else a for a in make_args),
                          {"graphs": graphs, "ops": ops, **extra}))
            return fn

        return register

    return case


def t(*shape, dtype=None):
    """A maker of a seeded random tensor of `shape` (the seed follows the shape)."""

    def make():
        g = torch.Generator().manual_seed(sum(shape) + len(shape))
        x = torch.randn(*shape, generator=g)
        return x if dtype is None else x.to(dtype)

    return make


def compare(expected, got):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        torch.testing.assert_close(got, expected, equal_nan=True)
    elif isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected)
        for e, g in zip(expected, got):
            compare(e, g)
    elif isinstance(expected, collections.deque):
        assert type(got) is type(expected) and got.maxlen == expected.maxlen
        compare(list(expected), list(got))
    elif isinstance(expected, dict):
        assert type(got) is type(expected) and list(got) == list(expected)
        for k in expected:
            compare(expected[k], got[k])
    elif isinstance(expected, (set, frozenset)):
        # Tensors in a set hash by identity: the compiled set holds other tensor objects, so
        # its tensors are matched by value, its other elements by equality.
        assert type(got) is type(expected) and len(got) == len(expected)
        tensors = [e for e in got if isinstance(e, torch.Tensor)]
        assert {e for e in got if not isinstance(e, torch.Tensor)} == \
            {e for e in expected if not isinstance(e, torch.Tensor)}
        for e in (e for e in expected if isinstance(e, torch.Tensor)):
            match = next((i for i, g in enumerate(tensors)
                          if g.shape == e.shape and torch.allclose(g, e)), None)
            assert match is not None, e
            del tensors[match]
    elif isinstance(expected, (np.ndarray, np.generic)):
        # A 0-d result is a 0-d array where NumPy gives a scalar (as under TorchDynamo).
        assert isinstance(got, np.ndarray) or type(got) is type(expected), type(got)
        assert np.asarray(got).dtype == np.asarray(expected).dtype
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    else:
        assert got == expected


def params(cases: list[Case]) -> list:
    """`cases` as pytest parameters, known gaps marked as strict expected failures."""
    return [pytest.param(*c, id=c[0], marks=[pytest.mark.xfail(strict=True, reason=c[3]["gap"])]
                         if "gap" in c[3] else []) for c in cases]


def reset_all() -> None:
    dynamo_rs.reset()
    torch._dynamo.reset()


def check_case(fn: Callable, make: Callable, spec: dict) -> None:
    theirs = torch._dynamo.testing.CompileCounter()
    compiled_theirs = torch.compile(fn, backend=theirs)
    if spec.get("dynamo_raises"):
        # TorchDynamo itself gets this wrong (its error is asserted, so the day it is fixed
        # the case says so); the counts are the case's own.
        with pytest.raises(spec["dynamo_raises"]):
            compiled_theirs(*make())
        reference = None
    else:
        reference = compiled_theirs(*make())
    if spec.get("recompiles"):
        # Code that cannot reuse its graph (a class statement makes a new class on every
        # call): TorchDynamo is called twice too, so both count their recompiles.
        compiled_theirs(*make())
    # Code that asks whether it is being compiled answers differently when compiled.
    expected = reference if spec.get("expect") == "compiled" else fn(*make())
    ours = CompileCounter()
    got = dynamo_rs.compile(fn, backend=ours)(*make())
    compare(expected, got)
    # A second call with new inputs of the same kind reuses the graph.
    again = dynamo_rs.compile(fn, backend=ours)
    compare(expected if spec.get("expect") else fn(*make()), again(*make()))
    want_graphs = theirs.frame_count if spec["graphs"] == "dynamo" else spec["graphs"]
    want_ops = (theirs.op_count if spec["ops"] == "dynamo"
                else spec["ops"](theirs.op_count) if callable(spec["ops"]) else spec["ops"])
    assert (ours.frame_count, ours.op_count) == (want_graphs, want_ops)
