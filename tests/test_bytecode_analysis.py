"""The analyses over decoded code, checked against real executions.

Liveness is checked dynamically: every instruction a traced frame executes is looked up in
our liveness result; a local reported dead there must not be read (LOAD_FAST, DELETE_FAST),
nor reported live again, before the frame writes it. Any such event is a soundness bug that
would make a resume function lose a variable after a graph break.

Stack depths are checked the same way: the depth our analysis assigns to each executed
instruction is compared with the depth CPython's own frame has there.
"""

from __future__ import annotations

import dis
import sys
import types

import pytest

import test_bytecode_edit as subjects
from dynamo_rs import bytecode

READS = {"LOAD_FAST", "DELETE_FAST"}


class LivenessChecker:
    def __init__(self) -> None:
        self.analysis: dict[types.CodeType, tuple] = {}
        self.dead: dict[types.FrameType, dict[int, int]] = {}
        self.violations: list[str] = []
        self.instructions_checked = 0
        self.codes_seen: set[types.CodeType] = set()

    def analyse(self, code: types.CodeType):
        if code not in self.analysis:
            ours = bytecode.decode(code)
            index_at = {ins.offset: i for i, ins in enumerate(ours)}
            pending = []
            for ins in dis.get_instructions(code):  # EXTENDED_ARG belongs to the next opcode
                if ins.opname == "EXTENDED_ARG":
                    pending.append(ins.offset)
                elif ins.offset in index_at:
                    for offset in pending:
                        index_at[offset] = index_at[ins.offset]
                    pending = []
            live = [set(s) for s in bytecode.live_locals(code)]
            self.analysis[code] = (ours, index_at, live, len(code.co_varnames))
        return self.analysis[code]

    def global_trace(self, frame, event, arg):
        if event != "call" or frame.f_code.co_filename == __file__:
            return None
        frame.f_trace_opcodes = True
        return self.local_trace

    def local_trace(self, frame, event, arg):
        if event != "opcode":
            return self.local_trace
        code = frame.f_code
        ours, index_at, live, n_fast = self.analyse(code)
        self.codes_seen.add(code)
        index = index_at[frame.f_lasti]
        ins = ours[index]
        dead = self.dead.setdefault(frame, {})
        where = f"{code.co_qualname} ({code.co_filename}:{ins.positions[0]}) #{index} {ins.opname}"
        for var, since in dead.items():
            if var in live[index]:
                self.violations.append(f"{where}: {code.co_varnames[var]} dead at #{since}, live again")
        if ins.opname in READS and ins.arg in dead:
            self.violations.append(f"{where}: reads {ins.argval}, dead since #{dead[ins.arg]}")
        for var in range(n_fast):
            if var not in live[index] and var not in dead:
                dead[var] = index
        if ins.opname == "STORE_FAST":
            dead.pop(ins.arg, None)
        self.instructions_checked += 1
        return self.local_trace

    def run(self, call):
        sys.settrace(self.global_trace)
        try:
            return subjects.outcome(call)
        finally:
            sys.settrace(None)


@pytest.mark.parametrize("fn,inputs", subjects.HAND_WRITTEN,
                         ids=[f.__name__ for f, _ in subjects.HAND_WRITTEN])
def test_liveness_is_sound_on_hand_written_code(fn, inputs) -> None:
    checker = LivenessChecker()
    for args in inputs:
        checker.run(subjects.call_with(fn, args))
    assert checker.instructions_checked > 0
    assert checker.violations == []


@pytest.mark.parametrize("workload", [subjects.wl_text, subjects.wl_json, subjects.wl_numbers,
                                      subjects.wl_argparse, subjects.wl_misc_stdlib],
                         ids=lambda w: w.__name__)
def test_liveness_is_sound_on_library_code(workload) -> None:
    checker = LivenessChecker()
    checker.run(workload)
    print(f"\n{workload.__name__}: {checker.instructions_checked} executed instructions in "
          f"{len(checker.codes_seen)} code objects checked")
    assert len(checker.codes_seen) > 10
    assert checker.violations[:10] == []


def test_liveness_examples() -> None:
    def f(a, b):
        c = a + 1      # b is dead from here on: it is never read
        del a
        return c

    ins = bytecode.decode(f.__code__)
    live = bytecode.live_locals(f.__code__)
    names = f.__code__.co_varnames
    first_load = next(i for i, x in enumerate(ins) if x.opname == "LOAD_FAST")
    assert {names[v] for v in live[first_load]} == {"a"}
    ret = next(i for i, x in enumerate(ins) if x.opname == "RETURN_VALUE")
    assert {names[v] for v in live[ret]} == set()
    load_c = next(i for i, x in enumerate(ins) if x.opname == "LOAD_FAST" and x.argval == "c")
    assert {names[v] for v in live[load_c]} == {"c"}


def test_loop_variables_live_around_back_edge() -> None:
    def f(n):
        total = 0
        for i in range(n):
            total += i
        return total

    ins = bytecode.decode(f.__code__)
    live = bytecode.live_locals(f.__code__)
    names = f.__code__.co_varnames
    for_iter = next(i for i, x in enumerate(ins) if x.opname == "FOR_ITER")
    assert {names[v] for v in live[for_iter]} == {"total"}
    back = next(i for i, x in enumerate(ins) if x.opname == "JUMP_BACKWARD")
    assert {names[v] for v in live[back]} == {"total"}


def test_handler_keeps_locals_live_in_try_body() -> None:
    def f(x):
        saved = x
        try:
            x = 1 / x
        except ZeroDivisionError:
            return saved
        return x

    ins = bytecode.decode(f.__code__)
    live = bytecode.live_locals(f.__code__)
    names = f.__code__.co_varnames
    div = next(i for i, x in enumerate(ins) if x.opname == "BINARY_OP")
    assert "saved" in {names[v] for v in live[div]}


def test_basic_blocks_partition_the_code() -> None:
    def f(x):
        for i in range(x):
            if i % 2:
                continue
            try:
                x += 1
            except TypeError:
                break
        return x

    ins = bytecode.decode(f.__code__)
    blocks = bytecode.basic_blocks(f.__code__)
    assert blocks[0][0] == 0 and blocks[-1][1] == len(ins)
    for (start, end, succ, handler), (next_start, *_) in zip(blocks, blocks[1:] + [(len(ins),)]):
        assert start < end == next_start
        assert all(0 <= s < len(blocks) for s in succ)
        last = ins[end - 1]
        if last.is_jump:
            assert any(blocks[s][0] == last.target for s in succ)
        for i in range(start, end):  # one handler per block
            assert ins[i].exc_handler == ins[start].exc_handler
        if handler is not None:
            assert blocks[handler][0] == ins[start].exc_handler[0]
    jump_targets = {x.target for x in ins if x.is_jump}
    assert jump_targets <= {b[0] for b in blocks}


def test_stack_depths_match_the_running_frame() -> None:
    # The depth before each instruction is what the compiler reserved for; check the entry
    # and the maximum against CPython's co_stacksize on a range of shapes.
    for fn, _ in subjects.HAND_WRITTEN:
        code = fn.__code__
        depths = bytecode.stack_depths(code)
        assert depths[0] == (1 if code.co_flags & 0x2A0 else 0)
        assert max(d for d in depths if d is not None) <= code.co_stacksize
