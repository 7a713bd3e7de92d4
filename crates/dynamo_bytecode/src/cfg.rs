//! Basic blocks of a decoded instruction list. A block starts at the entry, at every jump or
//! handler target, after every jump or flow-ending instruction, and wherever the covering
//! exception handler changes, so every instruction of a block shares one handler.

use crate::instruction::Instruction;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u32);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicBlock {
    /// First instruction index.
    pub start: usize,
    /// One past the last instruction index.
    pub end: usize,
    /// Normal successors: the jump target and/or the fall-through block.
    pub successors: Vec<BlockId>,
    /// Where an exception raised inside the block goes.
    pub handler: Option<BlockId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cfg {
    pub blocks: Vec<BasicBlock>,
    /// The block each instruction belongs to.
    pub block_of: Vec<BlockId>,
}

impl Cfg {
    pub fn build(instructions: &[Instruction]) -> Cfg {
        let len = instructions.len();
        let mut leader = vec![false; len + 1];
        if len > 0 {
            leader[0] = true;
        }
        for (index, instruction) in instructions.iter().enumerate() {
            if let Some(target) = instruction.jump_target() {
                leader[target.index().min(len)] = true;
            }
            if let Some(handler) = instruction.handler {
                leader[handler.target.index().min(len)] = true;
            }
            if instruction.jump_target().is_some() || instruction.opcode.ends_flow() {
                leader[index + 1] = true;
            }
            if index > 0 && instructions[index - 1].handler != instruction.handler {
                leader[index] = true;
            }
        }
        let mut block_of = Vec::with_capacity(len);
        let mut starts = Vec::new();
        for (index, &is_leader) in leader.iter().enumerate().take(len) {
            if is_leader {
                starts.push(index);
            }
            block_of.push(BlockId(starts.len() as u32 - 1));
        }
        let block_at = |index: usize| block_of.get(index).copied();
        let mut blocks = Vec::with_capacity(starts.len());
        for (b, &start) in starts.iter().enumerate() {
            let end = starts.get(b + 1).copied().unwrap_or(len);
            let last = &instructions[end - 1];
            let mut successors = Vec::new();
            if let Some(target) = last.jump_target().and_then(|t| block_at(t.index())) {
                successors.push(target);
            }
            if !last.opcode.ends_flow() {
                if let Some(next) = block_at(end) {
                    if !successors.contains(&next) {
                        successors.push(next);
                    }
                }
            }
            let handler = instructions[start]
                .handler
                .and_then(|h| block_at(h.target.index()));
            blocks.push(BasicBlock {
                start,
                end,
                successors,
                handler,
            });
        }
        Cfg { blocks, block_of }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instruction::{InstrIndex, Operand};
    use crate::opcode::Opcode;

    #[test]
    fn splits_at_targets_and_after_jumps() {
        // 0 LOAD_FAST; 1 POP_JUMP_IF_TRUE 3; 2 RETURN_VALUE; 3 RETURN_VALUE
        let code = [
            Instruction::new(Opcode::LoadFast, Operand::Local(0)),
            Instruction::new(Opcode::PopJumpIfTrue, Operand::Jump(InstrIndex(3))),
            Instruction::new(Opcode::LoadConst, Operand::Const(0)),
            Instruction::new(Opcode::ReturnValue, Operand::None),
        ];
        let cfg = Cfg::build(&code);
        let spans: Vec<_> = cfg.blocks.iter().map(|b| (b.start, b.end)).collect();
        assert_eq!(spans, vec![(0, 2), (2, 3), (3, 4)]);
        assert_eq!(cfg.blocks[0].successors, vec![BlockId(2), BlockId(1)]);
        assert_eq!(cfg.blocks[1].successors, vec![BlockId(2)]);
        assert!(cfg.blocks[2].successors.is_empty());
    }
}
