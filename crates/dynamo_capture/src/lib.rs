//! The parts of capture that need no Python, tested by `cargo test`: so far the table of
//! graph-break kinds ([`break_reasons`]), which the translator cites whenever it gives up
//! and `docs/graph-breaks.md` is generated from.

pub mod break_reasons;
