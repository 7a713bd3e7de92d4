"""Values made anew on every call that a graph break hands to a resume function: the bound
method of a list, dict, set, deque or OrderedDict (`outs.append(layer(x))` where `layer`
breaks — the method is on the stack) or of a constant (`print("loss {}".format(t.item()))`:
not rebuildable before, so the whole frame ran eagerly), a weak reference, a frame object. Each was guarded by
its identity, so the resume function compiled again on every call until the cache limit and
then ran eagerly. Now each is guarded by what it is (the receiver and the method's name; the
type), and the calls after the first compile nothing (no new trace at all, with or without
graph). Results are compared with eager's on every call, graph counts with TorchDynamo's
(which recompiles most of these on every call: ours must not exceed its count).

An iterator live at the break (over a list, a generator run ahead, a zip) is handed on as a
plain-Python iterator over the items it had left (`_polyfills.ResumeIterator`), which the rest
of the frame iterates in its trace: it was a tuple iterator, guarded by identity and not
iterable in a trace (the loop after the break ran eagerly).

A frame that names a weak reference keeps its locals alive across a break even when no code
reads them again (the weak reference may point to one): `ref()` returned None."""

from __future__ import annotations

import collections
import contextlib
import io
import sys
import weakref

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter

pytestmark = pytest.mark.usefixtures("reset_compilers")


class _Breaks(torch.nn.Module):
    def forward(self, x):
        print("inside")
        return x + 1


_layer = _Breaks()


def list_append(x):
    outs = []
    outs.append(_layer(x))
    outs.append(_layer(x * 2))
    return outs[0] + outs[1].sin()


def list_extend_and_insert(x):
    outs = [x]
    outs.extend([_layer(x)])
    outs.insert(0, _layer(x.cos()))
    return torch.stack(outs).sum(0)


def dict_update_and_setdefault(x):
    d = {"a": x}
    d.update(b=_layer(x))
    d.setdefault("c", _layer(x * 3))
    return d["a"] + d["b"] * d["c"]


def set_add(x):
    seen = set()
    seen.add(_layer(x).shape[0])
    return x * len(seen)


def deque_append(x):
    q = collections.deque(maxlen=2)
    q.append(_layer(x))
    q.appendleft(_layer(x - 1))
    return q[0] * q[1]


def ordered_dict_setitem_method(x):
    od = collections.OrderedDict()
    od.__setitem__("k", _layer(x))
    od.update(j=_layer(x.exp()))
    return od["k"] - od["j"]


def weak_reference_across_a_break(x):
    y = x * 2
    ref = weakref.ref(y)
    print("break")
    return ref() + 1


def frame_across_a_break(x):
    frame = sys._getframe()
    y = x.sin()
    print("break")
    return y + (frame is not None)


def format_of_an_item(x):
    # A training loop's log line: `.item()` breaks the graph inside the arguments of a
    # string's bound `format` (which ran the whole frame eagerly: not rebuildable).
    y = x * 2
    print("loss {:.3f}".format(y.sum().item()))
    return y + 1


def join_of_a_breaking_call(x):
    y = x.sin()
    text = ", ".join([str(_layer(y).shape[0]), "rows"])
    return y * len(text)


def format_method_with_keywords(x):
    y = x.exp()
    print("{name}: {value:.2f}".format(name="mean", value=y.mean().item()))
    return y - 1


def printf_style_and_f_string_of_an_item(x):
    y = x.cos()
    total = y.sum().item()
    print("total %.2f" % total, f"{total:.1f}")
    return y * 3


def iterators_live_across_a_break(x):
    # What `AveragedModel.update_parameters` does: iterators over parameters made before a
    # break, consumed by a loop after it.
    firsts = iter([x, x * 2, x * 3])
    seconds = (t + 1 for t in (x, x.cos(), x.sin()))
    print("break")
    total = x
    for a, b in zip(firsts, seconds):
        total = total + a * b
    return total


def iterator_partly_consumed_across_a_break(x):
    it = iter([x, x + 1, x + 2, x + 3])
    first = next(it)
    print("break")
    second = next(it)
    return first + second + sum(it)


CASES = [
    list_append,
    list_extend_and_insert,
    dict_update_and_setdefault,
    set_add,
    deque_append,
    ordered_dict_setitem_method,
    weak_reference_across_a_break,
    frame_across_a_break,
    iterators_live_across_a_break,
    iterator_partly_consumed_across_a_break,
    format_of_an_item,
    join_of_a_breaking_call,
    format_method_with_keywords,
    printf_style_and_f_string_of_an_item,
]

# TorchDynamo's resume function is not handed the dead `y`, which is freed: `ref()` is None.
DYNAMO_WRONG = {weak_reference_across_a_break: TypeError}
# The rest of the frame formats the `.item()` float it is handed, a new value on every call:
# the first trace of the rest formats the value it saw (guarded by it); the next, with the
# float symbolic once it changed, breaks the graph at the formatting instead (each resume
# function so made sees the float change once more), and once those are made the calls trace
# nothing more; the string made is passed on to `print` without a guard on its text.
FORMATS_A_NEW_FLOAT = {format_of_an_item, format_method_with_keywords,
                       printf_style_and_f_string_of_an_item}
# (ours, TorchDynamo's) where they differ: TorchDynamo runs the whole frame eagerly (a
# generator live at the break); we make the graph before it and the loop's after it.
OUR_GRAPHS = {iterators_live_across_a_break: (2, 0)}


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_resume_functions_compile_once(fn) -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter)
    theirs = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(fn, backend=theirs)
    traced_after_first = None
    for call in range(6):
        x = torch.randn(3, 4)
        with contextlib.redirect_stdout(io.StringIO()) as eager_out:
            expected = fn(x)
        with contextlib.redirect_stdout(io.StringIO()) as our_out:
            got = compiled(x)
        with contextlib.redirect_stdout(io.StringIO()):
            if fn in DYNAMO_WRONG:
                with pytest.raises(DYNAMO_WRONG[fn]):
                    reference(x)
            else:
                reference(x)
        torch.testing.assert_close(got, expected)
        assert our_out.getvalue() == eager_out.getvalue()
        if call == (3 if fn in FORMATS_A_NEW_FLOAT else 0):
            traced_after_first = len(compiled._dynamo_rs_converter.frames)
    assert len(compiled._dynamo_rs_converter.frames) == traced_after_first, \
        [f[0] for f in compiled._dynamo_rs_converter.frames[traced_after_first:]]
    # TorchDynamo guards these values by identity, and compiles again on every call.
    if fn in OUR_GRAPHS:
        assert (counter.frame_count, theirs.frame_count) == OUR_GRAPHS[fn]
    elif fn not in DYNAMO_WRONG:
        assert counter.frame_count <= theirs.frame_count, (counter.frame_count, theirs.frame_count)
