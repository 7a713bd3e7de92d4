from types import CodeType
from typing import Iterable

class BytecodeError(ValueError): ...

class Instruction:
    arg: int | None
    argval: object
    offset: int | None
    positions: tuple[int | None, int | None, int | None, int | None]
    target: int | None
    exc_handler: tuple[int, int, bool] | None
    opname: str
    @property
    def opcode(self) -> int: ...
    @property
    def base_opname(self) -> str: ...
    @property
    def is_jump(self) -> bool: ...
    def __init__(
        self,
        opname: str,
        arg: int | None = None,
        *,
        target: int | None = None,
        positions: tuple[int | None, int | None, int | None, int | None] | None = None,
        exc_handler: tuple[int, int, bool] | None = None,
    ) -> None: ...

def decode(code: CodeType) -> list[Instruction]: ...
def assemble(instructions: Iterable[Instruction], like: CodeType) -> CodeType: ...
def stack_effect(opcode: int, arg: int | None = None, *, jump: bool | None = None) -> int: ...
