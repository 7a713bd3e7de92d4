//! Resume functions for graph breaks, as instruction lists.
//!
//! When a frame is split at a graph break, the part after the break runs in a *resume
//! function*: a code object made from the original whose arguments are the values the
//! original frame had on its stack and in its live locals at the resume point. Its code is:
//!
//! ```text
//! COPY_FREE_VARS n            (if the original has free variables: the same closure)
//! MAKE_CELL slot + shift                         for each cell variable: the original
//! LOAD_FAST arg_c; STORE_FAST slot + shift        frame's own cell object, in place of the
//!                                                 fresh one (see `resume_instructions`)
//! RESUME 0
//! DELETE_FAST arg_c                              for each cell passed in
//! LOAD_FAST arg_k; STORE_FAST slot + shift;      for each live local passed in
//!     DELETE_FAST arg_k
//! PUSH_NULL | LOAD_FAST arg_j; DELETE_FAST arg_j for each stack value, bottom first
//! JUMP_FORWARD <target>
//! <the original body, every local slot shifted past the arguments>
//! ```
//!
//! The arguments come first in the new code's locals (CPython binds them there), so every
//! original local, cell and free slot moves up by the number of arguments. Jump targets and
//! exception handlers of the body are renumbered; handler depths stay as they are, since the
//! stack is rebuilt exactly as it was. NULLs on the stack (the 3.11 calling convention) are
//! not values and cannot be passed: they are pushed again at their positions. Cell variables
//! are the original frame's cells themselves, stored into the cell slots (3.11 keeps a cell
//! variable's cell object in its slot, which `LOAD_DEREF` and `LOAD_CLOSURE` read): a closure
//! made before the break shares them, as in the original, and sees what the rest of the
//! frame stores into them. That happens before `RESUME`, as a function's own `MAKE_CELL`s
//! do, so that code standing in for a resume function (a compiled one) runs it too.
//!
//! Also here: [`in_loop`], since a break inside a loop is not split (the resume function
//! would call itself once per iteration).

use crate::error::{BytecodeError, Result};
use crate::instruction::{ExceptionHandler, InstrIndex, Instruction, Operand};
use crate::opcode::Opcode;

/// What a resume function receives, in argument order: the non-NULL stack values (bottom
/// first), then the original locals listed in `locals`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResumeLayout {
    /// For each stack slot at the resume point, bottom first: whether it holds NULL.
    pub stack_nulls: Vec<bool>,
    /// Original localsplus slots (plain locals, not cells) passed after the stack values.
    pub locals: Vec<u32>,
    /// Every cell variable's slot: its cell object is passed, after the locals.
    pub cells: Vec<u32>,
    /// The original calls zero-argument `super()`, which CPython answers from the frame's
    /// first local (the receiver, `self`): at the end of the prologue, the original slot 0
    /// (moved up with the others) is copied back to slot 0, an argument slot whose value has
    /// been moved out by then. The original slot 0 must be passed (a local, or a cell that
    /// holds it).
    pub receiver_to_slot_zero: bool,
    /// Stack slots (positions in `stack_nulls`) that hold the `__exit__` of a `with` block
    /// the resume function enters again itself: the argument is the context manager, which
    /// the prologue enters (`BEFORE_WITH`, the `__enter__` result dropped), leaving its
    /// `__exit__` where the original had it.
    pub stack_contexts: Vec<usize>,
}

impl ResumeLayout {
    /// Stack values passed as arguments (NULLs are not).
    pub fn stack_args(&self) -> usize {
        self.stack_nulls.iter().filter(|null| !**null).count()
    }

    /// Arguments of the resume function.
    pub fn arg_count(&self) -> usize {
        self.stack_args() + self.locals.len() + self.cells.len()
    }
}

/// Whether instruction `index` lies inside a loop: some jump at or after it goes back to or
/// before it.
pub fn in_loop(instructions: &[Instruction], index: usize) -> bool {
    instructions
        .iter()
        .enumerate()
        .skip(index)
        .any(|(at, ins)| {
            ins.jump_target()
                .is_some_and(|t| t.index() <= index && t.index() <= at)
        })
}

/// The instructions of the resume function for `original` resuming at `target`.
///
/// `prologue_len` is the length of the original's prologue (through its `RESUME`), replaced
/// by the new one; `free_vars` the number of free variables (for `COPY_FREE_VARS`).
pub fn resume_instructions(
    original: &[Instruction],
    prologue_len: usize,
    target: usize,
    layout: &ResumeLayout,
    free_vars: u32,
) -> Result<Vec<Instruction>> {
    if target < prologue_len || target >= original.len() {
        return Err(BytecodeError::BadInstruction {
            index: target,
            reason: "a resume target outside the body".into(),
        });
    }
    let shift = layout.arg_count() as u32;
    let positions = original[target].positions;
    let mut out = Vec::new();
    let mut emit = |opcode: Opcode, operand: Operand| {
        out.push(Instruction {
            opcode,
            operand,
            positions,
            handler: None,
        })
    };
    if free_vars > 0 {
        emit(Opcode::CopyFreeVars, Operand::Int(free_vars));
    }
    let stack_args = layout.stack_args() as u32;
    let first_cell_arg = stack_args + layout.locals.len() as u32;
    for (k, &slot) in layout.cells.iter().enumerate() {
        // `MAKE_CELL` first, replaced at once: CPython's `locals()` and `frame.f_locals` read a
        // cell slot through its cell only where a `MAKE_CELL` for it ran (they would show the
        // cell object itself).
        emit(Opcode::MakeCell, Operand::Cell(slot + shift));
        emit(Opcode::LoadFast, Operand::Local(first_cell_arg + k as u32));
        emit(Opcode::StoreFast, Operand::Local(slot + shift));
    }
    emit(Opcode::Resume, Operand::Int(0));
    // Each argument is unbound once moved: it would keep its value alive after the body
    // drops it (`x = layer(x)`), and `locals()` would show it.
    for k in 0..layout.cells.len() as u32 {
        emit(Opcode::DeleteFast, Operand::Local(first_cell_arg + k));
    }
    for (k, &slot) in layout.locals.iter().enumerate() {
        emit(Opcode::LoadFast, Operand::Local(stack_args + k as u32));
        emit(Opcode::StoreFast, Operand::Local(slot + shift));
        emit(Opcode::DeleteFast, Operand::Local(stack_args + k as u32));
    }
    let mut next_arg = 0;
    for (k, &null) in layout.stack_nulls.iter().enumerate() {
        if null {
            emit(Opcode::PushNull, Operand::None);
        } else {
            emit(Opcode::LoadFast, Operand::Local(next_arg));
            emit(Opcode::DeleteFast, Operand::Local(next_arg));
            next_arg += 1;
            if layout.stack_contexts.contains(&k) {
                emit(Opcode::BeforeWith, Operand::None);
                emit(Opcode::PopTop, Operand::None);
            }
        }
    }
    if layout.receiver_to_slot_zero {
        if layout.cells.contains(&0) {
            emit(Opcode::LoadDeref, Operand::Cell(shift));
        } else {
            emit(Opcode::LoadFast, Operand::Local(shift));
        }
        emit(Opcode::StoreFast, Operand::Local(0));
    }
    // The body starts after the jump.
    let body_start = out.len() + 1;
    let renumber = |index: InstrIndex, at: usize| -> Result<InstrIndex> {
        if index.index() < prologue_len {
            return Err(BytecodeError::BadInstruction {
                index: at,
                reason: "a jump into the prologue".into(),
            });
        }
        Ok(InstrIndex(
            (index.index() - prologue_len + body_start) as u32,
        ))
    };
    let jump = renumber(InstrIndex(target as u32), target)?;
    out.push(Instruction {
        opcode: Opcode::Jump,
        operand: Operand::Jump(jump),
        positions,
        handler: None,
    });
    for (at, ins) in original.iter().enumerate().skip(prologue_len) {
        let operand = match ins.operand {
            Operand::Local(slot) => Operand::Local(slot + shift),
            Operand::Cell(slot) => Operand::Cell(slot + shift),
            Operand::Jump(t) => Operand::Jump(renumber(t, at)?),
            other => other,
        };
        let handler = match ins.handler {
            Some(h) => Some(ExceptionHandler {
                target: renumber(h.target, at)?,
                ..h
            }),
            None => None,
        };
        out.push(Instruction {
            operand,
            handler,
            ..*ins
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ins(opcode: Opcode, operand: Operand) -> Instruction {
        Instruction::new(opcode, operand)
    }

    /// RESUME; LOAD_FAST 0; LOAD_FAST 1; BINARY_OP; POP_JUMP_IF_FALSE 7; LOAD_CONST 0;
    /// RETURN_VALUE; LOAD_FAST 0; RETURN_VALUE
    fn sample() -> Vec<Instruction> {
        vec![
            ins(Opcode::Resume, Operand::Int(0)),
            ins(Opcode::LoadFast, Operand::Local(0)),
            ins(Opcode::LoadFast, Operand::Local(1)),
            ins(Opcode::BinaryOp, Operand::Int(0)),
            ins(Opcode::PopJumpIfFalse, Operand::Jump(InstrIndex(7))),
            ins(Opcode::LoadConst, Operand::Const(0)),
            ins(Opcode::ReturnValue, Operand::None),
            ins(Opcode::LoadFast, Operand::Local(0)),
            ins(Opcode::ReturnValue, Operand::None),
        ]
    }

    #[test]
    fn resume_moves_locals_pushes_stack_and_jumps() {
        let layout = ResumeLayout {
            stack_nulls: vec![true, false],
            locals: vec![0],
            cells: vec![],
            receiver_to_slot_zero: false,
            stack_contexts: Vec::new(),
        };
        let out = resume_instructions(&sample(), 1, 4, &layout, 0).unwrap();
        let ops: Vec<_> = out.iter().map(|i| (i.opcode, i.operand)).collect();
        // 2 arguments: the stack value (slot 0) and local 0 (slot 1); originals shift by 2.
        // Each argument is unbound once moved.
        assert_eq!(ops[0], (Opcode::Resume, Operand::Int(0)));
        assert_eq!(ops[1], (Opcode::LoadFast, Operand::Local(1)));
        assert_eq!(ops[2], (Opcode::StoreFast, Operand::Local(2)));
        assert_eq!(ops[3], (Opcode::DeleteFast, Operand::Local(1)));
        assert_eq!(ops[4], (Opcode::PushNull, Operand::None));
        assert_eq!(ops[5], (Opcode::LoadFast, Operand::Local(0)));
        assert_eq!(ops[6], (Opcode::DeleteFast, Operand::Local(0)));
        // The jump lands on the original instruction 4, now at 8 + (4 - 1) = 11.
        assert_eq!(ops[7], (Opcode::Jump, Operand::Jump(InstrIndex(11))));
        assert_eq!(out[11].opcode, Opcode::PopJumpIfFalse);
        // The body's own jump is renumbered the same way, and its locals shifted.
        assert_eq!(out[11].operand, Operand::Jump(InstrIndex(14)));
        assert_eq!(out[14].operand, Operand::Local(2));
    }

    #[test]
    fn the_receiver_is_copied_back_to_slot_zero_after_the_stack_is_rebuilt() {
        // `super()` reads localsplus[0]: the original local 0, passed second here (after a
        // stack value), must be there when the body runs; as a cell, by its contents.
        for (cells, load) in [
            (vec![], (Opcode::LoadFast, Operand::Local(2))),
            (vec![0], (Opcode::LoadDeref, Operand::Cell(2))),
        ] {
            let passed_as_cell = !cells.is_empty();
            let layout = ResumeLayout {
                stack_nulls: vec![false],
                locals: if passed_as_cell { vec![] } else { vec![0] },
                cells,
                receiver_to_slot_zero: true,
                stack_contexts: Vec::new(),
            };
            let out = resume_instructions(&sample(), 1, 4, &layout, 0).unwrap();
            let ops: Vec<_> = out.iter().map(|i| (i.opcode, i.operand)).collect();
            let jump = ops.iter().position(|(op, _)| *op == Opcode::Jump).unwrap();
            // The stack value is pushed first, then the receiver lands in slot 0.
            assert_eq!(ops[jump - 4], (Opcode::LoadFast, Operand::Local(0)));
            assert_eq!(ops[jump - 3], (Opcode::DeleteFast, Operand::Local(0)));
            assert_eq!(ops[jump - 2], load);
            assert_eq!(ops[jump - 1], (Opcode::StoreFast, Operand::Local(0)));
        }
    }

    #[test]
    fn handlers_are_renumbered() {
        let mut code = sample();
        code[5].handler = Some(ExceptionHandler {
            target: InstrIndex(7),
            depth: 0,
            lasti: false,
        });
        let layout = ResumeLayout {
            stack_nulls: vec![],
            locals: vec![],
            cells: vec![],
            receiver_to_slot_zero: false,
            stack_contexts: Vec::new(),
        };
        let out = resume_instructions(&code, 1, 5, &layout, 1).unwrap();
        // COPY_FREE_VARS, RESUME, JUMP, then the body from original 1.
        assert_eq!(out[0].opcode, Opcode::CopyFreeVars);
        let moved = &out[3 + 4];
        assert_eq!(moved.opcode, Opcode::LoadConst);
        assert_eq!(moved.handler.unwrap().target, InstrIndex(3 + 6));
    }

    #[test]
    fn cells_are_the_original_cells_stored_before_resume() {
        let layout = ResumeLayout {
            stack_nulls: vec![],
            locals: vec![],
            cells: vec![2, 3],
            receiver_to_slot_zero: false,
            stack_contexts: Vec::new(),
        };
        let out = resume_instructions(&sample(), 1, 4, &layout, 0).unwrap();
        let ops: Vec<_> = out.iter().take(7).map(|i| (i.opcode, i.operand)).collect();
        assert_eq!(
            ops,
            vec![
                (Opcode::MakeCell, Operand::Cell(4)),
                (Opcode::LoadFast, Operand::Local(0)),
                (Opcode::StoreFast, Operand::Local(4)),
                (Opcode::MakeCell, Operand::Cell(5)),
                (Opcode::LoadFast, Operand::Local(1)),
                (Opcode::StoreFast, Operand::Local(5)),
                (Opcode::Resume, Operand::Int(0)),
            ]
        );
    }

    #[test]
    fn loops_are_found() {
        let mut code = sample();
        assert!(!in_loop(&code, 3));
        code[8] = ins(Opcode::Jump, Operand::Jump(InstrIndex(2)));
        assert!(in_loop(&code, 3));
        assert!(in_loop(&code, 2));
        assert!(!in_loop(&code, 1));
    }

    #[test]
    fn targets_outside_the_body_are_refused() {
        let layout = ResumeLayout {
            stack_nulls: vec![],
            locals: vec![],
            cells: vec![],
            receiver_to_slot_zero: false,
            stack_contexts: Vec::new(),
        };
        assert!(resume_instructions(&sample(), 1, 0, &layout, 0).is_err());
        assert!(resume_instructions(&sample(), 1, 9, &layout, 0).is_err());
    }
}
