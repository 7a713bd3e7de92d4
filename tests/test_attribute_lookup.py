"""Attribute reads that must see what the trace did before them, and reads of attributes
that are not there. Each case was a wrong result:

- a descriptor written in Python (a class with `__get__`) ran on the real object while
  tracing, so it did not see a store the trace had made to the instance's `__dict__`;
- a property of a `dict` subclass (whose `__getattribute__` is `dict`'s slot, not
  `object`'s) ran on the real object too, missing the setter the trace had just inlined;
- `tup.zz` on a named tuple, or `lst.foo` on a list, gave a bound "method" instead of raising
  `AttributeError`, so `try: ... except AttributeError` took the wrong branch;
- an attribute set on an instance of a named tuple's subclass at a graph break went to one
  copy of the tuple and the resume function read another.

Side by side with TorchDynamo (`language_harness`); the objects the code changes are
returned, so their state after the call is compared with eager's too."""

from __future__ import annotations

import collections
import typing

import pytest
import torch

from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)


class ReadsDict:
    """A non-data descriptor reading the instance's `__dict__`."""

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__.get("_internal", "default")


class WritesDict(ReadsDict):
    """A data descriptor: it wins over the instance dict."""

    def __set__(self, obj, value):
        obj.__dict__["_internal"] = f"desc_{value}"


class WithReader:
    desc = ReadsDict()


class WithWriter:
    desc = WritesDict()


@case(t(2), WithReader)
def descriptor_after_a_dict_store(x, obj):
    obj.__dict__["_internal"] = "direct"
    return x + 1, obj.desc


@case(t(2), WithReader)
def descriptor_without_a_store(x, obj):
    return x + len(obj.desc)


class Positive:
    """A validating data descriptor keeping the value under another name."""

    def __set_name__(self, owner, name):
        self.storage = "_" + name

    def __get__(self, obj, objtype=None):
        return self if obj is None else getattr(obj, self.storage)

    def __set__(self, obj, value):
        if value < 0:
            raise ValueError("negative")
        setattr(obj, self.storage, value)

    def __delete__(self, obj):
        delattr(obj, self.storage)


class Scaled:
    scale = Positive()

    def __init__(self, scale):
        self.scale = scale


class PerInstance:
    """A data descriptor keeping its values in a dict of its own."""

    def __init__(self):
        self.values = {}

    def __get__(self, obj, objtype=None):
        return self if obj is None else self.values.get(id(obj), 0)

    def __set__(self, obj, value):
        self.values[id(obj)] = value


class Tagged:
    tag = PerInstance()


@case(t(2), lambda: Scaled(1.0))
def descriptor_set_on_an_argument(x, obj):
    obj.scale = 3.0
    return x * obj.scale, obj._scale


@case(t(2))
def descriptor_set_in_init_of_an_object_made_in_the_frame(x):
    return x * Scaled(2.0).scale


@case(t(2), lambda: Scaled(1.0))
def descriptor_set_raising_is_caught(x, obj):
    try:
        obj.scale = -1.0
    except ValueError:
        return x + obj.scale
    return x


@case(t(2), lambda: Scaled(1.0))
def descriptor_delete(x, obj):
    del obj.scale
    return x + hasattr(obj, "_scale")


# `id(obj)` is a constant of the trace, its identity guarded: the second call's new object
# compiles again (TorchDynamo reuses its graph).
@case(t(2), Tagged, graphs=2, ops=2)
def descriptor_set_changing_its_own_state_then_read(x, obj):
    obj.tag = 5
    return x + obj.tag


class Plain:
    pass


class SlottedWithWeakref:
    __slots__ = ("a", "__weakref__")


# `__weakref__` of an object made in the frame: None (no weak reference to it exists yet);
# the compiled frame gave the class's getset descriptor, which is truthy.
@case(t(2))
def weakref_field_of_an_object_made_in_the_frame(x):
    obj = Plain()
    return torch.cos(x) if obj.__weakref__ else torch.sin(x)


@case(t(2))
def weakref_field_of_a_slotted_object_made_in_the_frame(x):
    obj = SlottedWithWeakref()
    obj.a = 2
    return x + obj.a, obj.__weakref__ is None


@case(t(2), WithWriter)
def data_descriptor_then_dict_store(x, obj):
    obj.desc = "hello"
    obj.__dict__["_internal"] = "direct"
    return x + 1, obj.desc


class DictWithProperty(dict):
    @property
    def value(self):
        return self.__dict__.get("_value", 0)

    @value.setter
    def value(self, v):
        self.__dict__["_value"] = v


class OrderedWithProperty(collections.OrderedDict):
    def __init__(self):
        super().__init__()
        self.__dict__["_value"] = 0

    @property
    def value(self):
        return self.__dict__.get("_value", 0)

    @value.setter
    def value(self, v):
        self.__dict__["_value"] = v


@case(t(1), DictWithProperty)
def dict_subclass_property_after_its_setter(x, m):
    m.value = 100
    return x + m.value, m.__dict__["_value"]


@case(t(1), DictWithProperty)
def dict_subclass_property_after_a_dict_store(x, m):
    m.__dict__["_value"] = 7
    return x + m.value


@case(t(1), OrderedWithProperty)
def ordered_dict_subclass_property_after_its_setter(x, m):
    m.value = 100
    return x + m.value, dict(m.__dict__)


class Registry(collections.OrderedDict):
    def scaled(self, key, by):
        return self[key] * by


def _registry():
    registry = Registry(a=torch.ones(2), b=torch.full((2,), 3.0))
    registry.__dict__["bias"] = 0.5
    return registry


@case(t(2), _registry)
def ordered_dict_subclass_entries_and_attributes(x, m):
    # A new object per call, as the harness makes them: its type and what is read through
    # its entries and attributes are guarded, not which object it is.
    m["c"] = x
    return m.scaled("b", 2) + m["a"] * x + len(m) + m.bias, list(m)


class Pair(typing.NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class PairWithDict(Pair):
    pass


@case(t(2))
def missing_attribute_of_a_named_tuple_caught(x):
    pair = Pair(x + 1, x)
    try:
        pair.zz
    except AttributeError:
        return x - 1
    return x


@case(t(2))
def hasattr_on_a_named_tuple(x):
    pair = Pair(x + 1, x)
    return x + hasattr(pair, "a") + 2 * hasattr(pair, "zz")


@case(t(2), graphs=1, ops=1)  # TorchDynamo runs this frame eagerly
def missing_attribute_of_a_list_caught(x):
    items = [x, x]
    try:
        items.foo
    except AttributeError:
        return x - 1
    return x


@case(t(2), graphs=1, ops=1)  # TorchDynamo runs this frame eagerly
def missing_attribute_of_a_dict_caught(x):
    table = {"a": x}
    try:
        table.a
    except AttributeError:
        return x * 3
    return x


@case(t(2), graphs=2, ops=3)  # the store to a new tuple's attribute breaks the graph
def attribute_stored_on_a_named_tuple_subclass(x):
    pair = PairWithDict(a=x + 1, b=x)
    pair.c = x * 3
    return pair.c + pair.a


@case(t(2), lambda: PairWithDict(torch.ones(2), torch.zeros(2)), graphs=1, ops=1)
def attribute_stored_on_a_given_named_tuple_subclass(x, pair):
    pair.c = x * 3
    return pair


@pytest.mark.parametrize("name,fn,make,spec", params(CASES))
def test_side_by_side(name, fn, make, spec):
    reset_all()
    check_case(fn, make, spec)


def test_named_tuple_subclass_keeps_its_attribute_across_a_break():
    import dynamo_rs

    def f(x):
        pair = PairWithDict(a=x + 1, b=x)
        pair.c = x * 3
        torch._dynamo.graph_break()
        return pair

    dynamo_rs.reset()
    x = torch.randn(2)
    got = dynamo_rs.compile(f, backend="eager")(x)
    torch.testing.assert_close(got.c, x * 3)
    torch.testing.assert_close(got.a, x + 1)
