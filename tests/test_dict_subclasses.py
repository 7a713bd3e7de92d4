"""Dict subclasses whose class defines `__getitem__` in Python (transformers' `ACT2FN`, a
`ClassInstantier`; registries that post-process what they hold): the override is inlined, and
what it reads through `super().__getitem__(key)` — the dict's own table — is guarded as such
(`dict.__getitem__(d, key)`, not `d[key]`, which would run the override). Each case runs
eagerly, under dynamo_rs and under TorchDynamo (results, graph counts); then the dict or the
class changes and the compiled function must follow."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from test_graph_breaks import run_cases, t

pytestmark = pytest.mark.usefixtures("reset_compilers")


class Doubling(dict):
    def __getitem__(self, key):
        return super().__getitem__(key) * 2


class FunctionTable(OrderedDict):
    """Values are functions, or (function, keyword arguments) pairs."""

    def __getitem__(self, key):
        content = super().__getitem__(key)
        fn, kwargs = content if isinstance(content, tuple) else (content, {})
        return lambda x: fn(x, **kwargs)


SCALES = Doubling(a=2.0, b=0.5)
ACTIVATIONS = FunctionTable({"gelu": F.gelu, "tanh_gelu": (F.gelu, {"approximate": "tanh"}),
                             "relu": F.relu})


def scaled(x):
    return x * SCALES["a"] + SCALES["b"]


def scaled_by_get(x):
    # `dict.get` is the dict's own lookup too (no override involved).
    return x * SCALES.get("a", 1.0)


def activated(x):
    return ACTIVATIONS["gelu"](x) + ACTIVATIONS["tanh_gelu"](x) - ACTIVATIONS["relu"](x)


def key_from_argument(x, name):
    return ACTIVATIONS[name](x) * 2


CASES = {
    "scaled": (scaled, [(t(3),)]),
    "scaled_by_get": (scaled_by_get, [(t(3),)]),
    "activated": (activated, [(t(4),)]),
    "key_from_argument": (key_from_argument, [(t(4), "relu"), (t(4), "tanh_gelu")]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name) -> None:
    fn, calls = CASES[name]
    converter = run_cases(fn, calls)
    assert not converter.breaks, converter.breaks


def _follows(fn, change, undo, graphs_after=1) -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    x = t(3)
    torch.testing.assert_close(compiled(x), fn(x))
    try:
        change()
        torch.testing.assert_close(compiled(x), fn(x))
        assert counter.frame_count == 1 + graphs_after
    finally:
        undo()


def test_a_value_changed_in_the_table_recompiles() -> None:
    _follows(scaled, lambda: dict.__setitem__(SCALES, "a", 5.0), lambda: dict.__setitem__(SCALES, "a", 2.0))


def test_a_value_stored_through_the_subclass_recompiles() -> None:
    _follows(scaled, lambda: SCALES.__setitem__("b", -1.0), lambda: SCALES.__setitem__("b", 0.5))


def test_a_replaced_function_recompiles() -> None:
    _follows(activated, lambda: ACTIVATIONS.__setitem__("relu", torch.sigmoid),
             lambda: ACTIVATIONS.__setitem__("relu", F.relu))


def test_a_replaced_override_recompiles() -> None:
    original = Doubling.__getitem__

    def tripling(self, key):
        return dict.__getitem__(self, key) * 3

    def undo():
        Doubling.__getitem__ = original

    # The new override calls `dict.__getitem__(self, key)` itself, which breaks the graph
    # (a C method called unbound): two graphs after the change.
    _follows(scaled, lambda: setattr(Doubling, "__getitem__", tripling), undo, graphs_after=2)


def test_a_tensor_value_is_a_graph_input() -> None:
    # A tensor read past the override is a graph input, loaded as `dict.__getitem__(d, k)`.
    table = Doubling(w=torch.ones(3))

    def weighted(x):
        return x * table["w"]

    counter = CompileCounter()
    compiled = dynamo_rs.compile(weighted, backend=counter)
    x = t(3)
    torch.testing.assert_close(compiled(x), weighted(x))
    table["w"] = torch.full((3,), 4.0)
    torch.testing.assert_close(compiled(x), weighted(x))
    assert counter.frame_count == 1
    assert not compiled._dynamo_rs_converter.failures


class Fields(dict):
    """Items written through Python too (like transformers' ModelOutput): read through the
    class, so a lookup breaks the graph rather than reading the table past its methods."""

    def __getitem__(self, key):
        return super().__getitem__(key) + 1

    def __setitem__(self, key, value):
        super().__setitem__(key, value)


def test_a_class_writing_items_in_python_breaks_at_the_lookup() -> None:
    fields = Fields(k=1.0)

    def read(x):
        return x * fields["k"]

    converter = run_cases(read, [(t(3),)])
    assert converter.breaks
