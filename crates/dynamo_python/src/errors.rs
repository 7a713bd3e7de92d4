//! Python exception types of dynamo_rs and the one place Rust errors turn into them.

use dynamo_bytecode::BytecodeError as RustBytecodeError;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

create_exception!(
    dynamo_rs,
    BytecodeError,
    PyValueError,
    "Bytecode that cannot be decoded or assembled; the message says what and where."
);

pub fn bytecode_error(err: RustBytecodeError) -> PyErr {
    BytecodeError::new_err(err.to_string())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("BytecodeError", m.py().get_type::<BytecodeError>())
}
