"""Running a compiled frame's own code again, eagerly, when its graph raised.

A graph may hold operations from inside the frame's `try` blocks (or from functions called
there). Its graph runs first, before anything else the frame does (stores and other effects
are replayed after it), and changes nothing a second run would see (no in-place operation,
random number or running statistic: the translator keeps such graphs apart). So when it
raises, running the original code from the start with the same arguments is exactly what
eager would have done — and the exception meets the `except` clauses it would have met.
"""

from __future__ import annotations

import inspect
import sys
import types

import torch

from dynamo_rs import _native


def rerun_eagerly(error: BaseException, code: types.CodeType, grad_mode: bool,
                  parameters: tuple, closure: tuple):
    """Called by the generated code's handler around the graph call: `parameters` are the
    frame's parameter values in `co_varnames` order, `closure` its free variables' cells."""
    if not isinstance(error, Exception):
        raise error  # KeyboardInterrupt, SystemExit: not something a rerun should hide
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
