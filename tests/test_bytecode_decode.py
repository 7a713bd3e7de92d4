"""decode() agrees with the standard `dis` module on every instruction: name, argument,
meaning of the argument, offset, source positions and jump targets."""

from __future__ import annotations

import dis

from corpus import code_objects, stdlib_files
from dynamo_rs import bytecode


def dis_view(code):
    """dis's instructions without CACHE and EXTENDED_ARG, keyed like ours."""
    out = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("EXTENDED_ARG", "CACHE"):
            continue
        out.append(ins)
    return out


def test_decode_agrees_with_dis_on_stdlib_sample() -> None:
    files = stdlib_files()[::7]
    checked = 0
    for path, code in code_objects(files):
        ours = bytecode.decode(code)
        theirs = dis_view(code)
        assert len(ours) == len(theirs), f"{path}:{code.co_firstlineno}"
        offset_to_index = {ins.offset: i for i, ins in enumerate(theirs)}
        for mine, ref in zip(ours, theirs):
            where = f"{path}:{code.co_firstlineno} {code.co_name} @{ref.offset}"
            assert mine.opname == ref.opname, where
            assert mine.offset == ref.offset, where
            assert mine.arg == ref.arg, where
            assert tuple(mine.positions) == tuple(ref.positions), where
            if ref.opcode in dis.hasjrel:
                # dis points at the real opcode; a target with EXTENDED_ARG starts earlier.
                target = ours[mine.target]
                assert target.offset >= ref.argval, where
                assert offset_to_index[target.offset] == mine.target, where
            elif ref.opname == "KW_NAMES":
                # dis 3.11 shows <unknown> here; the argument is a co_consts index.
                assert mine.argval == code.co_consts[ref.arg], where
            else:
                assert mine.argval == ref.argval or mine.argval is ref.argval, where
            checked += 1
    assert checked > 100_000 // 7


def test_exception_handlers_match_dis_table() -> None:
    def f(x):
        try:
            return 1 / x
        except ZeroDivisionError:
            return None
        finally:
            x = 0

    ins = bytecode.decode(f.__code__)
    covered = [i for i in ins if i.exc_handler is not None]
    assert covered, "a try block must cover some instructions"
    targets = {ins[h[0]].offset for h in (i.exc_handler for i in covered)}
    assert all(ins[i].opname == "PUSH_EXC_INFO" or ins[i].opname == "COPY" for i in
               {i.exc_handler[0] for i in covered})
    assert targets


def test_load_global_and_compare_argvals() -> None:
    def f(a):
        return len(a) < 3

    by_name = {i.opname: i for i in bytecode.decode(f.__code__)}
    assert by_name["LOAD_GLOBAL"].argval == "len"
    assert by_name["COMPARE_OP"].argval == "<"
