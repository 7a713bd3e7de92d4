//! `dynamo_rs._native`: the only crate that knows about Python. Everything here is a thin
//! binding over the pure-Rust crates; errors from them become Python exceptions in
//! [`errors`].
//!
//! Module map:
//! - [`api::bytecode`]: `decode`, `assemble`, `stack_effect` and the `Instruction` class.
//! - [`api::shapes`]: result sizes and strides of common operations, for `_meta_rules`.
//! - [`api::files`]: fingerprints of installed file trees, for `_inductor_keys`.
//! - [`errors`]: Python exception types and the conversion from Rust errors.
//! - [`eval_frame`]: the PEP 523 frame hook and the per-code cache of transformed code.
//! - [`capture`]: symbolic execution of a frame into an FX graph, its guard and new code.

use pyo3::prelude::*;

pub mod api;
pub mod capture;
pub mod errors;
pub mod eval_frame;
pub mod imports;
pub mod torch_state;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    api::bytecode::register(m)?;
    api::shapes::register(m)?;
    api::files::register(m)?;
    errors::register(m)?;
    eval_frame::register(m)?;
    capture::register(m)?;
    Ok(())
}
