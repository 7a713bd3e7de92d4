"""Existing `OrderedDict`s and `defaultdict`s the compiled code reads and changes — a module's
cache keyed by size, a registry filled on first use, counters in a `defaultdict(int)` — are
traced as dicts of their class: missing keys of a `defaultdict` made by its factory, stores,
`move_to_end`, `pop`, `setdefault`, then the changes replayed into the object itself after
the graph (they ran the frame eagerly or broke the graph at each store). Each sequence runs
on two copies of the state, eagerly and compiled, compared call by call (results and the
containers' contents and order), and graph counts compared with TorchDynamo's."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter


class SizeCache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.cache = collections.OrderedDict()

    def forward(self, x):
        key = x.shape[0]
        if key not in self.cache:
            self.cache[key] = torch.ones(4) * key
            if len(self.cache) > 2:
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        return self.lin(x) + self.cache[key]


def counts_calls(state, x):
    state["calls"] += 1
    state["seen"].append(x.shape[0])
    return x * state["calls"] + len(state["seen"]) + state["never_set"]


def registers_on_first_use(state, x):
    order = state.setdefault("order", 0)
    state["order"] = order + 1
    state.move_to_end("order", last=False)
    return x + order, list(state)


def pops_and_reads(state, x):
    value = state.pop("scale", 2.0)
    state["last"] = value
    return x * value + state.get("missing", 1.0)


# A missing key read from an existing `defaultdict` adds the factory's value even when no
# store follows: the new entry (and what is done to it) must reach the real dict. Each was a
# wrong result: the entry was made only in the trace.
def appends_to_missing_list(state, x):
    state["seen"][x.shape[0]].append(x.sum())
    return x * len(state["seen"][x.shape[0]])


def fills_nested_default(state, x):
    inner = state["seen"]["inner"]
    inner[x.shape[0]] = inner.get(x.shape[0], 0) + 1
    return x * inner[x.shape[0]]


def reads_missing_key_only(state, x):
    _ = state["seen"]["probe"]
    return x * len(state["seen"]), sorted(map(str, state["seen"]))


def checks_then_touches(state, x):
    if "k" in state["seen"]:
        return x + len(state["seen"]["k"])
    state["seen"]["k"]
    return x - 1


def getitem_method_of_missing(state, x):
    state["seen"].__getitem__("m").append(1)
    return x * len(state["seen"]["m"])


def keyed_by_a_parameter(state, x):
    key = state["key"]
    state["seen"][key].append(x.sum())
    return sum(state["seen"][key]) + x


MISSING_KEY_FUNCTIONS = {f.__name__: f for f in [
    appends_to_missing_list, fills_nested_default, reads_missing_key_only, checks_then_touches,
    getitem_method_of_missing, keyed_by_a_parameter]}


def _state(kind):
    if kind == "counts_calls":
        return _counts_state()
    if kind in MISSING_KEY_FUNCTIONS:
        factory = dict if kind == "fills_nested_default" else list
        return {"seen": collections.defaultdict(factory), "key": torch.nn.Parameter(torch.zeros(1))}
    if kind == "registers_on_first_use":
        return collections.OrderedDict(a=1)
    return collections.OrderedDict(scale=3.0)


def _counts_state():
    state = collections.defaultdict(int)
    state["seen"] = []
    return state


FUNCTIONS = {"counts_calls": counts_calls, "registers_on_first_use": registers_on_first_use,
             "pops_and_reads": pops_and_reads, **MISSING_KEY_FUNCTIONS}


def _contents(state):
    """A deep copy of `state` with `defaultdict`s as plain dicts (in order) and tensor keys by
    position, so that contents are compared, not identities."""
    if isinstance(state, dict):
        return [(k if not isinstance(k, torch.Tensor) else "tensor", _contents(v))
                for k, v in state.items()]
    if isinstance(state, list):
        return [_contents(v) for v in state]
    return copy.deepcopy(state)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(b, a)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_state_changes_match_eager(name):
    fn = FUNCTIONS[name]
    results = {}
    for front in ("eager", "dynamo_rs", "torch"):
        dynamo_rs.reset()
        torch._dynamo.reset()
        state = _state(name)
        counter = CompileCounter() if front == "dynamo_rs" else torch._dynamo.testing.CompileCounter()
        run = {"eager": fn, "dynamo_rs": dynamo_rs.compile(fn, backend=counter),
               "torch": torch.compile(fn, backend=counter)}[front]
        outs = []
        for n in [3, 3, 5, 3]:
            outs.append(run(state, torch.arange(float(n))))
            outs.append(_contents(state))
            outs.append(list(state))
        results[front] = (outs, counter.frame_count if front != "eager" else None)
    for got, expected in zip(results["dynamo_rs"][0], results["eager"][0]):
        _same(expected, got)
    # Captured (not run eagerly), in no more graphs than TorchDynamo.
    assert 1 <= results["dynamo_rs"][1] <= results["torch"][1], (results["dynamo_rs"][1], results["torch"][1])


def test_module_cache_keyed_by_size():
    torch.manual_seed(0)
    eager = SizeCache()
    compiled_module = copy.deepcopy(eager)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(compiled_module, backend=counter)
    for n in [2, 2, 3, 5, 2, 3]:
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), eager(x))
        assert list(compiled_module.cache) == list(eager.cache)
        for k in eager.cache:
            torch.testing.assert_close(compiled_module.cache[k], eager.cache[k])
    theirs = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    reference = torch.compile(copy.deepcopy(SizeCache()), backend=theirs)
    for n in [2, 2, 3, 5, 2, 3]:
        reference(torch.randn(n, 4))
    assert 1 <= counter.frame_count <= theirs.frame_count, (counter.frame_count, theirs.frame_count)


def test_reordering_outside_the_compiled_code_is_seen():
    """`move_to_end` between calls changes an OrderedDict's order without changing the dict
    underneath (its version tag stays): the guard on its keys must still see it."""
    table = collections.OrderedDict(a=1.0, b=2.0, c=3.0)

    def f(x):
        first = next(iter(table))
        return x * table[first], list(table)

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    x = torch.ones(2)
    for key in ["a", "b", None, "c", "a"]:
        if key is not None:
            table.move_to_end(key, last=False)
        expected, got = f(x), compiled(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1]


def test_partials_made_per_call_swap_without_recompiling():
    import functools

    def scale(x, y):
        return x * y

    def f(f0, f1, x):
        return f0(x) * f1(x)

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    p0, p1 = functools.partial(scale, y=torch.randn(2, 2)), functools.partial(scale, y=torch.randn(2, 2))
    x = torch.randn(2, 2)
    for a, b in [(p0, p1), (p1, p0), (functools.partial(scale, y=torch.ones(2, 2)), p0)]:
        torch.testing.assert_close(compiled(a, b, x), f(a, b, x))
    assert counter.frame_count == 1
    other = functools.partial(lambda x, y: x - y, y=torch.ones(2, 2))  # another function
    torch.testing.assert_close(compiled(other, other, x), f(other, other, x))
    assert counter.frame_count == 2
