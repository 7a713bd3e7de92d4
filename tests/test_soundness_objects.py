"""Attribute stores on Python objects, answered as Python answers them: a property's setter
runs (on objects made in the frame and on the frame's inputs), a frozen dataclass refuses the
store, `__slots__` members change and are read back. Each case runs eagerly and compiled on
equal fresh objects and compares results and the objects' state afterwards."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


class Doubling:
    def __init__(self):
        self._k = 1.0

    @property
    def k(self):
        return self._k

    @k.setter
    def k(self, value):
        self._k = value * 2

    @k.deleter
    def k(self):
        self._k = -1.0


class ReadOnly:
    @property
    def k(self):
        return 4.0


class Slotted:
    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k


@dataclasses.dataclass(frozen=True)
class Frozen:
    k: float = 2.0


def set_through_property(x, obj):
    obj.k = 3.0
    return x * obj.k


def delete_through_property(x, obj):
    del obj.k
    return x * obj.k


def set_property_of_new_object(x):
    obj = Doubling()
    obj.k = 3.0
    return x * obj.k


def setattr_through_property(x, obj):
    setattr(obj, "k", 5.0)
    return x + obj.k


def set_read_only_property(x, obj):
    try:
        obj.k = 1.0
    except AttributeError:
        return x - obj.k
    return x


def bump_slot(x, obj):
    obj.k = obj.k + 1
    return x * obj.k


def assign_frozen(x):
    f = Frozen(3.0)
    try:
        f.k = 5.0
    except dataclasses.FrozenInstanceError:
        return x * f.k
    return x


class Box:
    """A plain object whose properties compute from its attributes."""

    def __init__(self) -> None:
        self.w = 2.0
        self.h = 3.0

    @property
    def area(self):
        return self.w * self.h

    @property
    def aspect(self):
        return self.w / self.h if self.h else 0.0


def read_property_after_store(x, box):
    box.w = 5.0
    return x * box.area


def read_property_after_two_stores(x, box):
    box.w = x.shape[0] * 1.5
    box.h = 0.0
    return x + box.area + box.aspect


def property_of_stored_tensor(x, box):
    box.w = x.sum()
    return x * box.area


def store_then_setter_then_getter(x, obj):
    obj.k = 2.0  # Doubling's setter: stores 4.0
    obj.extra = 1.0
    return x * obj.k


CASES = [
    (read_property_after_store, Box),
    (read_property_after_two_stores, Box),
    (property_of_stored_tensor, Box),
    (store_then_setter_then_getter, Doubling),
    (set_through_property, Doubling),
    (delete_through_property, Doubling),
    (set_property_of_new_object, None),
    (setattr_through_property, Doubling),
    (set_read_only_property, ReadOnly),
    (bump_slot, lambda: Slotted(1.0)),
    (assign_frozen, None),
]


def _state(obj):
    if obj is None:
        return None
    if hasattr(obj, "__slots__"):
        return {name: getattr(obj, name) for name in obj.__slots__}
    return dict(vars(obj))


@pytest.mark.parametrize(("fn", "make"), CASES, ids=[c[0].__name__ for c in CASES])
def test_attribute_store_matches_eager(fn, make) -> None:
    x = torch.randn(3)
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(2):
        eager_obj = make() if make else None
        compiled_obj = copy.copy(eager_obj) if make else None
        eager_args = (x, eager_obj) if make else (x,)
        compiled_args = (x, compiled_obj) if make else (x,)
        torch.testing.assert_close(compiled(*compiled_args), fn(*eager_args))
        assert _state(compiled_obj) == _state(eager_obj)


class Position:
    """An index whose value changes while the object stays the same."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        return self.n


POSITION = Position(0)


def list_item_at_position(x):
    items = [x, x * 2, x * 3]
    return items[POSITION] + 1


def tuple_slice_from_position(x):
    items = (x, x * 2, x * 3)
    return sum(items[POSITION:]) + 1


def tensor_item_at_position(x):
    return x[POSITION] + 1


def tensor_slice_from_position(x):
    return x[POSITION:] * 2


def tensor_slice_to_position(x):
    return x[:POSITION] * 2


def narrow_at_position(x):
    return x.narrow(0, POSITION, 2) + 1


def expand_by_position(x):
    return x.expand(POSITION, 5) + 1


def zeros_of_position(x):
    return torch.zeros(POSITION) + x.sum()


def sum_over_range_of_position(x):
    return sum(x[i] for i in range(POSITION)) + x.sum()


def int_and_round_of_position(x):
    return x * int(POSITION) + round(POSITION)


INDEX_CASES = [list_item_at_position, tuple_slice_from_position, tensor_item_at_position,
               tensor_slice_from_position, tensor_slice_to_position, narrow_at_position,
               expand_by_position, zeros_of_position, sum_over_range_of_position,
               int_and_round_of_position]


class _RoundablePosition(Position):
    def __int__(self) -> int:
        return self.n

    def __round__(self, ndigits=None) -> int:
        return self.n


@pytest.mark.parametrize("backend", ["counter", "aot_eager"])
@pytest.mark.parametrize("fn", INDEX_CASES, ids=[f.__name__ for f in INDEX_CASES])
def test_object_with_index_read_on_every_call(fn, backend) -> None:
    """An object used as an index (its `__index__`, `__int__`, `__round__`) is read again on
    every call: the object is the same (its identity guard holds), its value is not. Under
    `aot_eager` too, which bakes whatever the graph holds when it compiles."""
    global POSITION
    saved = POSITION
    POSITION = _RoundablePosition(0)
    try:
        _check_positions(fn, backend)
    finally:
        POSITION = saved


def _check_positions(fn, backend) -> None:
    compiled = dynamo_rs.compile(fn, backend=CompileCounter() if backend == "counter" else backend)
    x = torch.arange(5.0)
    try:
        for n in (1, 2, 1, 0):
            POSITION.n = n
            torch.testing.assert_close(compiled(x), fn(x))
    finally:
        POSITION.n = 0


class Bag:
    """A container written in Python: its protocols read `items`, which can change while the
    object stays the same."""

    def __init__(self) -> None:
        self.items = [1, 2]

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __contains__(self, k):
        return k in self.items


class Flag:
    def __init__(self) -> None:
        self.on = True

    def __bool__(self):
        return self.on


class Named:
    def __init__(self) -> None:
        self.n = 1

    def __str__(self):
        return f"v{self.n}"

    def __format__(self, spec):
        return f"v{self.n}"

    def __repr__(self):
        return f"Named({self.n})"


BAG, FLAG, NAMED = Bag(), Flag(), Named()

PROTOCOL_CASES = {
    "sum": (lambda x: x * sum(BAG), lambda: BAG.items.append(3)),
    "max": (lambda x: x * max(BAG), lambda: BAG.items.append(9)),
    "min": (lambda x: x * min(BAG), lambda: BAG.items.insert(0, -4)),
    "sorted": (lambda x: x * sorted(BAG)[-1], lambda: BAG.items.append(11)),
    "any/all": (lambda x: x * (all(BAG) + any(BAG)), lambda: BAG.items.append(0)),
    "list": (lambda x: x * list(BAG)[-1], lambda: BAG.items.append(13)),
    "tuple": (lambda x: x * tuple(BAG)[-1], lambda: BAG.items.append(15)),
    "len": (lambda x: x * len(BAG), lambda: BAG.items.append(3)),
    "in": (lambda x: x + 1 if 3 in BAG else x - 1, lambda: BAG.items.append(3)),
    "item": (lambda x: x * BAG[0], lambda: BAG.items.insert(0, 7)),
    "bool": (lambda x: x + 1 if FLAG else x - 1, lambda: setattr(FLAG, "on", False)),
    "f-string": (lambda x: x + 1 if f"{NAMED}" == "v1" else x - 1, lambda: setattr(NAMED, "n", 2)),
    "f-string !r": (lambda x: x + 1 if f"{NAMED!r}" == "Named(1)" else x - 1, lambda: setattr(NAMED, "n", 2)),
    "f-string of a list": (lambda x: x + 1 if f"{[NAMED]}" == "[Named(1)]" else x - 1,
                           lambda: setattr(NAMED, "n", 2)),
}


@pytest.mark.parametrize("name", list(PROTOCOL_CASES))
def test_python_protocols_of_an_existing_object_are_read_on_every_call(name) -> None:
    """Builtins over an object whose `__iter__`/`__len__`/`__bool__`/... are Python code: the
    object is the same on the next call (its identity guard holds), what they read is not."""
    fn, mutate = PROTOCOL_CASES[name]
    BAG.items, FLAG.on, NAMED.n = [1, 2], True, 1
    try:
        _compiled_sees_the_change(fn, mutate)
    finally:
        BAG.items, FLAG.on, NAMED.n = [1, 2], True, 1


def _compiled_sees_the_change(fn, mutate) -> None:
    """Compiled and eager agree before and after `mutate` changes what `fn` reads."""
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), fn(x))
    mutate()
    torch.testing.assert_close(compiled(x), fn(x))


class Dynamic:
    """Attributes computed by Python `__getattr__` from a dict that can change."""

    def __init__(self) -> None:
        self.store = {"scale": 2.0}

    def __getattr__(self, name):
        try:
            return self.store[name]
        except KeyError:
            raise AttributeError(name) from None


class Switched:
    """An attribute computed by a Python `__getattribute__` from other state."""

    def __init__(self) -> None:
        self.mode = "a"

    def __getattribute__(self, name):
        if name == "value":
            return 1.0 if object.__getattribute__(self, "mode") == "a" else 5.0
        return object.__getattribute__(self, name)


DYNAMIC, SWITCHED = Dynamic(), Switched()

COMPUTED_ATTRIBUTE_CASES = {
    "__getattr__": (lambda x: x * DYNAMIC.scale, lambda: DYNAMIC.store.update(scale=7.0)),
    "getattr()": (lambda x: x * getattr(DYNAMIC, "scale"), lambda: DYNAMIC.store.update(scale=7.0)),
    "getattr() with a default": (lambda x: x * getattr(DYNAMIC, "other", 3.0),
                                 lambda: DYNAMIC.store.update(other=9.0)),
    "hasattr()": (lambda x: x + 1 if hasattr(DYNAMIC, "extra") else x - 1,
                  lambda: DYNAMIC.store.update(extra=1)),
    "__getattribute__": (lambda x: x * SWITCHED.value, lambda: setattr(SWITCHED, "mode", "b")),
}


@pytest.mark.parametrize("name", list(COMPUTED_ATTRIBUTE_CASES))
def test_computed_attributes_are_read_on_every_call(name) -> None:
    fn, mutate = COMPUTED_ATTRIBUTE_CASES[name]
    DYNAMIC.store, SWITCHED.mode = {"scale": 2.0}, "a"
    try:
        _compiled_sees_the_change(fn, mutate)
    finally:
        DYNAMIC.store, SWITCHED.mode = {"scale": 2.0}, "a"


# --- names an instance's own __dict__ may shadow ------------------------------------------
# Python looks an attribute up in the instance's `__dict__` before a method (or any non-data
# descriptor) of its class, and `Module.__call__` calls `self.forward` the same way. A trace
# that inlined the class's method must recompile when the instance gets an attribute of that
# name, and run the instance's own one when it was there from the start.


class Scaler:
    def __init__(self) -> None:
        self.unrelated = 0

    def apply(self, x):
        return x + 1

    def other(self, x):
        return x * 3

    @classmethod
    def make(cls, x):
        return x - 2


class Partial(torch.nn.Module):
    """A module whose forward is chosen per instance in `__init__` (timm's FasterNet)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.conv = torch.nn.Linear(4, 4)
        self.forward = self.forward_a if mode == "a" else self.forward_b

    def forward_a(self, x):
        return self.conv(x) + 1

    def forward_b(self, x):
        return self.conv(x) * 2


class Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.partial = Partial("a")

    def helper(self, x):
        return x.relu()

    def forward(self, x):
        return self.helper(self.partial(self.inner(x)))


def _shadow_cases():
    """name -> (make the state, fn(x, state), change the state after the first call)."""
    cases = {
        "method shadowed by a lambda": (Scaler, lambda x, s: s.apply(x), lambda s: setattr(s, "apply", lambda x: x * 100)),
        "method shadowed by another bound method": (Scaler, lambda x, s: s.apply(x), lambda s: setattr(s, "apply", s.other)),
        "shadowing method removed": (Scaler, lambda x, s: s.apply(x),
                                     lambda s: s.__dict__.pop("apply")),
        "classmethod through the instance": (Scaler, lambda x, s: s.make(x), lambda s: setattr(s, "make", lambda x: x * 7)),
        "module forward replaced on the instance": (Outer, lambda x, m: m(x),
                                                    lambda m: setattr(m.inner, "forward", lambda x: x - 100)),
        "per-instance forward switched": (Outer, lambda x, m: m(x),
                                          lambda m: setattr(m.partial, "forward", m.partial.forward_b)),
        "per-instance forward removed": (Outer, lambda x, m: m(x),
                                         lambda m: m.partial.__dict__.pop("forward")),
        "module method shadowed": (Outer, lambda x, m: m(x), lambda m: setattr(m, "helper", lambda x: x.abs() + 5)),
    }
    return cases


def _with_shadow(name, state):
    """The "removed" case starts from an instance that has the attribute."""
    if name == "shadowing method removed":
        state.apply = state.other
    return state


@pytest.mark.parametrize("name", list(_shadow_cases()))
def test_instance_attribute_shadowing_a_class_entry(name) -> None:
    make, fn, mutate = _shadow_cases()[name]
    state = _with_shadow(name, make())
    # Without its own forward the module falls back to Module.forward, which raises.
    raises = name == "per-instance forward removed"
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, state), fn(x, state))
        frames = counter.frame_count
        # An unrelated attribute of the same objects changes: nothing recompiles.
        state.unrelated = 1
        if isinstance(state, torch.nn.Module):
            state.partial.unrelated = 1
        torch.testing.assert_close(compiled(x, state), fn(x, state))
        assert counter.frame_count == frames
        mutate(state)
        if raises:
            for run in (fn, compiled):
                with pytest.raises(NotImplementedError):
                    run(x, state)
        else:
            torch.testing.assert_close(compiled(x, state), fn(x, state))


def test_per_instance_forward_in_one_graph() -> None:
    """`self.forward = self.forward_a` in `__init__`: traced as the instance's method, in one
    graph (as TorchDynamo), not a break at `Module.forward`'s NotImplementedError."""
    model = Outer()
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


# --- the order of an instance dict after attribute stores and deletes ----------------------


class Record:
    def __init__(self) -> None:
        self.a = 1
        self.b = 2


def _delete_then_store(x, r):
    del r.a
    r.a = 5
    return x + 1


def _new_names_stored_twice(x, r):
    r.x = 1
    r.y = 2
    r.x = 3
    return x + r.x


def _store_delete_store(x, r):
    r.a = 7
    del r.a
    r.a = 8
    return x * r.a


def _new_name_stored_deleted_stored(x, r):
    r.z = 1
    r.w = 2
    del r.z
    r.z = 3
    return x - r.z


def _delete_for_good(x, r):
    r.c = 4
    del r.a
    return x + r.b


@pytest.mark.parametrize("fn", [_delete_then_store, _new_names_stored_twice, _store_delete_store,
                                _new_name_stored_deleted_stored, _delete_for_good])
def test_instance_dict_order_after_stores_matches_eager(fn) -> None:
    """Replayed stores and deletes leave the instance dict in eager's key order (`vars(obj)`,
    a dataclass's repr and `__dict__` iteration show it), found by the fuzzer (a `del`
    followed by a store of the same name kept the name's old place)."""
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    for _ in range(2):
        eager_record, compiled_record = Record(), Record()
        x = torch.ones(2)
        torch.testing.assert_close(compiled(x, compiled_record), fn(x, eager_record))
        assert list(vars(compiled_record).items()) == list(vars(eager_record).items())


# --- transformers configurations: read from the instance dict by the guard ------------------
# A configuration's `__getattribute__` renames through `attribute_map` and otherwise looks the
# name up as object's does; the guard reads its attributes (and answers `hasattr`) from the
# instance dict while that holds. Each change below must recompile and give eager's answer.


def _config():
    from transformers import GPT2Config

    return GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=16)


def _reads_config(x, config):
    y = x * config.n_embd if config.use_cache else x - config.hidden_size
    if hasattr(config, "extra_scale"):
        y = y * config.extra_scale
    if hasattr(config, "renamed_later"):
        y = y + 100
    return y + config.num_hidden_layers


def _set_instance_map(config):
    config.__dict__["attribute_map"] = {**type(config).attribute_map, "use_cache": "add_cross_attention"}


CONFIG_CHANGES = {
    "plain attribute": lambda c: setattr(c, "use_cache", False),
    "attribute read through attribute_map": lambda c: setattr(c, "n_layer", 5),
    "attribute added": lambda c: setattr(c, "extra_scale", 3.0),
    "instance attribute_map": _set_instance_map,
    "class attribute_map changed in place": lambda c: type(c).attribute_map.__setitem__("renamed_later", "n_head"),
    "unrelated attribute": lambda c: setattr(c, "unrelated", 1),
}


@pytest.mark.parametrize("name", list(CONFIG_CHANGES))
def test_configuration_reads_follow_changes(name) -> None:
    from transformers import GPT2Config

    saved_map = dict(GPT2Config.attribute_map)
    try:
        eager_config, compiled_config = _config(), _config()
        counter = CompileCounter()
        compiled = dynamo_rs.compile(_reads_config, backend=counter)
        x = torch.ones(2)
        torch.testing.assert_close(compiled(x, compiled_config), _reads_config(x, eager_config))
        torch.testing.assert_close(compiled(x, compiled_config), _reads_config(x, eager_config))
        assert counter.frame_count == 1
        CONFIG_CHANGES[name](eager_config)
        CONFIG_CHANGES[name](compiled_config)
        torch.testing.assert_close(compiled(x, compiled_config), _reads_config(x, eager_config))
        if name == "unrelated attribute":
            assert counter.frame_count == 1
    finally:
        GPT2Config.attribute_map.clear()
        GPT2Config.attribute_map.update(saved_map)


# --- properties that return an attribute of self, read by the guard from the instance dict ---


class Exposed:
    def __init__(self) -> None:
        self._scale = 2.0
        self.unrelated = 0

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, value):
        self._scale = value


def _reads_exposed(x, obj):
    return x * obj.scale


def _replace_getter_code(obj):
    type(obj).scale.fget.__code__ = (lambda self: self._scale * 10).__code__


class ExposedOther(Exposed):
    pass


EXPOSED_CHANGES = {
    "attribute behind the property": lambda o: setattr(o, "_scale", 5.0),
    "through the setter": lambda o: setattr(o, "scale", 7.0),
    "getter code replaced": _replace_getter_code,
    "property replaced on the class": lambda o: setattr(type(o), "scale", property(lambda self: -1.0)),
    "attribute behind the property deleted": lambda o: delattr(o, "_scale"),
    "unrelated attribute": lambda o: setattr(o, "unrelated", 1),
}


@pytest.mark.parametrize("name", list(EXPOSED_CHANGES))
def test_property_exposing_an_attribute_follows_changes(name) -> None:
    original = vars(Exposed)["scale"]
    code = original.fget.__code__
    try:
        eager_obj, compiled_obj = Exposed(), Exposed()
        counter = CompileCounter()
        compiled = dynamo_rs.compile(_reads_exposed, backend=counter)
        x = torch.ones(2)
        for _ in range(2):
            torch.testing.assert_close(compiled(x, compiled_obj), _reads_exposed(x, eager_obj))
        assert counter.frame_count == 1
        EXPOSED_CHANGES[name](eager_obj)
        if name not in ("getter code replaced", "property replaced on the class"):
            EXPOSED_CHANGES[name](compiled_obj)
        if name == "attribute behind the property deleted":
            for run, obj in ((_reads_exposed, eager_obj), (compiled, compiled_obj)):
                with pytest.raises(AttributeError):
                    run(x, obj)
            return
        torch.testing.assert_close(compiled(x, compiled_obj), _reads_exposed(x, eager_obj))
        if name == "unrelated attribute":
            assert counter.frame_count == 1
    finally:
        original.fget.__code__ = code
        Exposed.scale = original


# --- renamed configuration attributes (`config.hidden_size` -> `n_embd`), read by the guard
# from the instance dict under the name they are renamed to ---


def _renamed_config():
    transformers = pytest.importorskip("transformers")

    class RenamingConfig(transformers.GPT2Config):
        attribute_map = dict(transformers.GPT2Config.attribute_map)

    return RenamingConfig(n_embd=4, n_head=2, n_layer=3, n_positions=8, vocab_size=8)


def _read_renamed(x, config):
    return x * config.hidden_size + config.num_hidden_layers


def _del_rename(config):
    del type(config).attribute_map["num_hidden_layers"]
    config.__dict__["num_hidden_layers"] = 11  # now read under its own name


@pytest.mark.parametrize("change", [
    lambda c: setattr(c, "n_embd", 16),                           # the target changed
    lambda c: setattr(c, "hidden_size", 5),                       # set through the renaming
    lambda c: type(c).attribute_map.__setitem__("hidden_size", "n_head"),  # renamed elsewhere
    lambda c: c.__dict__.__setitem__("attribute_map", {"hidden_size": "n_head", "num_hidden_layers": "n_layer"}),
    _del_rename,                                                  # no longer renamed
], ids=["target", "set_through_rename", "class_table", "instance_table", "unrenamed"])
def test_renamed_configuration_attribute_follows_changes(change):
    config = _renamed_config()
    x = torch.randn(3)
    counter = CompileCounter()
    dynamo_rs.reset()
    compiled = dynamo_rs.compile(_read_renamed, backend=counter)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, config), _read_renamed(x, config))
    assert counter.frame_count == 1
    change(config)
    expected = _read_renamed(x, config)
    torch.testing.assert_close(compiled(x, config), expected)
    torch.testing.assert_close(compiled(x, config), expected)
    assert counter.frame_count == 2


# --- objects made in the frame that outlive a graph break -----------------------------------
# At a graph break, objects the trace made are built again for the code after it from the
# state the trace stored (`object.__new__`, then their attributes). A class's own
# `__setattr__` (frozen, validating, counting, nn.Module's) must not run again on that state:
# it ran while tracing, as it ran in eager.

SETATTR_CALLS: list = []


@dataclasses.dataclass(frozen=True)
class FrozenPair:
    a: torch.Tensor
    b: torch.Tensor


class Counting:
    def __init__(self, x):
        self.x = x
        self.n = 2

    def __setattr__(self, name, value):
        SETATTR_CALLS.append(name)
        object.__setattr__(self, name, value)


class Validating:
    def __init__(self, x):
        object.__setattr__(self, "x", x)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")


class SlottedFrozen:
    __slots__ = ("x", "k")

    def __init__(self, x):
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "k", 3)

    def __setattr__(self, name, value):
        raise AttributeError("read-only")


class Scale(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


def _escape(obj):
    """A call the trace cannot follow, handed the object (its state is read eagerly)."""
    torch._dynamo.graph_break()
    return obj


def frozen_across_break(x):
    p = FrozenPair(x.sin(), x + 1)
    q = _escape(p)
    return q.a + q.b, dataclasses.astuple(q)[1], q == p


def frozen_replace_across_break(x):
    p = dataclasses.replace(FrozenPair(x, x), b=x * 3)
    return _escape(p).b + 1


def counting_setattr_across_break(x):
    c = Counting(x * 2)
    c = _escape(c)
    return c.x + c.n


def validating_setattr_across_break(x):
    v = _escape(Validating(x.cos()))
    return v.x * 2


def slotted_frozen_across_break(x):
    s = _escape(SlottedFrozen(x - 1))
    return s.x * s.k


def module_made_in_frame_across_break(x):
    m = _escape(Scale(3.0))
    return m(x), len(list(m.parameters())), m.training


ESCAPING_CASES = [frozen_across_break, frozen_replace_across_break, counting_setattr_across_break,
                  validating_setattr_across_break, slotted_frozen_across_break,
                  module_made_in_frame_across_break]


@pytest.mark.parametrize("fn", ESCAPING_CASES, ids=[f.__name__ for f in ESCAPING_CASES])
def test_object_made_in_frame_outlives_a_graph_break(fn) -> None:
    x = torch.randn(3)
    SETATTR_CALLS.clear()
    expected = fn(x)
    eager_calls = list(SETATTR_CALLS)
    SETATTR_CALLS.clear()
    counter = CompileCounter()
    got = dynamo_rs.compile(fn, backend=counter)(x)
    assert counter.frame_count >= 1, "the code before the break compiled"
    assert SETATTR_CALLS == eager_calls
    for e, g in zip(expected, got) if isinstance(expected, tuple) else [(expected, got)]:
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(g, e)
        else:
            assert g == e


# --- properties written in Python run once per call, in the trace ---------------------------
# A property's getter is inlined: it is neither run on the real object while tracing nor read
# as a source on every call (the guard would run it again, and a getter that computes or
# changes state — a parametrization's weight, spectral norm's power iteration updating its
# buffers — then ran a different number of times than in eager, with results drifting).

class Ticking:
    def __init__(self):
        self.reads = 0
        self.scale = torch.tensor(2.0)

    @property
    def tick(self):
        self.reads += 1
        return self.scale * self.reads


class Doubled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    @property
    def weight(self):
        return self.w * 2

    def forward(self, x):
        return x @ self.weight.t()


def _parametrized(kind):
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 4)
    P = torch.nn.utils.parametrizations
    if kind == "spectral_norm":
        return P.spectral_norm(linear)
    if kind == "weight_norm":
        return P.weight_norm(linear)
    if kind == "orthogonal":
        return P.orthogonal(linear)
    if kind == "custom":
        class Symmetric(torch.nn.Module):
            def forward(self, w):
                return w.triu() + w.triu(1).transpose(-1, -2)
        torch.nn.utils.parametrize.register_parametrization(linear, "weight", Symmetric())
        return linear
    raise AssertionError(kind)


def test_property_with_side_effects_runs_once_per_call() -> None:
    def fn(x, obj):
        return x * obj.tick

    eager_obj, compiled_obj = Ticking(), Ticking()
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, compiled_obj), fn(x, eager_obj))
    assert compiled_obj.reads == eager_obj.reads == 3


def test_property_computing_from_a_parameter_follows_it() -> None:
    eager_model = Doubled()
    compiled_model = copy.deepcopy(eager_model)
    compiled = dynamo_rs.compile(compiled_model, backend="aot_eager")
    for step in range(3):
        x = torch.randn(2, 4)
        expected, got = eager_model(x), compiled(x)
        torch.testing.assert_close(got, expected)
        expected.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(compiled_model.w.grad, eager_model.w.grad)
        with torch.no_grad():  # an optimizer step changes the parameter in place
            for model in (eager_model, compiled_model):
                model.w -= 0.1 * model.w.grad
                model.w.grad = None


@pytest.mark.parametrize("kind", ["spectral_norm", "weight_norm", "orthogonal", "custom"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_parametrized_module_matches_eager(kind, training) -> None:
    eager_model = _parametrized(kind).train(training)
    compiled_model = copy.deepcopy(eager_model)
    compiled = dynamo_rs.compile(compiled_model, backend=CompileCounter())
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), eager_model(x))
        for (name, expected), (_, got) in zip(eager_model.state_dict().items(),
                                               compiled_model.state_dict().items()):
            torch.testing.assert_close(got, expected, msg=name)


# --- in-place forms and out= return their tensor argument -----------------------------------

def inplace_result_is_receiver(x):
    y = x.clone()
    z = y.add_(1)
    z.mul_(2)
    return z is y, y


def out_result_is_out(x):
    buf = torch.empty(3)
    r = torch.div(x, 2, out=buf)
    r.add_(1)
    return r is buf, buf


def normalize_out_into_attribute(x):
    holder = BUFFER_HOLDER
    holder.u = torch.nn.functional.normalize(x, dim=0, out=holder.u)
    return holder.u is holder.original, holder.u * 2


class _Holder:
    def __init__(self):
        self.u = torch.zeros(3)
        self.original = self.u


BUFFER_HOLDER = _Holder()


@pytest.mark.parametrize("fn", [inplace_result_is_receiver, out_result_is_out, normalize_out_into_attribute])
def test_in_place_and_out_results_are_their_argument(fn) -> None:
    x = torch.randn(3)
    expected = fn(x)
    BUFFER_HOLDER.__init__()
    got = dynamo_rs.compile(fn, backend=CompileCounter())(x)
    BUFFER_HOLDER.__init__()
    assert got[0] == expected[0]
    torch.testing.assert_close(got[1], expected[1])


# --- a function whose code is replaced in place, however the compiled code reached it ---


class _Scaler:
    def __init__(self):
        self.a = 1.0

    def norm(self, z):
        return z * 2 + self.a


def _method_code():
    return vars(_Scaler)["norm"].__code__


def through_a_break_in_the_arguments(p, x):
    # The break (a tensor operation inside `try` after an in-place change) falls between
    # loading `p.norm` and calling it: the resume function gets the bound method.
    x.clamp_(min=-1.0)
    try:
        y = p.norm(torch.where(x > 0, x, x * 2))
    except IndexError:
        y = x
    return y


def bound_method_argument(callback, x):
    return callback(x) + 1


def bound_method_in_a_list(callbacks, x):
    return callbacks[0](x) * 3


def through_the_instance(p, x):
    return p.norm(x)


REACHED = {
    "bound method handed to a resume function": (through_a_break_in_the_arguments, lambda p: p),
    "bound method as an argument": (bound_method_argument, lambda p: p.norm),
    "bound method in a list": (bound_method_in_a_list, lambda p: [p.norm]),
    "method of the instance": (through_the_instance, lambda p: p),
}


@pytest.mark.parametrize("name", list(REACHED))
def test_replaced_function_code_is_seen(name) -> None:
    fn, handed = REACHED[name]
    code = _method_code()
    try:
        counter = CompileCounter()
        compiled = dynamo_rs.compile(fn, backend=counter)
        p = _Scaler()
        x = torch.randn(3)
        torch.testing.assert_close(compiled(handed(p), x.clone()), fn(handed(p), x.clone()))
        torch.testing.assert_close(compiled(handed(p), x.clone()), fn(handed(p), x.clone()))
        vars(_Scaler)["norm"].__code__ = (lambda self, z: z - self.a).__code__
        torch.testing.assert_close(compiled(handed(p), x.clone()), fn(handed(p), x.clone()))
    finally:
        vars(_Scaler)["norm"].__code__ = code


# --- `is` between objects handed to the frame: the arrangement is guarded, not identities ------


class _Config:
    def __init__(self, scale):
        self.scale = scale


def test_is_between_two_arguments_guards_which_are_one_object() -> None:
    """`a is b` of two plain objects the frame gets (new ones on every call, as a resume
    function gets a module made per call under two names): the same arrangement reuses the
    graph, a different one recompiles and answers right."""

    def fn(x, a, b):
        return x * a.scale if a is b else x + b.scale

    counter = CompileCounter()
    compiled_fn = dynamo_rs.compile(fn, backend=counter)
    x = torch.ones(2)
    for _ in range(3):
        shared = _Config(2.0)
        torch.testing.assert_close(compiled_fn(x, shared, shared), fn(x, shared, shared))
    assert counter.frame_count == 1
    for _ in range(3):
        a, b = _Config(2.0), _Config(5.0)
        torch.testing.assert_close(compiled_fn(x, a, b), fn(x, a, b))
    assert counter.frame_count == 2
    # Three names, two objects: each pair compared keeps its answer.
    def three(x, a, b, c):
        return x * (a is b) + 2 * (b is c) + 4 * (a is c)

    compiled_three = dynamo_rs.compile(three, backend=CompileCounter())
    p, q = _Config(1.0), _Config(1.0)
    for args in [(p, p, q), (p, q, q), (q, p, q), (p, p, p), (p, q, p)]:
        torch.testing.assert_close(compiled_three(x, *args), three(x, *args))


def test_a_module_made_per_call_compared_after_a_break_is_not_recompiled(capsys) -> None:
    def fn(x):
        m = torch.nn.Softmax(dim=-1)
        alias = m
        y = m(x)
        print("break")
        return alias(y) if alias is m else y

    counter = CompileCounter()
    compiled_fn = dynamo_rs.compile(fn, backend=counter)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(compiled_fn(x), fn(x))
    assert counter.frame_count == 2
