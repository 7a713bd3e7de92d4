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

create_exception!(
    dynamo_rs,
    CompileError,
    pyo3::exceptions::PyRuntimeError,
    "Base of the errors compilation raises to the user (with fullgraph=True); the frame hook \
     always lets these through, whatever config.suppress_errors says."
);
create_exception!(
    dynamo_rs,
    Unsupported,
    CompileError,
    "Code dynamo_rs cannot capture in one graph; the message says what and where."
);
create_exception!(
    dynamo_rs,
    BackendCompilerFailed,
    CompileError,
    "The backend raised while compiling a graph."
);

create_exception!(
    dynamo_rs,
    InternalCheckFailed,
    CompileError,
    "One of dynamo_rs's own consistency checks failed (config.guard_self_check): a bug in \
     dynamo_rs, raised so that tests see it."
);

create_exception!(
    dynamo_rs,
    ConstraintViolation,
    CompileError,
    "A dimension marked dynamic (`mark_dynamic`) that the code specialises, or whose size is \
     outside the range it was marked with; the message names the dimension and the line."
);

pub fn bytecode_error(err: RustBytecodeError) -> PyErr {
    BytecodeError::new_err(err.to_string())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("BytecodeError", m.py().get_type::<BytecodeError>())?;
    m.add("CompileError", m.py().get_type::<CompileError>())?;
    m.add("Unsupported", m.py().get_type::<Unsupported>())?;
    m.add(
        "InternalCheckFailed",
        m.py().get_type::<InternalCheckFailed>(),
    )?;
    m.add(
        "ConstraintViolation",
        m.py().get_type::<ConstraintViolation>(),
    )?;
    m.add(
        "BackendCompilerFailed",
        m.py().get_type::<BackendCompilerFailed>(),
    )
}
