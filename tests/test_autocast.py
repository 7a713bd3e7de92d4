"""`with torch.autocast(...)` inside compiled code: the graph holds TorchDynamo's
`_enter_autocast`/`_exit_autocast` pair, the trace runs the block's operations in autocast (so
dtypes are autocast's), and every backend gets a graph it understands. A graph break inside
the block re-enters autocast for the code after it. Each test compares with eager: values,
dtypes, gradients, and the autocast state the caller is left in."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F

import dynamo_rs
from dynamo_rs.testing import CompileCounter

pytestmark = pytest.mark.usefixtures("reset_compilers")


def weights(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_same(got, expected):
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
    else:
        assert got == expected


def state():
    return (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch.is_autocast_cache_enabled())


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_autocast_block_on_every_backend(backend) -> None:
    w = weights(8, 8)

    def fn(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = F.linear(x, w).relu()
            y = h @ w
        return y.float().sum(-1), y.dtype, h.dtype

    compiled = dynamo_rs.compile(fn, backend=backend)
    x = weights(3, 8, seed=1)
    before = state()
    assert_same(compiled(x), fn(x))
    assert state() == before


def test_graph_break_inside_the_block(capsys) -> None:
    w = weights(4, 4)

    def fn(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ w
            print("inside", a.dtype)
            b = a @ w
        c = b.float() @ w
        return a, b, c

    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    x = weights(3, 4, seed=2)
    before = state()
    for _ in range(2):
        assert_same(compiled(x), fn(x))
        assert state() == before
    out = capsys.readouterr().out
    assert out.count("inside torch.bfloat16") == 4
    # The resume function enters the block again itself and leaves it in its graph: the
    # graphs TorchDynamo makes (before the break, and the rest).
    theirs = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    torch.compile(fn, backend=theirs)(x)
    assert counter.frame_count == theirs.frame_count == 2


@torch.compiler.disable
def _matmul_outside_the_graph(a, w):
    return a @ w


def test_the_instruction_that_breaks_runs_inside_the_block() -> None:
    # The call that breaks the graph computes a tensor: in the block's autocast, as in eager;
    # a data-dependent branch inside the block too (both sides resume inside it).
    w = weights(4, 4)

    def fn(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ w
            b = _matmul_outside_the_graph(a, w)
            if b.float().sum() > 0:
                c = b @ w
            else:
                c = (b @ w) * 2
        return a, b, c, c.float() @ w

    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    before = state()
    for seed in (4, 5, 6, 7):
        x = weights(3, 4, seed=seed) * (1 if seed % 2 else -1)
        assert_same(compiled(x), fn(x))
        assert state() == before


def test_nested_blocks_with_a_break_in_the_inner_one(capsys) -> None:
    w = weights(4, 4)

    def fn(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ w
            with torch.autocast("cpu", enabled=False):
                b = x @ w
                print("inner")
                c = b @ w
            d = c @ w
        return a, b, c, d

    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    x = weights(3, 4, seed=3)
    before = state()
    assert_same(compiled(x), fn(x))
    assert state() == before
    theirs = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    torch.compile(fn, backend=theirs)(x)
    assert counter.frame_count == theirs.frame_count


def test_training_through_an_autocast_block() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))

    def step(m, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(x)
        loss = F.cross_entropy(logits.float(), torch.tensor([0, 1, 2]))
        loss.backward()
        return loss

    x = weights(3, 8, seed=4)
    expected = step(model, x)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = dynamo_rs.compile(step, backend="aot_eager")(model, x)
    torch.testing.assert_close(got, expected)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


def test_compiled_inside_an_outer_autocast_turning_it_off() -> None:
    w = weights(4, 4)

    def fn(x):
        a = x @ w
        with torch.autocast("cpu", enabled=False):
            b = x @ w
        return a, b

    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    x = weights(3, 4, seed=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = fn(x)
        got = compiled(x)
        inside = state()
    assert_same(got, expected)
    assert inside[0] and inside[1] == torch.bfloat16
    # Called again outside autocast: the global state differs, so it is compiled again.
    assert_same(compiled(x), fn(x))


def test_exception_inside_the_block_leaves_autocast() -> None:
    w = weights(4, 4)

    def fn(x, fail):
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = x @ w
                if fail:
                    raise ValueError("stop")
        except ValueError:
            return y.float() - 1, torch.is_autocast_enabled("cpu")
        return y.float(), torch.is_autocast_enabled("cpu")

    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    x = weights(3, 4, seed=6)
    before = state()
    for fail in (False, True, False):
        assert_same(compiled(x, fail), fn(x, fail))
        assert state() == before


def test_bad_autocast_arguments_raise_as_in_eager() -> None:
    def fn(x):
        with torch.autocast("not-a-device"):
            return x + 1

    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    with pytest.raises(RuntimeError) as eager_error:
        fn(torch.ones(2))
    with pytest.raises(RuntimeError) as compiled_error:
        compiled(torch.ones(2))
    assert str(compiled_error.value) == str(eager_error.value)
    assert state()[0] is False


def test_a_generator_yielding_inside_an_autocast_block() -> None:
    """`sum()` of a generator that yields inside an autocast block: in eager the additions
    between the items run in autocast too (the generator's frame and its consumer interleave;
    entering autocast also counts as a change a generator run ahead may not make)."""
    w = weights(4, 4)

    def items(x):
        for i in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                yield (x @ w) * i

    def fn(x):
        return sum(items(x))

    compiled_fn = dynamo_rs.compile(fn, backend=CompileCounter())
    x = weights(2, 4, seed=7)
    assert_same(compiled_fn(x), fn(x))
    assert state()[0] is False
