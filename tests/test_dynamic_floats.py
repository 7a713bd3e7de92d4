"""Float arguments are automatic-dynamic as TorchDynamo makes them (`specialize_float=False`):
a constant on the first compile, a symbolic float (SymFloat graph input) once a second value
is seen — a sampler's noise level, a temperature or a scale passed on every call no longer
recompiles per value until the cache limit. Branches and conversions on the float are
guarded by the shape guard. Backends built on AOTAutograd (`aot_eager`, `inductor`) refuse
symbolic floats (torch's scalar-tensorification pass asks for a restart): the frame is traced
again with its floats as constants. Every case is compared with eager and, for graph counts,
with TorchDynamo in the same process."""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh(reset_compilers):
    yield


VALUES = (0.2, 0.4, 0.7, 0.9, 0.25, 1.5, 3.0, 0.4)

FUNCTIONS = {
    "multiply": lambda x, s: x * s + 1,
    "divide": lambda x, s: x / s - s / 2,
    "branch": lambda x, s: x * 2 if s > 0.5 else x - s,
    "pow": lambda x, s: x.abs().pow(s),
    "clamp": lambda x, s: x.clamp(min=-s, max=s),
    "full": lambda x, s: x + torch.full((2,), s),
    "sqrt": lambda x, s: x * math.sqrt(s),
    "int_of": lambda x, s: x * int(s * 10),
    "temperature_softmax": lambda x, s: (x / s).softmax(-1),
    "alpha": lambda x, s: torch.add(x, x, alpha=s),
    "lerp": lambda x, s: torch.lerp(x, x * 2, s),
    "where": lambda x, s: torch.where(x > s, x, -x),
    "builtin_max": lambda x, s: x * max(s, 0.3),
    "leaky_relu": lambda x, s: F.leaky_relu(x, s),
}


def _run(compiled, fn, x):
    for s in VALUES:
        torch.testing.assert_close(compiled(x, s), fn(x, s))


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_float_argument_graph_counts_match_torchdynamo(name):
    fn = FUNCTIONS[name]
    x = torch.randn(2)
    ours = CompileCounter()
    _run(dynamo_rs.compile(fn, backend=ours), fn, x)
    theirs = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(fn, backend=theirs)
    for s in VALUES:
        compiled(x, s)
    assert ours.frame_count == theirs.frame_count
    assert ours.frame_count < len(set(VALUES)), "a float must not recompile per value"


@pytest.mark.parametrize("name", ["multiply", "branch", "temperature_softmax", "int_of"])
def test_float_arguments_under_aot_autograd_match_eager(name):
    fn = FUNCTIONS[name]
    _run(dynamo_rs.compile(fn, backend="aot_eager"), fn, torch.randn(2))


def test_dynamic_true_makes_floats_symbolic_from_the_first_call():
    counter = CompileCounter()
    fn = FUNCTIONS["multiply"]
    _run(dynamo_rs.compile(fn, backend=counter, dynamic=True), fn, torch.randn(2))
    assert counter.frame_count == 1


def test_dynamic_false_keeps_floats_constant():
    counter = CompileCounter()
    fn = FUNCTIONS["multiply"]
    compiled = dynamo_rs.compile(fn, backend=counter, dynamic=False)
    for s in (0.5, 0.25, 0.5):
        torch.testing.assert_close(compiled(torch.ones(2), s), fn(torch.ones(2), s))
    assert counter.frame_count == 2


def test_a_sampling_loop_compiles_twice():
    """A diffusion-style loop: the model is called with a new noise level every step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU(), torch.nn.Linear(4, 4))

    def denoise(x, sigma):
        return x - sigma * model(x / (sigma**2 + 1) ** 0.5)

    counter = CompileCounter()
    compiled = dynamo_rs.compile(denoise, backend=counter)
    x_eager = x_compiled = torch.randn(3, 4)
    with torch.no_grad():
        for step in range(12):
            sigma = 10.0 * (0.7**step)
            x_eager = denoise(x_eager, sigma)
            x_compiled = compiled(x_compiled, sigma)
    torch.testing.assert_close(x_compiled, x_eager)
    assert counter.frame_count == 2


def test_an_int_where_a_float_was_recompiles():
    counter = CompileCounter()
    fn = FUNCTIONS["divide"]
    compiled = dynamo_rs.compile(fn, backend=counter)
    x = torch.randn(2)
    for s in (0.5, 0.25, 2, 0.75):
        torch.testing.assert_close(compiled(x, s), fn(x, s))
    # 0.5 (constant), 0.25 (symbolic float), 2 (an int: another type), then 0.75 reuses the
    # symbolic float entry.
    assert counter.frame_count == 3


def test_inductor_takes_float_arguments():
    fn = FUNCTIONS["multiply"]
    _run(dynamo_rs.compile(fn, backend="inductor"), fn, torch.randn(2))


def test_aot_backends_after_a_float_restart_stay_right():
    """torch's tensorification pass remembers the float symbols it was told to specialise in
    a process-wide set; a name left there by an earlier compile (ours or TorchDynamo's) made
    the pass burn a later frame's float into its graph without asking for a restart, and the
    entry, guarded as if the float were symbolic, returned the first value's result for
    every value. Each backend call now starts from an empty set."""
    functions = [
        lambda x, s: x * s,
        lambda x, s: x[: int(x.shape[0] * s)],
        lambda x, s: (x > s).float().sum() * s,
        lambda x, s: x.sum() + torch.arange(0, s, 0.5).sum(),
    ]
    x = torch.randn(10)
    theirs = torch.compile(functions[0], backend="aot_eager")
    for fn in functions:
        compiled = dynamo_rs.compile(fn, backend="aot_eager")
        for s in (0.5, 0.3, 0.7, 0.55, 2.0, 0.3):
            torch.testing.assert_close(compiled(x, s), fn(x, s))
            torch.testing.assert_close(theirs(x, s), functions[0](x, s))


def test_a_backend_that_expects_only_tensors_and_ints_gets_constant_floats():
    """TorchDynamo never hands a SymFloat to a backend; one written against it (reading the
    shape of every example input) gets the graph again with the float as a constant."""
    seen = []

    def shapes_backend(gm, example_inputs):
        seen.append([tuple(t.shape) if isinstance(t, torch.Tensor) else int(t) for t in example_inputs
                     if not isinstance(t, (float, torch.SymFloat)) or t.shape])
        return gm.forward

    fn = FUNCTIONS["multiply"]
    _run(dynamo_rs.compile(fn, backend=shapes_backend), fn, torch.randn(2))
    assert seen


def test_a_frame_with_a_graph_break_and_float_arguments_under_aot_autograd():
    """The part before a graph break is compiled with the floats constant when the backend
    refuses them, on the very call that found it out (not run eagerly once)."""

    def fn(x, s):
        y = x * s
        print("", end="")
        return y + s

    from torch._dynamo.backends.registry import lookup_backend

    graphs = []

    def aot_eager(gm, example_inputs):
        compiled_graph = lookup_backend("aot_eager")(gm, example_inputs)
        graphs.append(gm)
        return compiled_graph

    compiled = dynamo_rs.compile(fn, backend=aot_eager)
    x = torch.ones(2)
    for calls, s in enumerate((0.5, 0.25, 0.75), start=1):
        torch.testing.assert_close(compiled(x, s), fn(x, s))
        # Two graphs per call — the part before the break and the resume function, the
        # float a constant in each: the second call's symbolic float was refused and the
        # part before the break traced again at once, not run eagerly.
        assert len(graphs) == 2 * calls


# Floats read from elsewhere than the frame's arguments — a global config dict, an attribute
# of a plain object or of a module, a learning rate in a dict handed in — are automatic-
# dynamic too, as TorchDynamo wraps every float: each of these recompiled per value before.
CONFIG = {"scale": 0.5}


class _Holder:
    scale = 0.5


HOLDER = _Holder()


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 0.5
        self.norm = torch.nn.LayerNorm(2)

    def forward(self, x):
        return self.norm(x) * self.scale


MODULE = _Scaled()


def _set_everywhere(s):
    CONFIG["scale"] = s
    HOLDER.scale = s
    MODULE.scale = s


ELSEWHERE = {
    "global_dict": (lambda x, group: x * CONFIG["scale"] + 1),
    "global_object_attribute": (lambda x, group: x / HOLDER.scale),
    "module_attribute": (lambda x, group: MODULE(x)),
    # `layer_norm` specialises its `eps` (a guard on its value): a graph per value, as under
    # TorchDynamo — compared for values and counts only.
    "layer_norm_eps": (lambda x, group: F.layer_norm(x, (2,), eps=group["lr"] / 10)),
    "item_of_a_dict_argument": (lambda x, group: x.add(x, alpha=-group["lr"])),
    "branch_on_a_global": (lambda x, group: x * 2 if CONFIG["scale"] > 0.5 else x - 1),
}


@pytest.mark.parametrize("name", list(ELSEWHERE))
def test_floats_read_from_elsewhere_match_torchdynamo(name):
    fn = ELSEWHERE[name]
    x = torch.randn(2)
    counts = []
    for front in ("dynamo_rs", "torch"):
        counter = CompileCounter() if front == "dynamo_rs" else torch._dynamo.testing.CompileCounter()
        compiled = (dynamo_rs.compile if front == "dynamo_rs" else torch.compile)(fn, backend=counter)
        for s in VALUES:
            _set_everywhere(s)
            got = compiled(x, {"lr": s})
            if front == "dynamo_rs":
                torch.testing.assert_close(got, fn(x, {"lr": s}))
        counts.append(counter.frame_count)
    assert counts[0] == counts[1], counts
    if name != "layer_norm_eps":
        assert counts[0] < len(set(VALUES)), "a float must not recompile per value"


DECAY = {"value": 1.5}


def _decay_global(x):
    v = DECAY["value"]
    DECAY["value"] = math.sqrt(abs(v * v / 2))
    return x * 2


def test_a_float_made_python_again_is_guarded_by_its_inputs():
    """`math.sqrt` of a symbolic float needs a Python float: its inputs are specialised to
    their values, not the computed `v * v / 2` — whose guard, recomputed as `v ** 2 / 2`
    (sympy's form), rounds differently in the last bit for some values (v = 0.375 - 1 ulp)
    and failed on the frame it was built for."""
    x = torch.ones(2)
    DECAY["value"] = 1.5
    compiled = dynamo_rs.compile(_decay_global, backend=CompileCounter())
    expected = dict(DECAY)
    for i in range(8):
        if i == 4:
            x = x.detach().requires_grad_()  # a recompile at v = 0.37499999999999994
        torch.testing.assert_close(compiled(x), x * 2)
        v = expected["value"]
        expected["value"] = math.sqrt(abs(v * v / 2))
        assert DECAY["value"] == expected["value"]
