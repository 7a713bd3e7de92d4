//! Tensors handed to a frame inside tuples, made graph inputs only when the trace uses them.
//!
//! A frame split at a call that breaks the graph gets the call's result whole: after
//! `out, _ = self.lstm(x)` the resume function receives `(out, (h, c))`, and `h` and `c`
//! are stored in a dead local and never read. Wrapping every tensor eagerly gives each a
//! placeholder, a fake tensor (with symbolic sizes once automatic dynamic shapes made them
//! dynamic — milliseconds each through torch's ShapeEnv) and a guard on its metadata, for
//! nothing. TorchDynamo realises such inputs lazily; so does this.
//!
//! Tensor arguments and the tensors in tuples among the frame's arguments (through tuples
//! only) start as `VarKind::Unrealized`. Only a few instructions move values without
//! looking at them: loads and stores of locals, `POP_TOP`, `COPY`/`SWAP`, constants,
//! unconditional jumps (a resume function starts with one), a tuple indexed by a constant,
//! `UNPACK_SEQUENCE` of a tuple (which pushes its items), `BUILD_TUPLE` and `RETURN_VALUE`.
//! Before any other instruction every unrealized
//! tracker reachable from the stack is realised in place — wrapped as it would have been
//! at the start (`Tracer::wrap`: placeholder, fake, guard), its tracker id kept so that the
//! tuples and locals holding it see the tensor. So no operation, call or inlined frame ever
//! sees an unrealized value, and locals are reached only through the stack. What is left
//! unrealized at the end — in a dead local, or passed on at a graph break or returned — is
//! rebuilt by loading it from its source (`rebuild`): the frame's own argument tuple,
//! which the generated code never overwrites.

use std::rc::Rc;

use dynamo_bytecode::{Instruction, Opcode};
use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::frame_state::FrameState;
use super::source::Source;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// A tensor from `source` (an item of an argument tuple) left for `realize`.
    pub(super) fn unrealized(&mut self, value: &Bound<'py, PyAny>, source: Rc<Source>) -> VarId {
        self.has_unrealized = true;
        self.add(
            VarKind::Unrealized(OwnedRef::from_bound(value)),
            Some(source),
        )
    }

    /// Realises what `ins` could look at: every unrealized tracker on the stack (and in
    /// tuples on it), unless `ins` only moves values.
    pub(super) fn realize_for(
        &mut self,
        frame: &mut FrameState<'py>,
        ins: &Instruction,
    ) -> CResult<()> {
        use Opcode::*;
        match ins.opcode {
            Nop | Resume | ExtendedArg | Cache | LoadFast | StoreFast | DeleteFast | PopTop
            | LoadConst | Copy | Swap | PushNull | Jump | JumpNoInterrupt => Ok(()),
            // A tuple holds its items as they are (`return out, state`); what is returned
            // is rebuilt from its source if nothing realised it.
            BuildTuple | ReturnValue => Ok(()),
            // Pushes the tuple's items as they are; a tensor unpacked is iterated.
            UnpackSequence => match frame.stack.last() {
                Some(&top) if matches!(self.kind_unobserved(top), VarKind::Tuple(_)) => Ok(()),
                Some(&top) => self.realize_within(top),
                None => Ok(()),
            },
            // `self.lstm(x)[0]`: a tuple indexed by a constant (an int or a slice) pushes the
            // item (or a tuple of the items) as it is.
            BinarySubscr if self.constant_index_of_tuple(frame) => Ok(()),
            // The slice of such an index (`pair[1:]`), made of constants.
            BuildSlice if self.constants_on_top(frame, ins.effect_arg() as usize) => Ok(()),
            _ => {
                for at in 0..frame.stack.len() {
                    self.realize_within(frame.stack[at])?;
                }
                Ok(())
            }
        }
    }

    /// Whether the stack's top two values are a tuple and a constant to index it with.
    fn constant_index_of_tuple(&self, frame: &FrameState<'py>) -> bool {
        let n = frame.stack.len();
        n >= 2
            && matches!(self.kind_unobserved(frame.stack[n - 2]), VarKind::Tuple(_))
            && matches!(self.kind_unobserved(frame.stack[n - 1]), VarKind::Const(_))
    }

    /// Whether the stack's top `n` values are constants.
    fn constants_on_top(&self, frame: &FrameState<'py>, n: usize) -> bool {
        frame.stack.len() >= n
            && frame.stack[frame.stack.len() - n..]
                .iter()
                .all(|&id| matches!(self.kind_unobserved(id), VarKind::Const(_)))
    }

    /// Realises `id` if it is unrealized, and the unrealized trackers in it if it is a tuple
    /// (the only container they are ever put in).
    pub(super) fn realize_within(&mut self, id: VarId) -> CResult<()> {
        match self.kind_unobserved(id) {
            VarKind::Unrealized(_) => self.realize(id),
            VarKind::Tuple(items) => {
                for item in items.clone() {
                    self.realize_within(item)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Makes the unrealized tracker `id` what wrapping its value would have made when the
    /// frame started (a graph input), keeping its id.
    fn realize(&mut self, id: VarId) -> CResult<()> {
        let VarKind::Unrealized(value) = self.kind_unobserved(id) else {
            return Ok(());
        };
        let value = value.bind(self.py).clone();
        let source = self.source(id);
        let wrapped = self.wrap(&value, source)?;
        let VarKind::Tensor { node, fake } = self.kind(wrapped) else {
            return unsupported(
                BreakKind::Internal,
                "internal: a tensor input wrapped as another kind",
            );
        };
        let kind = VarKind::Tensor {
            node: *node,
            fake: fake.clone(),
        };
        self.vars[id.0 as usize].kind = kind;
        Ok(())
    }
}

/// What an operation does if it is ever handed an unrealized tracker: nothing but the
/// instructions `realize_for` lets through should see one, so this is an internal error
/// (the frame then runs as it is), never a value taken for another kind.
pub(super) fn unrealized_reached<T>() -> CResult<T> {
    unsupported(
        BreakKind::Internal,
        "internal: an operation reached a tensor input not yet realised",
    )
}
