"""Mappings that are not dicts, read the way Python reads them: `f(**encoding)` and
`{**encoding}` of a `UserDict` (a tokenizer's `BatchEncoding`), a `collections.abc.Mapping`
subclass with its own `keys()` and `__getitem__`, and a signature's `parameters` (a
read-only view) iterated as `transformers`' `_validate_model_kwargs` does. These broke the
graph ("dict update from an object", "iterating over a mappingproxy object"). Side by side
with TorchDynamo (`language_harness`)."""

from __future__ import annotations

import inspect
from collections import UserDict
from collections.abc import Mapping

import pytest
import torch

from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


class BatchEncoding(UserDict):
    def __getattr__(self, item):
        try:
            return self.data[item]
        except KeyError as e:
            raise AttributeError from e


class Fields(Mapping):
    """A read-only mapping over attributes, with its own `keys()`."""

    def __init__(self, **values):
        self._values = values

    def keys(self):
        return [k for k in self._values if not k.startswith("_")]

    def __getitem__(self, key):
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)


def model(input_ids, attention_mask=None, scale=1.0):
    out = input_ids * scale
    return out if attention_mask is None else out * attention_mask


@case(t(4), t(4))
def call_with_a_user_dict_made_in_the_frame(ids, mask):
    return model(**BatchEncoding({"input_ids": ids, "attention_mask": mask}))


@case(lambda: BatchEncoding({"input_ids": torch.ones(4), "attention_mask": torch.zeros(4)}), t(4))
def call_with_a_user_dict_given(encoding, x):
    return model(**encoding) + x + encoding.input_ids


@case(t(4))
def merge_a_user_dict_into_a_dict(x):
    merged = {**BatchEncoding({"input_ids": x}), "scale": 2.0}
    return model(**merged)


@case(t(4))
def call_with_a_mapping_whose_keys_are_its_own(x):
    return model(**Fields(input_ids=x, _hidden=3, scale=3.0))


def _validate_model_kwargs(fn, model_kwargs):
    unused = []
    accepted = set(inspect.signature(fn).parameters)
    for key, value in model_kwargs.items():
        if value is not None and key not in accepted:
            unused.append(key)
    if unused:
        raise ValueError(f"unused model kwargs: {unused}")


@case(t(4), t(4))
def keyword_arguments_checked_against_a_signature(ids, mask):
    kwargs = {"input_ids": ids, "attention_mask": mask, "scale": None}
    _validate_model_kwargs(model, kwargs)
    names = [name for name in inspect.signature(model).parameters]
    return model(**{k: v for k, v in kwargs.items() if v is not None}), names


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_case(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_a_user_dict_changed_between_calls_is_read_again() -> None:
    import dynamo_rs

    reset_all()

    def fn(encoding, x):
        return model(**encoding) + x

    compiled = dynamo_rs.compile(fn, backend="eager")
    encoding = BatchEncoding({"input_ids": torch.ones(4), "attention_mask": torch.zeros(4)})
    x = torch.ones(4)
    torch.testing.assert_close(compiled(encoding, x), fn(encoding, x))
    encoding["attention_mask"] = torch.full((4,), 2.0)
    torch.testing.assert_close(compiled(encoding, x), fn(encoding, x))
    encoding["scale"] = 3.0
    torch.testing.assert_close(compiled(encoding, x), fn(encoding, x))
    del encoding["attention_mask"]
    torch.testing.assert_close(compiled(encoding, x), fn(encoding, x))
