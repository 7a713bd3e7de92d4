//! Graph breaks: splitting a frame the translator cannot capture whole.
//!
//! When the translation of a frame fails at a root instruction `i` the frame can be split at
//! (see [`split_point`]), the frame is traced again from the start and stopped right before
//! `i` (`Tracer::stop_at`). What the trace computed up to there becomes a graph. The
//! generated code calls it, replays attribute stores, rebuilds the values the frame had on
//! its stack and in its live locals, runs instruction `i` itself (the call the trace could
//! not follow, a branch on a tensor's value), and hands the rest of the frame to a *resume
//! function*: a code object made from the original that starts right after `i` (at either
//! target, for a branch) and receives those values as arguments
//! (`dynamo_bytecode::resume`). The frame hook compiles a resume function when it is called,
//! like any other frame, so the code after the break gets graphs of its own.
//!
//! Inside a `try` or `with` block the generated code runs the instruction under an exception
//! handler of its own, which unwinds the stack as the original handler would and hands the
//! exception to a resume function starting at the original handler: the block's `except`,
//! `finally` or `__exit__` runs there, in the original code, with everything it had. For a
//! grad-mode `with` block the graph ends in the mode the frame started in (backends expect
//! graphs that leave it as they found it); the generated code sets the block's mode again
//! before the instruction, and the block's `__exit__` travels on the stack as a
//! `GradModeExit`, which the resume function calls where the block ends.
//!
//! Not split (the frame runs as it is, as before): instructions inside a loop (the resume
//! function would call itself once per iteration, as TorchDynamo also refuses), and
//! generators. Cell variables are passed by contents and get fresh cells in the resume
//! function (the trace's closures are never materialised, so nothing else holds the cells).

use super::break_reasons::{Break, BreakKind};
use std::collections::HashMap;

use crate::imports::ImportModule;
use dynamo_bytecode::resume::{in_loop, resume_instructions, ResumeLayout};
use dynamo_bytecode::{Instruction, Opcode, Operand};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::codegen::CodeGen;
use super::frame_state::frame_state;
use super::guards::NativeGuard;
use super::translator::{unsupported, CResult, CaptureError, FrameState, Tracer};
use super::vars::{Cell, VarId, VarKind};
use super::{Converter, Frame};

/// What happens at the break instruction in the generated code.
#[derive(Clone, Copy, Debug)]
enum Continuation {
    /// The instruction runs as it is; it pops `pops` values and pushes `pushes`, then the
    /// frame resumes at the next instruction.
    Run { pops: usize, pushes: usize },
    /// A `POP_JUMP_IF_*` on a value the trace could not decide: the frame resumes at the
    /// next instruction or at `target`, whichever the real value picks. `keeps_on_jump`:
    /// `JUMP_IF_FALSE_OR_POP`/`JUMP_IF_TRUE_OR_POP` (`a and b`, `a or b`), which leave the
    /// value on the stack when they jump.
    Branch { target: usize, keeps_on_jump: bool },
    /// `RAISE_VARARGS`: the instruction pops `pops` values and never continues (an
    /// enclosing handler, if any, takes over).
    Raise { pops: usize },
}

fn continuation(ins: &Instruction) -> Option<Continuation> {
    use Opcode::*;
    let arg = match ins.operand {
        Operand::Int(n) => n as usize,
        _ => 0,
    };
    let run = |pops, pushes| Some(Continuation::Run { pops, pushes });
    match ins.opcode {
        Call => run(arg + 2, 1),
        CallFunctionEx => run(3 + (arg & 1), 1),
        BinaryOp | CompareOp | BinarySubscr | ContainsOp | IsOp => run(2, 1),
        UnaryNot | UnaryNegative | UnaryPositive | UnaryInvert | LoadAttr => run(1, 1),
        StoreSubscr => run(3, 0),
        StoreGlobal => run(1, 0),
        DeleteSubscr | StoreAttr => run(2, 0),
        FormatValue => run(1 + usize::from(arg & 4 != 0), 1),
        BuildString | BuildSlice => run(arg, 1),
        RaiseVarargs => Some(Continuation::Raise { pops: arg }),
        // A context manager the translator does not follow: entered by the generated code,
        // the block's body (under its cleanup handler) runs in the resume function.
        BeforeWith => run(1, 2),
        PopJumpIfFalse | PopJumpIfTrue | PopJumpIfNone | PopJumpIfNotNone => {
            ins.jump_target().map(|t| Continuation::Branch {
                target: t.index(),
                keeps_on_jump: false,
            })
        }
        JumpIfFalseOrPop | JumpIfTrueOrPop => ins.jump_target().map(|t| Continuation::Branch {
            target: t.index(),
            keeps_on_jump: true,
        }),
        _ => None,
    }
}

/// The root instruction a failed trace of `state` can be split at, if any: the one it was
/// translating, when it is a kind of instruction the generated code can run itself, outside
/// any loop, outside generators.
pub fn split_point(state: &FrameState<'_>, code: &Bound<'_, PyAny>) -> CResult<Option<usize>> {
    let Some(index) = state.pc.checked_sub(1) else {
        return Ok(None);
    };
    Ok((state.is_root && can_split_at(&state.instructions, code, index)?).then_some(index))
}

/// Whether the frame of `code` could be split at instruction `index` when it is the root of
/// a trace: an instruction the generated code can run itself, outside loops, in a function
/// that is not a generator.
pub fn can_split_at(
    instructions: &[Instruction],
    code: &Bound<'_, PyAny>,
    index: usize,
) -> CResult<bool> {
    let Some(ins) = instructions.get(index) else {
        return Ok(false);
    };
    Ok(continuation(ins).is_some()
        && !in_loop(instructions, index)
        && code.getattr("co_flags")?.extract::<u32>()? & GENERATOR_FLAGS == 0)
}

/// Whether `code` is a method that can call zero-argument `super()`: it has positional
/// parameters and the compiler gave it a `__class__` free variable.
fn uses_zero_argument_super(code: &Bound<'_, PyAny>) -> CResult<bool> {
    let argcount: usize = code.getattr("co_argcount")?.extract()?;
    let freevars: Vec<String> = code.getattr("co_freevars")?.extract()?;
    Ok(argcount > 0 && freevars.iter().any(|name| name == "__class__"))
}

/// The names `state`'s code loads as globals (`LOAD_GLOBAL`), and as attributes or methods
/// (`LOAD_ATTR`, `LOAD_METHOD`).
fn loaded_names(state: &FrameState<'_>) -> CResult<(Vec<String>, Vec<String>)> {
    let (mut globals, mut attributes) = (Vec::new(), Vec::new());
    for ins in &state.instructions {
        let arg = ins.effect_arg() as usize;
        match ins.opcode {
            Opcode::LoadGlobal => globals.push(state.names.get_item(arg >> 1)?.to_string()),
            Opcode::LoadAttr | Opcode::LoadMethod => {
                attributes.push(state.names.get_item(arg)?.to_string())
            }
            _ => {}
        }
    }
    Ok((globals, attributes))
}

/// Whether the code calls a builtin that reads the frame's locals (`locals()`, `eval(...)`)
/// or reaches the frame itself (`sys._getframe()`, `inspect.currentframe()`): split at a
/// break, such a frame keeps every local it has bound, not only those its code reads again,
/// so what they see is the original's.
fn names_frame_readers(globals: &[String], attributes: &[String]) -> bool {
    use super::ops_frame_locals::FRAME_READING_BUILTINS as BUILTINS;
    const FRAME_GETTERS: [&str; 3] = ["_getframe", "currentframe", "getouterframes"];
    globals
        .iter()
        .any(|n| BUILTINS.contains(&n.as_str()) || FRAME_GETTERS.contains(&n.as_str()))
        || attributes
            .iter()
            .any(|n| FRAME_GETTERS.contains(&n.as_str()))
}

/// Whether the code makes weak references (`weakref.ref(y)`, `WeakValueDictionary`): such a
/// frame keeps every local it has bound alive across a break, as the original does until it
/// returns — a local no code reads again may still be what a weak reference points to.
fn names_weak_references(globals: &[String], attributes: &[String]) -> bool {
    const WEAK: [&str; 6] = [
        "ref",
        "proxy",
        "finalize",
        "WeakValueDictionary",
        "WeakKeyDictionary",
        "WeakSet",
    ];
    globals.iter().any(|n| n == "weakref")
        && globals
            .iter()
            .chain(attributes)
            .any(|n| WEAK.contains(&n.as_str()))
}

/// The name of every resume function starts with this: the hook compiles them even when
/// no tensor is among their arguments.
pub const RESUME_PREFIX: &str = "__resume_at_";

/// The name of a resume function starting at an exception handler starts with this; it runs
/// as it is (the translator does not follow exception handling, and only the path where the
/// instruction at the break raised reaches it).
pub const HANDLER_PREFIX: &str = "__handler_at_";

/// `CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR`.
const GENERATOR_FLAGS: u32 = 0x20 | 0x80 | 0x100 | 0x200;

/// One way out of the break: the resume function and the locals it receives.
#[derive(Debug)]
struct Exit {
    target: usize,
    locals: Vec<u32>,
    /// Every cell variable's slot (its cell object is passed, after the locals).
    cells: Vec<u32>,
    /// See [`ResumeLayout::receiver_to_slot_zero`].
    receiver_to_slot_zero: bool,
}

impl Exit {
    /// What the resume function for this exit receives, with the stack laid out as `nulls`.
    fn layout(&self, nulls: &[bool], contexts: &[usize]) -> ResumeLayout {
        ResumeLayout {
            stack_nulls: nulls.to_vec(),
            locals: self.locals.clone(),
            cells: self.cells.clone(),
            receiver_to_slot_zero: self.receiver_to_slot_zero,
            stack_contexts: contexts.to_vec(),
        }
    }
}

/// The frame's cell variables at the break: every cell's slot (the resume function gets the
/// cell itself), the slots and traced values of the frame's own cells that hold something
/// (the generated code stores each into its cell first), and those that hold nothing.
#[derive(Debug, Default)]
struct Cells {
    slots: Vec<u32>,
    values: Vec<(u32, VarId)>,
    empty: Vec<u32>,
}

impl Converter {
    /// The entry for a frame split at a graph break: the graph of what the trace computed
    /// before the break, and code that calls it, runs the break instruction and calls the
    /// resume function(s).
    pub(super) fn finish_break<'py>(
        &self,
        py: Python<'py>,
        tracer: &mut Tracer<'py>,
        split: Frame<'_, 'py>,
        t: std::time::Instant,
    ) -> CResult<(Py<NativeGuard>, Bound<'py, PyAny>)> {
        let state = split.state;
        if !state.handled.is_empty() {
            // Inside an `except` block for an exception the trace raised: the code after
            // the break would run with no exception being handled (a bare `raise`, an
            // exception's implicit `__context__`, `sys.exc_info()` in a callee).
            return unsupported(
                BreakKind::UnsupportedOperation,
                "a graph break inside an except block for an exception raised while tracing",
            );
        }
        let index = state.pc;
        let ins = state.instructions[index];
        let Some(continuation) = continuation(&ins) else {
            return unsupported(
                BreakKind::Internal,
                "internal: a graph break at an instruction that cannot run alone",
            );
        };
        let stack = state.stack.clone();
        let nulls: Vec<bool> = stack
            .iter()
            .map(|&id| matches!(tracer.kind_unobserved(id), VarKind::Null))
            .collect();
        // The stack right after the instruction: what it did not touch, then what it pushed.
        let (kept, exits) = match continuation {
            Continuation::Run { pops, pushes } => {
                if stack.len() < pops {
                    return unsupported(
                        BreakKind::Internal,
                        "internal: stack underflow at a graph break",
                    );
                }
                let kept = stack.len() - pops;
                (kept, vec![(index + 1, pushes)])
            }
            Continuation::Raise { pops } => {
                if stack.len() < pops {
                    return unsupported(
                        BreakKind::Internal,
                        "internal: stack underflow at a graph break",
                    );
                }
                (stack.len() - pops, Vec::new())
            }
            Continuation::Branch {
                target,
                keeps_on_jump,
            } => {
                if stack.is_empty() {
                    return unsupported(
                        BreakKind::Internal,
                        "internal: a branch on an empty stack",
                    );
                }
                let on_jump = usize::from(keeps_on_jump);
                (stack.len() - 1, vec![(index + 1, 0), (target, on_jump)])
            }
        };
        let liveness =
            dynamo_bytecode::liveness::liveness(&state.instructions, state.slot_names.len() as u32);
        let varnames = split.code.getattr("co_varnames")?.len()? as u32;
        // Cell variables (made by the frame's MAKE_CELLs, which the trace ran): passed by
        // contents, not as locals.
        let mut cells = Cells::default();
        let mut cell_slots: Vec<(usize, &Cell)> = state
            .cells
            .iter()
            .map(|(slot, cell)| (*slot, cell))
            .collect();
        cell_slots.sort_unstable_by_key(|(slot, _)| *slot);
        let first_free = state.slot_names.len() - split.code.getattr("co_freevars")?.len()?;
        for (slot, cell) in cell_slots {
            if slot >= first_free {
                continue; // a free variable's cell: the resume function has the same closure
            }
            cells.slots.push(slot as u32);
            // A cell a resume function was handed (`Cell::Real`) is already the one to pass,
            // and what the trace stored into it is replayed into it.
            if let Cell::Traced(contents) = cell {
                match *contents.borrow() {
                    Some(value) => cells.values.push((slot as u32, value)),
                    None => cells.empty.push(slot as u32),
                }
            }
        }
        // Zero-argument `super()` reads the frame's first local without naming it (no
        // liveness sees the use): a method with a `__class__` cell passes its receiver on
        // and puts it back in slot 0 (see `ResumeLayout::receiver_to_slot_zero`).
        let receiver = if uses_zero_argument_super(split.code)? {
            if cells.slots.contains(&0) {
                cells.values.iter().any(|(slot, _)| *slot == 0)
            } else {
                varnames > 0 && state.locals.first().is_some_and(|v| v.is_some())
            }
        } else {
            false
        };
        let (globals, attributes) = loaded_names(state)?;
        let reads_frame = names_frame_readers(&globals, &attributes);
        let keeps_all = reads_frame || names_weak_references(&globals, &attributes);
        let exit_to = |target: usize| {
            let passed = if keeps_all {
                (0..varnames).collect()
            } else {
                liveness.live_locals(target)
            };
            let mut locals: Vec<u32> = passed
                .into_iter()
                .filter(|&slot| {
                    slot < varnames
                        && state.locals[slot as usize].is_some()
                        && !cells.slots.contains(&slot)
                })
                .collect();
            if receiver && !cells.slots.contains(&0) && !locals.contains(&0) {
                locals.insert(0, 0);
            }
            Exit {
                target,
                locals,
                cells: cells.slots.clone(),
                receiver_to_slot_zero: receiver,
            }
        };
        let exits: Vec<(Exit, usize)> = exits
            .into_iter()
            .map(|(target, pushes)| (exit_to(target), pushes))
            .collect();
        // Inside a try or with block: where an exception from the instruction goes.
        let handler = match ins.handler {
            Some(h) if h.depth as usize > kept => {
                return unsupported(
                    BreakKind::Internal,
                    "internal: a handler deeper than the stack at a graph break",
                )
            }
            Some(h) => Some((h, exit_to(h.target.index()))),
            None => None,
        };

        // What the generated code rebuilds: every non-NULL stack value, then every local some
        // exit passes on. One plan set, so a list reached twice is refused (it would become
        // two lists).
        let mut roots: Vec<VarId> = stack
            .iter()
            .zip(&nulls)
            .filter(|(_, null)| !**null)
            .map(|(&id, _)| id)
            .collect();
        let stack_roots = roots.len();
        let mut local_plan: HashMap<u32, usize> = HashMap::new();
        let every_exit = exits
            .iter()
            .map(|(exit, _)| exit)
            .chain(handler.as_ref().map(|(_, exit)| exit));
        for exit in every_exit {
            for &slot in &exit.locals {
                local_plan.entry(slot).or_insert_with(|| {
                    roots.push(state.locals[slot as usize].expect("bound"));
                    roots.len() - 1
                });
            }
        }
        for &(slot, value) in &cells.values {
            roots.push(value);
            local_plan.insert(slot, roots.len() - 1);
        }
        // A call that reads the frame (`eval`, `sys._getframe`) sees every local the original
        // code has bound there, live after the break or not, in its own slot.
        let frame_read = (tracer.frame_read_break || reads_frame)
            && matches!(continuation, Continuation::Run { .. });
        if frame_read {
            for slot in 0..varnames {
                let bound = state.locals[slot as usize];
                if let Some(value) = bound {
                    if !cells.slots.contains(&slot)
                        && !local_plan.contains_key(&slot)
                        && tracer.rebuildable(value)
                    {
                        roots.push(value);
                        local_plan.insert(slot, roots.len() - 1);
                    }
                }
            }
        }
        // The generated code sets the mode of the blocks the break is in again before the
        // instruction.
        let break_grad_mode = tracer.end_in_entry_grad_mode()?;
        let (plans, graph) = self.compile_graph(py, tracer, split.code, &roots, t)?;
        let t = std::time::Instant::now();

        let mut gen = CodeGen::new(split.code, split.prologue, state.slot_names.clone())?;
        gen.set_positions(ins.positions);
        if let Some(compiled) = &graph.compiled {
            let rerun = super::rerun_plan(tracer, split.code)?;
            gen.call_graph(compiled, &graph.inputs, rerun.as_ref())?;
            gen.keep_outputs_in_local();
        } else {
            gen.set_grad_mode(graph.grad_mode_after)?;
        }
        gen.define_shared(&graph.shared)?;
        // Locals first, into temps: the stores replayed below and the break instruction may
        // change what their sources read.
        let mut local_temps: HashMap<u32, u32> = HashMap::new();
        let mut slots: Vec<u32> = local_plan.keys().copied().collect();
        slots.sort_unstable();
        for slot in slots {
            gen.push_rebuilt(&plans[local_plan[&slot]])?;
            let temp = gen.temp(&format!("___local_{}", state.slot_names[slot as usize]));
            gen.emit_instruction(Opcode::StoreFast, Operand::Local(temp));
            local_temps.insert(slot, temp);
        }
        // The stack as it was, NULLs included.
        let mut next_plan = 0;
        for &null in &nulls {
            if null {
                gen.emit_instruction(Opcode::PushNull, Operand::None);
            } else {
                gen.push_rebuilt(&plans[next_plan])?;
                next_plan += 1;
            }
        }
        debug_assert_eq!(next_plan, stack_roots);
        // The frame's cells hold what the trace left in them (the resume function and
        // closures made in the trace share them).
        for &(slot, _) in &cells.values {
            gen.emit_instruction(Opcode::LoadFast, Operand::Local(local_temps[&slot]));
            gen.store_frame_cell(slot);
        }
        for &slot in &cells.empty {
            gen.empty_frame_cell(slot);
        }
        // Stores the trace made to existing objects, before the instruction sees them.
        gen.replay(&graph.replays)?;
        gen.set_grad_mode(break_grad_mode)?;
        if frame_read {
            // Each local into its own slot, and the generated code's temps gone: the frame
            // reads as the original's would.
            let mut slots: Vec<u32> = local_temps.keys().copied().collect();
            slots.sort_unstable();
            for slot in slots {
                // (Cell variables are in their cells already.)
                if slot >= varnames || cells.slots.contains(&slot) {
                    continue;
                }
                gen.emit_instruction(Opcode::LoadFast, Operand::Local(local_temps[&slot]));
                gen.emit_instruction(Opcode::StoreFast, Operand::Local(slot));
                gen.emit_instruction(Opcode::DeleteFast, Operand::Local(local_temps[&slot]));
                local_temps.insert(slot, slot);
            }
        }
        // Nothing is rebuilt from the graph's outputs after this: the tuple is not kept alive
        // through the instruction and the rest of the frame.
        gen.drop_rebuild_temps();
        // Every value is in the stack and the temps now: the frame's own arguments are
        // unbound before the instruction, the temps as they are handed on to the resume
        // function. A value then lives where the original has it alone (the instruction, the
        // resume function's frame), and is freed when the code there drops it. Kept when the
        // instruction reads the frame.
        let release = !frame_read;
        if release {
            // (An argument that is also a cell variable holds its cell, which the resume
            // function is handed.)
            let cellvars: Vec<String> = split.code.getattr("co_cellvars")?.extract()?;
            for slot in 0..super::helpers::argument_slots(split.code)? as u32 {
                if !cellvars.contains(&state.slot_names[slot as usize]) {
                    gen.emit_instruction(Opcode::DeleteFast, Operand::Local(slot));
                }
            }
        }
        if let Some((h, _)) = &handler {
            // The stack is the original's, so the original handler's depth is right here.
            gen.begin_handled(h.depth, false);
        }
        let kept_nulls: Vec<bool> = nulls[..kept].to_vec();
        // Autocast (inference mode, sdpa_kernel) blocks the break is inside (their `__exit__`
        // below what the instruction takes): the generated code runs the instruction in a
        // real one, then leaves it
        // and hands the resume function the block's context, which the resume function
        // enters itself (as TorchDynamo's does) — its trace then leaves the block in its graph.
        let mut state_blocks = Vec::new();
        for (k, &id) in stack[..kept].iter().enumerate() {
            if let VarKind::StateContext(super::vars::StateContextVar::Exit { spec }) =
                *tracer.kind_unobserved(id)
            {
                state_blocks.push((k, tracer.state_handoff(spec)?));
            }
        }
        let resume_at = |gen: &mut CodeGen<'py>, exit: &Exit, nulls: &[bool]| {
            self.call_resume(
                py,
                gen,
                split.code,
                state,
                exit,
                nulls,
                &local_temps,
                &state_blocks,
                true,
                release,
            )
        };
        match continuation {
            Continuation::Run { .. } => {
                if ins.opcode == Opcode::Call {
                    if let Some(names) = &state.kw_names {
                        gen.emit_kw_names(names.as_any());
                    }
                    gen.emit_instruction(Opcode::Precall, ins.operand);
                }
                gen.emit_instruction(ins.opcode, ins.operand);
                gen.end_handled();
                let (exit, pushes) = &exits[0];
                let mut nulls = kept_nulls.clone();
                nulls.extend(std::iter::repeat_n(false, *pushes));
                resume_at(&mut gen, exit, &nulls)?;
            }
            Continuation::Raise { .. } => {
                gen.emit_instruction(ins.opcode, ins.operand);
                gen.end_handled();
            }
            Continuation::Branch { .. } => {
                let jump = gen.next_index();
                gen.emit_instruction(ins.opcode, Operand::Jump(dynamo_bytecode::InstrIndex(0)));
                gen.end_handled();
                let (fallthrough, _) = &exits[0];
                resume_at(&mut gen, fallthrough, &kept_nulls)?;
                gen.patch_jump_here(jump);
                // `JUMP_IF_*_OR_POP` jumps with the value still on the stack.
                let (taken, pushes) = &exits[1];
                let mut nulls = kept_nulls.clone();
                nulls.extend(std::iter::repeat_n(false, *pushes));
                resume_at(&mut gen, taken, &nulls)?;
            }
        }
        if let Some((h, exit)) = &handler {
            // The exception on top of the stack, unwound to the handler's depth; the resume
            // function starts at the original handler with the same stack, plus the offset of
            // the raising instruction if the handler takes one (a `with` block's cleanup
            // re-raises from there: the traceback's line) — its offset in the resume code.
            gen.patch_handlers_here();
            let exception = gen.temp("___exception");
            gen.emit_instruction(Opcode::StoreFast, Operand::Local(exception));
            let mut nulls = nulls[..h.depth as usize].to_vec();
            if h.lasti {
                nulls.push(false);
                let layout = exit.layout(&nulls, &[]);
                let lasti = resume_offset(state, h.target.index(), &layout, index, split.code)?;
                gen.load_const((lasti as i64).into_pyobject(py)?.as_any());
            }
            nulls.push(false);
            gen.emit_instruction(Opcode::LoadFast, Operand::Local(exception));
            // The cleanup calls the block's `__exit__` itself: the blocks stay entered.
            self.call_resume(
                py,
                &mut gen,
                split.code,
                state,
                exit,
                &nulls,
                &local_temps,
                &[],
                false,
                release,
            )?;
        }
        let new_code = gen.assemble()?;
        let t = self.lap("codegen", t);
        let guard = self.build_guard(py, tracer, &graph, &split)?;
        let t = self.lap("guards", t);
        if let Some(record) = &graph.record {
            self.save_persisted(py, tracer, &split, record, &graph, &new_code)?;
            self.lap("persistent cache", t);
        }
        Ok((guard, new_code))
    }

    /// Emits: the values on the stack (laid out as `nulls` says) into temps, then
    /// `return resume(stack values..., locals...)`; the stack slots of `contexts` (an
    /// state context block's `__exit__`) passed through their hand-off function (see
    /// `Tracer::state_handoff`), for the resume function to enter again.
    #[allow(clippy::too_many_arguments)]
    fn call_resume<'py>(
        &self,
        py: Python<'py>,
        gen: &mut CodeGen<'py>,
        code: &Bound<'py, PyAny>,
        state: &FrameState<'py>,
        exit: &Exit,
        nulls: &[bool],
        local_temps: &HashMap<u32, u32>,
        contexts: &[(usize, Bound<'py, PyAny>)],
        rebase: bool,
        release: bool,
    ) -> CResult<()> {
        // STORE_FAST pops the top first; a NULL stored leaves the temp unbound, harmlessly.
        let mut stack_temps = Vec::with_capacity(nulls.len());
        for (k, _) in nulls.iter().enumerate().rev() {
            let temp = gen.temp(&format!("___stack_{k}"));
            gen.emit_instruction(Opcode::StoreFast, Operand::Local(temp));
            stack_temps.push(temp);
        }
        stack_temps.reverse();
        let positions: Vec<usize> = contexts.iter().map(|(k, _)| *k).collect();
        let layout = exit.layout(nulls, &positions);
        let rebased = if rebase {
            rebased_resume_code(py, code, state, exit.target, &layout)?
        } else {
            None
        };
        let resume = match rebased {
            Some(resume) => resume,
            None => resume_code(py, code, state, exit.target, &layout)?,
        };
        gen.emit_instruction(Opcode::PushNull, Operand::None);
        let free_vars: Vec<String> = code.getattr("co_freevars")?.extract()?;
        if free_vars.is_empty() {
            gen.load_const(&resume);
            gen.emit_instruction(Opcode::MakeFunction, Operand::Int(0));
        } else {
            // The same closure as the frame's: its free-variable cells, in order.
            let first_free = state.slot_names.len() - free_vars.len();
            for k in 0..free_vars.len() {
                gen.load_closure((first_free + k) as u32);
            }
            gen.emit_instruction(Opcode::BuildTuple, Operand::Int(free_vars.len() as u32));
            gen.load_const(&resume);
            gen.emit_instruction(Opcode::MakeFunction, Operand::Int(0x08));
        }
        // The blocks left innermost first (each restores what its entering found).
        for (k, handoff) in contexts.iter().rev() {
            gen.emit_instruction(Opcode::PushNull, Operand::None);
            gen.load_const(handoff);
            gen.emit_instruction(Opcode::LoadFast, Operand::Local(stack_temps[*k]));
            gen.emit_instruction(Opcode::Precall, Operand::Int(1));
            gen.emit_instruction(Opcode::Call, Operand::Int(1));
            gen.emit_instruction(Opcode::StoreFast, Operand::Local(stack_temps[*k]));
        }
        let mut argc = 0;
        let mut pass = |gen: &mut CodeGen<'py>, temp: u32| {
            gen.emit_instruction(Opcode::LoadFast, Operand::Local(temp));
            if release {
                gen.emit_instruction(Opcode::DeleteFast, Operand::Local(temp));
            }
            argc += 1;
        };
        for (k, null) in nulls.iter().enumerate() {
            if !null {
                pass(gen, stack_temps[k]);
            }
        }
        for slot in &exit.locals {
            pass(gen, local_temps[slot]);
        }
        for &slot in &exit.cells {
            gen.load_closure(slot);
            argc += 1;
        }
        gen.emit_instruction(Opcode::Precall, Operand::Int(argc));
        gen.emit_instruction(Opcode::Call, Operand::Int(argc));
        gen.emit_instruction(Opcode::ReturnValue, Operand::None);
        Ok(())
    }
}

/// The offset (in code units, as `f_lasti` counts them) that instruction `index` of the
/// original has in the resume function at `target` with `layout`, whose body is the whole
/// original.
fn resume_offset(
    state: &FrameState<'_>,
    target: usize,
    layout: &ResumeLayout,
    index: usize,
    code: &Bound<'_, PyAny>,
) -> CResult<u32> {
    let (instructions, prologue_len) = resume_body(state, target, layout, code)?;
    let body_start = instructions.len() - (state.instructions.len() - prologue_len);
    let offsets = dynamo_bytecode::byte_offsets(&instructions).map_err(resume_failed)?;
    Ok(offsets[index - prologue_len + body_start] / 2)
}

/// The instructions of the resume function at `target` with `layout`, and the length of the
/// original's prologue they replaced.
fn resume_body(
    state: &FrameState<'_>,
    target: usize,
    layout: &ResumeLayout,
    code: &Bound<'_, PyAny>,
) -> CResult<(Vec<Instruction>, usize)> {
    let prologue_len = prologue_len(state)?;
    let free_vars = code.getattr("co_freevars")?.len()? as u32;
    let instructions =
        resume_instructions(&state.instructions, prologue_len, target, layout, free_vars)
            .map_err(resume_failed)?;
    Ok((instructions, prologue_len))
}

/// A resume function that could not be made (a bug: the frame runs as it is).
fn resume_failed(err: impl std::fmt::Display) -> CaptureError {
    CaptureError::Unsupported(Break::new(
        BreakKind::Internal,
        format!("internal: resume function: {err}"),
    ))
}

/// The length of the prologue of the frame's code (through its `RESUME`).
fn prologue_len(state: &FrameState<'_>) -> CResult<usize> {
    state
        .instructions
        .iter()
        .position(|i| i.opcode == Opcode::Resume)
        .map(|i| i + 1)
        .ok_or_else(|| {
            CaptureError::Unsupported(Break::new(BreakKind::Internal, "code without RESUME"))
        })
}

/// The code object of the resume function for `code` at `target` with `layout`, made once
/// and reused (by later compiles of the same frame too, so the resume function's own cache
/// entries accumulate on one code object).
fn resume_code<'py>(
    py: Python<'py>,
    code: &Bound<'py, PyAny>,
    state: &FrameState<'py>,
    target: usize,
    layout: &ResumeLayout,
) -> CResult<Bound<'py, PyAny>> {
    let cache = py
        .import_module("dynamo_rs._capture")?
        .getattr("RESUME_CODES")?
        .call_method1("setdefault", (code, PyDict::new(py)))?;
    // Which cells hold a value is part of the signature (a loop that ran or did not).
    let key = (
        target,
        PyTuple::new(py, &layout.stack_nulls)?,
        PyTuple::new(py, &layout.locals)?,
        PyTuple::new(py, &layout.cells)?,
        layout.receiver_to_slot_zero,
        PyTuple::new(py, &layout.stack_contexts)?,
    )
        .into_pyobject(py)?;
    if let Some(found) = cache
        .cast::<PyDict>()
        .map_err(PyErr::from)?
        .get_item(&key)?
    {
        return Ok(found);
    }
    let (instructions, original_prologue) = resume_body(state, target, layout, code)?;
    let flags: u32 = code.getattr("co_flags")?.extract()?;
    // Plain positional arguments: no `*args`/`**kwargs` flags.
    let flags = flags & !(0x04 | 0x08);
    let first_line: i32 = code.getattr("co_firstlineno")?.extract()?;
    let assembled =
        dynamo_bytecode::assemble(&instructions, first_line, flags).map_err(resume_failed)?;
    let offsets = dynamo_bytecode::byte_offsets(&state.instructions).map_err(resume_failed)?;
    // Argument names must not clash with the original's locals (a resume function of a
    // resume function has arguments of its own among them).
    let original: Vec<String> = code.getattr("co_varnames")?.extract()?;
    let mut prefix = String::from("___");
    while original.iter().any(|n| n.starts_with(&prefix)) {
        prefix.push('_');
    }
    let mut varnames: Vec<String> = Vec::new();
    varnames.extend((0..layout.stack_args()).map(|k| format!("{prefix}stack{k}")));
    varnames.extend(
        layout
            .locals
            .iter()
            .map(|&slot| format!("{prefix}arg_{}", state.slot_names[slot as usize])),
    );
    varnames.extend(
        layout
            .cells
            .iter()
            .map(|&slot| format!("{prefix}cell_{}", state.slot_names[slot as usize])),
    );
    varnames.extend(original);
    let number = cache.len()?;
    // A resume function starting at an exception handler runs as it is (`HANDLER_PREFIX`).
    let kind = if state.instructions[target].opcode == Opcode::PushExcInfo {
        HANDLER_PREFIX
    } else {
        RESUME_PREFIX
    };
    let name = format!("{kind}{}_{number}", offsets[target]);
    let qualname = format!("{}.{name}", code.getattr("co_qualname")?);
    let kwargs = PyDict::new(py);
    kwargs.set_item("co_argcount", layout.arg_count())?;
    kwargs.set_item("co_posonlyargcount", 0)?;
    kwargs.set_item("co_kwonlyargcount", 0)?;
    kwargs.set_item("co_nlocals", varnames.len())?;
    kwargs.set_item("co_varnames", PyTuple::new(py, &varnames)?)?;
    kwargs.set_item("co_flags", flags)?;
    kwargs.set_item("co_name", &name)?;
    kwargs.set_item("co_qualname", &qualname)?;
    let resume = crate::api::bytecode::code_with_tables(code, &assembled, kwargs)?;
    cache.set_item(&key, &resume)?;
    // Where its copy of the original's body starts, for `rebased_resume_code`.
    let body_start = instructions.len() + original_prologue - state.instructions.len();
    // The original by a weak reference: `RESUME_CODES` keeps the resume code alive as long
    // as the original lives, so a strong one back would keep both forever.
    let original = py.import_module("weakref")?.call_method1("ref", (code,))?;
    py.import_module("dynamo_rs._capture")?
        .getattr("RESUME_ORIGINS")?
        .set_item(&resume, (original, body_start, layout.arg_count()))?;
    Ok(resume)
}

/// For a break in a resume function of `code`'s original (`RESUME_ORIGINS`): the resume
/// function of the original itself at the same place, with the same values — so that paths
/// through different branches that meet again share it, as TorchDynamo's do (k data-dependent
/// branches in a row made up to 2^k resume functions, each compiled). None where the break
/// is not in the copied body, or the exit passes the resume function's own argument slots
/// (the receiver put back in slot 0 for `super()`): then a resume function of `code`.
fn rebased_resume_code<'py>(
    py: Python<'py>,
    code: &Bound<'py, PyAny>,
    state: &FrameState<'py>,
    target: usize,
    layout: &ResumeLayout,
) -> CResult<Option<Bound<'py, PyAny>>> {
    let origins = py
        .import_module("dynamo_rs._capture")?
        .getattr("RESUME_ORIGINS")?;
    let entry = origins.call_method1("get", (code,))?;
    if entry.is_none() {
        return Ok(None);
    }
    let (original, body_start, shift): (Bound<'py, PyAny>, usize, usize) = entry.extract()?;
    let original = original.call0()?;
    if original.is_none() {
        return Ok(None);
    }
    let shift = shift as u32;
    let slots = layout.locals.iter().chain(&layout.cells);
    if target < body_start || layout.receiver_to_slot_zero || slots.clone().any(|&s| s < shift) {
        return Ok(None);
    }
    let original_state = frame_state(
        &original,
        state.globals.clone(),
        state.builtins.clone(),
        false,
    )?;
    let original_target = target - body_start + prologue_len(&original_state)?;
    let unshift = |slots: &[u32]| slots.iter().map(|&s| s - shift).collect::<Vec<u32>>();
    let mapped = ResumeLayout {
        locals: unshift(&layout.locals),
        cells: unshift(&layout.cells),
        ..layout.clone()
    };
    resume_code(py, &original, &original_state, original_target, &mapped).map(Some)
}
