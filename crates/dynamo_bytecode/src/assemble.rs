//! Encoding `Instruction`s back into a 3.11 code object's raw tables: raw opcodes chosen by
//! jump direction, `EXTENDED_ARG` prefixes grown to a fixed point, `CACHE` units regenerated,
//! the exception table rebuilt from each instruction's handler, the location table written as
//! CPython's compiler writes it, and `co_stacksize` computed by stack analysis.

use crate::error::{BytecodeError, Result};
use crate::exception_table::{encode_exception_table, ExceptionTableEntry};
use crate::instruction::{Instruction, Operand};
use crate::line_table::LineTableWriter;
use crate::opcode::{Opcode, OperandKind, CACHE, EXTENDED_ARG};
use crate::stack_depth::stack_depths;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assembled {
    pub code: Vec<u8>,
    pub exception_table: Vec<u8>,
    pub line_table: Vec<u8>,
    pub stack_size: u32,
}

/// How many `EXTENDED_ARG` prefixes an argument needs.
fn extended_args(arg: u32) -> u32 {
    match arg {
        0..=0xff => 0,
        0x100..=0xffff => 1,
        0x1_0000..=0xff_ffff => 2,
        _ => 3,
    }
}

struct Layout {
    /// Raw opcode byte of each instruction.
    bytes: Vec<u8>,
    /// Encoded argument of each instruction.
    args: Vec<u32>,
    /// Start (in code units) of each instruction, plus the end of the code.
    starts: Vec<u32>,
}

fn raw_byte(index: usize, instruction: &Instruction) -> Result<u8> {
    let op = instruction.opcode;
    let backward = match instruction.operand {
        Operand::Jump(target) => target.index() <= index,
        _ => false,
    };
    let byte = if backward {
        op.backward_byte()
    } else {
        op.forward_byte()
    };
    byte.ok_or_else(|| BytecodeError::BadInstruction {
        index,
        reason: format!(
            "{} cannot jump {} in CPython 3.11",
            op.name(),
            if backward { "backward" } else { "forward" }
        ),
    })
}

fn check(index: usize, instruction: &Instruction, len: usize) -> Result<()> {
    let bad = |reason: String| Err(BytecodeError::BadInstruction { index, reason });
    let op = instruction.opcode;
    if matches!(op, Opcode::ExtendedArg) {
        return bad("EXTENDED_ARG is added by the assembler; fold it into the argument".into());
    }
    let expected = op.operand_kind();
    let got = instruction.operand.kind();
    if expected != got {
        return bad(format!(
            "{} takes a {expected:?} operand, not {got:?}",
            op.name()
        ));
    }
    if let Some(target) = instruction.jump_target() {
        if target.index() >= len {
            return bad(format!(
                "jump target {} is past the last instruction",
                target.0
            ));
        }
    }
    if let Some(handler) = instruction.handler {
        if handler.target.index() >= len {
            return bad(format!(
                "exception handler {} is past the last instruction",
                handler.target.0
            ));
        }
    }
    Ok(())
}

fn layout(instructions: &[Instruction]) -> Result<Layout> {
    let len = instructions.len();
    let mut bytes = Vec::with_capacity(len);
    let mut args = Vec::with_capacity(len);
    for (index, instruction) in instructions.iter().enumerate() {
        check(index, instruction, len)?;
        bytes.push(raw_byte(index, instruction)?);
        args.push(instruction.operand.raw().unwrap_or(0));
    }
    let caches: Vec<u32> = instructions
        .iter()
        .map(|i| u32::from(i.opcode.caches()))
        .collect();
    let mut starts = vec![0u32; len + 1];
    // Every span only grows as prefixes are added, so growing sizes until nothing changes
    // reaches the smallest consistent layout: the one CPython's compiler produces.
    loop {
        let mut at = 0u32;
        for index in 0..len {
            starts[index] = at;
            at += extended_args(args[index]) + 1 + caches[index];
        }
        starts[len] = at;
        let mut changed = false;
        for (index, instruction) in instructions.iter().enumerate() {
            let Some(target) = instruction.jump_target() else {
                continue;
            };
            let next = starts[index] + extended_args(args[index]) + 1;
            let to = starts[target.index()];
            let arg = if target.index() <= index {
                next - to
            } else {
                to - next
            };
            if extended_args(arg) > extended_args(args[index]) {
                changed = true;
            }
            args[index] = arg;
        }
        if !changed {
            return Ok(Layout {
                bytes,
                args,
                starts,
            });
        }
    }
}

/// The byte offset each instruction gets when `instructions` are assembled (what `dis` and
/// `f_lasti` call an instruction's offset).
pub fn byte_offsets(instructions: &[Instruction]) -> Result<Vec<u32>> {
    Ok(layout(instructions)?.starts[..instructions.len()]
        .iter()
        .map(|units| units * 2)
        .collect())
}

/// Encodes `instructions` for a code object whose first line is `first_line` and whose flags
/// are `co_flags` (generators start with a value on the stack), with `co_stacksize` found by
/// stack analysis.
pub fn assemble(instructions: &[Instruction], first_line: i32, co_flags: u32) -> Result<Assembled> {
    let (code, exception_table, line_table) = encode(instructions, first_line)?;
    let stack_size = stack_depths(instructions, co_flags)?.max;
    Ok(Assembled {
        code,
        exception_table,
        line_table,
        stack_size,
    })
}

/// Encodes `co_code`, `co_exceptiontable` and `co_linetable`, without stack analysis.
pub fn encode(
    instructions: &[Instruction],
    first_line: i32,
) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let Layout {
        bytes,
        args,
        starts,
    } = layout(instructions)?;
    let mut code = Vec::with_capacity(starts[instructions.len()] as usize * 2);
    let mut lines = LineTableWriter::new(first_line);
    for (index, instruction) in instructions.iter().enumerate() {
        let arg = args[index];
        let prefixes = extended_args(arg);
        for shift in (1..=prefixes).rev() {
            code.extend_from_slice(&[EXTENDED_ARG, (arg >> (8 * shift)) as u8]);
        }
        let low = if instruction.opcode.operand_kind() == OperandKind::None {
            0
        } else {
            arg as u8
        };
        code.extend_from_slice(&[bytes[index], low]);
        for _ in 0..instruction.opcode.caches() {
            code.extend_from_slice(&[CACHE, 0]);
        }
        lines.push(
            &instruction.positions,
            (starts[index + 1] - starts[index]) as usize,
        );
    }

    let mut entries: Vec<ExceptionTableEntry> = Vec::new();
    let mut run_start = 0;
    for index in 1..=instructions.len() {
        let handler = instructions[run_start].handler;
        if index < instructions.len() && instructions[index].handler == handler {
            continue;
        }
        if let Some(h) = handler {
            entries.push(ExceptionTableEntry {
                start: starts[run_start],
                end: starts[index],
                target: starts[h.target.index()],
                depth: h.depth,
                lasti: h.lasti,
            });
        }
        run_start = index;
    }
    let mut exception_table = Vec::new();
    encode_exception_table(&entries, &mut exception_table);
    Ok((code, exception_table, lines.finish()))
}
