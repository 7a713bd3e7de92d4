//! CPython 3.11: the generated opcode table and the stack effects of each opcode.
//! A later version gets a sibling module; nothing above the decoder depends on which.

#[rustfmt::skip]
pub mod table;
pub mod stack_effect;
