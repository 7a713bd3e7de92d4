"""Tensor operations inside `try` blocks go into the graph, as under TorchDynamo, and keep
eager's semantics where TorchDynamo does not: when the graph raises at run time (an index out
of range, a failed `torch._assert_async`, a matrix that is not positive definite), the frame
runs its original code again, eagerly, from the start, so the exception meets the handlers it
would have met. That is exact because the graph runs before anything else the frame does
(stores, prints and other effects come after it) and the translator keeps apart graphs that
change state a second run would see (in-place operations, random numbers, running
statistics): such a graph breaks at the block's operations instead.

Each case runs calls that raise inside the graph and calls that do not, eagerly and compiled,
comparing results (or the exception's type and message), printed output, the arguments'
values afterwards and grad mode; graphs are compared with TorchDynamo's on the calls that do
not raise (TorchDynamo lets the graph's exception escape the handler).
"""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    torch._dynamo.reset()
    yield
    dynamo_rs.reset()
    torch._dynamo.reset()


def _run(fn, args, kwargs):
    """(result or ("raised", type, message), printed text, the arguments afterwards)."""
    args, kwargs = copy.deepcopy(args), copy.deepcopy(kwargs)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            result = fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - compared with eager's
            result = ("raised", type(err), str(err).split("\n")[0])
    return result, out.getvalue(), (args, kwargs)


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        torch.testing.assert_close(a, b)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b, (a, b)


def check(fn, raising, passing, *, graphs=None):
    """Calls `fn` with each (args, kwargs) of `raising` (raise inside the graph) and `passing`
    (do not), eagerly and compiled, twice over; compares everything; returns the counter."""
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(2):
        for args, kwargs in list(passing) + list(raising):
            grad_mode = torch.is_grad_enabled()
            expected = _run(fn, args, kwargs)
            actual = _run(compiled, args, kwargs)
            _same(actual[0], expected[0])
            assert actual[1] == expected[1], "printed output differs"
            _same(actual[2], expected[2])
            assert torch.is_grad_enabled() == grad_mode
    if graphs is not None:
        theirs = torch._dynamo.testing.CompileCounter()
        reference = torch.compile(fn, backend=theirs)
        ours = CompileCounter()
        dynamo_rs.reset()
        mine = dynamo_rs.compile(fn, backend=ours)
        for args, kwargs in passing:
            _run(reference, args, kwargs)
            _run(mine, args, kwargs)
        assert ours.frame_count == theirs.frame_count + graphs, (ours.frame_count, theirs.frame_count)
    return counter


X = torch.arange(6.0).reshape(3, 2)
IN_RANGE = torch.tensor([0, 2])
OUT_OF_RANGE = torch.tensor([0, 7])


def _calls(fn_args):
    return [(a, {}) for a in fn_args]


# --- the exception caught by the frame's own handler ---------------------------------------


def index_caught(x, i):
    y = x * 2
    try:
        z = torch.index_select(y, 0, i) + 1
    except IndexError:
        z = y.sum(0, keepdim=True)
    return z * 3


def embedding_caught(table, ids):
    try:
        out = nn.functional.embedding(ids, table)
    except IndexError as e:
        out = table.mean(0) + len(str(e)) * 0
    return out.sin()


def assert_async_caught(x):
    try:
        torch._assert_async((x > 0).all())
        y = x.log()
    except RuntimeError:
        y = x.abs()
    return y + 1


def cholesky_caught(a):
    try:
        lower = torch.linalg.cholesky(a)
    except torch.linalg.LinAlgError:
        lower = torch.eye(a.shape[0])
    return lower @ lower.T


def caught_with_else_and_finally(x, i):
    log = []
    try:
        y = x[i]
    except IndexError:
        log.append("except")
        y = x
    else:
        log.append("else")
        y = y * 2
    finally:
        log.append("finally")
    return y, log


def nested_try_inner_handler_misses(x, i):
    try:
        try:
            y = x[i].sum()
        except KeyError:
            y = x * 0
    except IndexError:
        y = x * -1
    return y


@pytest.mark.parametrize("fn,raising,passing,graphs", [
    (index_caught, _calls([(X, OUT_OF_RANGE)]), _calls([(X, IN_RANGE)]), 0),
    (embedding_caught, _calls([(X, torch.tensor([[1, 9]]))]), _calls([(X, torch.tensor([[1, 2]]))]), 0),
    (assert_async_caught, _calls([(torch.tensor([1.0, -1.0]),)]), _calls([(torch.tensor([1.0, 2.0]),)]), 0),
    (cholesky_caught, _calls([(-torch.eye(2),)]), _calls([(torch.eye(2) * 2,)]), 0),
    (caught_with_else_and_finally, _calls([(X, OUT_OF_RANGE)]), _calls([(X, IN_RANGE)]), 0),
    (nested_try_inner_handler_misses, _calls([(X, OUT_OF_RANGE)]), _calls([(X, IN_RANGE)]), 0),
], ids=lambda v: getattr(v, "__name__", None))
def test_caught_by_the_frame(fn, raising, passing, graphs) -> None:
    counter = check(fn, raising, passing, graphs=graphs)
    assert counter.frame_count >= 1


# --- the exception raised in a function called inside the caller's try -------------------


def _pick(x, i):
    return x[i] * 2


def _pick_deeper(x, i):
    return _pick(x + 1, i)


def callee_raises(x, i):
    try:
        y = _pick(x, i)
    except IndexError:
        y = -x
    return y.sum()


def callee_two_deep_raises(x, i):
    try:
        y = _pick_deeper(x, i)
    except (IndexError, ValueError):
        y = x.T
    return y


class _Picker(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))

    def forward(self, x, i):
        try:
            return self.pick(x, i)
        except IndexError:
            return x.new_zeros(1, 2)

    def pick(self, x, i):
        return x[i] * self.scale


@pytest.mark.parametrize("fn", [callee_raises, callee_two_deep_raises, _Picker()],
                         ids=["callee", "callee of a callee", "module method"])
def test_caught_around_a_call(fn) -> None:
    check(fn, _calls([(X, OUT_OF_RANGE)]), _calls([(X, IN_RANGE)]), graphs=0)


# --- what the frame did before the failing operation happens once -------------------------


def effects_before(x, i, log):
    log.append(len(log))
    print("start")
    y = x.cos()
    try:
        y = y[i]
    except IndexError:
        print("caught")
        y = y.sum()
    log.append(y.shape)
    return y


def not_caught(x, i):
    print("before")
    y = x + 1
    try:
        z = y[i]
    except KeyError:
        z = y
    print("after")
    return z


def raising_outside_any_try(x, i):
    print("before")
    try:
        y = x + 1
    except RuntimeError:
        y = x
    return y[i]


def test_effects_before_the_failure_happen_once() -> None:
    check(effects_before, [((X, OUT_OF_RANGE, [0]), {})], [((X, IN_RANGE, []), {})])


@pytest.mark.parametrize("fn", [not_caught, raising_outside_any_try])
def test_not_caught_raises_as_in_eager(fn) -> None:
    check(fn, _calls([(X, OUT_OF_RANGE)]), _calls([(X, IN_RANGE)]), graphs=0)


# --- the frame's parameters, of every kind, and its closure --------------------------------


def every_kind_of_parameter(x, /, i, *rest, scale=2.0, **options):
    try:
        y = x[i] * scale
    except IndexError:
        y = x * len(rest) - len(options)
    return y + sum(rest) + options.get("shift", 0)


def make_closure():
    offset = torch.tensor(5.0)

    def closure(x, i):
        nonlocal_value = offset * 2
        try:
            y = x[i] + nonlocal_value
        except IndexError:
            y = x - offset

        def inner():
            return y + offset  # `offset` and `y` are cells of this frame

        return inner()

    return closure


def test_every_kind_of_parameter() -> None:
    check(every_kind_of_parameter,
          [((X, OUT_OF_RANGE, 1.0, 2.0), {"scale": 3.0, "shift": 1.0})],
          [((X, IN_RANGE, 1.0), {"shift": 2.0}), ((X, IN_RANGE), {})])


def test_closure_and_cells() -> None:
    check(make_closure(), _calls([(X, OUT_OF_RANGE)]), _calls([(X, IN_RANGE)]), graphs=0)


# --- grad mode changed inside the graph ----------------------------------------------------


def no_grad_inside_try(x, i):
    try:
        with torch.no_grad():
            y = x * 2
        z = y[i]
    except IndexError:
        z = x.sum() * torch.is_grad_enabled()
    return z, torch.is_grad_enabled()


def test_grad_mode_restored_before_the_rerun() -> None:
    w = torch.ones(3, 2, requires_grad=True)
    check(no_grad_inside_try, _calls([(w, OUT_OF_RANGE)]), _calls([(w, IN_RANGE)]))


# --- graphs that change state: the block's operations break instead ------------------------


def in_place_on_input_before_try(x, i):
    x.add_(1)
    try:
        y = x[i]
    except IndexError:
        y = x.sum()
    return y


def in_place_on_input_inside_try(x, i):
    try:
        x.mul_(2)
        y = x[i]
    except IndexError:
        y = x.sum()
    return y


def in_place_after_try(x, i):
    try:
        y = x[i]
    except IndexError:
        y = x[:1]
    x[0] = 100.0
    return y * 2


def dropout_in_training_inside_try(x, i):
    try:
        y = nn.functional.dropout(x, 0.5, training=True)[i]
    except IndexError:
        y = x
    return y


def batch_norm_training_inside_try(x, stats, i):
    try:
        y = nn.functional.batch_norm(x, stats[0], stats[1], training=True)
        y = y[i]
    except IndexError:
        y = x
    return y


@pytest.mark.parametrize("fn,extra", [
    (in_place_on_input_before_try, ()),
    (in_place_on_input_inside_try, ()),
    (in_place_after_try, ()),
    (batch_norm_training_inside_try, ((torch.zeros(2), torch.ones(2)),)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_state_changing_graphs_run_each_change_once(fn, extra) -> None:
    # The inputs are compared afterwards: a change applied twice would show.
    def call(i):
        return ((X.clone(), *extra, i), {}) if not extra else ((X.clone(), *extra, i), {})

    check(fn, [call(OUT_OF_RANGE)], [call(IN_RANGE)])


def test_random_numbers_drawn_once() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(dropout_in_training_inside_try, backend=counter)
    for i in (IN_RANGE, OUT_OF_RANGE, IN_RANGE):
        torch.manual_seed(3)
        expected = dropout_in_training_inside_try(X, i)
        after_eager = torch.rand(1)
        torch.manual_seed(3)
        actual = compiled(X, i)
        after_compiled = torch.rand(1)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(after_compiled, after_eager)


# --- models with a try block around their tensor code --------------------------------------


class _LayoutEmbeddings(nn.Module):
    """transformers' LayoutLM: box coordinates looked up inside `try`, the IndexError
    re-raised with a message of its own."""

    def __init__(self):
        super().__init__()
        self.x = nn.Embedding(10, 4)
        self.y = nn.Embedding(10, 4)
        self.dropout = nn.Dropout(0.1)

    def forward(self, bbox):
        try:
            left = self.x(bbox[:, :, 0])
            upper = self.y(bbox[:, :, 1])
        except IndexError as e:
            raise IndexError("The `bbox` coordinate values should be within 0-9") from e
        return self.dropout(left + upper)


def test_model_with_a_try_block_is_one_graph() -> None:
    model = _LayoutEmbeddings().eval()
    good = torch.tensor([[[1, 2], [3, 4]]])
    bad = torch.tensor([[[1, 2], [3, 40]]])
    counter = check(model, _calls([(bad,)]), _calls([(good,)]), graphs=0)
    assert counter.frame_count == 1


def test_generator_frames_keep_breaking_per_operation() -> None:
    # A generator's code cannot be run again as a call: its try-block operations break.
    def gen(x, i):
        try:
            yield x[i]
        except IndexError:
            yield x.sum()

    def consume(x, i):
        return list(gen(x, i))

    check(consume, _calls([(X, OUT_OF_RANGE)]), _calls([(X, IN_RANGE)]))


# --- random numbers in a graph that may raise: the generators are put back for the rerun ---


def _same_random_run(fn, args, compiled):
    """Runs `fn` eagerly and `compiled` from the same seed: equal results (or the same
    exception) and the generator left in the same state (the next draw equal)."""
    torch.manual_seed(11)
    expected = _run(fn, args, {})
    after_eager = torch.rand(3)
    torch.manual_seed(11)
    actual = _run(compiled, args, {})
    after_compiled = torch.rand(3)
    _same(actual[0], expected[0])
    assert actual[1] == expected[1]
    torch.testing.assert_close(after_compiled, after_eager)


def random_before_try(x, i):
    noise = torch.rand_like(x)
    try:
        y = (x + noise)[i]
    except IndexError:
        y = x - noise
    return y * torch.randn(1)


def random_factories_inside_try(x, i):
    try:
        y = torch.randn(3, 2) * x[i].sum() + torch.rand(2)
    except IndexError:
        y = torch.normal(torch.zeros(2), torch.ones(2))
    return y


def dropout_after_try(x, i):
    try:
        y = x[i]
    except IndexError as e:
        raise IndexError("index out of range, said the model") from e
    return nn.functional.dropout(y, 0.3, training=True) + torch.bernoulli(torch.full_like(y, 0.5))


def explicit_generator_inside_try(x, i, g):
    try:
        y = x[i] + torch.rand(2, generator=g)
    except IndexError:
        y = x[:1] * 0
    return y


@pytest.mark.parametrize("fn", [dropout_in_training_inside_try, random_before_try,
                                random_factories_inside_try, dropout_after_try],
                         ids=lambda f: f.__name__)
def test_random_graph_reruns_from_the_same_generator_state(fn) -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for i in (IN_RANGE, OUT_OF_RANGE, IN_RANGE, OUT_OF_RANGE):
        _same_random_run(fn, (X, i), compiled)
    # One graph, as under TorchDynamo (which lets the graph's exception escape instead).
    assert counter.frame_count == 1
    theirs = torch._dynamo.testing.CompileCounter()
    torch.manual_seed(0)
    torch.compile(fn, backend=theirs)(X, IN_RANGE)
    assert theirs.frame_count == 1


def test_explicit_generator_is_not_rerun() -> None:
    # A generator handed in is not put back: the operation breaks the graph and runs once.
    compiled = dynamo_rs.compile(explicit_generator_inside_try, backend=CompileCounter())
    for i in (IN_RANGE, OUT_OF_RANGE):
        g_eager, g_compiled = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        expected = explicit_generator_inside_try(X, i, g_eager)
        actual = compiled(X, i, g_compiled)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(torch.rand(2, generator=g_compiled), torch.rand(2, generator=g_eager))


def test_model_with_a_try_block_trains_in_one_graph() -> None:
    # LayoutLM in training: dropout after the try block's lookups (TorchDynamo: 1 graph).
    torch.manual_seed(0)
    model = _LayoutEmbeddings().train()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    good = torch.tensor([[[1, 2], [3, 4]]])
    bad = torch.tensor([[[1, 2], [3, 40]]])
    for bbox in (good, bad, good):
        _same_random_run(model, (bbox,), compiled)
    assert counter.frame_count == 1
