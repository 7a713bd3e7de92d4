"""Generators suspended at a `yield` and resumed later, side by side with TorchDynamo (the
harness is `language_harness.check_case`): `contextlib.contextmanager` (its body runs up to
the `yield` on entering, the rest on leaving), generators whose body changes state consumed
one item at a time (`for`, `next`, `send`), `yield from` and the value it returns,
StopIteration caught by the traced code. Each result is compared with eager, side effects on
lists included (returned with the result)."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)

T34 = t(3, 4)


# --- contextlib.contextmanager -----------------------------------------------------------------

@contextlib.contextmanager
def _logged(log, k):
    log.append("enter")
    yield k * 2
    log.append("exit")


@contextlib.contextmanager
def _restoring(log, k):
    log.append(k)
    try:
        yield len(log)
    finally:
        log.pop()


@contextlib.contextmanager
def _scaled_tensor(x):
    yield x * 3


@contextlib.contextmanager
def _nothing():
    yield


@case(T34)
def contextmanager_without_try(x):
    log = []
    with _logged(log, 3) as k:
        y = x * k + len(log)
    return y, tuple(log)
@case(T34)
def contextmanager_with_finally(x):
    log = ["base"]
    with _restoring(log, "a") as n:
        y = x * n
    return y + len(log), tuple(log)
@case(T34)
def contextmanager_nested(x):
    log = []
    with _logged(log, 1) as a:
        with _restoring(log, "inner") as b:
            y = x * a * b
        with _logged(log, 2) as c:
            y = y + c
    return y, tuple(log)
@case(T34)
def contextmanager_in_one_with(x):
    log = []
    with _logged(log, 2) as a, _restoring(log, "b") as b:
        y = x * a + b
    return y, tuple(log)
@case(T34)
def contextmanager_yielding_a_tensor(x):
    with _scaled_tensor(x) as s:
        y = s.sin()
    return y
@case(T34)
def contextmanager_yielding_nothing(x):
    with _nothing():
        y = x.cos()
    return y + 1
@case(T34, lambda: ["given"])
def contextmanager_on_an_argument_list(x, log):
    with _logged(log, 4) as k:
        y = x - k
    return y, tuple(log)
@case(T34)
def contextmanager_inside_a_helper(x):
    def helper(v, log):
        with _restoring(log, "h") as n:
            return v * n
    log = []
    return helper(x, log) + helper(x + 1, log), len(log)
@case(T34)
def contextmanager_made_in_the_frame(x):
    @contextlib.contextmanager
    def shifted(v):
        yield v + 1

    with shifted(x) as s:
        y = s * 2
    return y
_LAYERS = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())


@case(T34)
def contextmanager_around_a_module(x):
    log = []
    with _logged(log, 1):
        y = _LAYERS(x)
    return y, tuple(log)


# --- generators with effects, consumed one item at a time --------------------------------------

def _counting(log, x, n):
    for i in range(n):
        log.append(i)
        yield x * i


def _multiples(x, n):
    for i in range(n):
        yield x * i


@case(T34)
def generator_with_effects_in_a_loop(x):
    log = []
    out = []
    for v in _counting(log, x, 3):
        out.append(v + len(log))
    return out, tuple(log)
@case(T34)
def generator_with_effects_by_next(x):
    log = []
    g = _counting(log, x, 3)
    a = next(g)
    b = next(g) * len(log)
    return a + b, tuple(log)
@case(T34)
def generator_next_with_default(x):
    g = _counting([], x, 1)
    first = next(g)
    rest = next(g, None)
    return first if rest is None else first + rest
@case(T34)
def generator_stop_iteration_caught(x):
    g = _counting([], x, 1)
    y = next(g) + 1
    try:
        y = y + next(g)
    except StopIteration:
        y = y * 2
    return y
@case(T34)
def generator_two_interleaved(x):
    log = []
    a = _counting(log, x, 2)
    b = _counting(log, x + 1, 2)
    s = next(a) + next(b) + next(a) + next(b)
    return s, tuple(log)
@case(T34)
def generator_send(x):
    def accumulate(v):
        total = v
        while True:
            step = yield total
            if step is None:
                return
            total = total + step

    g = accumulate(x)
    first = next(g)
    second = g.send(x * 2)
    third = g.send(x.cos())
    return first + second + third
@case(T34)
def generator_loop_broken_early(x):
    log = []
    y = x
    for i, v in enumerate(_counting(log, x, 5)):
        if i == 2:
            break
        y = y + v
    return y, tuple(log)
@case(T34)
def generator_consumed_by_zip(x):
    return [a * b for a, b in zip(_counting([], x, 3), range(3))]
@case(T34)
def generator_of_modules(x):
    def each(mods):
        for m in mods:
            yield m

    for m in each(_LAYERS):
        x = m(x)
    return x


# --- zip, enumerate and map over generators; endless itertools ----------------------------------

@case(T34)
def zip_of_two_generators_with_effects(x):
    log = []
    out = []
    for a, b in zip(_counting(log, x, 3), _counting(log, x + 1, 2)):
        out.append(a * b + len(log))
    return out, tuple(log)
@case(T34)
def enumerate_generator_with_start(x):
    log = []
    y = x
    for i, v in enumerate(_counting(log, x, 3), start=1):
        y = y + v * i + len(log)
    return y, tuple(log)
@case(T34)
def map_over_a_generator(x):
    log = []
    return [v.sum() + len(log) for v in map(torch.sin, _counting(log, x, 3))], tuple(log)
@case(T34)
def count_in_a_for_loop(x):
    y = x
    for i, w in zip(itertools.count(), [x, x * 2]):
        y = y + w * i
    return y
@case(T34)
def count_with_float_step(x):
    c = itertools.count(0.5, 0.25)
    return x * next(c) + x * next(c) * next(c)
@case(T34)
def repeat_zipped_with_a_generator(x):
    return [a * b for a, b in zip(_counting([], x, 3), itertools.repeat(2.0))]
@case(T34)
def list_of_a_generator_without_effects(x):
    return torch.stack(list(zip(*[_multiples(x, 2), _multiples(x + 1, 2)]))[1])
@case(T34)
def list_of_a_generator_with_effects(x):
    log = []
    items = list(_counting(log, x, 3))
    return torch.stack(items) + len(log), tuple(log)
@case(T34)
def next_of_an_enumerate(x):
    e = enumerate(_counting([], x, 3))
    i, a = next(e)
    j, b = next(e)
    return a * i + b * j


# --- yield from -------------------------------------------------------------------------------

@case(T34)
def yield_from_return_value(x):
    def inner(v):
        yield v
        return 5

    def outer(v):
        r = yield from inner(v)
        yield v * r
    return list(outer(x))
@case(T34)
def yield_from_lazily(x):
    log = []

    def outer(v):
        yield from _counting(log, v, 2)
        log.append("done")
        yield v.sum()
    out = []
    for item in outer(x):
        out.append(item * len(log))
    return out, tuple(log)


# --- sum/max/min of generators whose body changes Python state -----------------------------
# They take every item in order, as list() does: the frame used to run eagerly ("a generator
# that changes state"). A body changing a tensor in place still breaks the graph (an item
# taken before the change must not see it) — and matches eager.

class _Stage:
    def __init__(self, k):
        self.k = k
        self.calls = 0
        self.last = None

    def __call__(self, v):
        self.calls += 1
        self.last = v
        return v * self.k


@case(t(3, 4))
def sum_of_generator_recording_state(x):
    stages = [_Stage(1.0), _Stage(2.0), _Stage(3.0)]
    total = sum(stage(x) for stage in stages)
    return total, [s.calls for s in stages], stages[2].last


@case(t(3, 4))
def sum_with_start_of_generator_appending(x):
    seen = []
    total = sum((seen.append(i) or x * i for i in range(3)), torch.ones(4))
    return total, seen


@case(t(3, 4))
def max_and_min_of_generators_counting(x):
    counter = {"n": 0}

    def score(v, k):
        counter["n"] += 1
        return v.shape[0] * k - counter["n"]

    hi = max(score(row, k) for k, row in enumerate(x))
    lo = min(score(row, k) for k, row in enumerate(x))
    return x * hi + lo, counter["n"]


@case(t(3, 4), gap="sum() of a generator changing a tensor in place runs the frame eagerly "
                  "(TorchDynamo interleaves the additions with the generator)")
def sum_of_generator_changing_a_tensor_in_place(x):
    acc = torch.zeros(4)
    return sum(acc.add_(row) for row in x)


@case(t(3, 4))
def generator_changing_only_tensors_it_made_in_place(x):
    # Each item is a new tensor changed in place before it is yielded: nothing older is
    # touched, so zip() may run the generator ahead of the loop.
    def scaled(rows):
        for row in rows:
            out = row * 2
            out.clamp_(min=0)
            yield out

    total = torch.zeros(4)
    for i, r in zip(range(3), scaled(x)):
        total = total + r * (i + 1)
    return total


@case(t(3, 4))
def generator_changing_a_view_of_an_older_tensor(x):
    # The view is made inside the generator, the storage it changes is older: the loop
    # must see each change in Python's order.
    acc = torch.zeros(2, 4)

    def steps(rows):
        for row in rows:
            acc.view(-1)[:4].add_(row)
            yield acc.sum()

    out = []
    for k, s in zip(range(3), steps(x)):
        out.append(s * (k + 1) + acc[0, 0])
    return torch.stack(out)


# PEP 479: a StopIteration raised inside a generator's body leaves it as a RuntimeError
# caused by it (the compiled frame took the `except StopIteration` branch instead).
@case(T34)
def stop_iteration_raised_in_a_generator_is_a_runtime_error(x):
    def gen():
        yield 1
        raise StopIteration("done")
    g = gen()
    try:
        next(g)
        next(g)
    except RuntimeError as e:
        return x + 100, str(e), type(e.__cause__).__name__
    except StopIteration:
        return x + 200
@case(T34)
def next_of_an_empty_iterator_inside_a_generator_consumed_by_list(x):
    def gen():
        yield x
        next(iter([]))
    try:
        return list(gen())
    except RuntimeError as e:
        return x + 1, str(e)
@case(T34)
def next_of_an_empty_iterator_inside_a_generator_expression(x):
    it = iter([1])
    try:
        return list(next(it) for _ in range(2)), x
    except RuntimeError as e:
        return x + 7, str(e)
@case(T34)
def next_of_an_empty_iterator_inside_a_list_comprehension_stays_stop_iteration(x):
    it = iter([1])
    try:
        return [next(it) for _ in range(2)], x
    except StopIteration:
        return x + 5



# A generator checked for its type by the function it is handed to (`clip_grad_norm_` asks
# `isinstance(parameters, types.GeneratorType)`), in a frame split by a graph break after it:
# the trace that stops at the break runs the generator ahead, and it is still a generator.
def _norm_of(params):
    import types
    is_generator = isinstance(params, types.GeneratorType)
    return sum(p.abs().sum() for p in list(params)), is_generator
def _rows(x):
    for row in x:
        yield row
@case(T34)
def generator_type_checked_before_a_break(x):
    total, was_generator = _norm_of(_rows(x))
    print("", end="")
    return total + was_generator
@case(T34)
def clip_grad_norm_of_parameters_before_a_break(x):
    lin = torch.nn.Linear(4, 2)
    lin.weight.grad = torch.ones_like(lin.weight)
    norm = torch.nn.utils.clip_grad_norm_(lin.parameters(), 0.5)
    print("", end="")
    return x.sum() + norm

@pytest.fixture(autouse=True)
def fresh_caches():
    reset_all()
    yield


def test_enough_cases() -> None:
    assert len(CASES) >= 20, len(CASES)



# --- exceptions thrown into generators: gen.throw and contextmanager's __exit__ -------------
@contextlib.contextmanager
def _catching(seen):
    try:
        yield
    except ValueError as e:
        seen.append(str(e))


@contextlib.contextmanager
def _cleaning(seen):
    try:
        yield
    finally:
        seen.append("cleaned")


@case(t(3, 4), list)
def contextmanager_catches_the_blocks_exception(x, seen):
    with _catching(seen):
        y = x + 1
        raise ValueError("inside")
    return x * 2, seen


@case(t(3, 4), list)
def contextmanager_cleans_up_and_an_outer_try_catches(x, seen):
    try:
        with _cleaning(seen):
            raise KeyError("k")
    except KeyError:
        x = x - 1
    return x, seen


@case(t(3, 4))
def suppress_around_a_raise(x):
    with contextlib.suppress(IndexError):
        x = x * 3
        raise IndexError("i")
    return x + 1


class _Swallow:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, LookupError)


@case(t(3, 4))
def user_context_manager_swallows(x):
    with _Swallow():
        x = x + 2
        raise KeyError("k")
    return x * 2


def _answers():
    try:
        yield 1
    except KeyError:
        yield 10
    yield 100


@case(t(3, 4))
def throw_caught_by_the_generator(x):
    it = _answers()
    first = next(it)
    second = it.throw(KeyError("k"))
    third = next(it)
    return x * (first + second + third)


@case(t(3, 4))
def throw_not_caught_reaches_the_consumer(x):
    it = _answers()
    next(it)
    try:
        it.throw(ValueError("v"))
    except ValueError:
        x = x + 7
    return x, list(it)


@case(t(3, 4))
def throw_into_a_generator_not_started(x):
    it = _answers()
    try:
        it.throw(KeyError("k"))
    except KeyError as e:
        x = x * 2 + len(e.args)
    return x, list(it)

@pytest.mark.parametrize(("name", "fn", "make", "spec"), params(CASES))
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)
