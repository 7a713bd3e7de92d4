//! Python face of `dynamo_bytecode`: `decode(code)` returns a list of `Instruction`s that can
//! be edited, and `assemble(instructions, like=code)` turns them back into a code object.
//! Jump targets and exception handlers are indices into the list, so an edit that inserts
//! or removes instructions must renumber them.

use crate::imports::ImportModule;
use dynamo_bytecode::opcode::raw_info;
use dynamo_bytecode::{
    assemble as assemble_rs, decode as decode_rs, stack_effect as stack_effect_rs, Decoded,
    ExceptionHandler, InstrIndex, Instruction as RsInstruction, Opcode, Operand, OperandKind,
    Positions, RawCode,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::errors::{bytecode_error, BytecodeError};

/// `dis.cmp_op`, which `COMPARE_OP`'s argument indexes.
const COMPARE_OPS: [&str; 6] = ["<", "<=", "==", "!=", ">", ">="];

type PyPositions = (Option<i32>, Option<i32>, Option<u32>, Option<u32>);

/// One decoded instruction. `opname` is CPython's name for the raw opcode as decoded (for
/// jumps, with its direction); the assembler picks the direction again from `target`.
#[derive(Debug)]
#[pyclass(module = "dynamo_rs.bytecode")]
pub struct Instruction {
    opcode: Opcode,
    raw: u8,
    /// The argument as CPython encodes it (for jumps: the relative offset); `None` for
    /// opcodes without argument.
    #[pyo3(get, set)]
    arg: Option<u32>,
    /// What the argument means, as `dis` shows it.
    #[pyo3(get, set)]
    argval: Py<PyAny>,
    /// Byte offset in the decoded `co_code`; `None` for new instructions.
    #[pyo3(get, set)]
    offset: Option<u32>,
    /// `(line, end_line, col, end_col)` as `code.co_positions()` gives them.
    #[pyo3(get, set)]
    positions: PyPositions,
    /// Index of the jump target in the instruction list, for jumps.
    #[pyo3(get, set)]
    target: Option<usize>,
    /// `(handler index, stack depth, lasti)` of the covering exception handler.
    #[pyo3(get, set)]
    exc_handler: Option<(usize, u32, bool)>,
}

fn opcode_from_name(name: &str) -> PyResult<(Opcode, u8)> {
    let op = Opcode::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown opcode name {name:?}")))?;
    let raw = (0u8..=255)
        .find(|&b| raw_info(b).is_some_and(|info| info.name == name))
        .or(op.forward_byte())
        .or(op.backward_byte())
        .expect("every opcode has an encoding");
    Ok((op, raw))
}

#[pymethods]
impl Instruction {
    #[new]
    #[pyo3(signature = (opname, arg=None, *, target=None, positions=None, exc_handler=None))]
    fn new(
        py: Python<'_>,
        opname: &str,
        arg: Option<u32>,
        target: Option<usize>,
        positions: Option<PyPositions>,
        exc_handler: Option<(usize, u32, bool)>,
    ) -> PyResult<Self> {
        let (opcode, raw) = opcode_from_name(opname)?;
        Ok(Instruction {
            opcode,
            raw,
            arg,
            argval: arg.into_pyobject(py)?.into_any().unbind(),
            offset: None,
            positions: positions.unwrap_or((None, None, None, None)),
            target,
            exc_handler,
        })
    }

    #[getter]
    fn opname(&self) -> &'static str {
        raw_info(self.raw).map_or(self.opcode.name(), |info| info.name)
    }

    #[setter]
    fn set_opname(&mut self, name: &str) -> PyResult<()> {
        (self.opcode, self.raw) = opcode_from_name(name)?;
        Ok(())
    }

    /// The raw opcode byte as decoded (or as named at construction).
    #[getter]
    fn opcode(&self) -> u8 {
        self.raw
    }

    /// The direction-free name (`POP_JUMP_IF_TRUE` for both raw directions).
    #[getter]
    fn base_opname(&self) -> &'static str {
        self.opcode.name()
    }

    #[getter]
    fn is_jump(&self) -> bool {
        self.opcode.is_jump()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let argval = self
            .argval
            .bind(py)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_default();
        match (self.target, self.arg) {
            (Some(t), _) => format!("<{} -> {t}>", self.opname()),
            (None, Some(_)) => format!("<{} {argval}>", self.opname()),
            (None, None) => format!("<{}>", self.opname()),
        }
    }
}

fn to_positions(p: &Positions) -> PyPositions {
    (p.line, p.end_line, p.col, p.end_col)
}

fn from_positions(p: PyPositions) -> Positions {
    Positions {
        line: p.0,
        end_line: p.1,
        col: p.2,
        end_col: p.3,
    }
}

/// `FORMAT_VALUE`'s argument as `dis` shows it: (conversion function or None, has a spec).
fn format_value_argval(py: Python<'_>, arg: u32) -> PyResult<Py<PyAny>> {
    let builtins = py.import_module("builtins")?;
    let conversion = match arg & 3 {
        0 => py.None(),
        1 => builtins.getattr("str")?.unbind(),
        2 => builtins.getattr("repr")?.unbind(),
        _ => builtins.getattr("ascii")?.unbind(),
    };
    Ok((conversion, arg & 4 != 0)
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Reads a code object's raw tables and decodes them; the one path from a Python code object
/// to `dynamo_bytecode`. Returns `co_code` too, for callers that look at raw bytes.
fn decode_code_object<'py>(
    py: Python<'py>,
    code: &Bound<'py, PyAny>,
    caller: &str,
) -> PyResult<(Bound<'py, PyBytes>, Decoded)> {
    let not_code = || {
        PyTypeError::new_err(format!(
            "{caller}() expects a code object, not {}",
            type_name(code)
        ))
    };
    let co_code = code
        .getattr(intern!(py, "co_code"))
        .map_err(|_| not_code())?;
    let co_code = co_code.cast_into::<PyBytes>().map_err(|_| not_code())?;
    let exception_table = code.getattr(intern!(py, "co_exceptiontable"))?;
    let line_table = code.getattr(intern!(py, "co_linetable"))?;
    let first_line: i32 = code.getattr(intern!(py, "co_firstlineno"))?.extract()?;
    let decoded = decode_rs(RawCode {
        code: co_code.as_bytes(),
        exception_table: exception_table.cast::<PyBytes>()?.as_bytes(),
        line_table: line_table.cast::<PyBytes>()?.as_bytes(),
        first_line,
    })
    .map_err(bytecode_error)?;
    Ok((co_code, decoded))
}

/// Decodes a code object into a list of `Instruction`s.
#[pyfunction]
fn decode<'py>(py: Python<'py>, code: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let (co_code, decoded) = decode_code_object(py, code, "decode")?;

    let consts = code.getattr(intern!(py, "co_consts"))?;
    let consts = consts.cast::<PyTuple>()?;
    let names = code.getattr(intern!(py, "co_names"))?;
    let names = names.cast::<PyTuple>()?;
    let varnames = code.getattr(intern!(py, "co_varnames"))?;
    let varnames = varnames.cast::<PyTuple>()?;
    let bytes = co_code.as_bytes();
    let none = py.None();
    let out = PyList::empty(py);
    for (index, instruction) in decoded.instructions.iter().enumerate() {
        let offset = decoded.offsets[index];
        let raw = bytes[offset as usize];
        let info = raw_info(raw).expect("decoder only yields known opcodes");
        let target = instruction.jump_target().map(InstrIndex::index);
        let arg = match instruction.operand {
            Operand::None => None,
            Operand::Jump(t) => {
                let next = offset / 2 + 1;
                let to = decoded.start_offsets[t.index()] / 2;
                Some(next.abs_diff(to))
            }
            other => other.raw(),
        };
        let lookup = |table: &Bound<'py, PyTuple>, what: &str, i: u32| -> PyResult<Py<PyAny>> {
            table.get_item(i as usize).map(Bound::unbind).map_err(|_| {
                BytecodeError::new_err(format!(
                    "{} at byte offset {offset}: {what} index {i} is out of range ({} entries)",
                    info.name,
                    table.len()
                ))
            })
        };
        let argval: Py<PyAny> = match instruction.operand {
            Operand::None => none.clone_ref(py),
            Operand::Const(i) => lookup(consts, "co_consts", i)?,
            Operand::Name(i) => {
                let i = if instruction.opcode == Opcode::LoadGlobal {
                    i >> 1
                } else {
                    i
                };
                lookup(names, "co_names", i)?
            }
            Operand::Local(i) => lookup(varnames, "co_varnames", i)?,
            Operand::Cell(i) => code
                .call_method1("_varname_from_oparg", (i,))
                .map_err(|_| {
                    BytecodeError::new_err(format!(
                        "{} at byte offset {offset}: cell index {i} is out of range",
                        info.name
                    ))
                })?
                .unbind(),
            Operand::Compare(i) => match COMPARE_OPS.get(i as usize) {
                Some(s) => s.into_pyobject(py)?.into_any().unbind(),
                None => i.into_pyobject(py)?.into_any().unbind(),
            },
            Operand::Jump(t) => decoded.start_offsets[t.index()]
                .into_pyobject(py)?
                .into_any()
                .unbind(),
            Operand::Int(i) if instruction.opcode == Opcode::FormatValue => {
                format_value_argval(py, i)?
            }
            Operand::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        };
        let exc_handler = instruction
            .handler
            .map(|h| (h.target.index(), h.depth, h.lasti));
        let obj = Instruction {
            opcode: info.opcode,
            raw,
            arg,
            argval,
            offset: Some(offset),
            positions: to_positions(&instruction.positions),
            target,
            exc_handler,
        };
        out.append(Bound::new(py, obj)?)?;
    }
    Ok(out)
}

fn to_rust(index: usize, item: &Bound<'_, PyAny>) -> PyResult<RsInstruction> {
    let instruction = item.cast::<Instruction>().map_err(|_| {
        PyTypeError::new_err(format!(
            "instruction {index} is not a dynamo_rs.bytecode.Instruction"
        ))
    })?;
    let i = instruction.borrow();
    let missing = |what: &str| {
        PyValueError::new_err(format!(
            "instruction {index} ({}) needs {what}",
            i.opcode.name()
        ))
    };
    let operand = match i.opcode.operand_kind() {
        OperandKind::None => Operand::None,
        OperandKind::Jump => Operand::Jump(InstrIndex(
            u32::try_from(i.target.ok_or_else(|| missing("a target"))?)
                .map_err(|_| missing("a target below 2**32"))?,
        )),
        kind => Operand::from_raw(kind, i.arg.ok_or_else(|| missing("an arg"))?),
    };
    let handler = match i.exc_handler {
        Some((target, depth, lasti)) => Some(ExceptionHandler {
            target: InstrIndex(
                u32::try_from(target).map_err(|_| missing("a handler below 2**32"))?,
            ),
            depth,
            lasti,
        }),
        None => None,
    };
    Ok(RsInstruction {
        opcode: i.opcode,
        operand,
        positions: from_positions(i.positions),
        handler,
    })
}

/// Assembles instructions into a new code object that is `like` with new `co_code`,
/// `co_exceptiontable`, `co_linetable` and `co_stacksize`.
#[pyfunction]
#[pyo3(signature = (instructions, like))]
fn assemble<'py>(
    py: Python<'py>,
    instructions: &Bound<'py, PyAny>,
    like: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut list = Vec::new();
    for (index, item) in instructions.try_iter()?.enumerate() {
        list.push(to_rust(index, &item?)?);
    }
    let first_line: i32 = like.getattr(intern!(py, "co_firstlineno"))?.extract()?;
    let flags: u32 = like.getattr(intern!(py, "co_flags"))?.extract()?;
    let assembled = assemble_rs(&list, first_line, flags).map_err(bytecode_error)?;
    code_with_tables(like, &assembled, PyDict::new(py))
}

/// `like.replace(...)` with the assembled tables, plus any other fields in `kwargs`.
pub fn code_with_tables<'py>(
    like: &Bound<'py, PyAny>,
    assembled: &dynamo_bytecode::Assembled,
    kwargs: Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = like.py();
    kwargs.set_item("co_code", PyBytes::new(py, &assembled.code))?;
    kwargs.set_item(
        "co_exceptiontable",
        PyBytes::new(py, &assembled.exception_table),
    )?;
    kwargs.set_item("co_linetable", PyBytes::new(py, &assembled.line_table))?;
    kwargs.set_item("co_stacksize", assembled.stack_size)?;
    like.call_method("replace", (), Some(&kwargs))
}

/// `(co_code, co_exceptiontable, co_linetable, co_stacksize)`.
type RawTables<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    u32,
);

/// Decodes and re-assembles `code` entirely in Rust, returning the new
/// `(co_code, co_exceptiontable, co_linetable, co_stacksize)` without building Python
/// instructions or a code object: the cost the tracer itself pays.
#[pyfunction]
fn round_trip_tables<'py>(py: Python<'py>, code: &Bound<'py, PyAny>) -> PyResult<RawTables<'py>> {
    let (_, decoded) = decode_code_object(py, code, "round_trip_tables")?;
    let first_line: i32 = code.getattr(intern!(py, "co_firstlineno"))?.extract()?;
    let flags: u32 = code.getattr(intern!(py, "co_flags"))?.extract()?;
    let assembled =
        assemble_rs(&decoded.instructions, first_line, flags).map_err(bytecode_error)?;
    Ok((
        PyBytes::new(py, &assembled.code),
        PyBytes::new(py, &assembled.exception_table),
        PyBytes::new(py, &assembled.line_table),
        assembled.stack_size,
    ))
}

fn decode_for_analysis(
    py: Python<'_>,
    code: &Bound<'_, PyAny>,
) -> PyResult<(Vec<RsInstruction>, u32)> {
    let (_, decoded) = decode_code_object(py, code, "analysis")?;
    let mut locals = 0usize;
    for field in ["co_varnames", "co_cellvars", "co_freevars"] {
        locals += code.getattr(field)?.len()?;
    }
    Ok((
        decoded.instructions,
        u32::try_from(locals).unwrap_or(u32::MAX),
    ))
}

/// For each instruction (as indexed by `decode`), the local indices ("localsplus": fast
/// locals, then cells, then free variables) that are live just before it.
#[pyfunction]
fn live_locals(py: Python<'_>, code: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u32>>> {
    let (instructions, locals) = decode_for_analysis(py, code)?;
    let live = dynamo_bytecode::liveness::liveness(&instructions, locals);
    Ok((0..instructions.len())
        .map(|i| live.live_locals(i))
        .collect())
}

/// Basic blocks as `(start, end, successor blocks, handler block or None)`, instruction
/// indices as in `decode`.
#[pyfunction]
fn basic_blocks(py: Python<'_>, code: &Bound<'_, PyAny>) -> PyResult<Vec<BlockTuple>> {
    let (instructions, _) = decode_for_analysis(py, code)?;
    let cfg = dynamo_bytecode::cfg::Cfg::build(&instructions);
    Ok(cfg
        .blocks
        .iter()
        .map(|b| {
            let successors = b.successors.iter().map(|s| s.0 as usize).collect();
            (b.start, b.end, successors, b.handler.map(|h| h.0 as usize))
        })
        .collect())
}

type BlockTuple = (usize, usize, Vec<usize>, Option<usize>);

/// Stack depth before each instruction (`None` where no path reaches), as the assembler
/// computes it for `co_stacksize`.
#[pyfunction]
fn stack_depths(py: Python<'_>, code: &Bound<'_, PyAny>) -> PyResult<Vec<Option<u32>>> {
    let (instructions, _) = decode_for_analysis(py, code)?;
    let flags: u32 = code.getattr(intern!(py, "co_flags"))?.extract()?;
    let depths =
        dynamo_bytecode::stack_depth::stack_depths(&instructions, flags).map_err(bytecode_error)?;
    Ok(depths.before)
}

/// `dis.stack_effect` computed by our table: `jump` is True (taken), False, or None (max).
#[pyfunction]
#[pyo3(signature = (opcode, arg=None, *, jump=None))]
fn stack_effect(opcode: u8, arg: Option<u32>, jump: Option<bool>) -> PyResult<i64> {
    let info = raw_info(opcode)
        .ok_or_else(|| PyValueError::new_err(format!("invalid opcode {opcode}")))?;
    let takes_arg = info.operand != OperandKind::None;
    if takes_arg != arg.is_some() {
        return Err(PyValueError::new_err(if takes_arg {
            "stack_effect: opcode requires oparg but oparg was not specified"
        } else {
            "stack_effect: opcode does not permit oparg but oparg was specified"
        }));
    }
    Ok(stack_effect_rs(info.opcode, arg.unwrap_or(0), jump))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Instruction>()?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(assemble, m)?)?;
    m.add_function(wrap_pyfunction!(stack_effect, m)?)?;
    m.add_function(wrap_pyfunction!(round_trip_tables, m)?)?;
    m.add_function(wrap_pyfunction!(live_locals, m)?)?;
    m.add_function(wrap_pyfunction!(basic_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(stack_depths, m)?)?;
    Ok(())
}
