"""Tensors handed to a frame as arguments, or inside argument tuples, become graph inputs only
when the trace uses them (as TorchDynamo realises its inputs lazily): `out, _ = self.lstm(x)`
split at the LSTM hands its resume function `(out, (h, c))`, and `h`, `c` cost no placeholder,
fake tensor or guard; a frame split at a branch hands the conditions it has not read yet on to
its resume functions without guarding them (so the same tensor passed for two of them, then
two tensors, does not compile the frame again).

Each case runs eagerly, under dynamo_rs and under TorchDynamo (results, graph counts); the
graphs' placeholders show which tensors became inputs, and changing an unused tensor must
not compile again while changing a used one must."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from test_graph_breaks import run_cases, t
from test_short_circuit_breaks import three_branches_in_a_row

pytestmark = pytest.mark.usefixtures("reset_compilers")


def state():
    return t(4, 3), (t(2, 3), t(2, 3))


def first_only(pair):
    out, _ = pair
    return out.sin()


def second_only(pair):
    _, (h, c) = pair
    return h * c


def dead_then_reassigned(pair, x):
    out, rest = pair
    rest = x.cos()
    return out + rest


def used_on_one_branch(pair, flag):
    out, (h, c) = pair
    if flag:
        return out + h.sum()
    return out * 2


def returns_unused_whole(pair):
    out, rest = pair
    return out.relu(), rest


def returns_item_untouched(pair):
    out, (h, c) = pair
    return out + 1, c


def passes_to_a_helper(pair):
    def helper(a, b):
        return a @ b.T

    out, (h, _) = pair
    return helper(out, h)


def iterated(pair):
    acc = 0
    for item in pair[1]:
        acc = acc + item.sum()
    return pair[0] * acc


def indexed(pair):
    return pair[0] - pair[1][1].mean()


def used_after_a_break(pair):
    out, (h, c) = pair
    y = out.sin()
    print("break")
    return y + h.sum(), c


def unused_across_a_break(pair):
    out, (h, c) = pair
    y = out.sin()
    print("break")
    return y * 2


def mutates_an_item(pair):
    out, (h, c) = pair
    h.add_(1)
    return out * 2


def aliases_another_argument(x, pair):
    a, b = pair
    x.mul_(2)
    return a + x


def identity_of_an_item(x, pair):
    a, b = pair
    return x + 1 if a is x else x - 1


def first_by_index(pair):
    return pair[0] * 2


def sliced(pair):
    rest = pair[1:]
    return pair[0] + rest[0][1].sum()


def varargs(*args):
    first, *rest = args
    return first.sin()


def mixed_items(pair):
    n, x = pair
    return x * n


CASES = {
    "first_only": (first_only, [(state(),)]),
    "second_only": (second_only, [(state(),)]),
    "dead_then_reassigned": (dead_then_reassigned, [(state(), t(4, 3))]),
    "used_on_one_branch_true": (used_on_one_branch, [(state(), True)]),
    "used_on_one_branch_false": (used_on_one_branch, [(state(), False)]),
    "returns_unused_whole": (returns_unused_whole, [(state(),)]),
    "returns_item_untouched": (returns_item_untouched, [(state(),)]),
    "passes_to_a_helper": (passes_to_a_helper, [(state(),)]),
    "iterated": (iterated, [(state(),)]),
    "indexed": (indexed, [(state(),)]),
    "used_after_a_break": (used_after_a_break, [(state(),)]),
    "unused_across_a_break": (unused_across_a_break, [(state(),)]),
    "mutates_an_item": (mutates_an_item, [(state(),)]),
    "varargs": (varargs, [(t(3), t(2), t(5))]),
    "first_by_index": (first_by_index, [(state(),)]),
    "sliced": (sliced, [(state(),)]),
    "mixed_items": (mixed_items, [((3, t(4)),)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name) -> None:
    fn, calls = CASES[name]
    run_cases(fn, calls)


def test_aliased_and_identity_cases() -> None:
    x = t(3)
    run_cases(aliases_another_argument, [(x, (x, t(3)))])
    y = t(3)
    run_cases(identity_of_an_item, [(y, (y, t(3)))])
    run_cases(identity_of_an_item, [(y, (t(3), y))])


def _placeholders(counter_graphs) -> list[list[str]]:
    return [[n.target for n in gm.graph.nodes if n.op == "placeholder"] for gm in counter_graphs]


class _Recorder:
    def __init__(self) -> None:
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


@pytest.mark.parametrize("fn,used", [(first_only, 1), (first_by_index, 1), (sliced, 2),
                                     (second_only, 2)], ids=lambda v: getattr(v, "__name__", str(v)))
def test_unused_items_are_not_graph_inputs(fn, used) -> None:
    recorder = _Recorder()
    compiled = dynamo_rs.compile(fn, backend=recorder)
    pair = state()
    assert torch.equal(compiled(pair), fn(pair))
    (inputs,) = _placeholders(recorder.graphs)
    assert len(inputs) == used, inputs


def test_changing_an_unused_item_does_not_compile_again() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(second_only, backend=counter)
    out, (h, c) = state()
    expected = second_only((out, (h, c)))
    assert torch.equal(compiled((out, (h, c))), expected)
    # The unused tensor changes shape, dtype, and becomes a non-tensor: nothing to recompile.
    for other in (t(7, 7, 7), torch.ones(2, dtype=torch.int64), "not a tensor"):
        assert torch.equal(compiled((other, (h, c))), expected)
    assert counter.frame_count == 1
    # A used one changes: compiled again, with the right result.
    h2 = t(5, 3)
    c2 = t(5, 3)
    assert torch.equal(compiled((out, (h2, c2))), second_only((out, (h2, c2))))
    assert counter.frame_count == 2


def test_returned_unused_item_is_the_same_object() -> None:
    compiled = dynamo_rs.compile(returns_item_untouched, backend=CompileCounter())
    pair = state()
    _, c = compiled(pair)
    assert c is pair[1][1]
    compiled_whole = dynamo_rs.compile(returns_unused_whole, backend=CompileCounter())
    _, rest = compiled_whole(pair)
    assert rest is pair[1]


class _Stacked(torch.nn.Module):
    """The pattern the lazy inputs are for: LSTMs breaking the graph (as under TorchDynamo),
    their states unused by the code after them."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm_a = torch.nn.LSTM(6, 6, batch_first=True, bidirectional=True)
        self.lstm_b = torch.nn.LSTM(12, 6, batch_first=True)
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x):
        y = self.lstm_a(x)[0]
        y = y.relu()
        z, (h, _) = self.lstm_b(y)
        return self.norm(z) + h[-1].unsqueeze(1)


@pytest.mark.parametrize("shapes", [[(2, 5, 6)], [(2, 5, 6), (3, 7, 6), (4, 2, 6)]])
def test_lstm_states_in_resume_functions(shapes) -> None:
    torch.manual_seed(0)
    model = _Stacked().eval()
    recorder = _Recorder()
    compiled = dynamo_rs.compile(model, backend=recorder)
    reference = torch.compile(model, backend=torch._dynamo.testing.CompileCounter())
    with torch.no_grad():
        for shape in shapes:
            x = t(*shape)
            torch.testing.assert_close(compiled(x), model(x))
            reference(x)
    # The resume functions get `(output, (h, c))`: the cell state `c` is never read, so no
    # graph takes it; the second LSTM's `h` is read, and is an input of its graph; the
    # graph after the first LSTM takes neither state.
    graphs = _placeholders(recorder.graphs)
    assert all("L_stack0_1_1_" not in inputs for inputs in graphs), graphs
    assert any("L_stack0_1_0_" in inputs for inputs in graphs), graphs
    assert any(inputs == ["L_stack0_0_"] for inputs in graphs), graphs


# --- tensor arguments -------------------------------------------------------------------


def swapped_across_a_break(a, b):
    a, b = b, a
    print("break")
    return a - b * 2


def overwritten_across_a_break(a, b):
    a = b
    print("break")
    return a + b * 2


def rotated_across_a_break(a, b):
    c = a
    a = b
    b = c
    print("break")
    return a * 2 - b


def deleted_across_a_break(a, b):
    c = a * 2
    del a
    print("break")
    return c + b


def read_through_locals(a, b):
    names = locals()
    return names["a"] + names["b"] * 2


def read_by_a_closure_after_a_break(a, b):
    def shifted():
        return a + 1

    print("break")
    return shifted() * b


def compared_by_identity(a, b):
    return a + 1 if a is b else a - 1


def unused_until_after_a_break(x, y):
    z = x.sin()
    print("break")
    return z + y


def returned_untouched(x, y):
    return x.cos(), y


TRUE, FALSE = torch.tensor([True]), torch.tensor([False])


def _pairs():
    a, b = t(3), t(3) + 5
    return [(a, b), (b, a), (a, a)]


ARGUMENT_CASES = {
    "swapped_across_a_break": swapped_across_a_break,
    "overwritten_across_a_break": overwritten_across_a_break,
    "rotated_across_a_break": rotated_across_a_break,
    "deleted_across_a_break": deleted_across_a_break,
    "read_through_locals": read_through_locals,
    "read_by_a_closure_after_a_break": read_by_a_closure_after_a_break,
    "compared_by_identity": compared_by_identity,
    "unused_until_after_a_break": unused_until_after_a_break,
    "returned_untouched": returned_untouched,
}


@pytest.mark.parametrize("name", sorted(ARGUMENT_CASES))
def test_tensor_argument_case(name) -> None:
    # Distinct tensors, the same two swapped, and one tensor passed twice (an alias that
    # matters once both are read).
    run_cases(ARGUMENT_CASES[name], _pairs())


@pytest.mark.parametrize("shared", [True, False], ids=["same_condition_objects", "fresh_conditions"])
def test_branches_on_arguments_join_their_resume_functions(shared) -> None:
    x = t(10)
    calls = []
    for a in (True, False):
        for b in (True, False):
            for c in (True, False):
                conditions = [TRUE if v else FALSE for v in (a, b, c)]
                if not shared:
                    conditions = [v.clone() for v in conditions]
                calls.append((x, *conditions))
    # Each branch splits the frame; the resume functions of both sides of one branch join
    # at the next, so 3 conditions make 7 graphs (2n + 1), not one per path.
    run_cases(three_branches_in_a_row, calls)


def test_an_argument_only_handed_on_is_neither_input_nor_guarded() -> None:
    recorder = _Recorder()
    counter = CompileCounter()

    def backend(gm, example_inputs):
        counter(gm, example_inputs)
        return recorder(gm, example_inputs)

    compiled = dynamo_rs.compile(unused_until_after_a_break, backend=backend)
    x = t(4)
    for y in (t(4), torch.ones(4, dtype=torch.int64), x, t(1)):
        torch.testing.assert_close(compiled(x, y), unused_until_after_a_break(x, y))
    # The graph before the break takes x alone; y's dtype, size or being x itself change
    # only the resume function's entries.
    assert _placeholders(recorder.graphs)[0] == ["L_x_"], _placeholders(recorder.graphs)
    before_break = [g for g in recorder.graphs if len(_placeholders([g])[0]) == 1
                    and "sin" in str(g.code)]
    assert len(before_break) == 1, [g.code for g in recorder.graphs]
    # Returned untouched: the very object passed, and nothing compiled for it.
    counter2 = CompileCounter()
    compiled2 = dynamo_rs.compile(returned_untouched, backend=counter2)
    for y in (t(2), "not a tensor", torch.zeros(3, 3)):
        out, same = compiled2(x, y)
        assert same is y
    assert counter2.frame_count == 1


# --- constant arguments -----------------------------------------------------------------
# A flag or a mode string is guarded only once the trace reads it: handed on at a graph
# break or returned, it is loaded again, so the part of the frame before the break is not
# compiled again for each value (TorchDynamo's lazy arguments).


def _shifted(t, flag):
    return t * 2 if flag else t - 2


def flag_read_after_a_break(x, flag, mode):
    y = x.sin()
    print("break")
    return _shifted(y, flag) * (1 if mode == "a" else -1)


def flag_read_before_and_after(x, flag, mode):
    if flag:
        x = x + 1
    print("break")
    return x * len(mode)


def flag_formatted(x, flag, mode):
    return x + len(f"{mode}-{flag}")


def flag_in_a_dict(x, flag, mode):
    d = {mode: x, "z": flag}
    return d.get("a", x * 0) + int(d["z"])


def flag_returned(x, flag, mode):
    return x + 1, flag


def flag_negated(x, flag, mode):
    return x if not flag else -x


def flag_in_a_closure(x, flag, mode):
    def pick():
        return x + 1 if flag else x - 1

    return pick()


def mode_by_its_methods(x, flag, mode):
    return x * len(mode.upper()) + mode.startswith("a")


def flag_as_a_keyword(x, flag, mode):
    return x.sum(dim=0, keepdim=flag) * len(mode)


def flag_and_a_tensor_multiplied(x, flag, mode):
    return x * flag + flag


CONSTANT_CASES = [flag_read_after_a_break, flag_read_before_and_after, flag_formatted,
                  flag_in_a_dict, flag_returned, flag_negated, flag_in_a_closure,
                  mode_by_its_methods, flag_as_a_keyword, flag_and_a_tensor_multiplied]


@pytest.mark.parametrize("fn", CONSTANT_CASES, ids=lambda f: f.__name__)
def test_constant_argument_case(fn) -> None:
    x = t(3, 4)
    run_cases(fn, [(x, flag, mode) for flag in (True, False) for mode in ("a", "b", "cc")])


def test_a_flag_read_only_after_a_break_does_not_compile_the_part_before_again() -> None:
    recorder = _Recorder()
    compiled = dynamo_rs.compile(flag_read_after_a_break, backend=recorder)
    x = t(3)
    for flag in (True, False):
        for mode in ("a", "b", "cc"):
            torch.testing.assert_close(compiled(x, flag, mode), flag_read_after_a_break(x, flag, mode))
    before_break = [g for g in recorder.graphs if "sin" in str(g.code)]
    assert len(before_break) == 1, [g.code for g in recorder.graphs]
