//! Stack depth before every instruction, and the maximum (`co_stacksize`), found by walking
//! every path from the entry as CPython 3.11's compiler does: each jump carries its "taken"
//! effect to the target, each instruction covered by an exception handler carries the
//! handler's entry depth (`depth + lasti + 1`) to the handler.
//!
//! CPython computes depths before it drops its `SETUP_*` pseudo-instructions, so it also
//! counts handlers whose protected code the optimizer removed. No path reaches those in the
//! final bytecode; their depth is recovered from what is left (see [`Walker::infer_orphans`]).

use crate::error::{BytecodeError, Result};
use crate::instruction::Instruction;
use crate::opcode::Opcode;
use crate::py311::stack_effect::stack_effect;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackDepths {
    /// Depth before each instruction; `None` for instructions no path reaches.
    pub before: Vec<Option<u32>>,
    /// The largest depth reached anywhere, which CPython stores as `co_stacksize`.
    pub max: u32,
}

/// `co_flags` bits of code that starts suspended: generators, coroutines, async generators.
/// Their first instruction runs with the value sent by the first `send()` on the stack.
pub const GENERATOR_FLAGS: u32 = 0x20 | 0x80 | 0x200;

/// Stack depths of `instructions` from a code object with flags `co_flags`.
pub fn stack_depths(instructions: &[Instruction], co_flags: u32) -> Result<StackDepths> {
    let mut walker = Walker {
        instructions,
        before: vec![None; instructions.len()],
        max: 0,
        work: Vec::new(),
    };
    if !instructions.is_empty() {
        let entry_depth = i64::from(co_flags & GENERATOR_FLAGS != 0);
        walker.max = entry_depth;
        walker.reach(0, entry_depth, 0)?;
    }
    walker.run()?;
    while walker.infer_orphans()? {
        walker.run()?;
    }
    let max = u32::try_from(walker.max).map_err(|_| bad(0, "stack too deep".into()))?;
    Ok(StackDepths {
        before: walker.before,
        max,
    })
}

fn bad(index: usize, reason: String) -> BytecodeError {
    BytecodeError::BadStack { index, reason }
}

struct Walker<'a> {
    instructions: &'a [Instruction],
    before: Vec<Option<u32>>,
    max: i64,
    work: Vec<usize>,
}

impl Walker<'_> {
    /// Records that `index` is reached at `depth` and queues it if it is new. A second path
    /// must arrive at the same depth.
    fn reach(&mut self, index: usize, depth: i64, from: usize) -> Result<bool> {
        if index >= self.before.len() {
            return Err(bad(
                from,
                format!("control flows to instruction {index}, past the end"),
            ));
        }
        if depth < 0 {
            return Err(bad(from, format!("stack depth would be {depth}")));
        }
        match self.before[index] {
            Some(known) if i64::from(known) == depth => Ok(false),
            Some(known) => Err(bad(
                index,
                format!("reached with depth {known} and {depth}"),
            )),
            None => {
                self.before[index] = Some(depth as u32);
                self.max = self.max.max(depth);
                self.work.push(index);
                Ok(true)
            }
        }
    }

    /// Follows every queued path forward.
    fn run(&mut self) -> Result<()> {
        let instructions = self.instructions;
        while let Some(index) = self.work.pop() {
            let depth = i64::from(self.before[index].expect("queued instructions have a depth"));
            let instruction = &instructions[index];
            let arg = instruction.effect_arg();
            let after = depth + stack_effect(instruction.opcode, arg, Some(false));
            if after < 0 {
                return Err(bad(index, format!("stack depth would be {after}")));
            }
            self.max = self.max.max(after);
            if let Some(target) = instruction.jump_target() {
                let taken = depth + stack_effect(instruction.opcode, arg, Some(true));
                self.reach(target.index(), taken, index)?;
            }
            if let Some(handler) = instruction.handler {
                let entry = i64::from(handler.depth) + i64::from(handler.lasti) + 1;
                self.reach(handler.target.index(), entry, index)?;
            }
            if !instruction.opcode.ends_flow() {
                self.reach(index + 1, after, index)?;
            }
        }
        Ok(())
    }

    /// Gives a depth to unreached code, returning whether it found any:
    /// - an unreached instruction that flows into reached code has the depth that leads there
    ///   (solved backward, so a straight run of orphans is done in one pass);
    /// - an unreached `PUSH_EXC_INFO` under its own cleanup handler starts a handler whose entry
    ///   depth is that cleanup's depth (CPython pushes the cleanup right at handler entry).
    fn infer_orphans(&mut self) -> Result<bool> {
        let instructions = self.instructions;
        let mut found = false;
        for index in (0..instructions.len()).rev() {
            if self.before[index].is_some() {
                continue;
            }
            let instruction = &instructions[index];
            let arg = instruction.effect_arg();
            let known = |i: usize| self.before.get(i).copied().flatten().map(i64::from);
            let fall_through = if instruction.opcode.ends_flow() {
                None
            } else {
                known(index + 1)
            };
            let depth = match (fall_through, instruction.jump_target()) {
                (Some(next), _) => Some(next - stack_effect(instruction.opcode, arg, Some(false))),
                (None, Some(target)) => known(target.index())
                    .map(|t| t - stack_effect(instruction.opcode, arg, Some(true))),
                (None, None) => None,
            };
            if let Some(depth) = depth.filter(|&d| d >= 0) {
                self.before[index] = Some(depth as u32);
                self.max = self.max.max(depth);
                self.work.push(index);
                found = true;
            }
        }
        if found {
            return Ok(true);
        }
        let orphan_handler = instructions.iter().enumerate().find(|(i, instr)| {
            self.before[*i].is_none()
                && instr.opcode == Opcode::PushExcInfo
                && instr.handler.is_some()
        });
        if let Some((index, instruction)) = orphan_handler {
            let depth = instruction.handler.expect("filtered on handler").depth;
            return self.reach(index, i64::from(depth), index);
        }
        Ok(false)
    }
}
