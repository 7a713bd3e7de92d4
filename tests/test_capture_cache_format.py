"""The persistent capture cache's object encoding, in process: what can be written is found
again as the same object (or an equal constant), what cannot raises NotPortable, and a name
that no longer leads to the written object is a Mismatch (issue 12)."""

from __future__ import annotations

import collections
import json
import math
import operator
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from dynamo_rs import _native, _persist


def _helper(t, scale=2):
    return t * scale


SAME_OBJECT = [
    torch.float32, torch.bfloat16, torch.channels_last, torch.strided, torch,
    torch.nn.functional, operator.getitem, F.relu, F.linear, torch.sigmoid, torch.Tensor.add,
    object.__new__, torch.nn.Linear, torch.nn.Linear.forward, collections.OrderedDict,
    types.FunctionType, sys.modules["builtins"].__dict__, torch.nn.functional.__dict__,
    _helper, None, True, 3, "text", Ellipsis,
    torch.ops.aten.shallow_copy_data_, torch.ops.aten.add.Tensor, torch.ops.aten.sym_size.int,
]

EQUAL_VALUE = [
    1.5, math.inf, -0.0, (1, (2.5, "a")), [1, 2], {"a": 1, 2: (3,)}, slice(1, None, 2),
    torch.device("cpu"), torch.Size([2, 3]), b"\x00\xff",
]


def _stable_id(obj) -> str:
    """A test id that is the same in every process (pytest-xdist workers must collect the same
    ids): the qualified name where there is one, never a repr holding an address."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if isinstance(obj, dict):
        name = f"dict-of-{obj.get('__name__')}"
    if isinstance(obj, torch._ops.OpOverloadPacket):
        name = str(obj)
    return str(name) if name is not None else repr(obj)


@pytest.mark.parametrize("obj", SAME_OBJECT, ids=_stable_id)
def test_named_objects_are_found_again(obj) -> None:
    encoded = _persist.encode(obj)
    assert json.loads(json.dumps(encoded)) == encoded  # plain JSON
    assert _persist.decode(encoded) is obj


@pytest.mark.parametrize("value", EQUAL_VALUE, ids=repr)
def test_constants_round_trip_by_value(value) -> None:
    decoded = _persist.decode(json.loads(json.dumps(_persist.encode(value))))
    assert type(decoded) is type(value)
    assert decoded == value or (isinstance(value, float) and math.isnan(value) and math.isnan(decoded))
    if isinstance(value, float):
        assert math.copysign(1, decoded) == math.copysign(1, value)


def test_nan_round_trips() -> None:
    assert math.isnan(_persist.decode(_persist.encode(math.nan)))


def test_disabled_function_wraps_the_same_callable() -> None:
    decoded = _persist.decode(_persist.encode(_native.DisabledFunction(F.relu)))
    assert type(decoded) is _native.DisabledFunction and decoded.wrapped_callable is F.relu


@pytest.mark.parametrize("obj", [lambda x: x, torch.nn.Linear(2, 2), torch.randn(2), object(),
                                 types.SimpleNamespace(a=1)],
                         ids=["lambda", "module instance", "tensor", "object", "namespace"])
def test_objects_no_process_can_find_are_not_portable(obj) -> None:
    with pytest.raises(_persist.NotPortable):
        _persist.encode(obj)


def test_a_changed_function_is_a_mismatch(monkeypatch) -> None:
    encoded = _persist.encode(_helper)
    _persist._resolved.clear()
    monkeypatch.setattr(_helper, "__defaults__", (3,))
    with pytest.raises(_persist.Mismatch):
        _persist.decode(encoded)
    _persist._resolved.clear()


def test_a_missing_name_is_a_mismatch() -> None:
    with pytest.raises(_persist.Mismatch):
        _persist.decode(["named", "torch.nn.functional", "no_such_function_here", None])
    with pytest.raises(_persist.Mismatch):
        _persist.decode(["module", "no_such_module_dynamo_rs_test"])
    with pytest.raises(_persist.Mismatch):
        _persist.decode(["op", "no_such_namespace_dynamo_rs", "f", None])
    with pytest.raises(_persist.Mismatch):
        _persist.decode(["op", "aten", "add", "no_such_overload"])


def test_code_hash_ignores_line_numbers_but_not_code() -> None:
    src = "def f(x):\n    return x + 1\n"
    a = compile(src, "f.py", "exec").co_consts[0]
    b = compile("\n\n" + src, "f.py", "exec").co_consts[0]
    c = compile(src.replace("+ 1", "+ 2"), "f.py", "exec").co_consts[0]
    assert _persist.code_hash(a) == _persist.code_hash(b) != _persist.code_hash(c)
