//! One function activation being translated (the compiled frame, an inlined call, a
//! generator's suspended frame) and how it is set up from a code object.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::break_reasons::{Break, BreakKind};
use super::translator::{CResult, CaptureError};
use super::vars::{Cell, VarId};
use dynamo_bytecode::Instruction;

/// One function activation being translated: the compiled frame or an inlined call.
#[derive(Debug)]
pub struct FrameState<'py> {
    pub code: Bound<'py, PyAny>,
    pub instructions: Vec<Instruction>,
    /// Source line of each instruction, for messages.
    pub lines: Vec<Option<i32>>,
    pub consts: Bound<'py, PyTuple>,
    pub names: Bound<'py, PyTuple>,
    /// Name of each localsplus slot.
    pub slot_names: Vec<String>,
    pub locals: Vec<Option<VarId>>,
    /// Cells of cell and free variables, by localsplus slot.
    pub cells: HashMap<usize, Cell>,
    pub stack: Vec<VarId>,
    pub kw_names: Option<Bound<'py, PyTuple>>,
    pub globals: Bound<'py, PyDict>,
    pub builtins: Bound<'py, PyAny>,
    /// Whether this is the compiled frame itself (its locals have sources).
    pub is_root: bool,
    pub pc: usize,
    pub qualname: String,
    pub filename: String,
    /// Values yielded so far, when a generator expression is run to completion.
    pub yields: Option<Vec<VarId>>,
    /// A generator's frame run lazily (see `VarKind::Generator`): `YIELD_VALUE` suspends it
    /// and hands the value to whoever resumed it.
    pub suspends: bool,
    /// The exceptions whose `except` blocks this frame is in, innermost last
    /// (`PUSH_EXC_INFO` .. `POP_EXCEPT`): what a bare `raise` raises again.
    pub handled: Vec<VarId>,
    /// The dict `locals()` handed out in this frame (Python refreshes and returns the same
    /// one at each call).
    pub locals_dict: Option<VarId>,
}

/// Builds the state for translating `code` with globals and builtins.
pub fn frame_state<'py>(
    code: &Bound<'py, PyAny>,
    globals: Bound<'py, PyDict>,
    builtins: Bound<'py, PyAny>,
    is_root: bool,
) -> CResult<FrameState<'py>> {
    let py = code.py();
    let co_code = code.getattr("co_code")?;
    let exception_table = code.getattr("co_exceptiontable")?;
    let line_table = code.getattr("co_linetable")?;
    let first_line: i32 = code.getattr("co_firstlineno")?.extract()?;
    let decoded = dynamo_bytecode::decode(dynamo_bytecode::RawCode {
        code: co_code
            .cast::<pyo3::types::PyBytes>()
            .map_err(PyErr::from)?
            .as_bytes(),
        exception_table: exception_table
            .cast::<pyo3::types::PyBytes>()
            .map_err(PyErr::from)?
            .as_bytes(),
        line_table: line_table
            .cast::<pyo3::types::PyBytes>()
            .map_err(PyErr::from)?
            .as_bytes(),
        first_line,
    })
    .map_err(|e| {
        CaptureError::Unsupported(Break::new(
            BreakKind::Internal,
            format!("undecodable bytecode: {e}"),
        ))
    })?;
    let varnames = code
        .getattr("co_varnames")?
        .cast_into::<PyTuple>()
        .map_err(PyErr::from)?;
    let cellvars = code
        .getattr("co_cellvars")?
        .cast_into::<PyTuple>()
        .map_err(PyErr::from)?;
    let freevars = code
        .getattr("co_freevars")?
        .cast_into::<PyTuple>()
        .map_err(PyErr::from)?;
    let mut slot_names: Vec<String> = varnames.iter().map(|n| n.to_string()).collect();
    for cell in cellvars.iter() {
        let name = cell.to_string();
        if !slot_names.contains(&name) {
            slot_names.push(name);
        }
    }
    slot_names.extend(freevars.iter().map(|n| n.to_string()));
    let lines = decoded
        .instructions
        .iter()
        .map(|i| i.positions.line)
        .collect();
    let _ = py;
    Ok(FrameState {
        consts: code
            .getattr("co_consts")?
            .cast_into::<PyTuple>()
            .map_err(PyErr::from)?,
        names: code
            .getattr("co_names")?
            .cast_into::<PyTuple>()
            .map_err(PyErr::from)?,
        locals: vec![None; slot_names.len()],
        slot_names,
        cells: HashMap::new(),
        stack: Vec::new(),
        kw_names: None,
        globals,
        builtins,
        is_root,
        pc: 0,
        qualname: code.getattr("co_qualname")?.extract()?,
        filename: code.getattr("co_filename")?.extract()?,
        instructions: decoded.instructions,
        yields: None,
        suspends: false,
        handled: Vec::new(),
        locals_dict: None,
        lines,
        code: code.clone(),
    })
}
