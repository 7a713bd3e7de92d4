//! What the rest of the crate needs to know about an opcode: its operand kind, inline caches,
//! jump direction, and how it moves control. The numbers come from the generated per-version
//! table (`py311::table`); the control-flow classes below are CPython semantics that its
//! `opcode` module does not list, so they are stated here once.

pub use crate::py311::table::Opcode;
use crate::py311::table::{INFO, RAW};

/// How an instruction's argument is interpreted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandKind {
    /// The opcode takes no argument (below `HAVE_ARGUMENT`).
    None,
    /// A plain integer: a count, flags, a `BINARY_OP` kind, a `RESUME` kind.
    Int,
    /// An index into `co_consts`.
    Const,
    /// An index into `co_names` (for `LOAD_GLOBAL` and `LOAD_ATTR` shifted and flagged).
    Name,
    /// An index into the fast locals (`co_varnames`).
    Local,
    /// An index into "localsplus" naming a cell or free variable.
    Cell,
    /// An index into `dis.cmp_op`.
    Compare,
    /// A relative jump; decoded into an instruction index.
    Jump,
}

/// Which way a raw jump opcode counts its offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    None,
    Forward,
    Backward,
}

/// Facts about one raw opcode byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawOpInfo {
    /// CPython's own name for this byte (`POP_JUMP_BACKWARD_IF_TRUE`).
    pub name: &'static str,
    /// The direction-free opcode it decodes to.
    pub opcode: Opcode,
    /// Number of inline `CACHE` code units that follow the instruction.
    pub caches: u8,
    pub operand: OperandKind,
    pub direction: Direction,
}

/// The raw opcode byte `EXTENDED_ARG`, which only ever appears as a prefix in encoded code.
pub const EXTENDED_ARG: u8 = 144;
/// The raw opcode byte `CACHE`, which fills inline cache entries.
pub const CACHE: u8 = 0;
/// Opcodes at or above this byte take an argument.
pub const HAVE_ARGUMENT: u8 = 90;

/// Facts about a raw opcode byte, or `None` if the byte is not a 3.11 opcode.
pub fn raw_info(byte: u8) -> Option<&'static RawOpInfo> {
    RAW[byte as usize].as_ref()
}

impl Opcode {
    /// Facts shared by every raw encoding of this opcode (caches and operand kind do not
    /// depend on direction).
    pub fn info(self) -> &'static RawOpInfo {
        &INFO[self as usize]
    }

    pub fn operand_kind(self) -> OperandKind {
        self.info().operand
    }

    pub fn caches(self) -> u8 {
        self.info().caches
    }

    /// Looks an opcode up by its direction-free name (`POP_JUMP_IF_TRUE`) or by any of
    /// CPython's raw names (`POP_JUMP_BACKWARD_IF_TRUE`).
    pub fn from_name(name: &str) -> Option<Opcode> {
        if let Some(op) = Opcode::ALL.iter().find(|op| op.name() == name) {
            return Some(*op);
        }
        RAW.iter()
            .flatten()
            .find(|info| info.name == name)
            .map(|info| info.opcode)
    }

    pub fn is_jump(self) -> bool {
        self.operand_kind() == OperandKind::Jump
    }

    /// A jump that never falls through.
    pub fn is_unconditional_jump(self) -> bool {
        matches!(self, Opcode::Jump | Opcode::JumpNoInterrupt)
    }

    /// An instruction after which control never reaches the next instruction.
    pub fn ends_flow(self) -> bool {
        self.is_unconditional_jump()
            || matches!(
                self,
                Opcode::ReturnValue | Opcode::RaiseVarargs | Opcode::Reraise
            )
    }
}
