"""The verification of shape rules (`_meta_rules`, `_symbolic_rules`) against FakeTensorMode,
run on every answer when `config.verify_meta_rules` is on (the whole test suite, the fuzzer):
the same sizes, strides, offset, dtype, device, requires_grad and aliasing, and no guard
FakeTensorMode records that the rule did not (or that does not follow from what it did)."""

from __future__ import annotations

import contextlib

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from dynamo_rs._meta_rules import NO_VALUE


#: Every disagreement `check` found, kept for the test suite (which fails on any).
mismatches: list[str] = []


def check(mode: FakeTensorMode, target, args, kwargs, ours) -> None:
    """Raises AssertionError unless `ours` describes what FakeTensorMode gives (the frame
    then falls back, as for any internal failure) and records the difference."""
    env = mode.shape_env
    recorded = None if env is None else (len(env.guards), len(env.replacements))
    knowledge_before = None if env is None else (dict(env.var_to_range), dict(env.axioms))
    # The reference is computed as `run_fake` would without rules: a call on symbolic values
    # through torch's Python decompositions.
    from dynamo_rs._symbolic_rules import all_static
    from torch._dispatch.python import enable_python_dispatcher

    symbolic = getattr(mode, "dynamo_rs_symbolic", False) and not all_static(args, kwargs)
    with mode, (enable_python_dispatcher() if symbolic else contextlib.nullcontext()):
        if isinstance(target, str):
            reference = getattr(args[0], target)(*args[1:], **kwargs)
        else:
            reference = target(*args, **kwargs)
    if env is not None and (len(env.guards), len(env.replacements)) != recorded:
        # A rule records no more than its answer relies on: if FakeTensorMode needed more (a
        # guard, a replacement of one symbol by another), the rule's answer may not hold
        # for every size the graph will serve — unless what it recorded follows from what
        # the rule did.
        extra = _not_implied_before(env, recorded[0], *knowledge_before)
        if extra or len(env.replacements) != recorded[1]:
            _mismatch(target, f"FakeTensorMode recorded guards the rule did not: {extra}")

    if ours is NO_VALUE or reference is None:
        if ours is not NO_VALUE or reference is not None:
            _mismatch(target, f"ours {ours!r}, torch {reference!r}")
        return
    if isinstance(ours, tuple) != isinstance(reference, tuple) or (
            isinstance(ours, tuple) and len(ours) != len(reference)
        ):
        _mismatch(target, f"ours {ours!r}, torch {reference!r}")
    pairs = zip(ours, reference) if isinstance(ours, tuple) else [(ours, reference)]

    def describe(t):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        # Symbolic sizes compare as sympy expressions (structurally): comparing SymInts
        # with == would record guards.
        return {
            "sizes": tuple(map(_expr, t.shape)), "strides": tuple(map(_expr, t.stride())),
            "offset": _expr(t.storage_offset()),
            "dtype": t.dtype, "device": t.device, "requires_grad": t.requires_grad,
            "is an argument": [t is a for a in tensors],
            "shares storage with": [t.untyped_storage()._cdata == a.untyped_storage()._cdata for a in tensors],
            "constant": None if getattr(t, "constant", None) is None else (t.constant.dtype, t.constant.tolist()),
        }

    for mine, theirs in pairs:
        if mine is None or theirs is None:
            if mine is not theirs:
                _mismatch(target, f"ours {mine!r}, torch {theirs!r}")
            continue
        mine, theirs = describe(mine), describe(theirs)
        if mine != theirs:
            _mismatch(target, f"ours {mine}, torch {theirs}")


def _not_implied_before(env, guards_before: int, ranges_before: dict, axioms_before: dict) -> list:
    """The guards recorded since `guards_before` that do not follow from what `env` knew
    then. Asked of the ShapeEnv as it was — the guards, the symbol ranges they narrowed and
    the implications drawn from them taken away for the question, then put back — since
    each new guard would otherwise imply itself."""
    from dynamo_rs._symbolic_rules import implied_by_sizes

    added = env.guards[guards_before:]
    after = env.var_to_range, env.axioms
    del env.guards[guards_before:]
    env.var_to_range, env.axioms = ranges_before, axioms_before
    env._version_counter += 1  # ShapeEnv caches are keyed by it
    try:
        return [g.expr for g in added if not implied_by_sizes(env, g.expr)]
    finally:
        env.guards.extend(added)
        env.var_to_range, env.axioms = after
        env._version_counter += 1


def _expr(size):
    """An int as itself, a SymInt as its sympy expression."""
    return size.node.expr if isinstance(size, torch.SymInt) else size


def _mismatch(target, difference: str):
    name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
    message = f"meta rule for {name} disagrees with FakeTensorMode: {difference}"
    mismatches.append(message)
    raise AssertionError(message)
