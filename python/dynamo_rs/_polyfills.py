"""Python versions of C functions that library code calls on tensors, traced in their
place (the capture cannot look inside a C function, and calling it on fake tensors would
hand back real containers the trace cannot follow), and of a few Python functions written
in a way the trace does not follow. Each behaves as the original does on the inputs library
code gives it; `POLYFILLS` maps the original to its Python version."""

from __future__ import annotations

import itertools

import torch
import torch.autograd.forward_ad
import torch.utils._pytree as pytree


def group_tensors_by_device_and_dtype(tensorlistlist, with_indices=False):
    """`torch._C._group_tensors_by_device_and_dtype`: the tensors at each position of the
    lists, grouped by the device and dtype of the first list's tensor there. Groups are in
    the order their first position appears (the C function's order is its hash map's; the
    callers in torch only combine groups order-independently)."""
    groups: dict = {}
    lists = len(tensorlistlist)
    for position, first in enumerate(tensorlistlist[0] if lists else ()):
        if first is None:
            raise RuntimeError(
                "Tensors of the first list of nested Tensor lists are supposed to be defined "
                f"but the {position}-th Tensor is not.")
        key = (first.device, first.dtype)
        if key not in groups:
            groups[key] = ([[] for _ in range(lists)], [])
        grouped, positions = groups[key]
        for i in range(lists):
            grouped[i].append(tensorlistlist[i][position])
        if with_indices:
            positions.append(position)
    return groups


def cycle(iterable):
    """`itertools.cycle`: the items of `iterable` as it is consumed, then the saved ones
    over and over. A generator, so the trace runs it only as far as its consumer asks (it
    never ends)."""
    saved = []
    for element in iterable:
        yield element
        saved.append(element)
    while saved:
        yield from saved


def tree_map_(func, tree, *rests, is_leaf=None):
    """`torch.utils._pytree.tree_map_`: `func` called on the leaves in order for its effects.
    torch consumes a lazy `map` with `deque(..., maxlen=0)`, which the trace makes eagerly
    and so refuses for a function with effects; a loop calls it in the same order."""
    leaves, treespec = pytree.tree_flatten(tree, is_leaf=is_leaf)
    flat_args = [leaves] + [treespec.flatten_up_to(r) for r in rests]
    for args in zip(*flat_args):
        func(*args)
    return tree


def tree_map(func, tree, *rests, is_leaf=None):
    """`torch.utils._pytree.tree_map`: torch unflattens a lazy `map`, which the trace makes
    eagerly and so refuses for a function with effects (`jvp` unpacking its duals); a list
    made in order calls it as torch's does."""
    leaves, treespec = pytree.tree_flatten(tree, is_leaf=is_leaf)
    flat_args = [leaves] + [treespec.flatten_up_to(r) for r in rests]
    return treespec.unflatten([func(*args) for args in zip(*flat_args)])


class _SetFwdGradEnabled:
    """`torch.autograd.forward_ad._set_fwd_grad_enabled` (`jvp`'s switch of forward-mode AD),
    as torch's: switched when made, put back on leaving; a plain class the trace follows
    (torch's derives from a decorator helper the trace does not make)."""

    def __init__(self, mode):
        self.prev = torch._C._is_fwd_grad_enabled()
        torch._C._set_fwd_grad_enabled(mode)

    def __enter__(self):
        pass

    def __exit__(self, exc_type, exc_value, traceback):
        torch._C._set_fwd_grad_enabled(self.prev)


def set_fwd_grad_enabled(mode):
    return _SetFwdGradEnabled(mode)


class _DualLevel:
    """`torch.autograd.forward_ad.dual_level`, as torch's: a forward-AD level entered and
    left around the block."""

    def __enter__(self):
        return torch.autograd.forward_ad.enter_dual_level()

    def __exit__(self, exc_type, exc_value, traceback):
        torch.autograd.forward_ad.exit_dual_level()


def dual_level():
    return _DualLevel()


def _pure_python_heapq():
    """`heapq` as its Python source defines it: the module replaces its functions with C
    ones from `_heapq` when that imports, which is kept from importing here."""
    import heapq
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("dynamo_rs._heapq_in_python", heapq.__file__)
    module = importlib.util.module_from_spec(spec)
    had, accelerator = "_heapq" in sys.modules, sys.modules.get("_heapq")
    sys.modules["_heapq"] = None  # `from _heapq import *` raises ImportError
    try:
        spec.loader.exec_module(module)
    finally:
        if had:
            sys.modules["_heapq"] = accelerator
        else:
            del sys.modules["_heapq"]
    return heapq, module


def _heapq_polyfills():
    heapq, in_python = _pure_python_heapq()
    names = ("heappush", "heappop", "heapify", "heapreplace", "heappushpop", "_heapify_max",
             "_heappop_max", "_heapreplace_max")
    return {getattr(heapq, n): getattr(in_python, n) for n in names
            if hasattr(heapq, n) and hasattr(in_python, n)
            and getattr(heapq, n) is not getattr(in_python, n)}


POLYFILLS = {
    torch.autograd.forward_ad.dual_level: dual_level,
    torch.autograd.forward_ad._set_fwd_grad_enabled: set_fwd_grad_enabled,
    pytree.tree_map_: tree_map_,
    pytree.tree_map: tree_map,
    torch._C._group_tensors_by_device_and_dtype: group_tensors_by_device_and_dtype,
    itertools.cycle: cycle,
    **_heapq_polyfills(),
}


class ComparedWhileTracing(Exception):
    """Raised when sorting (`min`, `max`) while tracing compares an item it does not know."""


class Incomparable:
    """Stands for a tensor (or another traced value) inside a tuple sorted while tracing: the
    tuples are ordered by their known items, and Python's tuple comparison never reaches this
    one unless those are equal (each stand-in is its own object, so identity decides nothing)."""

    __slots__ = ()

    def _compared(self, other):
        raise ComparedWhileTracing

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compared
    __hash__ = None


class ResumeIterator:
    """An iterator live at a graph break (over a list, a zip, a generator run ahead), made
    again for the rest of the frame from the items it had left. Plain Python with its items
    in a tuple and its position in an int, so that a trace of the rest reads each item
    through a guarded source (`it.items[k]`) and replays the position it advanced to; a
    builtin tuple iterator could not be read without advancing it, and the rest of the frame
    ran eagerly (and compiled again on every call, guarded by the iterator's identity)."""

    def __init__(self, items):
        self.items = items
        self.pos = 0

    def __iter__(self):
        return self

    def __next__(self):
        pos = self.pos
        if pos >= len(self.items):
            raise StopIteration
        self.pos = pos + 1
        return self.items[pos]

    def __length_hint__(self):
        return max(len(self.items) - self.pos, 0)
