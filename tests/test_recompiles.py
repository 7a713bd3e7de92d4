"""No recompile on a second identical call: what a frame is given anew on every call (a
transformers cache object, mask closures, a config-like object) is guarded by what the trace
reads of it, not by identity — while code that does depend on identity still is."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from models import build, tensors_of


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


def compiled(fn, **options):
    counter = CompileCounter()
    return dynamo_rs.compile(fn, backend=counter, **options), counter


# --- the model suite, and transformers models called the usual way (with a mask) -------------

MODELS = ["resnet18", "mobilenet_v3_small", "vit_tiny_patch16_224", "convnext_atto", "gpt2", "bert", "llama"]


def _calls(name: str, with_mask: bool):
    model, inputs = build(name)
    if not with_mask:
        return model, inputs, {}
    (ids,) = inputs
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    return model, (), {"input_ids": ids, "attention_mask": mask}


def _small_bart():
    from transformers import BartConfig, BartModel

    config = BartConfig(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
                        max_position_embeddings=64)
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    return BartModel(config).eval(), (), {"input_ids": ids, "attention_mask": mask}


CASES = [(name, False) for name in MODELS] + [(name, True) for name in ["gpt2", "bert", "llama", "bart"]]


@pytest.mark.parametrize("name,with_mask", CASES)
def test_second_identical_call_adds_no_graph(name, with_mask) -> None:
    model, args, kwargs = _small_bart() if name == "bart" else _calls(name, with_mask)
    counter = CompileCounter()
    cmodel = dynamo_rs.compile(model, backend=counter)
    with torch.no_grad():
        expected = model(*args, **kwargs)
        first = cmodel(*args, **kwargs)
        after_first = counter.frame_count
        for _ in range(2):
            again = cmodel(*args, **kwargs)
            assert counter.frame_count == after_first, "an identical call compiled again"
    for e, g in zip(tensors_of(expected), tensors_of(first)):
        torch.testing.assert_close(g, e)
    for e, g in zip(tensors_of(expected), tensors_of(again)):
        torch.testing.assert_close(g, e)


# --- objects and closures made anew on every call --------------------------------------------


class Box:
    def __init__(self, scale):
        self.scale = scale

    def apply(self, x):
        return x * self.scale


def use_box(x, box):
    return box.apply(x) + box.scale


def test_a_new_object_of_the_same_kind_reuses_the_code() -> None:
    cfn, counter = compiled(use_box)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(cfn(x, Box(2.0)), use_box(x, Box(2.0)))
    assert counter.frame_count == 1
    torch.testing.assert_close(cfn(x, Box(5.0)), use_box(x, Box(5.0)))
    assert counter.frame_count == 2


class OtherBox(Box):
    def apply(self, x):
        return x - self.scale


def test_an_object_of_another_class_recompiles() -> None:
    cfn, counter = compiled(use_box)
    x = torch.randn(3)
    cfn(x, Box(2.0))
    torch.testing.assert_close(cfn(x, OtherBox(2.0)), use_box(x, OtherBox(2.0)))
    assert counter.frame_count == 2


class CallableBox:
    def __init__(self, scale):
        self.scale = scale

    def __call__(self, x):
        return x * self.scale


class OtherCallableBox(CallableBox):
    def __call__(self, x):
        return x - self.scale


class Table(dict):
    """A dict subclass that leaves dict's lookups alone."""

    def total(self):
        return sum(self.values())


class DefaultingTable(dict):
    """A dict subclass that overrides a lookup: read by identity."""

    def __getitem__(self, key):
        return dict.get(self, key, 10)


def call_box(x, box):
    return box(x) + 1


def read_table(x, table):
    return x * table["a"] + len(table)


@pytest.mark.parametrize(("make", "other"), [
    (CallableBox, OtherCallableBox),
])
def test_a_new_callable_object_reuses_the_code(make, other) -> None:
    """A callable instance of a Python class is guarded by its type and what its `__call__`
    reads, not by identity; another value or another class recompiles."""
    cfn, counter = compiled(call_box)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(cfn(x, make(2.0)), call_box(x, make(2.0)))
    assert counter.frame_count == 1
    torch.testing.assert_close(cfn(x, make(5.0)), call_box(x, make(5.0)))
    torch.testing.assert_close(cfn(x, other(5.0)), call_box(x, other(5.0)))
    assert counter.frame_count == 3


def test_a_new_dict_subclass_object_reuses_the_code() -> None:
    cfn, counter = compiled(read_table)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(cfn(x, Table(a=2.0)), read_table(x, Table(a=2.0)))
    assert counter.frame_count == 1
    # Another value, other keys, a plain dict, a subclass overriding a lookup: each recompiles
    # (or is read anew) and gives eager's answer.
    for table in (Table(a=3.0), Table(a=3.0, b=1.0), {"a": 4.0}, DefaultingTable(b=1.0)):
        torch.testing.assert_close(cfn(x, table), read_table(x, table))
    assert counter.frame_count >= 4


def _object_across_a_break(x):
    box = CallableBox(2.0)
    print("between two graphs")
    return box(x)


def _counter_across_a_break(x):
    import collections

    counts = collections.Counter("hello")
    return x * counts["l"]


def _dict_subclass_across_a_break(x):
    table = Table(a=3.0)
    return x * table["a"]


@pytest.mark.parametrize("fn", [_object_across_a_break, _counter_across_a_break,
                                _dict_subclass_across_a_break])
def test_objects_made_before_a_break_do_not_recompile(fn, capsys) -> None:
    """An object made anew on every call and handed to the resume function (rebuilt after
    the graph, or made by the instruction that broke the graph) is not guarded by identity:
    the second call reuses the resume function's code."""
    cfn, counter = compiled(fn)
    x = torch.randn(3)
    torch.testing.assert_close(cfn(x), fn(x))
    graphs = counter.frame_count
    for _ in range(3):
        torch.testing.assert_close(cfn(x), fn(x))
    assert counter.frame_count == graphs


def make_scaler(k):
    def scale(x):
        return x * k

    return scale


def make_with_default(k):
    def scale(x, k=k):
        return x * k

    return scale


def call_fn(x, fn):
    return fn(x) + 1


@pytest.mark.parametrize("factory", [make_scaler, make_with_default])
def test_a_new_closure_of_the_same_code_reuses_the_code(factory) -> None:
    cfn, counter = compiled(call_fn)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(cfn(x, factory(2.0)), call_fn(x, factory(2.0)))
    assert counter.frame_count == 1
    torch.testing.assert_close(cfn(x, factory(7.0)), call_fn(x, factory(7.0)))
    assert counter.frame_count == 2
    torch.testing.assert_close(cfn(x, lambda t: t.cos()), call_fn(x, lambda t: t.cos()))
    assert counter.frame_count == 3


def checked_call(x, fn):
    # As transformers' `and_masks` checks its arguments.
    if not callable(fn):
        raise TypeError("not callable")
    return fn(x) + 1


def optional_call(x, fn, box):
    if fn is None or box is None:
        return x
    if box is not True and fn is not Ellipsis and box is not NotImplemented:
        return fn(x) + box.scale
    return x - 1


@pytest.mark.parametrize("fn", [checked_call, optional_call])
def test_callable_and_is_none_of_a_new_object_reuse_the_code(fn) -> None:
    """`callable(obj)` and `obj is None` (or another singleton) depend on the object's type
    alone: a closure or object made anew on every call reuses the code, while None itself, or
    an object that is not callable, gets what eager gives."""
    cfn, counter = compiled(fn)
    x = torch.randn(3)
    extra = (Box(2.0),) if fn is optional_call else ()
    for _ in range(3):
        fresh_extra = (Box(2.0),) if extra else ()
        torch.testing.assert_close(cfn(x, make_scaler(2.0), *fresh_extra), fn(x, make_scaler(2.0), *fresh_extra))
    assert counter.frame_count == 1
    if fn is optional_call:
        for args in [(None, Box(2.0)), (make_scaler(2.0), None)]:
            torch.testing.assert_close(cfn(x, *args), fn(x, *args))
    else:
        for run in (fn, cfn):
            with pytest.raises(TypeError):
                run(x, Box(2.0))


SENTINEL = Box(1.0)


def identity_branch(x, box):
    if box is SENTINEL:
        return x + 1
    return x - 1


def test_identity_comparisons_still_guard_identity() -> None:
    cfn, _ = compiled(identity_branch)
    x = torch.randn(3)
    torch.testing.assert_close(cfn(x, SENTINEL), identity_branch(x, SENTINEL))
    look_alike = Box(1.0)
    torch.testing.assert_close(cfn(x, look_alike), identity_branch(x, look_alike))


def optional_attribute(x, box):
    if hasattr(box, "extra"):
        return x + box.extra
    return x * box.scale


def test_attribute_presence_is_guarded() -> None:
    cfn, _ = compiled(optional_attribute)
    x = torch.randn(3)
    plain, with_extra = Box(2.0), Box(2.0)
    with_extra.extra = 10.0
    torch.testing.assert_close(cfn(x, plain), optional_attribute(x, plain))
    torch.testing.assert_close(cfn(x, with_extra), optional_attribute(x, with_extra))
    torch.testing.assert_close(cfn(x, Box(2.0)), optional_attribute(x, Box(2.0)))


def count_calls(x, box):
    box.calls = box.calls + 1
    return x * box.calls


def test_stores_reach_the_object_of_this_call() -> None:
    cfn, counter = compiled(count_calls)
    x = torch.randn(3)
    for _ in range(3):
        mine, theirs = Box(1.0), Box(1.0)
        mine.calls = theirs.calls = 0
        torch.testing.assert_close(cfn(x, mine), count_calls(x, theirs))
        assert mine.calls == theirs.calls == 1
    assert counter.frame_count == 1


def dict_keyed_by_object(x, box, table):
    return x * table[box]


def test_objects_used_as_keys_keep_identity() -> None:
    cfn, _ = compiled(dict_keyed_by_object)
    x = torch.randn(3)
    a, b = Box(1.0), Box(1.0)
    table = {a: 2.0, b: 3.0}
    torch.testing.assert_close(cfn(x, a, table), dict_keyed_by_object(x, a, table))
    torch.testing.assert_close(cfn(x, b, table), dict_keyed_by_object(x, b, table))


# --- instances of one module class share compiled code ---------------------------------------


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + self.fc(self.norm(x)).relu()


def test_instances_of_one_block_class_compile_one_frame() -> None:
    torch.manual_seed(0)
    blocks = [Block().eval() for _ in range(12)]
    counter = CompileCounter()
    compiled_blocks = [dynamo_rs.compile(b, backend=counter) for b in blocks]
    x = torch.randn(4, 16)
    with torch.no_grad():
        expected, actual = x, x
        for block, cblock in zip(blocks, compiled_blocks):
            expected = block(expected)
            actual = cblock(actual)
            torch.testing.assert_close(actual, expected)
    assert counter.frame_count == 1


def test_an_instance_with_another_structure_recompiles() -> None:
    torch.manual_seed(0)
    first, second = Block().eval(), Block().eval()
    second.fc = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())
    counter = CompileCounter()
    x = torch.randn(4, 16)
    with torch.no_grad():
        for block in (first, second, first):
            torch.testing.assert_close(dynamo_rs.compile(block, backend=counter)(x), block(x))
    assert counter.frame_count == 2


def test_an_instance_in_another_mode_recompiles() -> None:
    # Dropout(p=1) zeroes everything in training mode and nothing in eval mode: both results
    # are exact, and the training-mode instance must not run the eval-mode graph.
    torch.manual_seed(0)
    a, b = Block(), Block()
    for block in (a, b):
        block.fc = torch.nn.Sequential(torch.nn.Dropout(1.0), torch.nn.Linear(16, 16))
    a.eval()
    b.train()
    counter = CompileCounter()
    x = torch.randn(4, 16)
    with torch.no_grad():
        for block in (a, b, a):
            torch.testing.assert_close(dynamo_rs.compile(block, backend=counter)(x), block(x))
    assert counter.frame_count == 2


# --- recompile reasons -----------------------------------------------------------------------


def double(x):
    return x * 2


def test_recompile_reasons_are_logged_and_named_at_the_cache_limit(caplog) -> None:
    import logging
    import warnings

    previous = dynamo_rs.config.cache_size_limit
    dynamo_rs.config.cache_size_limit = 2
    try:
        # Static shapes: every size is an entry (automatic dynamic would serve 3 and 4 by one).
        cfn, counter = compiled(double, dynamic=False)
        with caplog.at_level(logging.INFO, logger="dynamo_rs.recompiles"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for n in (2, 3, 4):
                    torch.testing.assert_close(cfn(torch.ones(n)), double(torch.ones(n)))
        assert counter.frame_count == 2
        logged = [r.getMessage() for r in caplog.records if r.name == "dynamo_rs.recompiles"]
        assert logged and "double" in logged[0] and "shape" in logged[0]
        limit = [str(w.message) for w in caught if "cache_size_limit" in str(w.message)]
        assert len(limit) == 1 and "last recompile" in limit[0] and "shape" in limit[0], limit
    finally:
        dynamo_rs.config.cache_size_limit = previous


# --- a frame that fails for some inputs keeps its entries for the others ---------------------


def maybe_print(x, verbose):
    if verbose:
        for _ in range(1):
            print("verbose")  # a break inside a loop: this call's frame runs eagerly
    return x.sin() + 1


def test_failed_compile_keeps_earlier_entries(capsys) -> None:
    """BART's layer wrapper compiles for encoder layers and fails for decoder layers; the
    encoder layers must keep running their compiled code afterwards."""
    runs = []

    def backend(gm, example_inputs):
        def run(*args):
            runs.append(1)
            return gm.forward(*args)
        return run

    cfn = dynamo_rs.compile(maybe_print, backend=backend)
    x = torch.randn(3)
    for verbose in (False, True, False, True, False):
        torch.testing.assert_close(cfn(x, verbose), maybe_print(x, verbose))
    assert len(runs) == 3  # every quiet call ran the graph, the first one's entry
    assert capsys.readouterr().out.count("verbose") == 4


def _through_wrapper(fn):
    # As decorators do (transformers' `can_return_tuple`, `functools.wraps` wrappers): the
    # tensors reach the compiled frame inside `*args` and `**kwargs`.
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@_through_wrapper
def _scaled_sum(x, pair, *, bias):
    return x * 2 + pair[0] - pair[1] * bias


def test_tensors_in_args_kwargs_and_tuples_are_checked_first_and_still_guard() -> None:
    """Tensors inside `*args`, `**kwargs` and a tuple argument are read before the rest of the
    guard (a call with other shapes fails there first); a change in any of their shapes, a
    tuple given as a list, or a missing item still recompiles, with eager's results."""
    fn, counter = compiled(_scaled_sum)
    a, b, c, bias = (torch.randn(4) for _ in range(4))

    def call(*args, **kwargs):
        torch.testing.assert_close(fn(*args, **kwargs), _scaled_sum(*args, **kwargs))

    call(a, (b, c), bias=bias)
    call(a, (b, c), bias=bias)
    assert counter.frame_count == 1
    call(torch.randn(3), (torch.randn(3), torch.randn(3)), bias=torch.randn(3))
    assert counter.frame_count == 2
    call(a, (b, torch.randn(1)), bias=bias)  # broadcasts: a new shape in the tuple
    assert counter.frame_count == 3
    call(a, [b, c], bias=bias)  # a list where a tuple was
    assert counter.frame_count == 4
    call(a, (b, c), bias=torch.randn(1))  # a new shape under **kwargs
    assert counter.frame_count == 5
    call(a, (b, c), bias=bias)  # the first entry again
    assert counter.frame_count == 5
