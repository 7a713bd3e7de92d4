"""Graph breaks: a frame the translator cannot capture whole is split where it fails, the part
before becomes a graph and the rest runs in a resume function compiled in turn.

Every case runs the same function eagerly, under dynamo_rs and under TorchDynamo on the same
calls: results and printed output must equal eager's, the second round of calls must compile
nothing new, and the number of graphs is compared with TorchDynamo's (`EXPECT` notes the cases
where it differs on purpose and by how much)."""

from __future__ import annotations

import collections
import contextlib
import io
import re
import traceback

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter


pytestmark = pytest.mark.usefixtures("reset_compilers")


def _clone(args):
    """Fresh arguments for one run: tensors cloned, and `args` called if it makes them (cases
    whose arguments the function changes: lists, dicts, objects)."""
    if callable(args):
        return args()
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


class Raised:
    """What a call that raised left behind: the exception's type and message, the lines of
    this file its traceback went through, innermost last, and the grad mode after it."""

    def __init__(self, err: BaseException) -> None:
        self.type = type(err)
        self.message = str(err)
        self.lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == __file__]
        self.grad_mode = torch.is_grad_enabled()

    def check_against(self, eager: Raised) -> None:
        assert self.type == eager.type
        # Object addresses aside (pytest's rewritten asserts print bound methods).
        assert re.sub("0x[0-9a-f]+", "0x", self.message) == re.sub("0x[0-9a-f]+", "0x", eager.message)
        assert self.grad_mode == eager.grad_mode
        # Through the user's lines, ending where eager's ends (resume functions add frames
        # on the same lines).
        assert set(eager.lines) <= set(self.lines), (self.lines, eager.lines)
        assert self.lines[-1] == eager.lines[-1]


def _run(fn, args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            result = fn(*_clone(args))
        except Exception as err:  # compared with eager's below
            result = Raised(err)
    return result, out.getvalue()


def _check(actual, expected) -> None:
    if isinstance(expected, Raised):
        assert isinstance(actual, Raised), f"eager raised {expected.type.__name__}, compiled did not"
        actual.check_against(expected)
    else:
        assert not isinstance(actual, Raised), f"compiled raised {getattr(actual, 'type', None)}"
        torch.testing.assert_close(actual, expected)


def run_cases(fn, calls, *, graphs_delta=0, explain_delta=None):
    """Runs `calls` eagerly, compiled by dynamo_rs and by TorchDynamo; returns our counter."""
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    theirs = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(fn, backend=theirs)
    for args in calls:
        grad_mode = torch.is_grad_enabled()
        expected, expected_out = _run(fn, args)
        actual, actual_out = _run(compiled, args)
        _check(actual, expected)
        assert actual_out == expected_out
        assert torch.is_grad_enabled() == grad_mode
        _run(reference, args)
    graphs = counter.frame_count
    # Again: every entry (prefix graphs and resume functions) is reused.
    for args in calls:
        expected, _ = _run(fn, args)
        actual, _ = _run(compiled, args)
        _check(actual, expected)
    assert counter.frame_count == graphs, "a second round of the same calls compiled again"
    assert graphs == theirs.frame_count + graphs_delta, (graphs, theirs.frame_count)
    converter = compiled._dynamo_rs_converter
    # Side by side with torch._dynamo.explain on the first call, when it returns.
    if explain_delta is not None and not isinstance(_run(fn, calls[0])[0], Raised):
        with contextlib.redirect_stdout(io.StringIO()):
            ours = dynamo_rs.explain(fn)(*_clone(calls[0]))
            torch._dynamo.reset()
            explained = torch._dynamo.explain(fn)(*_clone(calls[0]))
        assert ours.graph_count == explained.graph_count + explain_delta, (ours.graph_count, explained.graph_count)
    return converter


def t(*shape):
    return torch.randn(*shape)


# --- unsupported calls at the top level -------------------------------------------------


def print_between(x):
    y = x.sin()
    print("Hi")
    return y.cos() + x


def print_first(x):
    print("first")
    return x.sin()


def print_last(x):
    y = x.sin() * 2
    print("last")
    return y


def print_tensor(x):
    y = x + 1
    print(y.shape)
    return y * 2


def print_twice(x):
    a = x + 1
    print("one")
    b = a * 2
    print("two")
    return b - 1


def print_result_used(x):
    y = x.relu()
    n = len(repr(print("ignored")))
    return y + n


def print_keyword(x):
    y = x.exp()
    print("k", end="!\n", sep="")
    return y


class Opaque:
    """A C-level call the translator does not follow: `sorted` over a generator of floats."""


def opaque_call(x):
    y = x * 3
    s = sorted(float(v) for v in [1.0, 3.0, 2.0])
    return y + s[0]


# --- data-dependent branches ------------------------------------------------------------


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def branch_item(x):
    y = x * 2
    if y.sum().item() > 0:
        return y + 1
    return y - 1


def branch_bool_tensor(x):
    y = x.abs()
    if (y > 1).any():
        y = y / 2
    return y


def branch_else(x, w):
    h = x @ w
    if h.mean() > 0:
        out = h.relu()
    else:
        out = h.sigmoid()
    return out * 2


def branch_ternary(x):
    y = x.cos()
    z = y * 2 if y.sum() > 0 else y * 3
    return z + 1


def branch_keeps_locals(x, y):
    a = x + y
    b = x - y
    c = [a, b]
    if a.sum() > b.sum():
        return c[0] * b
    return c[1] * a


def branch_then_more(x):
    y = x.sin()
    if y.max() > 0.5:
        y = y * 10
    z = y.cos()
    return z.sum(0)


# --- .item() / .tolist() and conversions -------------------------------------------------


def item_arith(x):
    s = x.sum().item()
    return x * s


def tolist_len(x):
    y = x + 1
    values = y.tolist()
    return y * len(values)


def int_of_tensor(x):
    y = x.abs().sum()
    n = int(y)
    return x[: n % 3 + 1]


def item_on_stack(x):
    return torch.cat([x.sin(), torch.tensor(x.sum().item()).reshape(1)])


def item_as_kwarg(x):
    y = x.cos()
    return torch.full((2,), fill_value=y.sum().item()) + 1


def item_method_args(x):
    y = x.sin()
    return y.add(torch.tensor(y.sum().item()))


# --- breaks inside inlined functions ------------------------------------------------------


def _inner3(x):
    print("deep")
    return x + 1


def _inner2(x):
    return _inner3(x * 2) - 1


def _inner1(x):
    return _inner2(x.cos()) * 3


def depth1(x):
    return _inner3(x.sin()).relu()


def depth2(x):
    return _inner2(x.sin()).relu()


def depth3(x):
    return _inner1(x.sin()).relu()


def _branching_helper(x):
    if x.sum() > 0:
        return x * 2
    return x * 3


def inlined_branch(x):
    y = x + 1
    z = _branching_helper(y)
    return z - 1


# --- values live across the break ---------------------------------------------------------


def live_tuple_list_dict(x):
    tup = (x, x + 1)
    lst = [x * 2, 3]
    dct = {"a": x - 1, "b": "text"}
    print("break")
    return tup[0] + tup[1] + lst[0] * lst[1] + dct["a"]


def live_nested_containers(x):
    state = {"pair": (x.sin(), [x.cos()]), "n": 2}
    print("break")
    return state["pair"][0] + state["pair"][1][0] * state["n"]


def live_input_identity(x, y):
    z = x + y
    print("break")
    return z, x, y


def live_constants(x):
    scale, name, none = 2.5, "n", None
    print("break")
    return x * scale if none is None else x


def live_function(x):
    act = torch.relu
    y = x - 0.5
    print("break")
    return act(y)


def unbound_local_at_break(x):
    if x.dim() == 2:
        extra = x.sum(1)
    print("break")
    return x * 2


# --- grad mode ------------------------------------------------------------------------------


def inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("in with")
    return y + 1


def inside_enable_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = a + x
            print("nested")
    return a + b


def requires_grad_after_break(x):
    y = x * 2
    print("break")
    return (y * y).sum()


# --- not split: loops, try blocks ---------------------------------------------------------


def in_loop(x):
    for i in range(3):
        x = x + 1
        print(i)
    return x


def in_try(x):
    try:
        y = x + 1
        print("try")
    finally:
        y = y * 2
    return y


def try_except_print(x):
    y = x.sin()
    try:
        print("in try")
        y = y + 1
    except ValueError:
        y = y - 1
    return y.cos()


def _raises_on_positive(v):
    if v.sum() > 0:
        raise ValueError("positive")
    return v


def try_except_catches_break(x):
    y = x.sin()
    try:
        y = _raises_on_positive(y) * 2
    except ValueError:
        print("caught")
        y = y - 1
    return y.cos()


def try_except_else(x):
    y = x * 2
    try:
        print("try")
    except KeyError:
        y = y * 0
    else:
        y = y + 3
    return y


def try_finally_raises(x):
    y = x * 2
    try:
        print("try")
        _raises_on_positive(y)
    finally:
        print("finally")
    return y


def branch_inside_try(x):
    y = x + 1
    try:
        if y.sum() > 0:
            y = y * 2
        else:
            y = y * 3
    except RuntimeError:
        y = y * 0
    return y


def no_grad_raises(x):
    with torch.no_grad():
        y = x * 2
        _raises_on_positive(y)
    return y


def no_grad_raise_caught(x):
    try:
        with torch.no_grad():
            y = x * 2
            _raises_on_positive(y)
    except ValueError:
        y = x * 4
    return y + 1


def try_inside_no_grad(x):
    y = x.sin()
    with torch.no_grad():
        try:
            print("a")
            y = y + 1
        except KeyError:
            pass
        with torch.enable_grad():
            print("b")
            y = y * 2
    return y


def no_grad_in_inlined(x):
    return _no_grad_block_helper(x) * 2


def _no_grad_block_helper(x):
    with torch.no_grad():
        y = x + 1
        print("helper")
    return y + x


def try_around_inlined_break(x):
    try:
        y = depth1(x)
    except ValueError:
        y = x
    return y + 1


def raise_on_tensor_value(x):
    y = x.sin()
    if y.sum() > 100:
        raise ValueError("too big")
    return y * 2


def error_after_a_break(x):
    y = x.sin()
    print("before the error")
    return y.view(7)


def failing_assert_after_break(x):
    y = x + 1
    print("checking")
    assert y.sum() > 1e9, "the sum is too small"
    return y


def user_context_manager(x):
    with contextlib.nullcontext():
        y = x + 1
    return y * 2


def iterator_live(x):
    it = iter([x, x * 2])
    a = next(it)
    print("between")
    return a + next(it)


def _two_multiples(x):
    yield x * 2
    yield x * 3


def generator_live(x):
    g = _two_multiples(x)
    a = next(g)
    print("between")
    return a + next(g)


def tolist_in_loop(x):
    total = x * 0
    for v in x.tolist():
        total = total + v
    return total


class _Describer:
    def describe(self, v):
        return v * 2


class _OverridingDescriber(_Describer):
    def describe(self, v):
        return super().describe(v) + 1

    def run(self, x):
        # `super().describe` is on the stack when `print` breaks: it must stay the base's.
        return super().describe(print("args") or x)


def super_method_on_stack(x):
    return _OverridingDescriber().run(x) + _OverridingDescriber().describe(x)


# Zero-argument `super()` answers from the frame's first local and its `__class__` cell: the
# resume function must have the receiver there although nothing else after the break reads
# `self` (or reads it through a closure's cell).
class _Base:
    def step(self, x):
        return x + 1


class _ReceiverOnlyThroughSuper(_Base):
    calls = 0

    def step(self, x):
        type(self).calls += 1
        print("break")
        return super().step(x) * 2


class _ReceiverInACell(_Base):
    def step(self, x):
        scale = lambda: self.scale  # noqa: E731 - `self` becomes a cell variable
        self.scale = 3
        print("break")
        return super().step(x) * scale()


class _SuperInBranches(_Base):
    def step(self, x):
        y = x.sin()
        if y.sum() > 0:
            return super().step(y)
        return super().step(-y) * __class__.__name__.count("_")


class _SuperLinear(torch.nn.Linear):
    def forward(self, x):
        h = x.relu()
        print("break in forward")
        return super().forward(h) + h.sum()


_SUPER_LINEAR = _SuperLinear(3, 3)


def super_after_a_break(x):
    return _ReceiverOnlyThroughSuper().step(x)


def super_with_receiver_in_a_cell(x):
    return _ReceiverInACell().step(x)


def super_in_branches(x):
    return _SuperInBranches().step(x)


def super_forward_after_a_break(x):
    return _SUPER_LINEAR(x)


_Pair = collections.namedtuple("_Pair", "first second")


def namedtuple_around_a_break(x):
    pair = _Pair(x.sin(), x.cos())
    print("between")
    return pair.first + pair.second


# --- closures ------------------------------------------------------------------------------


def make_closure():
    scale = torch.tensor(3.0)

    def with_free_var(x):
        y = x * scale
        print("closure")
        return y + scale

    return with_free_var


with_free_var = make_closure()


# --- modules ----------------------------------------------------------------------------------


class PrintingNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x).relu()
        print("shape", tuple(h.shape))
        return self.b(h)


class BranchingNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        if h.norm() > 1:
            h = h / h.norm()
        return h.tanh()


torch.manual_seed(0)
_printing = PrintingNet()
_branching = BranchingNet()


def module_print(x):
    return _printing(x)


def module_branch(x):
    return _branching(x)


class RowsAndColumns(torch.nn.Module):
    """timm's Sequencer2d block: a recurrent module over the columns and one over the rows
    of an image, joined by a linear layer. RNN, GRU and LSTM modules run eagerly with the
    graph broken at their call (as under TorchDynamo), so the int sizes and the permuted
    views live across the breaks reach resume functions."""

    def __init__(self, cell, channels: int) -> None:
        super().__init__()
        self.rnn_v = cell(channels, channels, batch_first=True)
        self.rnn_h = cell(channels, channels, batch_first=True)
        self.fc = torch.nn.Linear(2 * channels, channels)

    def forward(self, x):
        B, H, W, C = x.shape
        v = x.permute(0, 2, 1, 3).reshape(-1, H, C)
        v, _ = self.rnn_v(v)
        v = v.reshape(B, W, H, -1).permute(0, 2, 1, 3)
        h, _ = self.rnn_h(x.reshape(-1, W, C))
        h = h.reshape(B, H, W, -1)
        return self.fc(torch.cat([v, h], dim=-1))


class RecurrentStages(torch.nn.Module):
    """Blocks of `RowsAndColumns` with the image halved (a strided view) between them: the
    blocks' frames see new sizes and views, and are compiled again with symbolic ones."""

    def __init__(self, cell) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([RowsAndColumns(cell, 4) for _ in range(3)])

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == 0:
                x = x[:, ::2, ::2]
        return x.mean((1, 2))


_recurrent = {cell.__name__: RecurrentStages(cell) for cell in (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)}


def recurrent_lstm(x):
    return _recurrent["LSTM"](x)


def recurrent_gru(x):
    return _recurrent["GRU"](x)


def recurrent_rnn(x):
    return _recurrent["RNN"](x)


# --- more families: formatting, stores, containers, arguments, numpy, asserts ----------------

COUNT = 0


def fstring_of_tensor(x):
    y = x.sum() * 2
    print(f"sum {y:.3f}")
    return x / y


def global_counter(x):
    global COUNT
    y = x + 1
    COUNT = x.shape[0]
    return y * COUNT


def store_into_argument_list(x, out):
    out[0] = x * 2
    return out[0] + 1


def delete_from_argument_dict(x, table):
    y = x + table["a"]
    del table["a"]
    return y * len(table)


def numpy_roundtrip(x):
    y = x.relu()
    a = y.numpy()
    return torch.from_numpy(a * 2) + y


def assert_on_tensor(x):
    y = x.abs() + 1
    assert (y > 0).all(), "positive"
    return y.log()


def assert_positive(x):
    y = x * 2
    assert y.sum() > 0, "not positive"
    return y.exp()


def in_place_then_break(x):
    x.add_(1)
    print("after add_")
    return x * 2


class Counter:
    def __init__(self) -> None:
        self.calls = 0


def attribute_store_then_break(box, x):
    box.calls = box.calls + 1
    y = x * box.calls
    print("stored")
    return y + box.calls


def print_computed_value(x):
    y = x.cos()
    print((y * 0).sum().item() == 0)
    return y


def varargs_live(*args, **kwargs):
    y = args[0] + kwargs["bias"]
    print("varargs")
    return y * len(args) + kwargs["bias"]


def tuple_return_after_break(x):
    a, b = x.sin(), x.cos()
    print("tuple")
    return a, (b, a + b), [x]


def break_in_both_branches(x):
    if x.sum() > 0:
        print("positive")
        y = x * 2
    else:
        print("negative")
        y = x * 3
    return y + 1


def two_branches_in_a_row(x):
    if x.mean() > 0:
        x = x - 1
    if x.std() > 0.5:
        x = x / 2
    return x


def nested_function_call_chain(x):
    return torch.relu(depth1(x) + depth2(x))


def method_with_break(x):
    return _Helper().run(x)


class _Helper:
    def run(self, x):
        y = x * 2
        print("method")
        return y + 1


def chained_comparison(x):
    s = x.sum()
    if 0 < s < 100:
        return x * 2
    return x


def nonzero_count(x):
    idx = torch.nonzero(x > 0)
    return x * idx.shape[0]


def kwargs_to_inlined_breaking(x):
    return _scaled(x, scale=3.0, shift=torch.ones(1))


def _scaled(x, scale=1.0, shift=None):
    print("scaled")
    return x * scale + shift


def unused_result_of_break(x):
    y = x * 2
    len(str(y.sum().item()))
    return y


def early_return_on_tensor(x):
    if x.max() > 10:
        return x
    y = x.exp()
    return y - 1


def while_on_tensor(x):
    while x.sum() < 10:
        x = x + 1
    return x


def logging_call(x):
    import logging

    y = x.sigmoid()
    logging.getLogger("test_graph_breaks").debug("value %s", 1)
    return y * 2


def list_of_tensors_with_break(x):
    parts = [x[i] * i for i in range(3)]
    print(len(parts))
    return torch.stack(parts)


def dict_comprehension_live(x):
    stats = {k: getattr(x, k)() for k in ("sum", "mean")}
    print("stats")
    return stats["sum"] + stats["mean"]


def _closure_maker(x):
    offset = x.sum()

    def add(v):
        return v + offset

    return add


def returns_closure_value(x):
    f = _closure_maker(x)
    print("closure made")
    return f(x)


def comprehensions_around_a_break(x):
    scale = 2
    parts = [x * scale + i for i in range(2)]
    print("between")
    more = [p - scale for p in parts]
    return torch.stack(more)


def cell_written_after_break(x):
    total = x.sum()
    first = [total * i for i in range(2)]
    print("between")
    total = total + 1
    second = [total * i for i in range(2)]
    return first[1] + second[1]


def no_grad_decorated_helper(x):
    return _no_grad_helper(x) + 1


@torch.no_grad()
def _no_grad_helper(x):
    y = x * 2
    print("no grad helper")
    return y


class _Boxes:
    """A plain object holding tensors (as torchvision's `ImageList`)."""

    def __init__(self, tensors, sizes):
        self.tensors = tensors
        self.sizes = sizes


class _ProposalHead(torch.nn.Module):
    """Called with a plain object and an `OrderedDict` of tensors: no tensor among its
    arguments, yet its frame computes with its parameters (torchvision's RPN)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Linear(3, 3)

    def forward(self, boxes, features):
        scores = [self.conv(f) for f in features.values()]
        print("proposals", len(scores))
        return [s * boxes.tensors.sum() for s in scores]


class _Detector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = _ProposalHead()

    def forward(self, x):
        boxes = _Boxes(x * 2, [3])
        features = collections.OrderedDict(a=x.relu(), b=x.sigmoid())
        return self.head(boxes, features)


_detector = _Detector()


def module_called_with_objects_after_a_break(x):
    return _detector(x)


def _ones_scaled(n):
    print("making", n)
    return torch.ones(n) * 2


def helper_naming_torch_with_int_arguments(x):
    return x + _ones_scaled(3)


def _run_module(module, n):
    print("running", n)
    return module(torch.ones(2, n))


def module_passed_as_an_argument(x):
    return _run_module(_detector.head.conv, 3) + x


def tracing_state_and_determinism(x):
    if torch._C._get_tracing_state() is None and not torch.are_deterministic_algorithms_enabled():
        return x + 1
    return x - 1


# --- slices with tensor bounds: the bounds' arithmetic joins the graph, indexing breaks -----


def slice_by_tensor_bounds(x):
    lo = (x[0] > 0).long()
    hi = lo + 2
    return x[lo:hi] * 2


def store_into_slice_by_tensor_bounds(x):
    out = torch.zeros(6)
    start = (x.abs().argmax() % 3)
    out[start:start + 3] = x.sin()
    return out + 1


def slices_by_tensor_bounds_in_a_tuple(x):
    a = (x.sum() > 0).long()
    return x[a:a + 1, 1:3].cos()


def list_sliced_by_tensor_bounds(x):
    items = [x, x * 2, x * 3, x * 4]
    n = (x.sum() > 0).long() + 1
    return sum(items[0:n]).relu()


SLICE_OF_TENSORS = slice(torch.tensor(1), torch.tensor(3))


def global_slice_holding_tensors(x):
    return x[SLICE_OF_TENSORS] + 1


def paste_like(mask, box):
    w = int(box[2] - box[0] + 1)
    mask = torch.nn.functional.interpolate(mask[None, None], size=(w, w), mode="bilinear")[0, 0]
    im = torch.zeros(12, 12)
    x0 = max(box[0], 0)
    x1 = min(box[2] + 1, 12)
    im[x0:x1, x0:x1] = mask[(x0 - box[0]):(x1 - box[0]), (x0 - box[0]):(x1 - box[0])]
    return im


# --- a break inside a comprehension that reads the frame's locals (its cells) -------------------
# The frame splits at the comprehension's call; the comprehension gets the frame's own cells,
# holding what the trace holds, unless the rest of the frame (or the comprehension) writes them.


def item_in_listcomp_over_argument(x):
    keys = sorted([(x[i].sum().item(), i) for i in range(3)])
    return x[keys[0][1]] * 2


def int_in_listcomp_over_locals(masks, boxes):
    # torchvision's paste_masks_in_image: sizes read in the comprehension, tensors zipped.
    height, width = masks.shape[-2:]
    scale = masks.sum() * 0 + 1
    pasted = [m[: int(b[0]) + 1].sum() * scale + height for m, b in zip(masks, boxes)]
    return torch.stack(pasted) + width


def tolist_in_dict_comprehension(x):
    offset = x.mean()
    table = {i: v for i, v in enumerate(x.tolist())}
    return x + offset + table[0]


def local_written_after_the_comprehension(x):
    k = x.sum()
    firsts = [float(r[0]) + k.item() * 0 for r in x]
    k = k * 2
    return x * k + firsts[0]


def walrus_in_the_comprehension(x):
    last = x[0]
    squares = [(last := r).sum().item() for r in x]
    return last * squares[-1]


def comprehension_break_after_an_earlier_break(x):
    # The comprehension's break is in a resume function, whose cells exist only in the trace
    # (it makes them after its RESUME): not shared; the resume function runs its code.
    fn = torch.sin
    print("", end="")  # the earlier break
    k = x.sum()
    return [fn(r) * float(r[0]) + k for r in x]


def nested_function_called_at_the_break(x):
    bias = x.mean()

    def shifted(t):
        print("in shifted")
        return t + bias

    return shifted(x) * 2


CASES = {
    "print between": (print_between, [(t(3),)], 0),
    "print first": (print_first, [(t(3),)], 0),
    "print last": (print_last, [(t(3),)], 0),
    "print a tensor's shape": (print_tensor, [(t(2, 3),)], 0),
    "print twice": (print_twice, [(t(3),)], 0),
    "print result used": (print_result_used, [(t(3),)], 0),
    "print with keywords": (print_keyword, [(t(3),)], 0),
    "an opaque call": (opaque_call, [(t(3),)], 0),
    "toy_example, both branches": (toy_example, [(t(10), torch.ones(10)), (t(10), -torch.ones(10))], 0),
    "branch on item()": (branch_item, [(torch.ones(3),), (-torch.ones(3),)], 0),
    "branch on any()": (branch_bool_tensor, [(torch.full((3,), 3.0),), (torch.zeros(3),)], 0),
    "if/else on a tensor": (branch_else, [(t(2, 3), torch.eye(3)), (-torch.ones(2, 3), torch.eye(3))], 0),
    "ternary on a tensor": (branch_ternary, [(torch.zeros(3),), (torch.full((3,), 3.14),)], 0),
    "branch with live list": (branch_keeps_locals, [(torch.ones(3), torch.zeros(3)), (torch.zeros(3), torch.ones(3))], 0),
    "branch then more work": (branch_then_more, [(torch.ones(2, 2),), (torch.zeros(2, 2),)], 0),
    "item() in arithmetic": (item_arith, [(t(3),)], 0),
    "tolist()": (tolist_len, [(t(3),)], 0),
    "int(tensor)": (int_of_tensor, [(t(3),)], 0),
    "item() inside a list on the stack": (item_on_stack, [(t(3),)], 0),
    "item() as a keyword argument": (item_as_kwarg, [(t(3),)], 0),
    "item() under a method call": (item_method_args, [(t(3),)], 0),
    "break at depth 1": (depth1, [(t(3),)], 0),
    "break at depth 2": (depth2, [(t(3),)], 0),
    "break at depth 3": (depth3, [(t(3),)], 0),
    "branch in an inlined function": (inlined_branch, [(torch.ones(3),), (-torch.ones(3) * 5,)], 0),
    "live tuple, list and dict": (live_tuple_list_dict, [(t(3),)], 0),
    "live nested containers": (live_nested_containers, [(t(3),)], 0),
    "inputs returned after a break": (live_input_identity, [(t(3), t(3))], 0),
    "live constants": (live_constants, [(t(3),)], 0),
    "live function": (live_function, [(t(3),)], 0),
    "unbound local at the break": (unbound_local_at_break, [(t(3),), (t(2, 2),)], 0),
    "inside no_grad": (inside_no_grad, [(t(3),)], 0),
    "inside enable_grad inside no_grad": (inside_enable_grad, [(t(3),)], 0),
    "inside no_grad, requires grad": (inside_no_grad, [(t(3).requires_grad_(),)], 0),
    "try inside no_grad, enable_grad inside": (try_inside_no_grad, [(t(3).requires_grad_(),)], 3),
    "no_grad block in an inlined function": (no_grad_in_inlined, [(t(3).requires_grad_(),)], 0),
    # The resume function only leaves the block: TorchDynamo hands its backend an empty
    # graph for it, we set the grad mode in the generated code and compile none.
    "exception out of a no_grad block": (no_grad_raises, [(torch.ones(3),), (-torch.ones(3),)], -1),
    "exception out of no_grad caught outside": (no_grad_raise_caught, [(torch.ones(3),), (-torch.ones(3),)], 2),
    # TorchDynamo runs a frame with a break inside a try block eagerly (only the functions it
    # calls get graphs); we split it: the instruction runs under a handler that hands the
    # exception to the original `except`/`finally`, and the prefix and the resume functions
    # get graphs: the positive deltas here and above.
    "try/except, nothing raised": (try_except_print, [(t(3),)], 2),
    "try/except catching the call at the break": (try_except_catches_break, [(torch.ones(3),), (-torch.ones(3),)], 2),
    "try/except/else": (try_except_else, [(t(3),)], 2),
    "try/finally, raising": (try_finally_raises, [(torch.ones(3),), (-torch.ones(3),)], 1),
    # TorchDynamo runs the frame eagerly; the graphs hold the block's operations, and a graph
    # that raises runs the frame again eagerly (its handler sees the exception).
    "branch inside a try block": (branch_inside_try, [(torch.ones(3),), (-torch.ones(3) * 5,)], 3),
    "try around an inlined break": (try_around_inlined_break, [(t(3),)], 1),
    "raise on a tensor's value": (raise_on_tensor_value, [(t(3),), (torch.full((3,), 50.0),)], 0),
    "error in the resume function": (error_after_a_break, [(t(3),)], 0),
    "failing assert after a break": (failing_assert_after_break, [(t(3),)], 0),
    "user context manager": (user_context_manager, [(t(3),)], 0),
    "live iterator": (iterator_live, [(t(3),)], 0),
    "live generator": (generator_live, [(t(3),)], 0),
    "tolist() in a loop": (tolist_in_loop, [(t(3),)], 0),
    "assert on a tensor, passing and failing": (assert_positive, [(torch.ones(3),), (-torch.ones(3),)], 0),
    "super() method on the stack": (super_method_on_stack, [(t(3),)], 0),
    "namedtuple around a break": (namedtuple_around_a_break, [(t(3),)], 0),
    "zero-argument super() after a break": (super_after_a_break, [(t(3),)], 0),
    "super() after a break, receiver in a cell": (super_with_receiver_in_a_cell, [(t(3),)], 0),
    "super() and __class__ in branches on a tensor": (super_in_branches, [(torch.ones(3),), (-torch.ones(3),)], 0),
    "super().forward after a break in forward": (super_forward_after_a_break, [(t(2, 3),)], 0),
    "requires_grad after a break": (requires_grad_after_break, [(t(3).requires_grad_(),)], 0),
    "in a loop": (in_loop, [(t(3),)], 0),
    # TorchDynamo runs the frame eagerly; ours: the block's `x + 1` before the print, and the
    # `finally` clause's `y * 2` in the resume function.
    "in a try block": (in_try, [(t(3),)], 2),
    "closure": (with_free_var, [(t(3),)], 0),
    "module forward printing": (module_print, [(t(2, 4),)], 0),
    "module forward branching": (module_branch, [(t(2, 4) * 10,), (t(2, 4) * 0.01,)], 0),
    "f-string of a tensor": (fstring_of_tensor, [(t(3),)], 0),
    # A global store is replayed after the graph (as by TorchDynamo).
    "global counter": (global_counter, [(t(3),)], 0),
    # Stores into argument lists and `del` of argument dict items are replayed (as by
    # TorchDynamo).
    "store into an argument list": (store_into_argument_list, [lambda: (torch.ones(3), [None, 1])], 0),
    "delete from an argument dict": (delete_from_argument_dict, [lambda: (torch.ones(3), {"a": 1, "b": 2})], 0),
    # NumPy code on tensors is traced through torch._numpy, as TorchDynamo does.
    "numpy round trip": (numpy_roundtrip, [(t(3),)], 0),
    "assert on a tensor": (assert_on_tensor, [(t(3),)], 0),
    "in-place then break": (in_place_then_break, [(t(3),)], 0),
    "attribute store then break": (attribute_store_then_break, [lambda: (Counter(), torch.ones(3))], 0),
    "print a computed value": (print_computed_value, [(t(3),)], 0),
    "*args and **kwargs live": (lambda x, b: varargs_live(x, x * 2, bias=b), [(t(3), t(3))], 0),
    "tuple returned after a break": (tuple_return_after_break, [(t(3),)], 0),
    "break in both branches": (break_in_both_branches, [(torch.ones(3),), (-torch.ones(3),)], 0),
    "two branches in a row": (two_branches_in_a_row, [(torch.ones(3),), (-torch.ones(3),), (t(3) * 3,)], 0),
    "chain of inlined calls with breaks": (nested_function_call_chain, [(t(3),)], 0),
    "method with a break": (method_with_break, [(t(3),)], 0),
    "chained comparison on a tensor": (chained_comparison, [(torch.ones(3),), (torch.full((3,), 50.0),)], 0),
    "nonzero": (nonzero_count, [(t(5),)], 0),
    "keywords into an inlined function that breaks": (kwargs_to_inlined_breaking, [(t(3),)], 0),
    "unused result of a break": (unused_result_of_break, [(t(3),)], 0),
    "early return on a tensor": (early_return_on_tensor, [(torch.full((3,), 20.0),), (torch.ones(3),)], 0),
    # The resume function holds the loop; its branch is inside it and not split (TorchDynamo
    # gets a graph for the loop's first condition in the resume function too).
    "while on a tensor": (while_on_tensor, [(torch.ones(3),)], -1),
    "logging call": (logging_call, [(t(3),)], 0),
    # A comprehension reading a local makes it a cell variable.
    "list of tensors live": (list_of_tensors_with_break, [(t(3, 2),)], 0),
    "dict comprehension live": (dict_comprehension_live, [(t(3),)], 0),
    "closure returned by an inlined function": (returns_closure_value, [(t(3),)], 0),
    "no_grad-decorated helper": (no_grad_decorated_helper, [(t(3),)], 0),
    "comprehensions around a break": (comprehensions_around_a_break, [(t(3),)], 0),
    "cell written after a break": (cell_written_after_break, [(t(3),)], 0),
    # Frames with no tensor among their arguments that TorchDynamo compiles: a module's
    # forward given objects and an OrderedDict holding tensors, a helper that names `torch`,
    # a module passed in (each reached after its caller broke at the call).
    "module called with objects after a break": (module_called_with_objects_after_a_break, [(t(2, 3),)], 0),
    "helper naming torch, int arguments": (helper_naming_torch_with_int_arguments, [(t(3),)], 0),
    "module passed as an argument": (module_passed_as_an_argument, [(t(2, 3),)], 0),
    "JIT tracing state and determinism folded": (tracing_state_and_determinism, [(t(3),)], 0),
    # TorchDynamo runs the rest of a frame after an instruction it cannot trace as plain
    # bytecode ("step_unsupported"); we resume after the indexing and compile the rest: one
    # more graph.
    "slice by tensor bounds": (slice_by_tensor_bounds, [(torch.ones(4),), (-torch.ones(4),)], 1),
    "store into a slice by tensor bounds": (store_into_slice_by_tensor_bounds, [(t(3),)], 1),
    "tensor-bounded slice in a tuple index": (slices_by_tensor_bounds_in_a_tuple, [(torch.ones(3, 4),), (-torch.ones(3, 4),)], 1),
    # (and the two calls hand lists of two lengths to the resume function: one graph each)
    "list sliced by tensor bounds": (list_sliced_by_tensor_bounds, [(torch.ones(3),), (-torch.ones(3),)], 2),
    "global slice holding tensors": (global_slice_holding_tensors, [(t(5),)], 1),
    # The loop over the blocks runs eagerly (a break inside a loop) and each block's frames
    # are compiled, for new sizes with symbolic ones; on the second call (another batch,
    # gradients on) the two front ends recompile the blocks' frames for different guards
    # (sizes, strides, requires_grad): one graph fewer here.
    "LSTM modules between tensor operations, views across breaks": (recurrent_lstm, [(t(2, 8, 8, 4),), (t(1, 6, 4, 4),)], -1),
    "GRU modules between tensor operations": (recurrent_gru, [(t(2, 8, 8, 4),)], 0),
    "RNN modules between tensor operations": (recurrent_rnn, [(t(1, 6, 4, 4),)], 0),
    "paste a mask (torchvision's paste_mask_in_image)": (paste_like, [(torch.rand(5, 5), torch.tensor([2, 3, 7, 9])), (torch.rand(5, 5), torch.tensor([0, 1, 4, 4]))], 0),
    "item() in a list comprehension over an argument": (item_in_listcomp_over_argument, [(t(3, 4),)], 0),
    "int() in a comprehension over the frame's locals": (int_in_listcomp_over_locals, [(torch.rand(3, 4, 5), torch.tensor([[1.0], [2.0], [0.0]]))], 0),
    "tolist() in a dict comprehension": (tolist_in_dict_comprehension, [(t(4),)], 0),
    "a local written after the comprehension": (local_written_after_the_comprehension, [(t(3, 4),)], 0),
    # The comprehension writes the frame's variable (`:=`): the resume function is handed the
    # frame's cell, so it sees the write (the frame ran eagerly before: delta -2).
    "an assignment expression in the comprehension": (walrus_in_the_comprehension, [(t(3, 4),)], 0),
    "a nested function called at the break": (nested_function_called_at_the_break, [(t(3),)], 0),
    # In a resume function, whose cells are the ones it was handed (it ran eagerly before,
    # where TorchDynamo captures `x.sum()` before the comprehension: delta -1).
    "a comprehension break after an earlier break": (comprehension_break_after_an_earlier_break, [(t(3, 4),)], 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_graph_break(name) -> None:
    fn, calls, delta = CASES[name]
    run_cases(fn, calls, graphs_delta=delta, explain_delta=EXPLAIN_DELTAS.get(name, delta))


# Where one call (what `explain` sees) differs from TorchDynamo by another number of graphs
# than all the case's calls do.
EXPLAIN_DELTAS = {
    # The second call takes the other path: one more resume function of ours.
    "exception out of no_grad caught outside": 1,
    "try/except catching the call at the break": 1,
    "list sliced by tensor bounds": 1,
    "LSTM modules between tensor operations, views across breaks": 0,
    # The prefix graph and the resume function of the branch the first call takes.
    "branch inside a try block": 2,
}


def test_toy_example_splits_into_prefix_and_branches() -> None:
    converter = run_cases(toy_example, [(t(10), torch.ones(10)), (t(10), -torch.ones(10))])
    (where, reason), = converter.breaks
    assert "toy_example" in where and "branch" in reason
    explained = torch._dynamo.explain(toy_example)(t(10), torch.ones(10))
    assert explained.graph_break_count == len(converter.breaks)


def test_break_counts_match_explain() -> None:
    for fn, args in [(print_between, (t(3),)), (print_twice, (t(3),)), (branch_item, (torch.ones(3),))]:
        dynamo_rs.reset()
        converter = run_cases(fn, [args])
        explained = torch._dynamo.explain(fn)(*args)
        assert len(converter.breaks) == explained.graph_break_count, fn.__name__


def test_print_runs_once_per_call() -> None:
    compiled = dynamo_rs.compile(print_between, backend=CompileCounter())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for _ in range(3):
            compiled(t(3))
    assert out.getvalue() == "Hi\n" * 3


def test_exception_inside_no_grad_restores_grad_mode() -> None:
    def raises_in_block(x, n):
        try:
            with torch.no_grad():
                y = x * 2
                n[:2]  # raises TypeError for an int
        except TypeError:
            pass
        return x + 1

    compiled = dynamo_rs.compile(raises_in_block, backend=CompileCounter())
    x = t(3).requires_grad_()
    torch.testing.assert_close(compiled(x, 5), raises_in_block(x, 5))
    assert torch.is_grad_enabled()
    assert compiled(x, 5).requires_grad


def test_grad_mode_is_restored_after_a_break_in_no_grad() -> None:
    x = t(3).requires_grad_()
    compiled = dynamo_rs.compile(inside_no_grad, backend=CompileCounter())
    with contextlib.redirect_stdout(io.StringIO()):
        out = compiled(x)
    assert torch.is_grad_enabled()
    assert not out.requires_grad  # computed under no_grad, as eagerly


def test_exception_after_a_break_keeps_type_and_traceback() -> None:
    def raises(x):
        y = x + 1
        print("before")
        if y.sum() > -1e9:
            raise ValueError("after the break")
        return y

    compiled = dynamo_rs.compile(raises, backend=CompileCounter())
    with contextlib.redirect_stdout(io.StringIO()):
        with pytest.raises(ValueError, match="after the break") as info:
            compiled(t(3))
    lines = [frame.line for frame in traceback.extract_tb(info.tb)]
    assert 'raise ValueError("after the break")' in lines


def test_fullgraph_still_raises_at_the_first_break() -> None:
    compiled = dynamo_rs.compile(print_between, backend=CompileCounter(), fullgraph=True)
    with pytest.raises(dynamo_rs.Unsupported):
        compiled(t(3))


def test_new_shape_recompiles_prefix_and_resume() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(print_between, backend=counter)
    with contextlib.redirect_stdout(io.StringIO()):
        compiled(t(3))
        assert counter.frame_count == 2
        for x in (t(5), t(2, 2)):
            torch.testing.assert_close(compiled(x), print_between(x))
    assert counter.frame_count == 6


def test_resume_functions_are_named_and_cached() -> None:
    compiled = dynamo_rs.compile(print_between, backend=CompileCounter())
    with contextlib.redirect_stdout(io.StringIO()):
        compiled(t(3))
        compiled(t(4))
    from dynamo_rs import _capture

    resumes = list(_capture.RESUME_CODES.get(print_between.__code__, {}).values())
    assert len(resumes) == 1
    assert resumes[0].co_name.startswith("__resume_at_")
    assert resumes[0].co_filename == print_between.__code__.co_filename


def test_side_effects_before_the_break_are_visible_to_the_call() -> None:
    class Box:
        pass

    def stores_then_breaks(box, x):
        box.value = x * 2
        observed = box.value.sum().item()
        return box.value + observed

    box_e, box_c = Box(), Box()
    x = t(3)
    expected = stores_then_breaks(box_e, x)
    compiled = dynamo_rs.compile(stores_then_breaks, backend=CompileCounter())
    torch.testing.assert_close(compiled(box_c, x), expected)
    torch.testing.assert_close(box_c.value, box_e.value)


def test_break_keeps_module_outputs_under_inductor_like_backend() -> None:
    compiled = dynamo_rs.compile(module_print, backend="aot_eager")
    x = t(2, 4)
    with contextlib.redirect_stdout(io.StringIO()):
        torch.testing.assert_close(compiled(x), module_print(x))


def test_explain_reports_graphs_breaks_and_ops() -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        ours = dynamo_rs.explain(print_twice)(t(3))
        theirs = torch._dynamo.explain(print_twice)(t(3))
    assert ours.graph_count == theirs.graph_count
    assert ours.graph_break_count == theirs.graph_break_count
    assert ours.op_count == theirs.op_count
    assert [len(ops) for ops in ours.ops_per_graph] == [len(ops) for ops in theirs.ops_per_graph]
    assert all("print" in reason.reason for reason in ours.break_reasons)
    assert all("print_twice" in reason.where for reason in ours.break_reasons)
    text = str(ours)
    assert "Graph count: 3" in text and "Break reasons:" in text


def test_tracing_state_and_global_settings_fold_to_constants() -> None:
    """`torch._C._get_tracing_state()` (no JIT tracer: None), the deterministic-algorithms and
    autocast settings are answered while tracing, as TorchDynamo answers them (the settings are
    part of torch's global state, which every entry's guard checks): no graph operation for
    them, and turning determinism on recompiles and takes the other branch."""
    def fn(x):
        if torch._C._get_tracing_state() is not None or torch.is_autocast_cache_enabled() is None:
            return x * 3
        if torch.are_deterministic_algorithms_enabled() or torch.is_deterministic_algorithms_warn_only_enabled():
            return x - 1
        return x + 1

    x = t(3)
    ours = dynamo_rs.explain(fn)(x)
    torch._dynamo.reset()
    theirs = torch._dynamo.explain(fn)(x)
    assert ours.op_count == theirs.op_count == 1
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    torch.testing.assert_close(compiled(x), fn(x))
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.testing.assert_close(compiled(x), fn(x))
    finally:
        torch.use_deterministic_algorithms(False)
    assert counter.frame_count == 2


def test_callees_of_a_split_frame_are_traced_once() -> None:
    """A break three calls deep: the root frame is traced twice (to fail, then to stop at the
    call), and each callee, reached next as a frame of its own, once — stopped where the
    root's trace saw it fail — instead of twice; each resume function once. Same graphs,
    breaks and results as tracing every callee twice."""
    counter = CompileCounter()
    compiled = dynamo_rs.compile(depth3, backend=counter)
    x = t(3)
    with contextlib.redirect_stdout(io.StringIO()):
        torch.testing.assert_close(compiled(x), depth3(x))
    converter = compiled._dynamo_rs_converter
    outcomes = [outcome for _, _, outcome in converter.frames]
    assert outcomes == ["split"] * 4 + ["graph"] * 4
    assert converter.traces == 2 + 3 + 4
    assert len(converter.breaks) == 4
    assert all("_inner3" in where for where, _ in converter.breaks)


LIST_SLICE = slice(torch.tensor(0), torch.tensor(2))


def list_by_global_slice_of_tensors(x):
    items = [x, x * 2, x * 3]
    return sum(items[LIST_SLICE]) + 1


@pytest.mark.parametrize("fn, window", [(global_slice_holding_tensors, SLICE_OF_TENSORS),
                                        (list_by_global_slice_of_tensors, LIST_SLICE)])
def test_slice_holding_tensors_is_not_a_constant(fn, window) -> None:
    """A slice whose bounds are tensors is not an immutable constant: the tensors change in
    place, and the next call must see the new bounds (a guard on the slice's value would
    compare the same tensor objects and pass)."""
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    x = torch.randn(5)
    saved = window.start.item(), window.stop.item()
    try:
        torch.testing.assert_close(compiled(x), fn(x))
        window.start.fill_(1)
        window.stop.fill_(3)
        torch.testing.assert_close(compiled(x), fn(x))
    finally:
        window.start.fill_(saved[0])
        window.stop.fill_(saved[1])
