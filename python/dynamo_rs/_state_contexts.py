"""Context managers that switch a piece of torch's global state for the code inside them —
`torch.autocast`, `torch.inference_mode`, `torch.nn.attention.sdpa_kernel` — as graphs and
generated code use them (see the translator's `ops_state_context`).

Inside a graph a block is a pair of nodes, `enter(*values)` and `exit(<what enter returned>)`.
At a graph break inside a block the graph has left it, and the code after the graph enters a
real one again (`enter`) before the instruction that broke; then leaves it and hands the resume
function a new, not entered context (`handoff`), which the resume function enters itself where
the block's own `__exit__` was. Each kind is named by a string: the values are constants."""

from __future__ import annotations

import torch


def enter_sdpa_kernel(names, set_priority):
    """The graph node entering `sdpa_kernel`: enables the backends named, returns what
    `exit_sdpa_kernel` needs to put the previous ones back (read when the graph runs, not
    when it was traced, so a change of the global flags between calls is undone right)."""
    from torch.nn import attention

    previous = attention._cur_sdpa_kernel_backends(with_priority=set_priority)
    attention._sdpa_kernel([getattr(attention.SDPBackend, n) for n in names], set_priority)
    return previous, set_priority


def exit_sdpa_kernel(token):
    from torch.nn import attention

    previous, set_priority = token
    attention._sdpa_kernel(previous, set_priority)


class StateContext:
    """A context of one of these kinds with its values, handed to a resume function: the
    resume function's trace recognises it by its type (and guards `kind` and `values`)."""

    __slots__ = ("kind", "values", "_exit")

    def __init__(self, kind, values):
        self.kind = kind
        self.values = tuple(values)
        self._exit = None

    def __enter__(self):
        self._exit = enter(self.kind, *self.values)

    def __exit__(self, exc_type, exc_value, traceback):
        exit_fn, self._exit = self._exit, None
        return exit_fn(exc_type, exc_value, traceback)

    def __repr__(self):
        return f"StateContext({self.kind!r}, {self.values!r})"


def _real(kind, *values):
    """The context the traced code made (not entered)."""
    if kind == "autocast":
        device_type, dtype, enabled, cache_enabled = values
        return torch.amp.autocast(device_type, dtype=dtype, enabled=enabled,
                                  cache_enabled=cache_enabled)
    if kind == "inference_mode":
        return torch.inference_mode(*values)
    if kind == "sdpa_kernel":
        from torch.nn import attention

        names, set_priority = values
        return attention.sdpa_kernel([getattr(attention.SDPBackend, n) for n in names],
                                     set_priority)
    raise ValueError(f"dynamo_rs: unknown state context {kind!r}")


def make(kind, *values):
    """A context of `kind` as the traced code made it (not entered): a real `torch.autocast`
    (which the trace also takes from the user), else a `StateContext`."""
    if kind == "autocast":
        return _real(kind, *values)
    return StateContext(kind, values)


def enter(kind, *values):
    """Enters such a context; returns its bound `__exit__`."""
    context = _real(kind, *values)
    context.__enter__()
    return context.__exit__


def handoff(kind, *args):
    """`handoff(kind, *values, grad_outside, exit_fn)`: leaves the context `exit_fn` belongs
    to (entered by `enter` for the instruction that broke the graph), puts grad mode back to
    what it is outside the block when leaving changed it (`inference_mode` restores the grad
    mode it found, which the code after the graph had already set for the instruction), and
    returns a new context for the resume function to enter."""
    *values, grad_outside, exit_fn = args
    exit_fn(None, None, None)
    if grad_outside is not None:
        torch._C._set_grad_enabled(grad_outside)
    return make(kind, *values)
