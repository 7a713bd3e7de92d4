//! The parts of capture that need no Python, tested by `cargo test`: the table of
//! graph-break kinds ([`break_reasons`]), which the translator cites whenever it gives up
//! and `docs/graph-breaks.md` is generated from, and the symbolic-shape guard expressions
//! ([`shape_expr`]) the native guard evaluates on every call, and fingerprints of installed
//! file trees ([`file_tree`]) that remembered Inductor keys are filed under.

pub mod break_reasons;
pub mod file_tree;
pub mod shape_expr;
