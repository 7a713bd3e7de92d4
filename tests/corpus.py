"""Real code objects for bytecode tests: every `.py` file of the standard library and of the
installed torch package, compiled from source (nothing is imported or run), walked through
`co_consts` so nested functions, classes, lambdas and comprehensions are included."""

from __future__ import annotations

import os
import sys
import sysconfig
import types
import warnings
from collections.abc import Iterator


def stdlib_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    skip = {os.path.join(root, "site-packages")}
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if os.path.join(dirpath, d) not in skip)
        out.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return out


def torch_files() -> list[str]:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    root = os.path.dirname(spec.origin)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        out.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return out


def walk_code(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from walk_code(const)


def code_objects(files: list[str]) -> Iterator[tuple[str, types.CodeType]]:
    """(file, code) for every code object of every file that compiles on this interpreter."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in files:
            try:
                with open(path, "rb") as f:
                    top = compile(f.read(), path, "exec", dont_inherit=True)
            except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
                # Test fixtures with deliberately bad syntax, or Python 2 files.
                continue
            for code in walk_code(top):
                yield path, code


assert sys.version_info[:2] == (3, 11), "the bytecode corpus tests are written for CPython 3.11"
