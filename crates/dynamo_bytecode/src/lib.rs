//! CPython 3.11 bytecode as plain Rust data, with no dependency on Python.
//!
//! What it does: decode a code object's raw tables (`co_code`, `co_exceptiontable`,
//! `co_linetable`) into [`Instruction`]s with typed operands, and assemble instructions back
//! into tables that CPython accepts — byte for byte the same tables for unedited code. On top
//! of the instruction list: basic blocks ([`cfg`]), stack depths ([`stack_depth`]) and liveness
//! of locals ([`liveness`]).
//!
//! What it does not: touch Python objects. Constants, names and the code object itself are
//! handled by the extension crate (`dynamo_python`); here they are indices.
//!
//! Module map:
//! - [`opcode`]: facts about each opcode; the numbers are generated into `py311::table`.
//! - [`instruction`]: `Instruction`, `Operand`, `Positions`, `ExceptionHandler`.
//! - [`decode`], [`assemble`]: the two directions.
//! - [`exception_table`], [`line_table`]: the two side tables' encodings.
//! - [`stack_depth`], [`cfg`], [`liveness`]: analyses over an instruction list.
//! - [`resume`]: the code of resume functions for graph breaks.
//! - [`error`]: `BytecodeError`, the one error type; nothing here panics on bad input.

pub mod assemble;
pub mod binding;
pub mod cfg;
pub mod decode;
pub mod error;
pub mod exception_table;
pub mod instruction;
pub mod line_table;
pub mod liveness;
pub mod opcode;
pub mod py311;
pub mod resume;
pub mod stack_depth;

pub use assemble::{assemble, byte_offsets, encode, Assembled};
pub use decode::{decode, Decoded, RawCode};
pub use error::{BytecodeError, Result};
pub use instruction::{ExceptionHandler, InstrIndex, Instruction, Operand, Positions};
pub use opcode::{Opcode, OperandKind};
pub use py311::stack_effect::stack_effect;
