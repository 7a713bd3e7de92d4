"""assemble(decode(code)) reproduces co_code, co_exceptiontable, co_linetable and co_stacksize
exactly, for every code object of the standard library and of torch."""

from __future__ import annotations

import pytest

from corpus import code_objects, stdlib_files, torch_files
from dynamo_rs import bytecode

FIELDS = ("co_code", "co_exceptiontable", "co_linetable", "co_stacksize")


def round_trip_corpus(files: list[str]) -> tuple[int, int, list[str]]:
    count = 0
    mismatches: list[str] = []
    for path, code in code_objects(files):
        count += 1
        try:
            rebuilt = bytecode.assemble(bytecode.decode(code), like=code)
        except bytecode.BytecodeError as err:
            mismatches.append(f"{path}:{code.co_firstlineno} {code.co_name}: {err}")
            continue
        for field in FIELDS:
            if getattr(rebuilt, field) != getattr(code, field):
                mismatches.append(f"{path}:{code.co_firstlineno} {code.co_name}: {field} differs")
    return len(files), count, mismatches


@pytest.mark.parametrize("corpus", ["stdlib", "torch"])
def test_round_trip_is_exact(corpus: str) -> None:
    files = stdlib_files() if corpus == "stdlib" else torch_files()
    n_files, n_code, mismatches = round_trip_corpus(files)
    print(f"\n{corpus}: {n_files} files, {n_code} code objects, {len(mismatches)} mismatches")
    # The corpus must be the real thing, not an accidentally empty walk: CPython 3.11.7's
    # stdlib has about 78,000 code objects and torch 2.15 about 77,000.
    assert n_code > 70_000
    assert mismatches == [], "\n".join(mismatches[:20])


def test_rebuilt_code_equals_original() -> None:
    # Code objects compare by value, including names, constants and flags.
    for _, code in code_objects(stdlib_files()[:50]):
        assert bytecode.assemble(bytecode.decode(code), like=code) == code
