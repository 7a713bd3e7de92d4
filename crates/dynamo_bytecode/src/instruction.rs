//! The instruction model: one `Instruction` per real opcode, with `EXTENDED_ARG` folded into
//! the argument, inline caches implied by the opcode, jump targets as instruction indices,
//! and the source position and exception handler that cover it.

use crate::opcode::{Opcode, OperandKind};

/// Index of an instruction in a decoded instruction list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstrIndex(pub u32);

impl InstrIndex {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A typed instruction argument. The variant must match the opcode's `OperandKind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    None,
    Int(u32),
    Const(u32),
    Name(u32),
    Local(u32),
    Cell(u32),
    Compare(u32),
    Jump(InstrIndex),
}

impl Operand {
    /// Wraps a raw argument in the variant the operand kind calls for. Jumps are not raw
    /// arguments; they are resolved by the decoder.
    pub fn from_raw(kind: OperandKind, arg: u32) -> Operand {
        match kind {
            OperandKind::None => Operand::None,
            OperandKind::Int => Operand::Int(arg),
            OperandKind::Const => Operand::Const(arg),
            OperandKind::Name => Operand::Name(arg),
            OperandKind::Local => Operand::Local(arg),
            OperandKind::Cell => Operand::Cell(arg),
            OperandKind::Compare => Operand::Compare(arg),
            OperandKind::Jump => Operand::Jump(InstrIndex(arg)),
        }
    }

    pub fn kind(self) -> OperandKind {
        match self {
            Operand::None => OperandKind::None,
            Operand::Int(_) => OperandKind::Int,
            Operand::Const(_) => OperandKind::Const,
            Operand::Name(_) => OperandKind::Name,
            Operand::Local(_) => OperandKind::Local,
            Operand::Cell(_) => OperandKind::Cell,
            Operand::Compare(_) => OperandKind::Compare,
            Operand::Jump(_) => OperandKind::Jump,
        }
    }

    /// The argument as encoded, for every operand but a jump.
    pub fn raw(self) -> Option<u32> {
        match self {
            Operand::None | Operand::Jump(_) => None,
            Operand::Int(v)
            | Operand::Const(v)
            | Operand::Name(v)
            | Operand::Local(v)
            | Operand::Cell(v)
            | Operand::Compare(v) => Some(v),
        }
    }

    pub fn jump_target(self) -> Option<InstrIndex> {
        match self {
            Operand::Jump(target) => Some(target),
            _ => None,
        }
    }
}

/// Source span of an instruction, as `code.co_positions()` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Positions {
    pub line: Option<i32>,
    pub end_line: Option<i32>,
    pub col: Option<u32>,
    pub end_col: Option<u32>,
}

/// Where an exception raised by an instruction goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExceptionHandler {
    pub target: InstrIndex,
    /// Stack depth to unwind to before pushing the exception.
    pub depth: u32,
    /// Whether the offset of the raising instruction is pushed too.
    pub lasti: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Instruction {
    pub opcode: Opcode,
    pub operand: Operand,
    pub positions: Positions,
    pub handler: Option<ExceptionHandler>,
}

impl Instruction {
    pub fn new(opcode: Opcode, operand: Operand) -> Instruction {
        Instruction {
            opcode,
            operand,
            positions: Positions::default(),
            handler: None,
        }
    }

    pub fn jump_target(&self) -> Option<InstrIndex> {
        self.operand.jump_target()
    }

    /// The argument that `stack_effect` and the encoder see (0 for jumps and no-arg opcodes;
    /// no 3.11 jump's stack effect depends on its argument).
    pub fn effect_arg(&self) -> u32 {
        self.operand.raw().unwrap_or(0)
    }
}
