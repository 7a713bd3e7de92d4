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
    """Items written through Python too (like transformers' ModelOutput): they are still kept
    in the dict's own table, which `super().__getitem__` reads."""

    def __getitem__(self, key):
        return super().__getitem__(key) + 1

    def __setitem__(self, key, value):
        super().__setitem__(key, value)


def test_a_class_writing_items_in_python_reads_its_table() -> None:
    fields = Fields(k=1.0)

    def read(x):
        return x * fields["k"]

    x = t(3)
    converter = run_cases(read, [(x,)])
    assert not converter.breaks
    compiled = dynamo_rs.compile(read, backend=CompileCounter())
    for value in (1.0, 3.0, 1.0):
        fields["k"] = value
        torch.testing.assert_close(compiled(x), read(x))


# --- instances made in the trace ---------------------------------------------------------------
# A dict subclass instance made in the frame is a traced dict of its class: what the class adds
# in Python (methods, `__getitem__`, `__getattr__`/`__setattr__`, class constants) is inlined;
# classes overriding what dicts do natively (`__setitem__`, `__missing__`, ...) break the graph.


class Plain(dict):
    pass


class Registry(OrderedDict):
    def __getitem__(self, key):
        content = super().__getitem__(key)
        fn, kwargs = content if isinstance(content, tuple) else (content, {})
        return lambda x: fn(x, **kwargs)


class Doubled(Registry):
    def __getitem__(self, key):
        once = super(Doubled, self).__getitem__(key)
        return lambda x: once(once(x))


class AttrDict(dict):
    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


class EasyDict(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value


class Totals(OrderedDict):
    SCALE = 3.0

    def total(self):
        return sum(self.values()) * self.SCALE

    def scaled(self, key, by=2.0):
        return self[key] * by


class WithMissing(dict):
    def __missing__(self, key):
        return 0.0


class Recording(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value * 2)


def made_plain(x):
    d = Plain(a=x)
    d["b"] = x * 2
    d.update(c=x + 1)
    return d["a"] + d["b"] + d["c"], type(d) is Plain, isinstance(d, Plain), len(d)


def made_registry(x):
    acts = Registry(gelu=F.gelu, tanh=(F.gelu, {"approximate": "tanh"}))
    return acts["gelu"](x) - acts["tanh"](x)


def made_subclass_of_registry(x):
    return Doubled(relu=F.relu, sig=torch.sigmoid)["sig"](x)


def made_attr_dict(x):
    cfg = AttrDict(scale=2.0)
    cfg.shift = 1.0
    return x * cfg.scale + cfg.shift, len(cfg), "shift" in cfg


def made_easy_dict(x):
    cfg = EasyDict(scale=0.5)
    cfg.bias = x.sum()
    return x * cfg.scale + cfg.bias + getattr(cfg, "missing", 3.0), hasattr(cfg, "nope")


def made_ordered_with_methods(x):
    t = Totals(a=x, b=x * 3)
    t["c"] = x - 1
    return t.total() + t.scaled("b"), len(t), t.SCALE


def made_copies_keep_python_classes(x):
    plain, ordered = Plain(a=x), Totals(a=x)
    return (type(plain.copy()) is dict, type(ordered.copy()) is Totals,
            type(plain | {"b": 1}) is dict, type(ordered | {"b": 1}) is Totals, plain.copy()["a"] + 1)


def made_and_returned(x):
    d = Totals(a=x + 1)
    d["b"] = x * 2
    return d


def made_then_break(x):
    d = EasyDict(w=x * 2)
    d.v = d.w + 1
    print("break")
    return d, d.v * 3


def made_with_missing(x):
    d = WithMissing(a=x)
    return d["a"] + d["zzz"]


def made_with_own_setitem(x):
    d = Recording()
    d["a"] = x
    return d["a"] + 1


MADE_CASES = {
    "made_plain": (made_plain, 0),
    "made_registry": (made_registry, 0),
    "made_subclass_of_registry": (made_subclass_of_registry, 0),
    "made_attr_dict": (made_attr_dict, 1),  # TorchDynamo runs this frame eagerly
    "made_easy_dict": (made_easy_dict, 0),
    "made_ordered_with_methods": (made_ordered_with_methods, 0),
    "made_copies_keep_python_classes": (made_copies_keep_python_classes, 0),
    "made_and_returned": (made_and_returned, 0),
    "made_then_break": (made_then_break, 1),  # TorchDynamo runs the resume function eagerly
    # Not admitted (they override what the translator does natively): a break at the call.
    "made_with_missing": (made_with_missing, None),
    "made_with_own_setitem": (made_with_own_setitem, None),
}


@pytest.mark.parametrize("name", sorted(MADE_CASES))
def test_made_in_the_trace(name, capsys) -> None:
    fn, more_graphs = MADE_CASES[name]  # None: not admitted, a break before the graph
    x = t(4)
    expected = fn(x)
    got = dynamo_rs.compile(fn, backend=CompileCounter())(x)
    assert type(got) is type(expected)
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            torch.testing.assert_close(got[key], expected[key])
    # Results (values, types, graph counts) side by side with TorchDynamo.
    converter = run_cases(fn, [(t(4),)], graphs_delta=more_graphs or 0)
    if more_graphs is not None and name != "made_then_break":
        assert not converter.breaks, converter.breaks


def test_made_in_the_trace_follows_changes_to_its_class() -> None:
    def fn(x):
        t = Totals(a=x, b=x + 1)
        return t.total()

    original_total, original_scale = Totals.total, Totals.SCALE
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    x = t(3)
    torch.testing.assert_close(compiled(x), fn(x))
    try:
        Totals.SCALE = -1.0
        torch.testing.assert_close(compiled(x), fn(x))
        Totals.total = lambda self: self["a"] * self.SCALE
        torch.testing.assert_close(compiled(x), fn(x))
        assert counter.frame_count == 3
    finally:
        Totals.total, Totals.SCALE = original_total, original_scale


def test_made_in_the_trace_and_changed_after_a_break_is_right(capsys) -> None:
    def fn(x):
        d = Plain(a=x)
        print("break")
        d["b"] = d["a"] * 2
        return d

    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    x = t(3)
    got, expected = compiled(x), fn(x)
    assert type(got) is Plain and list(got) == list(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key])


class PlainConfig(dict):
    """A dict subclass that adds nothing: iterated, it is its keys."""


def test_iterating_an_existing_plain_subclass_follows_its_keys() -> None:
    table = PlainConfig({2: 5.0, 4: 10.0})
    table.note = 3.0

    def f(x):
        for key in table:
            x = x * key
        for key, value in table.items():
            x = x + value
        return x * table.note + len(table)

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter, fullgraph=True)
    x = torch.ones(3)
    torch.testing.assert_close(compiled(x), f(x))
    table[6] = 1.0  # another key: the guard on the keys fails, the trace follows it
    torch.testing.assert_close(compiled(x), f(x))
    del table[2]
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 3
