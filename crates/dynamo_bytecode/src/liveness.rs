//! Which local variables are live (may be read before being overwritten) before each
//! instruction. Graph breaks need this: a resume function only has to receive the locals
//! that are live where it resumes.
//!
//! Locals are "localsplus" indices, the space `LOAD_FAST` and `LOAD_DEREF` share in 3.11.
//! Cell and free variables are treated as always read and never killed, because a closure
//! may read the cell at any time.

use crate::instruction::{Instruction, Operand};
use crate::opcode::Opcode;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Liveness {
    words: usize,
    live_in: Vec<u64>,
}

impl Liveness {
    /// Whether `local` is live just before instruction `index`.
    pub fn is_live(&self, index: usize, local: u32) -> bool {
        let word = local as usize / 64;
        word < self.words && self.live_in[index * self.words + word] >> (local % 64) & 1 == 1
    }

    /// The live locals before instruction `index`, in increasing order.
    pub fn live_locals(&self, index: usize) -> Vec<u32> {
        let row = &self.live_in[index * self.words..(index + 1) * self.words];
        let mut out = Vec::new();
        for (w, &bits) in row.iter().enumerate() {
            for bit in 0..64 {
                if bits >> bit & 1 == 1 {
                    out.push((w * 64 + bit) as u32);
                }
            }
        }
        out
    }
}

/// What one instruction reads and writes among the locals.
fn effect(instruction: &Instruction) -> (Option<u32>, Option<u32>) {
    match (instruction.opcode, instruction.operand) {
        (Opcode::LoadFast, Operand::Local(i)) => (Some(i), None),
        (Opcode::StoreFast, Operand::Local(i)) => (None, Some(i)),
        // Deleting reads (it raises if unbound) and leaves the local unbound.
        (Opcode::DeleteFast, Operand::Local(i)) => (Some(i), Some(i)),
        (_, Operand::Cell(i)) => (Some(i), None),
        _ => (None, None),
    }
}

pub fn liveness(instructions: &[Instruction], locals: u32) -> Liveness {
    let len = instructions.len();
    let words = (locals as usize).div_ceil(64).max(1);
    let mut live_in = vec![0u64; len * words];
    let mut scratch = vec![0u64; words];
    // Backward dataflow to a fixed point; reverse order converges in a few passes.
    let mut changed = true;
    while changed {
        changed = false;
        for index in (0..len).rev() {
            let instruction = &instructions[index];
            scratch.iter_mut().for_each(|w| *w = 0);
            let mut union = |from: usize| {
                if from < len {
                    for w in 0..words {
                        scratch[w] |= live_in[from * words + w];
                    }
                }
            };
            if !instruction.opcode.ends_flow() {
                union(index + 1);
            }
            if let Some(target) = instruction.jump_target() {
                union(target.index());
            }
            let (read, write) = effect(instruction);
            if let Some(i) = write {
                if i < locals {
                    scratch[i as usize / 64] &= !(1u64 << (i % 64));
                }
            }
            if let Some(i) = read {
                if i < locals {
                    scratch[i as usize / 64] |= 1u64 << (i % 64);
                }
            }
            // An exception may leave from this instruction before anything is written.
            if let Some(handler) = instruction.handler {
                let h = handler.target.index();
                if h < len {
                    for w in 0..words {
                        scratch[w] |= live_in[h * words + w];
                    }
                }
            }
            let row = &mut live_in[index * words..(index + 1) * words];
            if row != scratch.as_slice() {
                row.copy_from_slice(&scratch);
                changed = true;
            }
        }
    }
    Liveness { words, live_in }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instruction::InstrIndex;

    #[test]
    fn store_kills_and_load_revives() {
        // 0 LOAD_FAST 0; 1 STORE_FAST 1; 2 LOAD_FAST 1; 3 RETURN_VALUE
        let code = [
            Instruction::new(Opcode::LoadFast, Operand::Local(0)),
            Instruction::new(Opcode::StoreFast, Operand::Local(1)),
            Instruction::new(Opcode::LoadFast, Operand::Local(1)),
            Instruction::new(Opcode::ReturnValue, Operand::None),
        ];
        let live = liveness(&code, 2);
        assert_eq!(live.live_locals(0), vec![0]);
        assert_eq!(live.live_locals(1), Vec::<u32>::new());
        assert_eq!(live.live_locals(2), vec![1]);
    }

    #[test]
    fn loops_keep_variables_live_around_the_back_edge() {
        // 0 LOAD_FAST 0; 1 POP_JUMP_IF_FALSE 4; 2 LOAD_FAST 1; 3 JUMP 0 (pops 2 via 1..); 4 RETURN
        let code = [
            Instruction::new(Opcode::LoadFast, Operand::Local(0)),
            Instruction::new(Opcode::PopJumpIfFalse, Operand::Jump(InstrIndex(5))),
            Instruction::new(Opcode::LoadFast, Operand::Local(1)),
            Instruction::new(Opcode::PopTop, Operand::None),
            Instruction::new(Opcode::Jump, Operand::Jump(InstrIndex(0))),
            Instruction::new(Opcode::LoadConst, Operand::Const(0)),
            Instruction::new(Opcode::ReturnValue, Operand::None),
        ];
        let live = liveness(&code, 2);
        assert_eq!(live.live_locals(0), vec![0, 1]);
        assert_eq!(live.live_locals(5), Vec::<u32>::new());
    }
}
