"""Guards are sound: whatever the trace depended on, changing it on a later call recompiles
(and gives the eager result); leaving it alone reuses the compiled code."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield


def compiled(fn, **options):
    counter = CompileCounter()
    return dynamo_rs.compile(fn, backend=counter, **options), counter


def check(fn, first_args, changed_args, expect_recompile=True):
    cfn, counter = compiled(fn)
    torch.testing.assert_close(cfn(*first_args), fn(*first_args))
    assert counter.frame_count == 1
    torch.testing.assert_close(cfn(*first_args), fn(*first_args))
    assert counter.frame_count == 1, "same inputs must reuse the compiled code"
    torch.testing.assert_close(cfn(*changed_args), fn(*changed_args))
    assert counter.frame_count == (2 if expect_recompile else 1)


def double(x):
    return x * 2 + x.shape[0]


def test_dtype_change_recompiles() -> None:
    check(double, (torch.ones(3),), (torch.ones(3, dtype=torch.float64),))


def test_shape_change_recompiles() -> None:
    check(double, (torch.ones(3),), (torch.ones(5),))


def test_stride_change_recompiles() -> None:
    x = torch.randn(4, 6)
    check(lambda t: t.sum(0) * 2, (x,), (x.t().contiguous().t(),))


def test_requires_grad_change_recompiles() -> None:
    check(double, (torch.ones(3),), (torch.ones(3, requires_grad=True),))


def test_grad_mode_change_recompiles() -> None:
    cfn, counter = compiled(double)
    x = torch.ones(3, requires_grad=True)
    cfn(x)
    with torch.no_grad():
        out = cfn(x)
    assert counter.frame_count == 2 and not out.requires_grad


def test_python_constant_argument_change_recompiles() -> None:
    def scale(x, k):
        return x * k

    check(scale, (torch.ones(3), 2), (torch.ones(3), 5))


def test_string_argument_change_recompiles() -> None:
    def act(x, kind):
        return x.relu() if kind == "relu" else x.sigmoid()

    check(act, (torch.randn(3), "relu"), (torch.randn(3), "sigmoid"))


def test_nan_argument_reuses_the_compiled_code() -> None:
    # An equality guard on `float("nan")` failed on every call (NaN != NaN): a recompile
    # each time until the cache limit, then eager. NaN matches NaN; other floats recompile.
    def shift(x, n):
        return x * 2 + n

    cfn, counter = compiled(shift)
    x = torch.randn(4)
    for n in (float("nan"), float("nan"), float("nan")):
        torch.testing.assert_close(cfn(x, n), shift(x, n), equal_nan=True)
    assert counter.frame_count == 1
    torch.testing.assert_close(cfn(x, 1.5), shift(x, 1.5))
    assert counter.frame_count == 2


def test_nan_global_and_attribute_reuse_the_compiled_code() -> None:
    class Config:
        eps = float("nan")

    def fill(x, cfg):
        return torch.nan_to_num(x + cfg.eps, nan=3.0) + NAN_GLOBAL

    cfn, counter = compiled(fill)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(cfn(x, Config()), fill(x, Config()), equal_nan=True)
    assert counter.frame_count == 1


NAN_GLOBAL = float("nan")
FACTOR = 2.0


def uses_global(x):
    return x * FACTOR


def test_global_change_recompiles() -> None:
    global FACTOR
    cfn, counter = compiled(uses_global)
    x = torch.ones(3)
    assert torch.equal(cfn(x), x * 2)
    FACTOR = 7.0
    try:
        assert torch.equal(cfn(x), x * 7)
        assert counter.frame_count == 2
    finally:
        FACTOR = 2.0


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.use_relu = True
        self.scale = 1.5

    def forward(self, x):
        y = self.linear(x) * self.scale
        return y.relu() if self.use_relu else y


def compiled_gate():
    """A seeded `Gate`, its compiled version, the counter and an input."""
    torch.manual_seed(0)
    module = Gate().eval()
    counter = CompileCounter()
    return module, dynamo_rs.compile(module, backend=counter), counter, torch.randn(2, 3)


def test_module_attribute_change_recompiles() -> None:
    module, cm, counter, x = compiled_gate()
    with torch.no_grad():
        torch.testing.assert_close(cm(x), module(x))
        module.use_relu = False
        torch.testing.assert_close(cm(x), module(x))
        assert counter.frame_count == 2
        module.scale = 3.0
        torch.testing.assert_close(cm(x), module(x))
        assert counter.frame_count == 3


def test_module_parameter_values_are_inputs_not_constants() -> None:
    module, cm, counter, x = compiled_gate()
    with torch.no_grad():
        cm(x)
        module.linear.weight.mul_(2)  # same tensor, new values: no recompile, new result
        torch.testing.assert_close(cm(x), module(x))
    assert counter.frame_count == 1


def test_replaced_parameter_is_read_again() -> None:
    """A parameter object replaced by another of the same shape: the guards read module dicts
    through a cache that trusts an unchanged dict (PEP 509 version tag); the replacement
    changes `_parameters`, so the new parameter's values are used."""
    module, cm, counter, x = compiled_gate()
    with torch.no_grad():
        cm(x)
        for _ in range(3):
            module.linear.weight = torch.nn.Parameter(torch.randn(3, 3))
            torch.testing.assert_close(cm(x), module(x))
            module.linear.__dict__["_parameters"]["bias"] = torch.nn.Parameter(torch.randn(3))
            torch.testing.assert_close(cm(x), module(x))


def test_attribute_changed_back_and_forth_is_reread() -> None:
    """The same dict changed and changed back: a new version tag each time, so the cached read
    is never trusted across a change (each value gets its own compiled entry)."""
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 2  # an int: a module's ints stay constants, floats would not

        def forward(self, x):
            return x * self.scale

    module = Scaled()
    counter = CompileCounter()
    cm = dynamo_rs.compile(module, backend=counter)
    x = torch.randn(4)
    for scale in (2, 3, 2, 3, 5):
        module.scale = scale
        torch.testing.assert_close(cm(x), x * scale)
    assert counter.frame_count == 3


def test_submodule_swapped_for_another_kind_recompiles() -> None:
    module, cm, counter, x = compiled_gate()
    with torch.no_grad():
        cm(x)
        module.linear = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
        torch.testing.assert_close(cm(x), module(x))
    assert counter.frame_count == 2


def test_submodule_swapped_for_one_of_the_same_kind_runs_the_new_one() -> None:
    # Same class and structure: the compiled code is shared (parameters are graph inputs read
    # from the module each call), and the new submodule's weights are the ones used.
    module, cm, counter, x = compiled_gate()
    with torch.no_grad():
        before = cm(x)
        module.linear = torch.nn.Linear(3, 3)
        after = cm(x)
        torch.testing.assert_close(after, module(x))
        assert not torch.allclose(before, after)
    assert counter.frame_count == 1


def test_list_length_change_recompiles() -> None:
    def total(x, items):
        for k in items:
            x = x + k
        return x

    check(total, (torch.ones(2), [1, 2]), (torch.ones(2), [1, 2, 3]))


def test_dict_keys_change_recompiles() -> None:
    def pick(x, options):
        return x * options["a"] if "b" not in options else x * options["b"]

    check(pick, (torch.ones(2), {"a": 2}), (torch.ones(2), {"a": 2, "b": 5}))


def test_guards_can_be_inspected() -> None:
    cfn, _ = compiled(double)
    cfn(torch.ones(3))
    from dynamo_rs import eval_frame

    (guard, _code), = eval_frame.cache_entries(double)
    described = guard.describe()
    assert any("tensor matches" in d for d in described)
    assert any("is_grad_enabled" in d for d in described)


def test_hook_added_later_is_respected() -> None:
    from dynamo_rs import eval_frame

    torch.manual_seed(0)
    module = Gate().eval()
    cm = dynamo_rs.compile(module, backend=CompileCounter())
    x = torch.randn(2, 3)
    with torch.no_grad():
        cm(x)
        (guard, _), = eval_frame.cache_entries(Gate.forward)
        assert any("linear" in d and "has no hooks" in d for d in guard.describe())
        assert any('G["_global_forward_hooks"] has length 0' in d for d in guard.describe())
        handle = module.linear.register_forward_hook(lambda m, i, o: o * 10)
        try:
            # The guard fails, the module call with a hook cannot be captured, and the frame
            # runs eagerly with the hook applied.
            torch.testing.assert_close(cm(x), module(x))
        finally:
            handle.remove()


def test_same_named_globals_of_two_modules_are_two_graph_inputs() -> None:
    # Two functions from different modules each read a global tensor named W: different
    # sources, so two graph inputs — even though their names look alike.
    first = {"W": torch.ones(3)}
    second = {"W": torch.full((3,), 5.0)}
    exec("def scale(x):\n    return x * W", first)
    exec("def shift(x):\n    return x + W", second)
    scale, shift = first["scale"], second["shift"]

    def both(x):
        return scale(x) + shift(x)

    cfn, counter = compiled(both)
    x = torch.arange(3.0)
    torch.testing.assert_close(cfn(x), both(x))
    assert counter.frame_count == 1
    (gm,) = counter.graphs
    assert sum(n.op == "placeholder" for n in gm.graph.nodes) == 3


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        self.head = torch.nn.Linear(4, 2)
        self.register_buffer("_shift", torch.ones(2))

    def forward(self, x):
        return self.head(self.body(x)) + self._shift


def test_graph_input_names_follow_torchdynamo() -> None:
    import torch._dynamo

    torch.manual_seed(0)
    model = TwoLayers().eval()
    ours, theirs = CompileCounter(), []

    def keep(gm, example_inputs):
        theirs.append(gm)
        return gm.forward

    x = torch.randn(2, 4)
    torch._dynamo.reset()
    with torch.no_grad():
        dynamo_rs.compile(model, backend=ours)(x)
        torch.compile(model, backend=keep)(x)

    def names(gm):
        return sorted(n.name for n in gm.graph.nodes if n.op == "placeholder")

    assert names(ours.graphs[0]) == names(theirs[0])
    assert "l_self_modules_body_modules_0_parameters_weight_" in names(theirs[0])


def test_graph_inputs_from_the_passing_guard_are_this_calls_values() -> None:
    # The values a passing guard read go straight to the graph; with several cache entries
    # (an entry whose guard fails part-way must hand nothing over) and interleaved calls,
    # every call must still compute with its own inputs.
    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((4,), 2.0))

        def forward(self, x):
            return x * self.weight.sum() + x.shape[0]

    model = Scale()
    cm, counter = compiled(model)
    shapes = [(4,), (2, 4), (3, 4), (4,), (2, 4)]
    with torch.no_grad():
        for i, shape in enumerate(shapes * 2):
            x = torch.randn(*shape)
            if i == 7:
                model.weight.fill_(3.0)  # same tensor, new data: read through, not cached
            torch.testing.assert_close(cm(x), model(x))
    assert counter.frame_count == 3


def test_handed_over_inputs_need_the_matching_graph() -> None:
    from dynamo_rs import _native

    assert _native.take_graph_inputs(object()) is None


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0

    def forward(self, x):
        return x * self.scale


def test_property_added_to_the_class_later_is_respected() -> None:
    # The guard reads `scale` from the instance dict while the class is unchanged; a data
    # descriptor added to the class afterwards takes precedence and must be seen.
    cls = type("ScaledCopy", (Scaled,), {})
    model = cls()
    cm, counter = compiled(model)
    x = torch.ones(3)
    torch.testing.assert_close(cm(x), x * 2.0)
    cls.scale = property(lambda self: 5.0)
    torch.testing.assert_close(cm(x), x * 5.0)
    assert counter.frame_count == 2


def test_class_reassignment_is_respected() -> None:
    class Other(Scaled):
        scale = property(lambda self: 7.0)

    model = Scaled()
    cm, counter = compiled(model)
    x = torch.ones(3)
    torch.testing.assert_close(cm(x), x * 2.0)
    model.__class__ = Other
    torch.testing.assert_close(cm(x), x * 7.0)
    model.__class__ = Scaled
    model.scale = 3.0
    torch.testing.assert_close(cm(x), x * 3.0)


def test_entries_for_other_shapes_fail_on_the_arguments_first() -> None:
    from dynamo_rs import eval_frame

    model = Scaled()
    cm, counter = compiled(model, dynamic=False)  # one entry per shape
    small, large = torch.ones(2), torch.ones(5)
    for _ in range(3):
        torch.testing.assert_close(cm(small), small * 2.0)
        torch.testing.assert_close(cm(large), large * 2.0)
    assert counter.frame_count == 2
    entries = eval_frame.cache_entries(Scaled.forward)
    reasons = [guard.first_failure({"self": model, "x": small}) for guard, _ in entries]
    assert sorted(reasons, key=str) == sorted([None, 'L["x"].shape is [2], was [5]'], key=str)
