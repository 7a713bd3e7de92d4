"""CPython 3.11 bytecode, decoded and assembled in Rust.

    >>> from dynamo_rs import bytecode
    >>> instructions = bytecode.decode(fn.__code__)
    >>> fn.__code__ = bytecode.assemble(instructions, like=fn.__code__)

`decode` folds EXTENDED_ARG, hides CACHE entries and turns jump offsets and exception-table
ranges into indices into the returned list (`Instruction.target`, `Instruction.exc_handler`).
`assemble` chooses jump directions and EXTENDED_ARG prefixes again, regenerates caches and
rebuilds `co_exceptiontable`, `co_linetable` and `co_stacksize`; for unedited instructions
the result is byte for byte the original.
"""

from dynamo_rs._native import (
    BytecodeError,
    Instruction,
    assemble,
    basic_blocks,
    decode,
    live_locals,
    round_trip_tables,
    stack_depths,
    stack_effect,
)

__all__ = [
    "BytecodeError",
    "Instruction",
    "assemble",
    "basic_blocks",
    "decode",
    "live_locals",
    "round_trip_tables",
    "stack_depths",
    "stack_effect",
]
