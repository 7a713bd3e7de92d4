//! The one error type of this crate. Every failure is a value that says what was wrong and
//! where (a byte offset into the table or code it was read from); decoding never panics.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BytecodeError {
    /// `co_code` has an odd length or ends inside an instruction or its caches.
    Truncated { offset: usize },
    /// A byte that is not a 3.11 opcode.
    UnknownOpcode { offset: usize, byte: u8 },
    /// An inline cache slot that does not hold `CACHE`.
    BadCache { offset: usize, byte: u8 },
    /// `EXTENDED_ARG` in front of an opcode that takes no argument.
    ExtendedArgWithoutArgument { offset: usize },
    /// A jump whose target is outside the code or not at an instruction boundary.
    BadJumpTarget { offset: usize, target: i64 },
    /// An exception table that cannot be read or whose ranges do not fit the code.
    BadExceptionTable { offset: usize, reason: &'static str },
    /// A line table that cannot be read.
    BadLineTable { offset: usize, reason: &'static str },
    /// An instruction that cannot be encoded (wrong operand kind, target out of range).
    BadInstruction { index: usize, reason: String },
    /// Stack analysis found a depth below zero or two paths meeting at different depths.
    BadStack { index: usize, reason: String },
}

pub type Result<T> = std::result::Result<T, BytecodeError>;

impl fmt::Display for BytecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BytecodeError::Truncated { offset } => {
                write!(f, "bytecode is truncated at byte offset {offset}")
            }
            BytecodeError::UnknownOpcode { offset, byte } => {
                write!(f, "unknown opcode {byte} at byte offset {offset}")
            }
            BytecodeError::BadCache { offset, byte } => {
                write!(
                    f,
                    "inline cache at byte offset {offset} holds opcode {byte}, not CACHE"
                )
            }
            BytecodeError::ExtendedArgWithoutArgument { offset } => write!(
                f,
                "EXTENDED_ARG before an opcode without argument at byte offset {offset}"
            ),
            BytecodeError::BadJumpTarget { offset, target } => write!(
                f,
                "jump at byte offset {offset} targets {target}, which is not an instruction"
            ),
            BytecodeError::BadExceptionTable { offset, reason } => {
                write!(f, "bad exception table at byte {offset}: {reason}")
            }
            BytecodeError::BadLineTable { offset, reason } => {
                write!(f, "bad line table at byte {offset}: {reason}")
            }
            BytecodeError::BadInstruction { index, reason } => {
                write!(f, "instruction {index}: {reason}")
            }
            BytecodeError::BadStack { index, reason } => {
                write!(f, "stack analysis at instruction {index}: {reason}")
            }
        }
    }
}

impl std::error::Error for BytecodeError {}
