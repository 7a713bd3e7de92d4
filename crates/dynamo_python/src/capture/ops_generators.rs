//! Generator functions called in traced code (`self.parameters()`, `self.children()`, a
//! user generator consumed by a loop or `sum`): run to the end when called, like generator
//! expressions, and handed on as an iterator over what they yielded.
//!
//! Running a generator ahead of its consumer is only what Python does when the two do not
//! interleave observably: the generator's body must change nothing (no container, attribute,
//! global, cell or set written, no tensor changed in place — counted by `Tracer::effects`),
//! else the call breaks the graph and runs as it is.

use super::break_reasons::BreakKind;
use super::translator::{CResult, Flow, FrameState, Tracer};
use super::vars::{VarId, VarKind};
use dynamo_bytecode::Instruction;

/// Items a generator may yield before the trace gives up on running it ahead (an endless
/// generator would never finish).
pub const MAX_YIELDS: usize = 10_000;

impl<'py> Tracer<'py> {
    /// Runs the generator frame `state` to the end; its items as an iterator.
    pub(super) fn run_generator(&mut self, state: &mut FrameState<'py>) -> CResult<VarId> {
        // What a generator nested in another run ahead changes is the outer one's own (the
        // floor stays the outermost's).
        state.yields = Some(Vec::new());
        self.without_effects("a generator", |t| {
            t.enter_depth()?;
            let result = t.run(state);
            t.depth -= 1;
            result
        })
    }

    /// Counts a change to Python state; `target` is the tracker changed, if any (one made
    /// inside the generator being run ahead does not count, unless it stands for an object
    /// that existed before: a global list first read there is still the caller's).
    pub fn note_effect(&mut self, target: Option<VarId>) {
        let private = target.is_some_and(|t| {
            t.0 >= self.effects_floor && self.source(t).is_none() && !self.is_existing_container(t)
        });
        if !private {
            self.effects += 1;
        }
    }

    /// `GET_YIELD_FROM_ITER` in a generator run ahead: an iterator over the operand.
    pub(super) fn op_get_yield_from_iter(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let iterable = self.pop(f)?;
        let iterator = if matches!(self.kind(iterable), VarKind::Iter { .. }) {
            iterable
        } else {
            let items = self.items_of(iterable)?;
            self.new_iter(items, &[iterable])
        };
        f.stack.push(iterator);
        Ok(Flow::Continue)
    }

    /// `SEND` of `yield from`: the next item of the sub-iterator in place of the value sent
    /// (always None here), or, once it is exhausted, both popped and None (its return
    /// value, which the trace does not keep) pushed at the jump target.
    pub(super) fn op_send(&mut self, f: &mut FrameState<'py>, ins: &Instruction) -> CResult<Flow> {
        let _sent = self.pop(f)?;
        let iterator = *f.stack.last().ok_or_else(|| {
            super::translator::CaptureError::Unsupported(super::break_reasons::Break::new(
                BreakKind::Internal,
                "SEND on an empty stack",
            ))
        })?;
        match self.iter_advance(iterator)? {
            Some(item) => f.stack.push(item),
            None => {
                f.stack.pop();
                let none = self.constant(&self.py.None().into_bound(self.py));
                f.stack.push(none);
                f.pc = ins.jump_target().map_or(f.pc, |t| t.index());
            }
        }
        Ok(Flow::Continue)
    }
}
