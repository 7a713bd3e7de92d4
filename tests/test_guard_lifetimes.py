"""What a compiled frame's guards keep alive. A guard compares classes, modules and functions
by identity or by type, but holds them weakly: a model, a class defined inside a function —
and whatever its methods' closures hold, like the layers of a model built by a factory — are
freed once the user drops them, as they are without compiling (TorchDynamo's guards hold them
weakly too). The code object the entries hang on outlives them, so a strong reference there
would keep them for the life of the process."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn

import dynamo_rs


@pytest.fixture(autouse=True)
def _production_guards():
    # The suite's "debug" mode builds a second, reference guard from the sources, which
    # holds what it reads strongly: a testing aid, not what users run.
    before = dynamo_rs.config.guard_check_mode
    dynamo_rs.config.guard_check_mode = "fast"
    yield
    dynamo_rs.config.guard_check_mode = before


def _freed(make_and_run) -> list[bool]:
    refs = make_and_run()
    gc.collect()
    return [r() is None for r in refs]


def _module_compiled_itself(compile_it: bool):
    def run():
        layer = nn.Linear(4, 4)

        class Wrapper(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = layer  # the class's __init__ closes over the layer

            def forward(self, x):
                return self.layer(x).relu()

        model = Wrapper()
        x = torch.randn(2, 4)
        out = (dynamo_rs.compile(model, backend="eager") if compile_it else model)(x)
        torch.testing.assert_close(out, model(x))
        return [weakref.ref(layer), weakref.ref(Wrapper), weakref.ref(model),
                weakref.ref(layer.weight)]
    return run


def _module_called_inside(compile_it: bool):
    def step(model, x):
        return model(x) * 2

    compiled = dynamo_rs.compile(step, backend="eager")

    def run():
        class Local(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                return self.fc(x)

        model = Local()
        x = torch.randn(3, 4)
        out = (compiled if compile_it else step)(model, x)
        torch.testing.assert_close(out, step(model, x))
        return [weakref.ref(Local), weakref.ref(model), weakref.ref(model.fc)]
    return run


def _plain_object_argument(compile_it: bool):
    def scale(obj, x):
        return x * obj.factor + obj.bias()

    compiled = dynamo_rs.compile(scale, backend="eager")

    def run():
        class Config:
            factor = 3.0

            def __init__(self):
                self.offset = torch.randn(64)

            def bias(self):
                return self.offset.sum()

        obj = Config()
        x = torch.randn(4)
        out = (compiled if compile_it else scale)(obj, x)
        torch.testing.assert_close(out, scale(obj, x))
        return [weakref.ref(Config), weakref.ref(obj), weakref.ref(obj.offset)]
    return run


def _tensor_in_a_method_closure(compile_it: bool):
    def scale(obj, x):
        return x + obj.bias()

    compiled = dynamo_rs.compile(scale, backend="eager")

    def run():
        big = torch.randn(64)

        class Config:
            def bias(self):
                return big.sum()  # the method closes over a tensor

        obj = Config()
        x = torch.randn(4)
        out = (compiled if compile_it else scale)(obj, x)
        torch.testing.assert_close(out, scale(obj, x))
        return [weakref.ref(Config), weakref.ref(obj), weakref.ref(big)]
    return run


FAMILIES = [
    _module_compiled_itself, _module_called_inside, _plain_object_argument,
    pytest.param(_tensor_in_a_method_closure, marks=pytest.mark.xfail(strict=True, reason=(
        "a closure cell of an inlined function guarded by identity is read directly, and "
        "the guard holds the cell (cells take no weak references)"))),
]


@pytest.mark.parametrize("family", FAMILIES,
                         ids=["module_compiled_itself", "module_called_inside",
                              "plain_object_argument", "tensor_in_a_method_closure"])
def test_objects_dropped_by_the_user_are_freed_as_without_compiling(family):
    dynamo_rs.reset()
    expected = _freed(family(compile_it=False))
    assert all(expected)  # the family frees them when not compiled
    got = _freed(family(compile_it=True))
    assert got == expected


def test_an_entry_whose_class_died_never_matches_a_new_class():
    """A dead class's entry must not match a new class that happens to reuse its address:
    the guard checks its weak reference, not only the address."""
    dynamo_rs.reset()

    def call(obj, x):
        return x + obj.value()

    compiled = dynamo_rs.compile(call, backend="eager")
    for k in range(12):
        cls = type(f"C{k}", (), {"value": (lambda self, k=k: float(k))})
        x = torch.zeros(2)
        torch.testing.assert_close(compiled(cls(), x), x + k)
        del cls
        gc.collect()


@pytest.mark.parametrize("kind", ["class attribute", "module class"])
def test_entries_for_collected_objects_do_not_count_toward_the_cache_limit(kind):
    """A class defined in a loop (or a model class built by a factory) gives each call a new
    class to guard: the entries of the classes already collected can never match again, so
    they no longer fill `cache_size_limit` (which ran the frame eagerly from the ninth class
    on, with a warning) — as TorchDynamo drops entries whose guarded objects die."""
    import warnings

    from dynamo_rs import eval_frame
    from dynamo_rs.testing import CompileCounter

    def scale_by(obj, x):
        return x * obj.scale

    def run_layer(model, x):
        return model(x) + 1

    fn = scale_by if kind == "class attribute" else run_layer
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    limit = dynamo_rs.config.cache_size_limit
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cache-limit warning would fail the test
        for i in range(limit * 2 + 3):
            if kind == "class attribute":
                class Scaled:
                    scale = i

                obj = Scaled()
            else:
                class Layer(nn.Module):
                    def forward(self, x, i=i):
                        return x * i

                obj = Layer()
            x = torch.ones(2)
            torch.testing.assert_close(compiled(obj, x), fn(obj, x))
            del obj
            if kind == "class attribute":
                del Scaled
            else:
                del Layer
            gc.collect()
    assert counter.frame_count == limit * 2 + 3  # every call compiled, none ran eagerly
    assert len(eval_frame.cache_entries(fn.__code__)) <= limit
