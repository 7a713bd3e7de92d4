"""Bad input to decode/assemble gets a typed error that says what and where; never a panic,
a crash or a silently wrong code object."""

from __future__ import annotations

import opcode
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_rs import bytecode
from dynamo_rs.bytecode import BytecodeError, Instruction

OP = opcode.opmap


def fake_code(code: bytes, exc: bytes = b"", lines: bytes = b"", consts=(None,), names=("x",),
              varnames=("a",)) -> types.SimpleNamespace:
    """An object with a code object's raw fields, so we can hand decode() any bytes."""
    return types.SimpleNamespace(co_code=code, co_exceptiontable=exc, co_linetable=lines,
                                 co_firstlineno=1, co_consts=consts, co_names=names,
                                 co_varnames=varnames)


def ok_code() -> bytes:
    return bytes([OP["RESUME"], 0, OP["LOAD_CONST"], 0, OP["RETURN_VALUE"], 0])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x97", "truncated"),                                             # odd length
        (bytes([OP["LOAD_GLOBAL"], 0, 0, 0]), "truncated"),                 # caches cut off
        (bytes([3, 0]), "unknown opcode 3 at byte offset 0"),
        (bytes([OP["EXTENDED_ARG"], 1]), "truncated"),                      # prefix at the end
        (bytes([OP["EXTENDED_ARG"], 1, OP["POP_TOP"], 0]), "EXTENDED_ARG before an opcode"),
        (bytes([OP["JUMP_FORWARD"], 9, OP["RETURN_VALUE"], 0]), "jump at byte offset 0"),
        (bytes([OP["JUMP_BACKWARD"], 9, OP["RETURN_VALUE"], 0]), "jump at byte offset 0"),
        (bytes([OP["BINARY_SUBSCR"], 0, OP["POP_TOP"], 0, 0, 0, 0, 0, 0, 0]), "inline cache"),
        (bytes([OP["EXTENDED_ARG"], 1] * 5 + [OP["LOAD_CONST"], 0]), "wider than 32 bits"),
        (bytes([OP["LOAD_CONST"], 7, OP["RETURN_VALUE"], 0]), "co_consts index 7 is out of range"),
        (bytes([OP["LOAD_FAST"], 3, OP["RETURN_VALUE"], 0]), "co_varnames index 3 is out of range"),
        (bytes([OP["LOAD_GLOBAL"], 9] + [0] * 10), "co_names index 4 is out of range"),
    ],
)
def test_corrupt_code_is_a_bytecode_error(raw: bytes, message: str) -> None:
    with pytest.raises(BytecodeError, match=message):
        bytecode.decode(fake_code(raw))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (b"\x01\x01\x01\x01", "start bit"),
        (b"\x80\x41", "ends inside"),
        (bytes([0x80 | 1, 1, 0, 0]), "boundaries"),      # range starts inside nothing useful
        (bytes([0x80, 50, 0, 0]), "boundaries"),         # range past the end
        (bytes([0x80, 1, 40, 0]), "handler"),            # handler past the end
        (bytes([0x80, 2, 2, 0, 0x80, 1, 2, 0]), "overlap"),
    ],
)
def test_bad_exception_table_is_a_bytecode_error(table: bytes, message: str) -> None:
    code = bytes([OP["NOP"], 0, OP["NOP"], 0, OP["LOAD_CONST"], 0, OP["RETURN_VALUE"], 0])
    if message == "boundaries" and table[1] == 1:
        code = bytes([OP["EXTENDED_ARG"], 1, OP["LOAD_CONST"], 0, OP["RETURN_VALUE"], 0])
    with pytest.raises(BytecodeError, match=message):
        bytecode.decode(fake_code(code, exc=table, consts=tuple(range(300))))


def test_bad_line_table_is_a_bytecode_error() -> None:
    with pytest.raises(BytecodeError, match="line table"):
        bytecode.decode(fake_code(ok_code(), lines=b"\x01"))
    with pytest.raises(BytecodeError, match="line table"):
        bytecode.decode(fake_code(ok_code(), lines=bytes([0xF0])))  # long form, no data


def test_decode_rejects_non_code() -> None:
    with pytest.raises(TypeError, match="code object"):
        bytecode.decode(42)
    with pytest.raises(TypeError, match="code object"):
        bytecode.decode(lambda: 0)


def function_code():
    def f(a):
        if a:
            return 1
        return 2

    return f.__code__


def test_assemble_rejects_bad_instructions() -> None:
    code = function_code()
    good = bytecode.decode(code)
    with pytest.raises(BytecodeError, match="past the last instruction"):
        bad = list(good)
        jump = next(i for i in bad if i.is_jump)
        jump.target = 999
        bytecode.assemble(bad, like=code)
    with pytest.raises(ValueError, match="needs a target"):
        bytecode.assemble([Instruction("JUMP_FORWARD")], like=code)
    with pytest.raises(ValueError, match="needs an arg"):
        bytecode.assemble([Instruction("LOAD_CONST"), Instruction("RETURN_VALUE")], like=code)
    with pytest.raises(BytecodeError, match="EXTENDED_ARG is added by the assembler"):
        bytecode.assemble([Instruction("EXTENDED_ARG", 1)], like=code)
    with pytest.raises(BytecodeError, match="cannot jump backward"):
        bytecode.assemble([Instruction("FOR_ITER", target=0), Instruction("RETURN_VALUE")], like=code)
    with pytest.raises(TypeError, match="not a dynamo_rs.bytecode.Instruction"):
        bytecode.assemble(["NOP"], like=code)
    with pytest.raises(ValueError, match="unknown opcode name"):
        Instruction("NOT_AN_OPCODE")


def test_assemble_rejects_inconsistent_stack() -> None:
    code = function_code()
    # RETURN_VALUE on an empty stack.
    with pytest.raises(BytecodeError, match="stack depth would be -1"):
        bytecode.assemble([Instruction("RESUME", 0), Instruction("RETURN_VALUE")], like=code)
    # Falling off the end of the code.
    with pytest.raises(BytecodeError, match="past the end"):
        bytecode.assemble([Instruction("NOP")], like=code)


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=24), st.binary(max_size=24))
def test_random_bytes_never_crash(code: bytes, exc: bytes, lines: bytes) -> None:
    try:
        bytecode.decode(fake_code(code, exc, lines, consts=(None,) * 300, names=("x",) * 300,
                                  varnames=("a",) * 300))
    except BytecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_real_code_never_crashes(data) -> None:
    code = function_code()
    raw = bytearray(code.co_code)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    fake = fake_code(bytes(raw), code.co_exceptiontable, code.co_linetable,
                     consts=code.co_consts + (None,) * 300, names=("x",) * 300,
                     varnames=("a",) * 300)
    try:
        instructions = bytecode.decode(fake)
    except BytecodeError:
        return
    try:
        bytecode.assemble(instructions, like=code)
    except (BytecodeError, ValueError):
        pass
