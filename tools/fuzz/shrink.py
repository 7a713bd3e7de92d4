"""Shrinks a program that shows a mismatch to a small one that still does, and saves it as a
regression case under tests/fuzz_cases/ (run by tests/test_fuzz_cases.py)."""

from __future__ import annotations

import copy
import os
import re
from typing import Callable

from fuzz.grammar import Program, Stmt

PARAMETERS = ("t0", "t1", "n0", "l0", "d0", "p0")


def _statement_lists(body: list[Stmt]):
    """Every statement list in the body (the body itself and each block's), outermost first."""
    yield body
    for stmt in body:
        for _, block in stmt.blocks:
            yield from _statement_lists(block)


def _bound_names(program: Program) -> set[str]:
    text = "\n".join(line for stmt in program.body for line in stmt.render(""))
    return set(re.findall(r"^\s*(?:def\s+)?([A-Za-z_]\w*)\s*(?:=|\()", text, re.M))


def _without_dangling_returns(program: Program) -> Program:
    bound = _bound_names(program)
    program.returns = [n for n in program.returns if n in PARAMETERS or n in bound] or ["t0"]
    return program


def shrink(program: Program, fails: Callable[[Program], bool], budget: int = 400) -> Program:
    """Greedily drops mutations, statements (at any depth) and returned names while `fails`
    still holds; at most `budget` runs."""
    def still_fails(candidate: Program) -> bool:
        try:
            return fails(candidate)
        except Exception:  # noqa: BLE001 - a candidate that no longer runs at all
            return False

    runs = 0
    changed = True
    while changed and runs < budget:
        changed = False
        for i in range(len(program.mutations) - 1, -1, -1):
            candidate = copy.deepcopy(program)
            del candidate.mutations[i]
            runs += 1
            if still_fails(candidate):
                program, changed = candidate, True
        lists = list(_statement_lists(program.body))
        for which in range(len(lists) - 1, -1, -1):
            for i in range(len(lists[which]) - 1, -1, -1):
                candidate = copy.deepcopy(program)
                target = list(_statement_lists(candidate.body))[which]
                if i >= len(target):
                    continue
                del target[i]
                candidate = _without_dangling_returns(candidate)
                runs += 1
                if still_fails(candidate):
                    program, changed = candidate, True
                    lists = list(_statement_lists(program.body))
                    if which >= len(lists):
                        break
        for i in range(len(program.returns) - 1, -1, -1):
            candidate = copy.deepcopy(program)
            del candidate.returns[i]
            if not candidate.returns:
                continue
            runs += 1
            if still_fails(candidate):
                program, changed = candidate, True
    return program


def save(program: Program, mismatch: str, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"case_{program.seed}.py")
    header = ('"""Found by `make fuzz` (seed {seed}); shrunk. Eager and compiled disagreed:\n'
              "{mismatch}\n"
              '"""\n').format(seed=program.seed, mismatch=mismatch.replace('"""', "'''"))
    with open(path, "w") as out:
        out.write(header + program.source())
    return path
