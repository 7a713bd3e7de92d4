"""The frame-evaluation hook, as Python sees it.

`set_eval_frame(callback)` installs `callback(frame, cache_size)` for the calling thread
(None removes it) and returns the previous one. On a cache miss the callback gets the frame
object (`types.FrameType`) and the number of cached versions of its code, runs with the hook
off, and returns None (run the original code), `SKIP` (run it and never intercept this code
again), or `(check, code)`: a new cache entry whose `code` (same arguments and free
variables as the original) runs whenever `check(f_locals)` is true (`check=None`: always).
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from dynamo_rs import _native

SKIP = _native.SKIP
set_eval_frame = _native.set_eval_frame
skip_code = _native.skip_code
reset_code = _native.reset_code
reset_all = _native.reset_all
cache_entries = _native.cache_entries
code_mode = _native.code_mode
stats = _native.stats
reset_stats = _native.reset_stats
is_enabled = _native.is_enabled

F = TypeVar("F", bound=Callable)


def disable(fn: F | None = None, recursive: bool = True, *, reason: str | None = None) -> F:
    """Runs `fn` (and, with `recursive=True`, everything it calls) without interception, as
    `torch.compiler.disable`. Usable as a decorator, with or without arguments. Called from
    compiled code, a disabled function breaks the graph. With `recursive=False` only `fn`'s
    own frames run as they are: what it calls is compiled (comprehensions included)."""
    if fn is None:
        return functools.partial(disable, recursive=recursive, reason=reason)  # type: ignore[return-value]
    if recursive:
        wrapper = _native.DisabledFunction(fn)
        functools.update_wrapper(wrapper, fn)
        return wrapper  # type: ignore[return-value]
    code = getattr(fn, "__code__", None)

    @functools.wraps(fn)
    def nonrecursive_disabled(*args, **kwargs):
        # Marked on every call: `reset()` forgets skipped codes. (This wrapper's own frame is
        # dynamo_rs's, never intercepted.)
        if code is not None:
            _native.skip_code(code)
        return fn(*args, **kwargs)

    # The marks torch's non-recursive disable leaves, which traces honour (a graph break
    # where it is called, its code skipped).
    nonrecursive_disabled._torchdynamo_disable = True  # type: ignore[attr-defined]
    nonrecursive_disabled._torchdynamo_disable_recursive = False  # type: ignore[attr-defined]
    nonrecursive_disabled._torchdynamo_disable_msg = reason  # type: ignore[attr-defined]
    nonrecursive_disabled._torchdynamo_orig_callable = fn  # type: ignore[attr-defined]
    return nonrecursive_disabled  # type: ignore[return-value]
