//! The 3.11 location table (`co_linetable`, PEP 657). Each entry covers 1 to 8 code units and
//! starts with `1 kkkk lll` (kind, length - 1). Kinds: 0-9 "short" (same line, column group
//! in the kind), 10-12 "one line" (line delta 0-2, byte columns), 13 "no column", 14 "long",
//! 15 "no location". Lines are deltas from the previous entry's line, starting at
//! `co_firstlineno`.
//!
//! The encoder makes the same choices as CPython 3.11's compiler (one or more entries per
//! instruction, never one entry for two), so decoding then encoding reproduces the table.

use crate::error::{BytecodeError, Result};
use crate::instruction::Positions;

const ONE_LINE_0: u8 = 10;
const NO_COLUMN: u8 = 13;
const LONG: u8 = 14;
const NONE: u8 = 15;

/// `units` consecutive code units that share `positions`: one table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineRun {
    pub units: u32,
    pub positions: Positions,
}

/// Decodes the table into its entries, in code order. Code units past the last entry have no
/// location, as CPython reports them.
pub fn decode_line_table(table: &[u8], first_line: i32) -> Result<Vec<LineRun>> {
    let mut out = Vec::with_capacity(table.len() / 2);
    let mut line = first_line;
    let mut pos = 0;
    while pos < table.len() {
        let head = table[pos];
        if head & 0x80 == 0 {
            return Err(bad(pos, "entry does not start with the start bit"));
        }
        pos += 1;
        let kind = (head >> 3) & 0x0f;
        let units = u32::from(head & 7) + 1;
        let positions = match kind {
            NONE => Positions::default(),
            NO_COLUMN => {
                line = line.wrapping_add(read_svarint(table, &mut pos)?);
                Positions {
                    line: Some(line),
                    end_line: Some(line),
                    col: None,
                    end_col: None,
                }
            }
            LONG => {
                line = line.wrapping_add(read_svarint(table, &mut pos)?);
                let end_line = line.wrapping_add(read_varint(table, &mut pos)? as i32);
                let col = read_varint(table, &mut pos)?.checked_sub(1);
                let end_col = read_varint(table, &mut pos)?.checked_sub(1);
                Positions {
                    line: Some(line),
                    end_line: Some(end_line),
                    col,
                    end_col,
                }
            }
            ONE_LINE_0..=12 => {
                line = line.wrapping_add(i32::from(kind - ONE_LINE_0));
                let col = u32::from(read_byte(table, &mut pos)?);
                let end_col = u32::from(read_byte(table, &mut pos)?);
                Positions {
                    line: Some(line),
                    end_line: Some(line),
                    col: Some(col),
                    end_col: Some(end_col),
                }
            }
            _ => {
                let second = read_byte(table, &mut pos)?;
                let col = u32::from(kind) * 8 + u32::from((second >> 4) & 7);
                let end_col = col + u32::from(second & 15);
                Positions {
                    line: Some(line),
                    end_line: Some(line),
                    col: Some(col),
                    end_col: Some(end_col),
                }
            }
        };
        out.push(LineRun { units, positions });
    }
    Ok(out)
}

fn read_byte(table: &[u8], pos: &mut usize) -> Result<u8> {
    let byte = *table
        .get(*pos)
        .ok_or_else(|| bad(*pos, "table ends inside an entry"))?;
    if byte & 0x80 != 0 {
        return Err(bad(*pos, "start bit inside an entry"));
    }
    *pos += 1;
    Ok(byte)
}

fn read_varint(table: &[u8], pos: &mut usize) -> Result<u32> {
    let start = *pos;
    let mut value: u64 = 0;
    let mut shift = 0;
    loop {
        let byte = read_byte(table, pos)?;
        value |= u64::from(byte & 0x3f) << shift;
        if value > u64::from(u32::MAX) || shift > 30 {
            return Err(bad(start, "value too large"));
        }
        if byte & 0x40 == 0 {
            return Ok(value as u32);
        }
        shift += 6;
    }
}

fn read_svarint(table: &[u8], pos: &mut usize) -> Result<i32> {
    let raw = read_varint(table, pos)?;
    let magnitude = (raw >> 1) as i32;
    Ok(if raw & 1 == 1 {
        magnitude.wrapping_neg()
    } else {
        magnitude
    })
}

fn bad(offset: usize, reason: &'static str) -> BytecodeError {
    BytecodeError::BadLineTable { offset, reason }
}

/// Writes a location table entry by entry, as CPython 3.11's assembler does.
#[derive(Debug)]
pub struct LineTableWriter {
    out: Vec<u8>,
    line: i32,
}

impl LineTableWriter {
    pub fn new(first_line: i32) -> LineTableWriter {
        LineTableWriter {
            out: Vec::new(),
            line: first_line,
        }
    }

    /// Adds the location of one instruction that is `units` code units long.
    pub fn push(&mut self, positions: &Positions, mut units: usize) {
        while units > 8 {
            self.entry(positions, 8);
            units -= 8;
        }
        if units > 0 {
            self.entry(positions, units);
        }
    }

    pub fn finish(self) -> Vec<u8> {
        self.out
    }

    fn head(&mut self, kind: u8, units: usize) {
        self.out.push(0x80 | (kind << 3) | (units - 1) as u8);
    }

    fn entry(&mut self, p: &Positions, units: usize) {
        let Some(line) = p.line else {
            self.head(NONE, units);
            return;
        };
        let delta = line.wrapping_sub(self.line);
        match (p.col, p.end_col) {
            (Some(col), Some(end_col)) if p.end_line == Some(line) => {
                if delta == 0 && col < 80 && end_col >= col && end_col - col < 16 {
                    self.head((col >> 3) as u8, units);
                    self.out.push((((col & 7) << 4) | (end_col - col)) as u8);
                    return;
                }
                if (0..3).contains(&delta) && col < 128 && end_col < 128 {
                    self.head(ONE_LINE_0 + delta as u8, units);
                    self.out.push(col as u8);
                    self.out.push(end_col as u8);
                    self.line = line;
                    return;
                }
            }
            (Some(_), Some(_)) => {}
            _ if p.end_line == Some(line) || p.end_line.is_none() => {
                self.head(NO_COLUMN, units);
                self.write_svarint(delta);
                self.line = line;
                return;
            }
            _ => {}
        }
        self.head(LONG, units);
        self.write_svarint(delta);
        let end_line = p.end_line.unwrap_or(line);
        self.write_varint(end_line.wrapping_sub(line) as u32);
        self.write_varint(p.col.map_or(0, |c| c + 1));
        self.write_varint(p.end_col.map_or(0, |c| c + 1));
        self.line = line;
    }

    fn write_varint(&mut self, mut value: u32) {
        while value >= 64 {
            self.out.push(0x40 | (value & 0x3f) as u8);
            value >>= 6;
        }
        self.out.push(value as u8);
    }

    fn write_svarint(&mut self, value: i32) {
        let zigzag = if value < 0 {
            (value.unsigned_abs() << 1) | 1
        } else {
            (value as u32) << 1
        };
        self.write_varint(zigzag);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: i32, end_line: i32, col: u32, end_col: u32) -> Positions {
        Positions {
            line: Some(line),
            end_line: Some(end_line),
            col: Some(col),
            end_col: Some(end_col),
        }
    }

    #[test]
    fn every_entry_kind_round_trips() {
        let rows = [
            (at(1, 1, 4, 9), 1),       // short
            (at(3, 3, 100, 120), 2),   // one line, delta 2
            (at(3, 3, 200, 300), 1),   // long: wide columns
            (at(2, 7, 0, 5), 11),      // long, multi-line, split 8 + 3
            (Positions::default(), 1), // no location
            (
                Positions {
                    line: Some(-4),
                    end_line: Some(-4),
                    col: None,
                    end_col: None,
                },
                1,
            ),
        ];
        let mut writer = LineTableWriter::new(1);
        let mut expected = Vec::new();
        for (p, units) in rows {
            writer.push(&p, units);
            expected.extend(std::iter::repeat_n(p, units));
        }
        let table = writer.finish();
        let per_unit: Vec<Positions> = decode_line_table(&table, 1)
            .unwrap()
            .iter()
            .flat_map(|run| std::iter::repeat_n(run.positions, run.units as usize))
            .collect();
        assert_eq!(per_unit, expected);
    }

    #[test]
    fn rejects_truncated_entries() {
        assert!(decode_line_table(&[0xf0], 1).is_err());
        assert!(decode_line_table(&[0x00], 1).is_err());
    }
}
