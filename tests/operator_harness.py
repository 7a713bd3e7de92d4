"""Shared checks of the tests of higher-order operators and transforms (`test_loops.py`,
`test_vmap.py`, `test_func_grad.py`): each case runs eagerly, under torch.compile and under
dynamo_rs.compile with a counting backend; values must equal eager's, and graphs and
operations TorchDynamo's."""

from __future__ import annotations

import warnings
from typing import Callable

import torch
import torch._dynamo.testing

import dynamo_rs


def seeded_inputs(shapes, seed: int = 1) -> list:
    """Random tensors of `shapes`, the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


def flat_values(value) -> list:
    """The leaves of a result (tensors, numbers), dicts by sorted key."""
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in flat_values(value[k])]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat_values(v)]
    return [value]


def assert_same_values(got, expected) -> None:
    for g, e in zip(flat_values(got), flat_values(expected), strict=True):
        torch.testing.assert_close(g, e)


def check_against_torchdynamo(fn: Callable, run: Callable, backend: str,
                              after_each: Callable = lambda: None):
    """`run(f, seed)` calls `f` on inputs of that seed; returns (ours, theirs, compiled) after
    checking values against eager for two seeds (`after_each` after every compiled call)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch._dynamo.testing.CompileCounterWithBackend(backend)
        run(torch.compile(fn, backend=theirs), 1)
        ours = torch._dynamo.testing.CompileCounterWithBackend(backend)
        compiled = dynamo_rs.compile(fn, backend=ours)
        for seed in (1, 2):
            assert_same_values(run(compiled, seed), run(fn, seed))
            after_each()
    assert ours.op_count == theirs.op_count
    assert not compiled._dynamo_rs_converter.failures
    return ours, theirs, compiled
