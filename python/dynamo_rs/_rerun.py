"""Running a compiled frame's own code again, eagerly, when its graph raised.

A graph may hold operations from inside the frame's `try` blocks (or from functions called
there). Its graph runs first, before anything else the frame does (stores and other effects
are replayed after it), and changes nothing a second run would see (no in-place operation or
running statistic: the translator keeps such graphs apart) — except random numbers drawn
from the default generators (dropout in training), whose state is taken before the graph
runs and put back before the rerun. So when it raises, running the original code from the
start with the same arguments is exactly what eager would have done — and the exception
meets the `except` clauses it would have met.
"""

from __future__ import annotations

import inspect
import sys
import types

import torch

from dynamo_rs import _native


def random_state():
    """The state of the default random generators a graph may draw from (CPU, and CUDA's
    when CUDA is in use), taken before a graph that draws random numbers runs."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _restore_random_state(state) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def rerun_eagerly(error: BaseException, code: types.CodeType, grad_mode: bool,
                  parameters: tuple, closure: tuple, random=None):
    """Called by the generated code's handler around the graph call: `parameters` are the
    frame's parameter values in `co_varnames` order, `closure` its free variables' cells,
    `random` the generators' state before the graph ran when it draws random numbers."""
    if not isinstance(error, Exception):
        raise error  # KeyboardInterrupt, SystemExit: not something a rerun should hide
    if random is not None:
        _restore_random_state(random)
    frame_globals = sys._getframe(1).f_globals
    function = types.FunctionType(code, frame_globals, code.co_name, None, closure or None)
    function.__qualname__ = code.co_qualname
    positional = code.co_argcount
    keyword_only = code.co_kwonlyargcount
    args = list(parameters[:positional])
    kwargs = dict(zip(code.co_varnames[positional:positional + keyword_only],
                      parameters[positional:positional + keyword_only]))
    index = positional + keyword_only
    if code.co_flags & inspect.CO_VARARGS:
        args.extend(parameters[index])
        index += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(parameters[index])
    torch._C._set_grad_enabled(grad_mode)
    return _native.DisabledFunction(function)(*args, **kwargs)
