"""Wrong results found by trying dynamo-rs as a user would, and state the trace read without
guarding it. Each case runs the same code eagerly and compiled, changes what the compiled
code depended on, and checks that the next call gives eager's result (recompiling where it
must) — and that leaving things alone reuses the compiled code."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


def compiled(fn):
    counter = CompileCounter()
    return dynamo_rs.compile(fn, backend=counter), counter


def same(compiled_fn, fn, *args):
    """Calls eager first, then compiled, on the same state; their results must agree."""
    expected = fn(*args)
    actual = compiled_fn(*args)
    torch.testing.assert_close(actual, expected)
    return actual


# --- dict views are live --------------------------------------------------------------------


def keys_view_after_store(x):
    d = {"a": x}
    keys = d.keys()
    d["b"] = x * 2
    return x + ("b" in keys) + len(keys)


def values_view_after_store(x):
    d = {"a": x}
    values = d.values()
    d["b"] = x * 2
    total = x * 0
    for v in values:
        total = total + v
    return total + len(values)


def items_view_after_store(x):
    d = {"a": 1}
    items = d.items()
    d["b"] = 2
    d["a"] = 5
    return x * sum(v for _, v in items) + (("a", 5) in items)


def view_after_delete(x):
    d = {"a": 1, "b": 2}
    keys = d.keys()
    d.pop("a")
    return x + len(keys) + ("a" in keys) + len(list(keys))


@pytest.mark.parametrize(
    "fn", [keys_view_after_store, values_view_after_store, items_view_after_store, view_after_delete]
)
def test_dict_views_see_later_stores(fn) -> None:
    cfn, counter = compiled(fn)
    same(cfn, fn, torch.randn(3))
    assert counter.frame_count == 1


# --- tensor predicates honour every argument --------------------------------------------------


def branch_on_channels_last(x):
    if x.is_contiguous(memory_format=torch.channels_last):
        return x + 1
    return x - 1


def size_and_stride_by_keyword(x):
    return x * x.size(dim=1) + x.stride(dim=0)


@pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format])
def test_is_contiguous_memory_format(layout) -> None:
    cfn, _ = compiled(branch_on_channels_last)
    x = torch.randn(2, 3, 4, 5).to(memory_format=layout)
    same(cfn, branch_on_channels_last, x)


def test_size_and_stride_keywords() -> None:
    cfn, _ = compiled(size_and_stride_by_keyword)
    same(cfn, size_and_stride_by_keyword, torch.randn(2, 3, 4))


# --- module containers: structure is guarded -------------------------------------------------


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
        self.seq = torch.nn.Sequential(torch.nn.ReLU())
        self.named = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4)})

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        x = self.seq(x)
        for key in self.named:
            x = self.named[key](x)
        return x * len(self.layers)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.layers.append(torch.nn.Linear(4, 4)),
        lambda m: m.seq.append(torch.nn.Tanh()),
        lambda m: m.named.update({"b": torch.nn.Linear(4, 4)}),
        lambda m: m.layers.pop(0),
    ],
    ids=["modulelist-append", "sequential-append", "moduledict-add", "modulelist-pop"],
)
def test_module_container_changes_recompile(change) -> None:
    model = Stack().eval()
    counter = CompileCounter()
    cmodel = dynamo_rs.compile(model, backend=counter)
    x = torch.randn(2, 4)
    with torch.no_grad():
        same(cmodel, model, x)
        same(cmodel, model, x)
        assert counter.frame_count == 1
        change(model)
        same(cmodel, model, x)
        assert counter.frame_count == 2


def test_unrelated_module_attribute_does_not_recompile() -> None:
    model = Stack().eval()
    counter = CompileCounter()
    cmodel = dynamo_rs.compile(model, backend=counter)
    x = torch.randn(2, 4)
    with torch.no_grad():
        same(cmodel, model, x)
        model.some_note = "unrelated"
        same(cmodel, model, x)
    assert counter.frame_count == 1


# --- the backend is part of the cache key ----------------------------------------------------


def test_another_backend_gets_its_own_graph() -> None:
    def f(x):
        return x.sin() + 1

    seen = []

    def first(gm, example_inputs):
        seen.append("first")
        return gm

    def second(gm, example_inputs):
        seen.append("second")
        return gm

    x = torch.randn(3)
    same(dynamo_rs.compile(f, backend=first), f, x)
    same(dynamo_rs.compile(f, backend=second), f, x)
    assert seen == ["first", "second"]
    # The same backend object again shares what was compiled for it.
    same(dynamo_rs.compile(f, backend=first), f, x)
    assert seen == ["first", "second"]


# --- classes: methods and class data read by the trace ---------------------------------------


class Scaler:
    factor = 2.0

    def scale(self, x):
        return x * self.factor

    @classmethod
    def offset(cls, x):
        return x + cls.factor


class ScalerChild(Scaler):
    def apply(self, x):
        return super().scale(x) + super().offset(x)


scaler = ScalerChild()


def call_methods(x):
    return scaler.scale(x) + scaler.offset(x) + scaler.apply(x)


def test_method_patched_on_the_class_recompiles(monkeypatch) -> None:
    cfn, counter = compiled(call_methods)
    x = torch.randn(3)
    same(cfn, call_methods, x)
    same(cfn, call_methods, x)
    assert counter.frame_count == 1, "a classmethod through an instance must not recompile"
    monkeypatch.setattr(Scaler, "scale", lambda self, x: x * 100)
    same(cfn, call_methods, x)
    assert counter.frame_count == 2


def test_class_data_patched_on_a_base_recompiles(monkeypatch) -> None:
    cfn, counter = compiled(call_methods)
    x = torch.randn(3)
    same(cfn, call_methods, x)
    monkeypatch.setattr(Scaler, "factor", 7.0)
    same(cfn, call_methods, x)
    assert counter.frame_count == 2


class Config:
    scale = 3

    def __init__(self, bias):
        self.bias = bias


def instance_made_in_trace(x):
    config = Config(1)
    return x * config.scale + config.bias


def test_class_attribute_through_an_instance_made_in_the_trace(monkeypatch) -> None:
    cfn, counter = compiled(instance_made_in_trace)
    x = torch.randn(3)
    same(cfn, instance_made_in_trace, x)
    monkeypatch.setattr(Config, "scale", 10)
    same(cfn, instance_made_in_trace, x)
    assert counter.frame_count == 2


class Base:
    table = [1, 2]


class Derived(Base):
    def total(self, x):
        return x * sum(super().table)


derived = Derived()


def super_data(x):
    return derived.total(x)


def test_super_attribute_is_guarded(monkeypatch) -> None:
    cfn, counter = compiled(super_data)
    x = torch.randn(3)
    same(cfn, super_data, x)
    monkeypatch.setattr(Base, "table", [5, 6, 7])
    same(cfn, super_data, x)
    assert counter.frame_count == 2


# --- function-level imports, defaults, os.environ, default dtype ----------------------------


def test_function_level_import_is_guarded() -> None:
    first = types.ModuleType("dynamo_rs_test_settings")
    first.SCALE = 2
    second = types.ModuleType("dynamo_rs_test_settings")
    second.SCALE = 5
    sys.modules["dynamo_rs_test_settings"] = first

    def f(x):
        import dynamo_rs_test_settings

        return x * dynamo_rs_test_settings.SCALE

    cfn, counter = compiled(f)
    x = torch.randn(3)
    try:
        same(cfn, f, x)
        first.SCALE = 3
        same(cfn, f, x)
        sys.modules["dynamo_rs_test_settings"] = second
        same(cfn, f, x)
        assert counter.frame_count == 3
    finally:
        del sys.modules["dynamo_rs_test_settings"]


def with_default(x, k=2):
    return x * k


def calls_with_default(x):
    return with_default(x)


def test_replaced_defaults_recompile(monkeypatch) -> None:
    cfn, counter = compiled(calls_with_default)
    x = torch.randn(3)
    same(cfn, calls_with_default, x)
    same(cfn, calls_with_default, x)
    assert counter.frame_count == 1
    monkeypatch.setattr(with_default, "__defaults__", (7,))
    same(cfn, calls_with_default, x)
    assert counter.frame_count == 2


def appends_to_default(x, seen=[]):  # noqa: B006 - the mutable default is the point
    seen.append(1)
    return x * len(seen)


def calls_mutating_default(x):
    return appends_to_default(x)


def test_mutable_default_is_not_taken_for_a_fresh_list() -> None:
    seen = appends_to_default.__defaults__[0]
    x = torch.randn(3)
    seen.clear()
    expected = [calls_mutating_default(x) for _ in range(3)]
    seen.clear()
    cfn, _ = compiled(calls_mutating_default)
    actual = [cfn(x) for _ in range(3)]
    torch.testing.assert_close(actual, expected)
    assert len(seen) == 3


def test_keyword_only_default_is_guarded() -> None:
    def inner(x, *, k=2):
        return x * k

    def f(x):
        return inner(x)

    cfn, counter = compiled(f)
    x = torch.randn(3)
    same(cfn, f, x)
    inner.__kwdefaults__["k"] = 9
    same(cfn, f, x)
    assert counter.frame_count == 2


def reads_environment(x):
    if os.environ.get("DYNAMO_RS_TEST_FLAG") == "1":
        return x + 1
    if "DYNAMO_RS_TEST_OTHER" in os.environ:
        return x + 2
    return x - 1


def test_environment_reads_are_guarded(monkeypatch) -> None:
    monkeypatch.delenv("DYNAMO_RS_TEST_FLAG", raising=False)
    monkeypatch.delenv("DYNAMO_RS_TEST_OTHER", raising=False)
    cfn, counter = compiled(reads_environment)
    x = torch.randn(3)
    same(cfn, reads_environment, x)
    same(cfn, reads_environment, x)
    assert counter.frame_count == 1
    monkeypatch.setenv("DYNAMO_RS_TEST_FLAG", "1")
    same(cfn, reads_environment, x)
    monkeypatch.setenv("DYNAMO_RS_TEST_FLAG", "0")
    same(cfn, reads_environment, x)
    monkeypatch.setenv("DYNAMO_RS_TEST_OTHER", "")
    same(cfn, reads_environment, x)


def uses_default_dtype(x):
    return x.to(torch.get_default_dtype()) * 2


def test_default_dtype_is_guarded() -> None:
    cfn, counter = compiled(uses_default_dtype)
    x = torch.randn(3, dtype=torch.float16)
    same(cfn, uses_default_dtype, x)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        out = same(cfn, uses_default_dtype, x)
        assert out.dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    assert counter.frame_count == 2


SCALE_BY_DTYPE = {torch.float32: 2.0, torch.float64: 3.0}


def dtype_keyed_table(x):
    return x * SCALE_BY_DTYPE[x.dtype]


def test_dict_values_under_dtype_keys_are_guarded(monkeypatch) -> None:
    cfn, counter = compiled(dtype_keyed_table)
    x = torch.randn(3)
    same(cfn, dtype_keyed_table, x)
    same(cfn, dtype_keyed_table, x)
    assert counter.frame_count == 1
    monkeypatch.setitem(SCALE_BY_DTYPE, torch.float32, 5.0)
    same(cfn, dtype_keyed_table, x)
    assert counter.frame_count == 2


ENABLED = {"relu"}


def membership_in_a_set(x):
    if "relu" in ENABLED:
        return torch.relu(x)
    return x * 2


def test_membership_in_an_existing_set_is_guarded() -> None:
    cfn, counter = compiled(membership_in_a_set)
    x = torch.randn(5)
    try:
        same(cfn, membership_in_a_set, x)
        ENABLED.discard("relu")
        same(cfn, membership_in_a_set, x)
        assert counter.frame_count == 2
    finally:
        ENABLED.add("relu")


# --- global state ----------------------------------------------------------------------------


def matmul(x, y):
    return (x @ y).relu()


def test_autocast_state_is_guarded() -> None:
    cfn, counter = compiled(matmul)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    same(cfn, matmul, x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = matmul(x, y)
        actual = cfn(x, y)
    assert actual.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(actual, expected)
    assert counter.frame_count == 2


def test_deterministic_algorithms_state_is_guarded() -> None:
    cfn, counter = compiled(matmul)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    same(cfn, matmul, x, y)
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        same(cfn, matmul, x, y)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert counter.frame_count == 2


class AddOne(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.relu:
            return out + 1
        return out


def test_torch_function_mode_is_honoured() -> None:
    cfn, counter = compiled(matmul)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    same(cfn, matmul, x, y)
    with AddOne():
        expected = matmul(x, y)
        actual = cfn(x, y)
    torch.testing.assert_close(actual, expected)
    same(cfn, matmul, x, y)
    assert counter.frame_count == 1


# --- aliasing --------------------------------------------------------------------------------


def mutate_first(a, b):
    a.add_(1)
    return b * 2


def test_arguments_that_become_the_same_tensor_recompile() -> None:
    cfn, counter = compiled(mutate_first)
    a, b = torch.zeros(3), torch.zeros(3)
    a2, b2 = a.clone(), b.clone()
    torch.testing.assert_close(cfn(a, b), mutate_first(a2, b2))
    shared, shared2 = torch.zeros(3), torch.zeros(3)
    torch.testing.assert_close(cfn(shared, shared), mutate_first(shared2, shared2))
    torch.testing.assert_close(shared, shared2)
    assert counter.frame_count == 2


class WithBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        x.add_(1)
        return self.total * 2


def test_argument_that_is_a_buffer_recompiles() -> None:
    model = WithBuffer()
    counter = CompileCounter()
    cmodel = dynamo_rs.compile(model, backend=counter)
    cmodel(torch.zeros(3))
    expected = model.total.clone().add_(1) * 2
    actual = cmodel(model.total)
    torch.testing.assert_close(actual, expected)
    assert counter.frame_count == 2


# --- code that must compile, not fail --------------------------------------------------------


def accumulate_from_zero(x):
    out = 0
    out += x.sin()
    out *= 2
    return out


def accumulate_float(x):
    total = 1.5
    total -= x
    total **= 2
    return total


@pytest.mark.parametrize("fn", [accumulate_from_zero, accumulate_float])
def test_augmented_assignment_on_a_number(fn) -> None:
    cfn, counter = compiled(fn)
    same(cfn, fn, torch.randn(3))
    assert counter.frame_count == 1


# --- a program that runs eagerly must run compiled -------------------------------------------


def optional_mask(x, mask):
    if mask is not None:
        return x.masked_fill(mask, 0.0)
    return x * 2


def test_tensor_argument_later_none_recompiles() -> None:
    cfn, counter = compiled(optional_mask)
    x = torch.randn(4)
    same(cfn, optional_mask, x, x > 0)
    same(cfn, optional_mask, x, None)
    same(cfn, optional_mask, x, x > 0.5)
    assert counter.frame_count == 2


def _small_bart():
    from transformers import BartConfig, BartModel

    config = BartConfig(encoder_layers=1, decoder_layers=1, d_model=32, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100,
                        max_position_embeddings=32)
    torch.manual_seed(0)
    return BartModel(config).eval()


@pytest.mark.parametrize("with_mask", [False, True])
def test_bart_with_and_without_attention_mask(with_mask) -> None:
    model = _small_bart()
    ids = torch.randint(3, 100, (2, 6))
    kwargs = {"input_ids": ids}
    if with_mask:
        mask = torch.ones_like(ids)
        mask[0, -2:] = 0
        kwargs["attention_mask"] = mask
    cmodel = dynamo_rs.compile(model, backend="eager")
    with torch.no_grad():
        expected = model(**kwargs)
        for _ in range(2):
            actual = cmodel(**kwargs)
            torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state)
            torch.testing.assert_close(actual.encoder_last_hidden_state, expected.encoder_last_hidden_state)


class TwoBuffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.zeros(3))
        self.register_buffer("b", torch.ones(3))

    def forward(self, x):
        self.a.add_(1)
        return self.b * 2 + x


@pytest.mark.parametrize("backend", ["counter", "aot_eager"])
def test_buffers_that_become_one_tensor_recompile(backend) -> None:
    model, reference = TwoBuffers(), TwoBuffers()
    counter = CompileCounter()
    cmodel = dynamo_rs.compile(model, backend=counter if backend == "counter" else "aot_eager")
    x = torch.zeros(3)
    torch.testing.assert_close(cmodel(x), reference(x))
    model.b = model.a
    reference.b = reference.a
    torch.testing.assert_close(cmodel(x), reference(x))
    torch.testing.assert_close(model.a, reference.a)
    if backend == "counter":
        assert counter.frame_count == 2


# --- stores replayed after the graph read what was there before ----------------------------
# The generated code replays the trace's stores to existing objects after the graph ran. Every
# value it stores and returns must be read before the first store lands: a value that the
# trace read from an attribute it then overwrote is the old one.


class _Holder:
    pass


def _holder(**attrs):
    h = _Holder()
    for name, value in attrs.items():
        setattr(h, name, value)
    return h


def returns_the_value_it_replaced(h, x):
    old = h.v
    h.v = [x + 1]
    return old


def returns_a_tensor_it_replaced(h, x):
    old = h.t
    h.t = x * 2
    return old + 1, old


def swaps_two_attributes(h, x):
    h.p, h.q = h.q, h.p
    return x + 1


def rotates_three_attributes(h, x):
    h.p, h.q, h.r = h.q, h.r, h.p
    return x * 2


def moves_a_list_between_objects(h, x):
    h.q = h.p
    h.p = [x]
    return x - 1


def deletes_after_reading(h, x):
    old = h.p
    del h.p
    return x + 1, old


def returns_replaced_value_after_a_break(h, x):
    old = h.v
    h.v = [x + 1]
    print("break")
    return old, h.v


REPLAY_ORDER = [
    returns_the_value_it_replaced,
    returns_a_tensor_it_replaced,
    swaps_two_attributes,
    rotates_three_attributes,
    moves_a_list_between_objects,
    deletes_after_reading,
    returns_replaced_value_after_a_break,
]


def _holder_state(h):
    return {k: v for k, v in sorted(vars(h).items())}


@pytest.mark.parametrize("fn", REPLAY_ORDER, ids=lambda f: f.__name__)
def test_replayed_stores_read_the_old_values(fn, capsys) -> None:
    def make():
        return _holder(v=[torch.ones(2)], t=torch.zeros(2), p=[1], q=[2], r=[3])

    compiled_fn, counter = compiled(fn)
    x = torch.ones(2)
    for _ in range(2):
        eager_holder, compiled_holder = make(), make()
        expected = fn(eager_holder, x)
        actual = compiled_fn(compiled_holder, x)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(_holder_state(compiled_holder), _holder_state(eager_holder))
    assert counter.frame_count >= 1


# --- iterators read their container live ----------------------------------------------------
# Python's list and dict iterators read the container as it is at each step: a list grown
# inside its own loop yields the new items, a dict whose size changes raises. The trace must
# give eager's answer (or leave the frame to run as it is), never the items it started with.


def list_grown_in_its_own_loop(x):
    items = [1, 2]
    for v in items:
        if v < 3:
            items.append(v + 2)
        x = x + v
    return x, items


def list_grown_under_enumerate(x):
    items = [x, x * 2]
    for i, v in enumerate(items):
        if i == 0:
            items.append(v + 10)
        x = x + v
    return x, len(items)


def list_item_replaced_ahead_of_the_loop(x):
    items = [x, x, x]
    for i, v in enumerate(items):
        if i + 1 < len(items):
            items[i + 1] = v * 2
        x = x + v
    return x


def list_shrunk_under_next(x):
    items = [x, x + 1, x + 2]
    it = iter(items)
    first = next(it)
    items.pop()
    return first + sum(it)


def dict_value_changed_while_iterating_items(x):
    d = {"a": x, "b": x * 2}
    total = x * 0
    for k, v in d.items():
        if k == "a":
            d["b"] = v * 10
        total = total + v
    return total


def dict_grown_while_iterating(x):
    d = {"a": x}
    for k in d:
        d[k + "!"] = x
    return x


def list_shrunk_under_reversed(x):
    items = [1, 2, 3]
    for v in reversed(items):
        if v == 3:
            items.pop(0)
        x = x + v
    return x


def iterator_exhausted_by_sum(x):
    it = iter([x, x + 1])
    total = sum(it)
    return total, next(it, None)


def iterator_used_after_enumerate(x):
    it = iter([x, x + 1, x + 2])
    pairs = enumerate(it)
    first = next(it)
    return first, [v for _, v in pairs]


LIVE_ITERATION = [
    list_shrunk_under_reversed,
    iterator_exhausted_by_sum,
    iterator_used_after_enumerate,
    list_grown_in_its_own_loop,
    list_grown_under_enumerate,
    list_item_replaced_ahead_of_the_loop,
    list_shrunk_under_next,
    dict_value_changed_while_iterating_items,
    dict_grown_while_iterating,
]


@pytest.mark.parametrize("fn", LIVE_ITERATION, ids=lambda f: f.__name__)
def test_iterators_see_changes_to_their_container(fn) -> None:
    x = torch.ones(2)
    try:
        expected = fn(x)
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match=str(error)):
            compiled(fn)[0](x)
        return
    same(compiled(fn)[0], fn, x)


# --- plain attribute stores on modules --------------------------------------------------------
# `self.x = value` in a module's forward goes through `nn.Module.__setattr__`, which behaves as
# `object.__setattr__` unless the value is a parameter or module or the name is a parameter's,
# buffer's or submodule's. Such stores are replayed (guarded that the name stays out of those
# tables); the others make the frame split or run as it is.


class _Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.cache = [torch.ones(3)]
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        self.cache = [c * 2 for c in self.cache]
        self.last = x.sum()
        self.calls = getattr(self, "calls", 0) + 1
        return self.lin(x) * self.scale + self.cache[0]


class _RegistersModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        self.extra = torch.nn.Identity()  # a submodule: Module.__setattr__ registers it
        self.scale = x.sum()  # later a buffer of that name makes it special
        return self.lin(x) * self.scale


@pytest.mark.parametrize("cls", [_Stateful, _RegistersModule], ids=lambda c: c.__name__)
def test_module_attribute_stores_are_replayed(cls) -> None:
    torch.manual_seed(0)
    eager = cls()
    twin = cls()
    twin.load_state_dict(eager.state_dict())
    compiled_module = dynamo_rs.compile(twin, backend=CompileCounter())
    x = torch.randn(2, 3)
    for step in range(3):
        if step == 2 and cls is _RegistersModule:
            for m in (eager, twin):
                del m.scale
                m.register_buffer("scale", torch.ones(()))
        torch.testing.assert_close(compiled_module(x), eager(x))
        for name in ("cache", "last", "calls", "extra", "scale"):
            assert hasattr(twin, name) == hasattr(eager, name), name
            if hasattr(eager, name) and not isinstance(getattr(eager, name), torch.nn.Module):
                torch.testing.assert_close(getattr(twin, name), getattr(eager, name))
        assert sorted(twin._modules) == sorted(eager._modules)
        assert sorted(twin._buffers) == sorted(eager._buffers)


# --- global stores ----------------------------------------------------------------------------
# `global NAME; NAME = value` is replayed into the globals dict after the graph; reads of NAME
# later in the trace (in the frame, in inlined functions of the same module, as `module.NAME`)
# see the stored value.

COUNTER = 0
SCALE_TABLE = {"a": 1}


def _read_counter():
    return COUNTER


def bumps_a_global(x):
    global COUNTER
    before = COUNTER
    for _ in range(2):
        COUNTER = COUNTER + 1
    return x * before + _read_counter() + sys.modules[__name__].COUNTER


def stores_a_tensor_and_a_list_globally(x):
    global COUNTER, SCALE_TABLE
    SCALE_TABLE = {"a": x.sum()}
    COUNTER = [x * 2]
    return x + 1


@pytest.mark.parametrize("fn", [bumps_a_global, stores_a_tensor_and_a_list_globally],
                         ids=lambda f: f.__name__)
def test_global_stores_are_replayed(fn) -> None:
    global COUNTER, SCALE_TABLE
    compiled_fn = compiled(fn)[0]
    x = torch.ones(2)
    for _ in range(3):
        COUNTER, SCALE_TABLE = 0, {"a": 1}
        expected = fn(x)
        expected_globals = (COUNTER, SCALE_TABLE)
        COUNTER, SCALE_TABLE = 0, {"a": 1}
        actual = compiled_fn(x)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close((COUNTER, SCALE_TABLE), expected_globals)


# --- functools: lru_cache runs its function once, partials keep their identity --------------


def _make_cached(log):
    import functools

    @functools.lru_cache(maxsize=None)
    def cached(n):
        log.append(n)
        return n * 2

    return cached


def test_lru_cache_side_effects_happen_once_as_in_eager() -> None:
    eager_log, compiled_log = [], []
    eager_cached, compiled_cached = _make_cached(eager_log), _make_cached(compiled_log)

    def make_fn(cached):
        def fn(x):
            return x * cached(3) + cached(4)
        return fn

    eager_fn = make_fn(eager_cached)
    compiled_fn, counter = compiled(make_fn(compiled_cached))
    x = torch.ones(2)
    for _ in range(3):
        torch.testing.assert_close(compiled_fn(x), eager_fn(x))
    assert compiled_log == eager_log == [3, 4]
    assert counter.frame_count == 1


def test_partial_made_in_the_trace_handed_back() -> None:
    import functools

    def fn(x):
        p = functools.partial(torch.add, x.relu(), alpha=2)
        q = functools.partial(p, alpha=3)
        return p, q, p

    compiled_fn, counter = compiled(fn)
    x = torch.randn(4)
    for _ in range(2):
        p, q, again = compiled_fn(x)
        ep, eq, _ = fn(x)
        assert isinstance(p, functools.partial) and again is p
        torch.testing.assert_close(p(x), ep(x))
        torch.testing.assert_close(q(x), eq(x))
        assert q.func is torch.add and q.keywords == {"alpha": 3}
    assert counter.frame_count == 1


def test_existing_partial_rebound_is_seen() -> None:
    import functools

    holder = types.SimpleNamespace(act=functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.1))

    def fn(x):
        return holder.act(x)

    compiled_fn, counter = compiled(fn)
    x = torch.randn(8)
    same(compiled_fn, fn, x)
    holder.act = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.5)
    same(compiled_fn, fn, x)
    holder.act.keywords["negative_slope"] = 0.9
    same(compiled_fn, fn, x)
    assert counter.frame_count >= 2


# --- autograd.Function: forward inlined when no gradient can flow, else apply called by the
# graph; ctx not guarded by identity


class _SinTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale=2.0):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x.sin() * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos() * ctx.scale, None


class _SplitSetup(torch.autograd.Function):
    @staticmethod
    def forward(x, y):
        return x * y + 1

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y, grad * x


def _uses_autograd_functions(x, w):
    return _SinTwice.apply(x + 1) + _SplitSetup.apply(x, w) + _SinTwice.apply(x, 3.0)


@pytest.mark.parametrize("mode", ["no_grad", "grad_mode_on", "requires_grad"])
def test_autograd_function_apply(mode) -> None:
    compiled_fn, counter = compiled(_uses_autograd_functions)
    w = torch.randn(5)
    for _ in range(3):
        x = torch.randn(5, requires_grad=mode == "requires_grad")
        if mode == "no_grad":
            with torch.no_grad():
                expected, actual = _uses_autograd_functions(x, w), compiled_fn(x, w)
        else:
            expected, actual = _uses_autograd_functions(x, w), compiled_fn(x, w)
        torch.testing.assert_close(actual, expected)
        assert actual.requires_grad == expected.requires_grad
        if mode == "requires_grad":
            (g_expected,) = torch.autograd.grad(expected.sum(), x)
            (g_actual,) = torch.autograd.grad(actual.sum(), x)
            torch.testing.assert_close(g_actual, g_expected)
    # With an input that requires grad the graph calls apply itself (forward and backward
    # run as eagerly); one graph either way.
    assert counter.frame_count == 1


class _Warner:
    def __init__(self):
        self.said = []

    @__import__("functools").lru_cache(None)
    def say_once(self, message):
        self.said.append(message)


def test_lru_cached_method_runs_once_like_transformers_warning_once() -> None:
    eager_warner, compiled_warner = _Warner(), _Warner()

    def make(warner):
        def fn(x):
            if x.shape[0] > 2:
                warner.say_once("padded")
            return x + 1
        return fn

    eager_fn = make(eager_warner)
    compiled_fn, counter = compiled(make(compiled_warner))
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(compiled_fn(x), eager_fn(x))
    assert compiled_warner.said == eager_warner.said == ["padded"]
    assert counter.frame_count == 1


# --- copy.deepcopy: the copy is private to the trace, what it was made from is guarded -------


class _Config:
    def __init__(self, **entries):
        self.__dict__.update(entries)


def _decoder_view(config, x):
    import copy

    view = copy.deepcopy(config)
    for key in list(view.__dict__):
        if key.startswith("decoder_"):
            setattr(view, key[len("decoder_"):], getattr(view, key))
    view.scale = view.scale * 2
    return x * view.scale + view.layers + len(view.names), view.names


def _copied_table_changed(config, x):
    import copy

    view = copy.deepcopy(config)
    view.table["extra"] = 5  # a change to a container of the copy
    delattr(view, "scale")
    return x + sum(view.table.values()) + hasattr(view, "scale")


def _copied_containers(config, x):
    import copy

    names = copy.deepcopy(config.names)
    names.append("z")
    table = copy.deepcopy({"a": config.layers, "b": [1, 2]})
    table["b"].append(3)
    return x * len(names) + sum(table["b"]) + table["a"], names, config.names


@pytest.mark.parametrize("fn", [_decoder_view, _copied_table_changed, _copied_containers],
                         ids=lambda f: f.__name__)
def test_deepcopy_of_a_config(fn) -> None:
    def make():
        return _Config(scale=1.5, layers=2, decoder_layers=3, names=["a", "b"], table={"t": 1})

    compiled_fn, counter = compiled(fn)
    eager_config, compiled_config = make(), make()
    x = torch.randn(3)
    for step in range(4):
        expected = fn(eager_config, x)
        actual = compiled_fn(compiled_config, x)
        if isinstance(expected, tuple):
            torch.testing.assert_close(actual[0], expected[0])
            assert actual[1:] == expected[1:]
        else:
            torch.testing.assert_close(actual, expected)
        assert vars(compiled_config) == vars(eager_config), "the original is left alone"
        if step == 1:
            for config in (eager_config, compiled_config):
                config.decoder_layers = 7
                config.names.append("c")
    # Captured, and recompiled once when the original changed (a change to the copy's own
    # containers is refused: that frame runs as it is).
    assert counter.frame_count <= 3
    if fn is not _copied_table_changed:
        assert counter.frame_count == 2


def _store_with_builtins(holder):
    def fn(x):
        setattr(holder, "a", holder.a + 1)
        setattr(holder, "c", x.sum())
        delattr(holder, "b")
        return x * holder.a

    return fn


def test_setattr_and_delattr_builtins() -> None:
    holder, eager_holder = _Config(a=1, b=torch.ones(2)), _Config(a=1, b=torch.ones(2))
    compiled_fn, counter = compiled(_store_with_builtins(holder))
    x = torch.randn(3)
    torch.testing.assert_close(compiled_fn(x), _store_with_builtins(eager_holder)(x))
    assert counter.frame_count == 1
    assert holder.a == eager_holder.a and not hasattr(holder, "b")
    torch.testing.assert_close(holder.c, eager_holder.c)


# --- exceptions caught inside the trace depend on guarded state ------------------------------


class _Table:
    shared = {"sin": torch.sin}

    def __getitem__(self, key):
        return self.shared[key]

    def get(self, key, default):
        try:
            return self[key]
        except KeyError:
            return default


def _uses_table(table, holder, items, x):
    y = table.get("extra", torch.tanh)(x)
    try:
        y = y + holder.bonus
    except AttributeError:
        y = y - 1
    try:
        y = y * items[2]
    except IndexError:
        y = y * 0.5
    return y


def test_caught_exceptions_follow_the_state_they_came_from() -> None:
    compiled_fn, counter = compiled(_uses_table)
    table, holder, items = _Table(), types.SimpleNamespace(), [1, 2]
    x = torch.randn(4)
    same(compiled_fn, _uses_table, table, holder, items, x)
    same(compiled_fn, _uses_table, table, holder, items, x)
    assert counter.frame_count == 1
    _Table.shared["extra"] = torch.relu  # the missing key appears
    same(compiled_fn, _uses_table, table, holder, items, x)
    holder.bonus = 3.0  # the missing attribute appears
    same(compiled_fn, _uses_table, table, holder, items, x)
    items.append(7)  # the index is in range now
    same(compiled_fn, _uses_table, table, holder, items, x)
    del _Table.shared["extra"]
    # One recompile per change (a graph operation inside a `try` body of the compiled frame
    # itself is split off, so the attribute's arrival adds a resume function too).
    assert counter.frame_count <= 6


def test_exception_not_caught_reaches_the_caller() -> None:
    def helper(n):
        if n > 1:
            raise RuntimeError("boom")
        return n

    def fn(x, n):
        try:
            return x + helper(n)
        except ValueError:
            return x

    compiled_fn, _ = compiled(fn)
    x = torch.randn(3)
    torch.testing.assert_close(compiled_fn(x, 1), fn(x, 1))
    with pytest.raises(RuntimeError, match="boom"):
        compiled_fn(x, 2)


# --- writes to closure cells of functions from outside the trace are replayed ---------------


def _counter_closure():
    calls = 0
    history = []

    def record(v):
        nonlocal calls, history
        calls = calls + 1
        history = history + [v]
        return calls

    return record, lambda: (calls, history)


def test_nonlocal_writes_in_called_closures() -> None:
    compiled_record, compiled_state = _counter_closure()
    eager_record, eager_state = _counter_closure()

    def make(record):
        def fn(x):
            first = record("a")
            second = record("b")
            return x * first + second
        return fn

    compiled_fn, counter = compiled(make(compiled_record))
    eager_fn = make(eager_record)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(compiled_fn(x), eager_fn(x))
        assert compiled_state() == eager_state()
    assert counter.frame_count >= 1


def _stepper():
    count = 0
    scale = 1.0

    def step(x):
        nonlocal count, scale
        count += 1
        scale = scale * 2
        if count > 2:
            print("graph break after the stores")
        return x * scale + count

    return step, lambda: (count, scale)


def test_nonlocal_writes_of_a_compiled_closure(capsys) -> None:
    """The compiled frame is itself a closure: its free variables are written (also before a
    graph break) into its own cells, as eagerly."""
    compiled_step, compiled_state = _stepper()
    eager_step, eager_state = _stepper()
    compiled_fn, counter = compiled(compiled_step)
    for _ in range(4):
        x = torch.randn(3)
        torch.testing.assert_close(compiled_fn(x), eager_step(x))
        assert compiled_state() == eager_state()
    assert counter.frame_count >= 1


# --- generators run ahead of their consumer only when that cannot be seen --------------------


def _logging_generator(log, n):
    for i in range(n):
        log.append(i)  # a change the consumer reads: must interleave as in eager
        yield i


def _consumer_reads_the_log(x, log):
    out = x
    for i in _logging_generator(log, 3):
        out = out + len(log) * i
    return out


def _generator_bumps_an_attribute(x, holder):
    def bump(n):
        for i in range(n):
            holder.count += 1
            yield holder.count

    return x * sum(bump(2)) + holder.count


def _generator_changes_a_tensor(x):
    def scaled(t):
        t.mul_(2)
        yield t

    y = x.clone()
    first = next(scaled(y))
    return first + y


@pytest.mark.parametrize("fn", [_consumer_reads_the_log, _generator_bumps_an_attribute,
                                _generator_changes_a_tensor], ids=lambda f: f.__name__)
def test_generators_with_side_effects(fn) -> None:
    def args():
        if fn is _consumer_reads_the_log:
            return [torch.ones(2), []]
        if fn is _generator_bumps_an_attribute:
            return [torch.ones(2), types.SimpleNamespace(count=1)]
        return [torch.ones(2)]

    compiled_fn, _ = compiled(fn)
    for _ in range(2):
        eager_args, compiled_args = args(), args()
        torch.testing.assert_close(compiled_fn(*compiled_args), fn(*eager_args))
        for e, c in zip(eager_args[1:], compiled_args[1:]):
            assert vars(e) == vars(c) if hasattr(e, "__dict__") else e == c


# --- a generator run ahead must change nothing: a global list first read inside it counts ------

_SEEN: list = []


def _global_appending_generator(n):
    for i in range(n):
        _SEEN.append(i)
        yield i


def sums_a_global_appending_generator(x):
    total = 0
    for i in _global_appending_generator(3):
        total = total + x * i
    return total


def test_generator_appending_to_a_global_list_keeps_eager_order() -> None:
    x = torch.randn(3)
    _SEEN.clear()
    expected = sums_a_global_appending_generator(x)
    eager_seen = list(_SEEN)
    _SEEN.clear()
    got = dynamo_rs.compile(sums_a_global_appending_generator, backend="eager")(x)
    torch.testing.assert_close(got, expected)
    assert _SEEN == eager_seen == [0, 1, 2]


# --- torch's named results keep their class when handed back ----------------------------------


def test_named_results_keep_their_class() -> None:
    def fn(x):
        return torch.topk(x, 2), torch.max(x, 0), torch.sort(x)

    compiled_fn, counter = compiled(fn)
    x = torch.randn(6)
    for got, expected in zip(compiled_fn(x), fn(x)):
        assert type(got) is type(expected)
        torch.testing.assert_close(got.values, expected.values)
        torch.testing.assert_close(got.indices, expected.indices)
    assert counter.frame_count == 1


def test_module_with_parameters_made_in_forward_runs_as_eager() -> None:
    def fn(x):
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 3)  # new random weights every call
        return layer(x) + torch.nn.Softmax(dim=-1)(x)

    compiled_fn, _ = compiled(fn)
    x = torch.randn(2, 3)
    for _ in range(2):
        torch.testing.assert_close(compiled_fn(x), fn(x))


# --- map/filter/itertools computed when made only when that cannot be seen ------------------


def _map_with_side_effects(x, log):
    def note(v):
        log.append(len(log))
        return v * len(log)

    out = x
    for y in map(note, [x, x + 1]):
        out = out + y * len(log)  # eager interleaves the calls with this loop
    return out


def _islice_then_rest(x, items):
    it = iter(items)
    head = list(__import__("itertools").islice(it, 1))
    rest = list(it)
    return x * len(head) + len(rest), head, rest


def _zip_map_uneven(x, items):
    it = iter(items)
    pairs = list(zip(map(lambda v: v * 2, it), [1]))
    return x * len(pairs), list(it)


@pytest.mark.parametrize("fn", [_map_with_side_effects, _islice_then_rest, _zip_map_uneven],
                         ids=lambda f: f.__name__)
def test_lazy_iteration_matches_eager(fn) -> None:
    compiled_fn, _ = compiled(fn)
    for _ in range(2):
        eager_args = [torch.ones(2), [] if fn is _map_with_side_effects else [1, 2, 3]]
        compiled_args = [torch.ones(2), [] if fn is _map_with_side_effects else [1, 2, 3]]
        expected, actual = fn(*eager_args), compiled_fn(*compiled_args)
        if isinstance(expected, tuple):
            torch.testing.assert_close(actual[0], expected[0])
            assert actual[1:] == expected[1:]
        else:
            torch.testing.assert_close(actual, expected)
        assert compiled_args[1] == eager_args[1]


def test_explicit_len_of_a_tensor_with_a_symbolic_size() -> None:
    """`x.__len__()` once the size is symbolic (automatic dynamic shapes) is `x.size(0)`: right
    for every later size, not the size it was traced with."""

    def fn(x):
        return x * x.__len__()

    compiled_fn, _ = compiled(fn)
    for n in (3, 5, 7, 2, 9):
        x = torch.randn(n)
        torch.testing.assert_close(compiled_fn(x), fn(x))
