"""Items of containers the code never reads are not guarded.

A dict, list or tuple handed to the frame (an argument, a global, an attribute) is wrapped
item by item; each constant item used to get a guard on its value at once, so a batch dict
whose file name or step counter changes every call recompiled on every call — and ran
eagerly once the cache limit was reached — although the code reads only `batch["x"]`.
TorchDynamo wraps items lazily and guards only what the trace reads. Now a constant item's
guard is added when the trace looks at it (`Tracer::kind`). Every case runs a sequence of
calls eagerly, compiled by us and by TorchDynamo: results equal eager at every call, graph
counts equal TorchDynamo's; the cases whose read items change check the recompile is there."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import compare, reset_all

SEQUENCES: list = []


def sequence(calls, graphs=None):
    """Registers `fn` with `calls`: a function of the call number giving the arguments, and
    the number of graphs the ten calls must make (TorchDynamo's when None)."""

    def register(fn):
        SEQUENCES.append(pytest.param(fn, calls, graphs, id=fn.__name__))
        return fn

    return register


def x():
    return torch.arange(4.0)


@sequence(lambda i: (x(), {"scale": 2.0, "step": i, "name": f"run{i}", "lr": 0.1 * i,
                           "flag": i % 2 == 0, "extra": None if i % 3 else "e"}))
def dict_argument_reads_one_item(x, opts):
    return x * opts["scale"]


@sequence(lambda i: (x(), [2.0, i, f"s{i}", 0.5 * i]))
def list_argument_reads_one_item(x, items):
    return x * items[0] + len(items)


@sequence(lambda i: (x(), (3, f"path{i}", i * 1.5, None)))
def tuple_argument_reads_one_item(x, items):
    return x + items[0]


@sequence(lambda i: ({"x": x() + i, "meta": {"path": f"f{i}.png", "idx": i}, "tag": str(i)},))
def batch_dict_with_metadata(batch):
    return batch["x"].relu() * 2


@sequence(lambda i: (x(), {"scale": [1.0, 2.0, 3.0][i % 3], "step": i}))
def read_item_changes_value(x, opts):
    return x * opts["scale"]


@sequence(lambda i: (x(), {"mode": "train" if i % 2 else "eval", "step": i}))
def branch_on_a_string_item(x, opts):
    if opts["mode"] == "train":
        return x + 1
    return x - 1


@sequence(lambda i: (x(), {"scale": 2.0, "step": i, "tag": f"t{i}"}))
def items_passed_as_keywords(x, opts):
    def inner(x, scale, **rest):
        return x * scale

    return inner(x, **opts)


@sequence(lambda i: (x(), {"a": 1.5, "b": 2.0 + (i % 2), "n": "k"}))
def every_item_read_by_iteration(x, opts):
    for key, value in opts.items():
        if isinstance(value, float):
            x = x * value
    return x


@sequence(lambda i: (x(), {"mask": None if i % 2 else torch.ones(4), "step": i}))
def none_check_on_an_item(x, opts):
    if opts["mask"] is None:
        return x
    return x * opts["mask"]


@sequence(lambda i: (x(), {"fill": 3.0, "step": i, "name": f"n{i}"}))
def item_given_to_a_torch_function(x, opts):
    return x + torch.full((4,), opts["fill"])


@sequence(lambda i: (x(), {"scale": 2.0, "step": i}))
def get_with_default(x, opts):
    return x * opts.get("missing", 1.5) + opts.get("scale")


@sequence(lambda i: (x(), {"scale": 2.0, "step": i, "tags": ["a", f"b{i}"]}))
def nested_list_item_unread(x, opts):
    return x * opts["scale"]


@sequence(lambda i: (x(), {"flag": bool(i % 2), "step": i}))
def truth_of_an_item(x, opts):
    if opts["flag"]:
        return x * 3
    return x


@sequence(lambda i: (x(), [1.0, 2.0, float(i)]))
def sum_of_the_items_reads_them_all(x, items):
    return x * sum(items)


@sequence(lambda i: (x(), {"scale": 2.0, "step": i}))
def returned_container(x, opts):
    return x * opts["scale"], opts


@sequence(lambda i: (x(), {"scale": 2.0, "step": i}))
def item_copied_into_the_result(x, opts):
    return x * opts["scale"], opts["step"]


@sequence(lambda i: (x(), {"scale": [2.0, 3.0][i % 2], "step": i}))
def item_read_after_a_graph_break(x, opts):
    y = x * 2
    torch._dynamo.graph_break()
    return y * opts["scale"]


@sequence(lambda i: (x(), [1.5, f"p{i}", i]))
def items_unpacked_one_returned(x, items):
    scale, path, step = items
    return x * scale, path


# TorchDynamo guards the items it copies (a graph per call); they are loaded where they are.
@sequence(lambda i: (x(), [1.5, f"p{i}", i]), graphs=1)
def copy_of_the_list_returned(x, items):
    return x * items[0], list(items)


@sequence(lambda i: (x(), {"tag": f"t{i}", "scale": 2.0}))
def item_moved_then_replaced(x, opts):
    old = opts["tag"]
    opts["tag"] = "new"
    return x * opts["scale"], old, opts


@sequence(lambda i: (x(), [2.0, f"p{i}", i]), graphs=1)
def list_item_replaced_then_old_returned(x, items):
    old = items[1]
    items[1] = "replaced"
    return x * items[0], old, items


@sequence(lambda i: (x(), [float((i * 7) % 5), 1.0, float(i % 3)]))
def list_sorted_in_place(x, items):
    items.sort()
    return x * items[0], items


@sequence(lambda i: (x(), {"name": "a" if i % 3 == 0 else "b", "step": i}))
def item_compared_with_a_string(x, opts):
    if opts["name"] == "a":
        return x + 1
    return x


@sequence(lambda i: (x(), {"tags": ["x"] if i % 2 else ["y", "z"], "step": i}))
def membership_in_a_nested_item(x, opts):
    if "x" in opts["tags"]:
        return x * 2
    return x


@sequence(lambda i: (x(), {"name": f"n{i % 4}", "scale": 2.0}))
def item_formatted_into_the_result(x, opts):
    return x * opts["scale"], f"run-{opts['name']}"


@sequence(lambda i: (x(), {"v": 1 if i % 2 else 1.0, "step": i}))
def isinstance_of_an_item_equal_across_types(x, opts):
    # 1 == 1.0: the item's guard must tell an int from a float.
    if isinstance(opts["v"], int):
        return x + opts["v"]
    return x - opts["v"]


@sequence(lambda i: (x(), {"m": None if i % 2 else 0, "step": i}))
def none_or_zero_item(x, opts):
    if opts["m"] is None:
        return x + 1
    return x + opts["m"]


@sequence(lambda i: (x(), {"alpha": i, "beta": f"b{i}", "gamma": 0.5 * i}))
def keys_iterated_values_unread(x, opts):
    for key in opts:
        x = x + len(key)
    return x


@sequence(lambda i: ([x(), x() + i, f"name{i}"],))
def tensors_and_metadata_in_a_list(batch):
    return batch[0] + batch[1]


@sequence(lambda i: (x(), (2, f"path{i}", (i, f"q{i}"))))
def nested_tuple_argument_unread(x, meta):
    return x * meta[0]


@sequence(lambda i: (x(), (i % 3, 5)))
def tuple_int_item_read(x, meta):
    return x * meta[0] + meta[1]


CONFIG = {"scale": 2.0, "calls": 0, "run": "r0"}


# The argument stored is only moved: the store is replayed with it loaded from the frame,
# so one graph serves every value (TorchDynamo specialises the int first: 2 graphs).
@sequence(lambda i: (x(), i), graphs=1)
def global_config_dict(x, i):
    CONFIG["calls"] = i
    return x * CONFIG["scale"]


class ScaledFromSettings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = SETTINGS[0]
        self.shift, self.label = SETTINGS[1]

    def forward(self, x):
        return x * self.scale + self.shift


SETTINGS = [2.0, (1.0, "a")]


def _set_settings(i):
    SETTINGS[0] = float(i % 3)
    SETTINGS[1] = (float(i % 2), f"l{i % 2}")
    return (x(),)


# Six combinations of values; the floats read from the settings become symbolic once they
# change, as under TorchDynamo (its graph count: 3; one per combination before).
@sequence(_set_settings, graphs=None)
def module_made_from_global_items(x):
    # The module is made for real from what its `__init__` read, though the trace of it
    # only moves the items into attributes: they are guarded all the same.
    return ScaledFromSettings()(x)


class WithConfig(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # An int scale: a float read here would become symbolic once it changed (as under
        # TorchDynamo), and this test counts one graph per value read.
        self.cfg = {"scale": 2, "calls": 0, "tags": ["a"]}
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.cfg["scale"] + len(self.cfg["tags"])


def test_a_module_attribute_dict_guards_what_forward_reads():
    # `calls` changes every call and is never read; `scale` and the length of `tags` are.
    torch.manual_seed(0)
    model = WithConfig()
    ours = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=ours)
    x = torch.randn(2, 4)
    seen = set()
    for i in range(12):
        model.cfg["calls"] = i
        if i % 4 == 3:
            model.cfg["scale"] = i
        if i % 5 == 4:
            model.cfg["tags"].append("b")
        seen.add((model.cfg["scale"], len(model.cfg["tags"])))
        torch.testing.assert_close(compiled(x), model(x))
    assert ours.frame_count == len(seen)


@pytest.fixture(autouse=True)
def _fresh():
    reset_all()
    yield
    reset_all()


@pytest.mark.parametrize("fn,calls,graphs", SEQUENCES)
def test_sequence(fn, calls, graphs) -> None:
    n = 10
    theirs = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(fn, backend=theirs)
    for i in range(n):
        reference(*calls(i))
    ours = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=ours)
    for i in range(n):
        compare(fn(*calls(i)), compiled(*calls(i)))
    if graphs is None:
        assert ours.frame_count == theirs.frame_count
    else:
        assert ours.frame_count == graphs


@pytest.mark.parametrize("fn,calls,graphs", SEQUENCES)
def test_sequence_matches_eager_in_any_order(fn, calls, graphs) -> None:
    # Values seen before come back after others: a missing guard would return a stale result.
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    for i in [0, 1, 2, 1, 0, 5, 3, 3, 4, 0]:
        compare(fn(*calls(i)), compiled(*calls(i)))
