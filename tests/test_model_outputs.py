"""transformers `ModelOutput` dataclasses made in a compiled frame: the object the generated
code returns is the one eager returns — its class, every field as an attribute (in order),
the fields that are not None as items (in order), indexing by name and position, pytree
flattening — whether it is made directly from the graph's outputs (classes whose
construction is the standard one) or by calling the class (any class that changes a step
of it). A class patched after the first call recompiles; a first field that `__post_init__`
would unpack into fields is not modelled (the frame breaks, results stay eager's)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest
import torch
import torch.utils._pytree as pytree

transformers = pytest.importorskip("transformers")

import dynamo_rs  # noqa: E402
from dynamo_rs.testing import CompileCounter  # noqa: E402
from transformers.modeling_outputs import (  # noqa: E402
    BaseModelOutput,
    BaseModelOutputWithPooling,
    CausalLMOutputWithCrossAttentions,
)
from transformers.utils import ModelOutput  # noqa: E402


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield


def assert_same_output(got, expected):
    """Everything a caller can observe of a ModelOutput, compared field by field."""
    assert type(got) is type(expected)
    assert list(got.__dict__) == list(expected.__dict__)
    assert list(got.keys()) == list(expected.keys())
    for name, value in expected.__dict__.items():
        other = got.__dict__[name]
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(other, value)
        elif isinstance(value, tuple):
            assert isinstance(other, tuple) and len(other) == len(value)
            for a, b in zip(other, value):
                torch.testing.assert_close(a, b)
        else:
            assert other == value
    assert len(got.to_tuple()) == len(expected.to_tuple())
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key])
        torch.testing.assert_close(getattr(got, key), expected[key])
    for i in range(len(expected)):
        torch.testing.assert_close(got[i], expected[i])
    got_leaves, got_spec = pytree.tree_flatten(got)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert got_spec == expected_spec
    assert len(got_leaves) == len(expected_leaves)


# Fields set in different patterns: only the first, a None first field with later ones set,
# all set, tuples of tensors as fields.
CASES = {
    "first_only": lambda x: BaseModelOutput(last_hidden_state=x.sin()),
    "first_none_second_set": lambda x: CausalLMOutputWithCrossAttentions(logits=x.cos()),
    "loss_and_logits": lambda x: CausalLMOutputWithCrossAttentions(loss=x.sum(), logits=x * 2),
    "positional": lambda x: BaseModelOutputWithPooling(x + 1, x.mean(0)),
    "tuple_fields": lambda x: BaseModelOutput(
        last_hidden_state=x, hidden_states=(x.sin(), x.cos()), attentions=(x.exp(),)
    ),
    "all_none_but_a_middle_one": lambda x: BaseModelOutput(hidden_states=(x.tanh(),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_output_equals_eager(case):
    fn = CASES[case]
    x = torch.randn(3, 4)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(3):
        assert_same_output(compiled(x), fn(x))
    assert counter.frame_count == 1


def test_output_read_back_in_the_frame_equals_eager():
    def fn(x):
        out = CausalLMOutputWithCrossAttentions(logits=x.sin())
        first = out[0]
        return out.logits + first + out["logits"] + len(out), out

    x = torch.randn(2, 3)
    compiled = dynamo_rs.compile(fn, backend="eager")
    got, expected = compiled(x), fn(x)
    torch.testing.assert_close(got[0], expected[0])
    assert_same_output(got[1], expected[1])


@dataclasses.dataclass
class CountingOutput(ModelOutput):
    """A class whose `__post_init__` does more than ModelOutput's: made by calling it."""

    value: Optional[torch.Tensor] = None
    other: Optional[torch.Tensor] = None
    made = 0

    def __post_init__(self):
        super().__post_init__()
        CountingOutput.made += 1


def test_a_class_with_its_own_post_init_is_constructed_as_in_eager():
    fn = lambda x: CountingOutput(value=x.sin(), other=x.cos())  # noqa: E731
    compiled = dynamo_rs.compile(fn, backend="eager")
    x = torch.randn(3)
    CountingOutput.made = 0
    expected = [fn(x) for _ in range(3)]
    eager_made = CountingOutput.made
    CountingOutput.made = 0
    got = [compiled(x) for _ in range(3)]
    assert CountingOutput.made == eager_made == 3
    for g, e in zip(got, expected):
        assert_same_output(g, e)


@dataclasses.dataclass
class PatchedOutput(ModelOutput):
    value: Optional[torch.Tensor] = None
    other: Optional[torch.Tensor] = None


def test_a_construction_step_patched_after_the_first_call_recompiles():
    fn = lambda x: PatchedOutput(value=x + 1, other=x * 3)  # noqa: E731
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    x = torch.ones(2)
    assert_same_output(compiled(x), fn(x))
    original = PatchedOutput.__post_init__
    calls = []

    def post_init(self):
        calls.append(1)
        original(self)

    PatchedOutput.__post_init__ = post_init
    try:
        expected = fn(x)
        assert calls == [1]
        got = compiled(x)
        assert calls == [1, 1]
        assert_same_output(got, expected)
        assert counter.frame_count == 2
    finally:
        PatchedOutput.__post_init__ = original


@pytest.mark.parametrize("pairs", [list, tuple, dict])
def test_a_first_field_of_name_value_pairs_is_unpacked_as_in_eager(pairs):
    def fn(x):
        fields = [("last_hidden_state", x.sin()), ("hidden_states", (x,))]
        out = BaseModelOutput(dict(fields) if pairs is dict else pairs(fields))
        # Read back in the frame: the field holds the tensor, not the pairs.
        return out.last_hidden_state * 2, len(out), out

    x = torch.randn(2)
    compiled = dynamo_rs.compile(fn, backend="eager")
    got, expected = compiled(x), fn(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] == expected[1]
    assert_same_output(got[2], expected[2])


def test_transformers_model_output_equals_eager():
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 6))
    mask = torch.ones(1, 6, dtype=torch.long)
    compiled = dynamo_rs.compile(model, backend="eager")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask)
        for _ in range(2):
            got = compiled(ids, attention_mask=mask)
    assert type(got) is type(expected)
    assert list(got.keys()) == list(expected.keys())
    assert list(got.__dict__) == list(expected.__dict__)
    torch.testing.assert_close(got.logits, expected.logits)
    cache, eager_cache = got.past_key_values, expected.past_key_values
    assert type(cache) is type(eager_cache)
    for layer, eager_layer in zip(cache.layers, eager_cache.layers):
        torch.testing.assert_close(layer.keys, eager_layer.keys)
        torch.testing.assert_close(layer.values, eager_layer.values)


def _replace_an_item(x):
    out = BaseModelOutput(last_hidden_state=x + 1, hidden_states=(x,))
    out.last_hidden_state = x * 2  # an item: replaced in place (dinov3's pattern)
    return out


def _set_a_none_field_after_the_items(x):
    out = BaseModelOutputWithPooling(last_hidden_state=x + 1)
    out.pooler_output = x.sum(0)  # ModelOutput.__setattr__ makes it an item, appended
    return out


def _item_store_of_a_none_field(x):
    out = BaseModelOutput(last_hidden_state=x + 1)
    out["attentions"] = (x.exp(),)
    return out


def _set_a_none_field_before_the_items(x):
    out = BaseModelOutputWithPooling(pooler_output=x.sum(0))
    out.last_hidden_state = x + 1  # appended after pooler_output: not field order
    return out


def _none_over_an_item(x):
    out = BaseModelOutput(last_hidden_state=x + 1, hidden_states=(x,))
    out.hidden_states = None  # the attribute only: the item keeps its value
    return out


# Stores into a ModelOutput made in the frame (parakeet's `out.pooler_output = ...`,
# dinov3's `output.last_hidden_state = ...`): the first three are traced, the last two
# (attributes and items that differ from field order) break the graph — each returns
# what eager returns.
STORES = {
    "replace_an_item": (_replace_an_item, 1),
    "set_a_none_field_after_the_items": (_set_a_none_field_after_the_items, 1),
    "item_store_of_a_none_field": (_item_store_of_a_none_field, 1),
    "set_a_none_field_before_the_items": (_set_a_none_field_before_the_items, None),
    "none_over_an_item": (_none_over_an_item, None),
}


@pytest.mark.parametrize("case", sorted(STORES))
def test_stores_into_an_output_made_in_the_frame_equal_eager(case):
    fn, graphs = STORES[case]
    x = torch.randn(3, 4)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(2):
        got, expected = compiled(x), fn(x)
        # Attributes and items may differ here (`none_over_an_item`): each compared apart.
        assert type(got) is type(expected)
        assert list(got.__dict__) == list(expected.__dict__)
        assert list(got.keys()) == list(expected.keys())
        for name in expected.__dict__:
            assert (getattr(got, name) is None) == (getattr(expected, name) is None)
            if getattr(expected, name) is not None:
                torch.testing.assert_close(getattr(got, name), getattr(expected, name))
        for key in expected.keys():
            torch.testing.assert_close(got[key], expected[key])
        torch.testing.assert_close(got.to_tuple(), expected.to_tuple())
    if graphs is not None:
        assert counter.frame_count == graphs


def test_stores_read_back_in_the_frame_equal_eager():
    def fn(x):
        out = BaseModelOutputWithPooling(last_hidden_state=x + 1)
        out.pooler_output = x.sum(0)
        out.last_hidden_state = out.last_hidden_state * 3
        return out.to_tuple(), list(out.keys()), out[1], "pooler_output" in out, len(out)

    x = torch.randn(3, 4)
    explained = dynamo_rs.explain(fn)(x)
    got, expected = dynamo_rs.compile(fn, backend="eager")(x), fn(x)
    assert got[1:] != () and got[1] == expected[1] and got[3:] == expected[3:]
    for a, b in zip(got[0], expected[0]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got[2], expected[2])
    assert explained.graph_count == 1 and explained.break_reasons == []
