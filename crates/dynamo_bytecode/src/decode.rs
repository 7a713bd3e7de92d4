//! Decoding a 3.11 code object's raw tables into `Instruction`s: `EXTENDED_ARG` folded,
//! inline caches skipped (and checked), jump offsets resolved to instruction indices, the
//! exception table spread onto the instructions it covers, positions from the line table.

use crate::error::{BytecodeError, Result};
use crate::exception_table::decode_exception_table;
use crate::instruction::{ExceptionHandler, InstrIndex, Instruction, Operand, Positions};
use crate::line_table::decode_line_table;
use crate::opcode::{raw_info, Direction, OperandKind, CACHE, EXTENDED_ARG, HAVE_ARGUMENT};

/// The raw parts of a code object that decoding reads.
#[derive(Clone, Copy, Debug)]
pub struct RawCode<'a> {
    pub code: &'a [u8],
    pub exception_table: &'a [u8],
    pub line_table: &'a [u8],
    pub first_line: i32,
}

/// A decoded code object: the instructions and, for each, where it sat in `co_code`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub instructions: Vec<Instruction>,
    /// Byte offset of each instruction's opcode (after any `EXTENDED_ARG`), as `dis` shows.
    pub offsets: Vec<u32>,
    /// Byte offset of each instruction's first code unit (its first `EXTENDED_ARG`, if any).
    pub start_offsets: Vec<u32>,
}

pub fn decode(raw: RawCode<'_>) -> Result<Decoded> {
    let code = raw.code;
    if !code.len().is_multiple_of(2) {
        return Err(BytecodeError::Truncated {
            offset: code.len() - 1,
        });
    }
    let units = code.len() / 2;
    let mut instructions = Vec::with_capacity(units);
    let mut offsets = Vec::with_capacity(units);
    let mut start_offsets = Vec::with_capacity(units);
    // Jumps hold code-unit targets until every instruction's start is known.
    let mut pending_jumps: Vec<(usize, i64, usize)> = Vec::new();
    // Instruction index starting at each code unit, or u32::MAX inside an instruction.
    let mut index_at_unit = vec![u32::MAX; units + 1];

    let mut unit = 0;
    while unit < units {
        let start = unit;
        let mut ext: u64 = 0;
        let mut has_ext = false;
        while code[unit * 2] == EXTENDED_ARG {
            ext = (ext << 8) | u64::from(code[unit * 2 + 1]);
            has_ext = true;
            if ext > u64::from(u32::MAX >> 8) {
                return Err(BytecodeError::BadInstruction {
                    index: instructions.len(),
                    reason: "argument wider than 32 bits".into(),
                });
            }
            unit += 1;
            if unit >= units {
                return Err(BytecodeError::Truncated { offset: unit * 2 });
            }
        }
        let offset = unit * 2;
        let byte = code[offset];
        let info = raw_info(byte).ok_or(BytecodeError::UnknownOpcode { offset, byte })?;
        if byte < HAVE_ARGUMENT && has_ext {
            return Err(BytecodeError::ExtendedArgWithoutArgument { offset });
        }
        let arg = u32::try_from((ext << 8) | u64::from(code[offset + 1])).map_err(|_| {
            BytecodeError::BadInstruction {
                index: instructions.len(),
                reason: "argument wider than 32 bits".into(),
            }
        })?;
        unit += 1;
        for _ in 0..info.caches {
            let cache = code
                .get(unit * 2)
                .copied()
                .ok_or(BytecodeError::Truncated { offset: unit * 2 })?;
            if cache != CACHE {
                return Err(BytecodeError::BadCache {
                    offset: unit * 2,
                    byte: cache,
                });
            }
            unit += 1;
        }
        let index = instructions.len();
        index_at_unit[start] = index as u32;
        let operand = match info.operand {
            OperandKind::Jump => {
                // 3.11 jumps count code units from the instruction after this one.
                let next = (offset / 2 + 1) as i64;
                let target = match info.direction {
                    Direction::Backward => next - i64::from(arg),
                    _ => next + i64::from(arg),
                };
                pending_jumps.push((index, target, offset));
                Operand::Jump(InstrIndex(0))
            }
            OperandKind::None => Operand::None,
            kind => Operand::from_raw(kind, arg),
        };
        instructions.push(Instruction::new(info.opcode, operand));
        offsets.push(offset as u32);
        start_offsets.push((start * 2) as u32);
    }
    index_at_unit[units] = instructions.len() as u32;

    let count = instructions.len();
    let resolve = |unit: i64| -> Option<InstrIndex> {
        let slot = *index_at_unit.get(usize::try_from(unit).ok()?)?;
        (slot != u32::MAX && (slot as usize) < count).then_some(InstrIndex(slot))
    };
    for &(index, target, offset) in &pending_jumps {
        let resolved = resolve(target).ok_or(BytecodeError::BadJumpTarget {
            offset,
            target: target * 2,
        })?;
        instructions[index].operand = Operand::Jump(resolved);
    }

    for entry in decode_exception_table(raw.exception_table)? {
        let bad = |reason| BytecodeError::BadExceptionTable {
            offset: entry.start as usize * 2,
            reason,
        };
        let first = index_at_unit
            .get(entry.start as usize)
            .copied()
            .filter(|&i| i != u32::MAX);
        let last = index_at_unit
            .get(entry.end as usize)
            .copied()
            .filter(|&i| i != u32::MAX);
        let (Some(first), Some(last)) = (first, last) else {
            return Err(bad("range is not on instruction boundaries"));
        };
        let target =
            resolve(i64::from(entry.target)).ok_or(bad("handler is not an instruction"))?;
        let handler = ExceptionHandler {
            target,
            depth: entry.depth,
            lasti: entry.lasti,
        };
        for instruction in &mut instructions[first as usize..last as usize] {
            if instruction.handler.is_some() {
                return Err(bad("ranges overlap"));
            }
            instruction.handler = Some(handler);
        }
    }

    // Each instruction takes the location of its first code unit.
    let runs = decode_line_table(raw.line_table, raw.first_line)?;
    let mut run = 0;
    let mut run_end = runs.first().map_or(0, |r| r.units);
    for (instruction, &start) in instructions.iter_mut().zip(&start_offsets) {
        let unit = start / 2;
        while run < runs.len() && run_end <= unit {
            run += 1;
            run_end += runs.get(run).map_or(0, |r| r.units);
        }
        instruction.positions = runs.get(run).map_or(Positions::default(), |r| r.positions);
    }
    Ok(Decoded {
        instructions,
        offsets,
        start_offsets,
    })
}
