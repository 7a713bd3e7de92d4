//! `co_exceptiontable` of CPython 3.11: a list of entries `(start, length, target,
//! depth << 1 | lasti)`, each value a big-endian varint of 6-bit groups where bit 6 says
//! "more follows" and bit 7 marks the first byte of an entry. Offsets are in code units.

use crate::error::{BytecodeError, Result};

/// One row of the table, in code units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExceptionTableEntry {
    pub start: u32,
    pub end: u32,
    pub target: u32,
    pub depth: u32,
    pub lasti: bool,
}

const ENTRY_START: u8 = 0x80;
const CONTINUE: u8 = 0x40;

pub fn decode_exception_table(table: &[u8]) -> Result<Vec<ExceptionTableEntry>> {
    let mut entries = Vec::new();
    let mut pos = 0;
    while pos < table.len() {
        if table[pos] & ENTRY_START == 0 {
            return Err(bad(pos, "entry does not start with the start bit"));
        }
        let start = read_varint(table, &mut pos)?;
        let length = read_varint(table, &mut pos)?;
        let target = read_varint(table, &mut pos)?;
        let depth_lasti = read_varint(table, &mut pos)?;
        let end = start
            .checked_add(length)
            .ok_or_else(|| bad(pos, "range overflows"))?;
        entries.push(ExceptionTableEntry {
            start,
            end,
            target,
            depth: depth_lasti >> 1,
            lasti: depth_lasti & 1 == 1,
        });
    }
    Ok(entries)
}

fn read_varint(table: &[u8], pos: &mut usize) -> Result<u32> {
    let mut value: u64 = 0;
    let first = *pos;
    loop {
        let Some(&byte) = table.get(*pos) else {
            return Err(bad(*pos, "table ends inside a value"));
        };
        if *pos != first && byte & ENTRY_START != 0 {
            return Err(bad(*pos, "start bit inside a value"));
        }
        *pos += 1;
        value = (value << 6) | u64::from(byte & 0x3f);
        if value > u64::from(u32::MAX) {
            return Err(bad(first, "value too large"));
        }
        if byte & CONTINUE == 0 {
            return Ok(value as u32);
        }
    }
}

fn bad(offset: usize, reason: &'static str) -> BytecodeError {
    BytecodeError::BadExceptionTable { offset, reason }
}

pub fn encode_exception_table(entries: &[ExceptionTableEntry], out: &mut Vec<u8>) {
    for entry in entries {
        write_varint(out, entry.start, ENTRY_START);
        write_varint(out, entry.end - entry.start, 0);
        write_varint(out, entry.target, 0);
        write_varint(out, (entry.depth << 1) | u32::from(entry.lasti), 0);
    }
}

fn write_varint(out: &mut Vec<u8>, value: u32, first_byte_mark: u8) {
    let mut shift = 30;
    while shift > 0 && value >> shift == 0 {
        shift -= 6;
    }
    let mut mark = first_byte_mark;
    while shift > 0 {
        out.push(((value >> shift) & 0x3f) as u8 | CONTINUE | mark);
        mark = 0;
        shift -= 6;
    }
    out.push((value & 0x3f) as u8 | mark);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_small_and_large_values() {
        let entries = vec![
            ExceptionTableEntry {
                start: 0,
                end: 3,
                target: 9,
                depth: 0,
                lasti: false,
            },
            ExceptionTableEntry {
                start: 70,
                end: 5000,
                target: 1 << 20,
                depth: 77,
                lasti: true,
            },
        ];
        let mut bytes = Vec::new();
        encode_exception_table(&entries, &mut bytes);
        assert_eq!(decode_exception_table(&bytes).unwrap(), entries);
    }

    #[test]
    fn rejects_truncated_and_unmarked_tables() {
        assert!(decode_exception_table(&[0x80, 0x41]).is_err());
        assert!(decode_exception_table(&[0x01, 0x01, 0x01, 0x01]).is_err());
    }
}
