"""`torch.autocast` blocks made again by generated code (see the translator's
`ops_autocast`): at a graph break inside a block, the graph has left autocast, and the code
after it enters a real one again before the instruction that broke; then leaves it and hands
the resume function a new (not entered) autocast, which the resume function enters itself
where the block's own `__exit__` was."""

from __future__ import annotations

import torch


def make(device_type, dtype, enabled, cache_enabled):
    """`torch.autocast(...)` as the traced code made it (not entered)."""
    return torch.amp.autocast(device_type, dtype=dtype, enabled=enabled,
                              cache_enabled=cache_enabled)


def enter(device_type, dtype, enabled, cache_enabled):
    """Enters such an autocast; returns its bound `__exit__`."""
    mode = make(device_type, dtype, enabled, cache_enabled)
    mode.__enter__()
    return mode.__exit__


def handoff(device_type, dtype, enabled, cache_enabled, exit_fn):
    """Leaves the autocast `exit_fn` belongs to (entered by `enter` for the instruction that
    broke the graph); returns a new one for the resume function to enter."""
    exit_fn(None, None, None)
    return make(device_type, dtype, enabled, cache_enabled)
