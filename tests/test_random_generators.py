"""`torch.Generator` objects: made in the frame (`torch.Generator().manual_seed(s)`), given to
it, held by a module; seeded, their state read and restored, and passed to draws
(`torch.randn(..., generator=g)`, `randperm`, `normal`, `bernoulli`, `multinomial`, in-place
`uniform_`).

A generator's methods are called at graph breaks and a draw given one breaks the graph, as
under TorchDynamo. Before, a generator made in the frame ran the whole frame eagerly (the
bound `g.manual_seed` on the stack at the break was not rebuildable), and one given to the
frame or handed to a resume function was guarded by identity, so a new generator per call
compiled again on every call. Now the bound method is looked up again on the generator this
call has, and a generator is guarded by its type. Every case: results equal eager on every
call (each run given identically seeded generators), no new trace after the first call,
graphs no more than TorchDynamo's."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter

pytestmark = pytest.mark.usefixtures("reset_compilers")


def seeded(seed):
    return lambda: torch.Generator().manual_seed(seed)


def made_then_seeded(x):
    g = torch.Generator()
    g.manual_seed(0)
    return x + torch.randn(x.shape, generator=g)


def made_seeded_in_one_expression(x):
    g = torch.Generator().manual_seed(3)
    return x * torch.rand(x.shape, generator=g)


def made_with_device_keyword(x):
    g = torch.Generator(device="cpu")
    g.manual_seed(11)
    n = torch.normal(0.0, 1.0, size=x.shape, generator=g)
    return x * n, g.initial_seed()


def permutation_from_a_made_generator(x):
    g = torch.Generator().manual_seed(3)
    return x[torch.randperm(x.shape[0], generator=g)] * 2


def given_generator(x, g):
    return x + torch.randn(x.shape, generator=g)


def given_generator_seeded_inside(x, g):
    g.manual_seed(7)
    y = x * 2
    return y + torch.rand(x.shape, generator=g)


def state_saved_and_restored(x, g):
    state = g.get_state()
    a = torch.rand(x.shape, generator=g)
    g.set_state(state)
    b = torch.rand(x.shape, generator=g)
    return x + a - b


def several_draws_from_one_generator(x, g):
    mask = torch.bernoulli(torch.full(x.shape, 0.5), generator=g)
    idx = torch.multinomial(x.abs() + 0.1, 2, generator=g)
    noise = torch.empty_like(x).uniform_(-1, 1, generator=g)
    return x * mask + noise, idx


def generator_read_twice(x, g):
    a = torch.randint(0, 10, x.shape, generator=g)
    seed = g.initial_seed()
    return x + a + seed


class NoisyLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x):
        self.gen.manual_seed(5)
        return self.lin(x + torch.randn(x.shape, generator=self.gen))


_noisy = NoisyLinear()


def module_holding_a_generator(x):
    return _noisy(x).relu()


def global_seed_in_the_frame(x):
    torch.manual_seed(0)
    return x + torch.randn(x.shape)


CASES = [
    (made_then_seeded, ()),
    (made_seeded_in_one_expression, ()),
    (made_with_device_keyword, ()),
    (permutation_from_a_made_generator, ()),
    (given_generator, (seeded(5),)),
    (given_generator_seeded_inside, (torch.Generator,)),
    (state_saved_and_restored, (seeded(2),)),
    (several_draws_from_one_generator, (seeded(4),)),
    (generator_read_twice, (seeded(9),)),
    (module_holding_a_generator, ()),
    (global_seed_in_the_frame, ()),
]


@pytest.mark.parametrize("fn,makers", CASES, ids=[c[0].__name__ for c in CASES])
def test_generators_side_by_side(fn, makers) -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    theirs = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(fn, backend=theirs)
    traced_after_first = None
    for call in range(4):
        x = torch.randn(5, 4)
        expected = fn(x, *(m() for m in makers))
        got = compiled(x, *(m() for m in makers))
        reference(x, *(m() for m in makers))
        torch.testing.assert_close(got, expected)
        if call == 0:
            traced_after_first = len(compiled._dynamo_rs_converter.frames)
    assert compiled._dynamo_rs_converter.failures == []
    # A new generator per call compiles nothing more (it was guarded by identity).
    assert len(compiled._dynamo_rs_converter.frames) == traced_after_first, \
        [f[0] for f in compiled._dynamo_rs_converter.frames[traced_after_first:]]
    assert counter.frame_count <= theirs.frame_count, (counter.frame_count, theirs.frame_count)
    assert counter.frame_count >= 1
