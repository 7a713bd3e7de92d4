//! Control flow: branches on values known at trace time (a branch on a tensor's value is
//! unsupported until graph breaks exist), and `for` loops over known items, unrolled.

use super::break_reasons::{Break, BreakKind};
use dynamo_bytecode::{Instruction, Opcode};
use pyo3::prelude::*;

use super::translator::{kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::VarKind;
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    pub(super) fn op_branch(
        &mut self,
        f: &mut FrameState<'py>,
        ins: &Instruction,
    ) -> CResult<Flow> {
        let Some(target) = ins.jump_target() else {
            return unsupported(BreakKind::Internal, "a jump without a target");
        };
        let value = *f
            .stack
            .last()
            .ok_or(super::translator::CaptureError::Unsupported(Break::new(
                BreakKind::Internal,
                "empty stack at a branch",
            )))?;
        if ins.opcode == Opcode::PopJumpIfTrue && matches!(self.kind(value), VarKind::Tensor { .. })
        {
            if let Some(message) = assert_message(f)? {
                // `assert tensor_condition[, "message"]`: checked when the graph runs, as
                // TorchDynamo rewrites it (`torch._assert_async`), instead of a graph break
                // on the tensor's truth.
                let check = self.h.torch.getattr("_assert_async")?;
                let message = self.constant(&message);
                self.graph_call(
                    super::graph::Op::CallFunction(OwnedRef::from_bound(&check)),
                    "_assert_async",
                    vec![value, message],
                    Vec::new(),
                )?;
                f.stack.pop();
                f.pc = target.index();
                return Ok(Flow::Continue);
            }
        }
        let taken = match ins.opcode {
            Opcode::PopJumpIfNone | Opcode::PopJumpIfNotNone => {
                let is_none = match self.kind(value) {
                    VarKind::Const(v) | VarKind::Object(v) => v.bind(self.py).is_none(),
                    VarKind::Null => return unsupported(BreakKind::Internal, "a branch on NULL"),
                    _ => false,
                };
                (ins.opcode == Opcode::PopJumpIfNone) == is_none
            }
            _ => {
                let truth = self.truth(value)?;
                matches!(ins.opcode, Opcode::PopJumpIfTrue | Opcode::JumpIfTrueOrPop) == truth
            }
        };
        let keeps_value = matches!(
            ins.opcode,
            Opcode::JumpIfFalseOrPop | Opcode::JumpIfTrueOrPop
        );
        if !(keeps_value && taken) {
            f.stack.pop();
        }
        if taken {
            f.pc = target.index();
        }
        Ok(Flow::Continue)
    }

    pub(super) fn op_get_iter(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let value = self.pop(f)?;
        let iter = match self.kind(value) {
            VarKind::Iter { .. } | VarKind::Generator { .. } | VarKind::Lazy(_) => value,
            _ => {
                // An iterator class of the user's is advanced one item per loop step.
                if let Some(iterator) = self.python_iter_of(value)? {
                    f.stack.push(iterator);
                    return Ok(Flow::Continue);
                }
                let items = self.items_of(value)?;
                self.new_iter(items, &[value])
            }
        };
        f.stack.push(iter);
        Ok(Flow::Continue)
    }

    pub(super) fn op_for_iter(
        &mut self,
        f: &mut FrameState<'py>,
        ins: &Instruction,
    ) -> CResult<Flow> {
        let iter = *f
            .stack
            .last()
            .ok_or(super::translator::CaptureError::Unsupported(Break::new(
                BreakKind::Internal,
                "FOR_ITER on an empty stack",
            )))?;
        let next = match self.kind(iter) {
            VarKind::Iter { .. } | VarKind::Generator { .. } | VarKind::Lazy(_) => {
                self.iter_advance(iter)?
            }
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
            | VarKind::Tuple(_)
            | VarKind::List(_)
            | VarKind::Dict(_)
            | VarKind::DictView { .. }
            | VarKind::Null
            | VarKind::Method { .. }
            | VarKind::Function(_)
            | VarKind::Partial { .. }
            | VarKind::CellRef(_)
            | VarKind::Super { .. }
            | VarKind::Instance { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("FOR_ITER over {}", kind_name(other)),
                )
            }
        };
        match next {
            Some(item) => f.stack.push(item),
            None => {
                f.stack.pop();
                f.pc = ins.jump_target().map_or(f.pc, |t| t.index());
            }
        }
        Ok(Flow::Continue)
    }
}

/// The message of the `assert` statement whose failing branch starts at `f.pc` —
/// `LOAD_ASSERTION_ERROR`, optionally a constant string called with, `RAISE_VARARGS` — or
/// None when the code there is not such an assert (a message computed at run time, an
/// f-string, is not: it is code to run).
fn assert_message<'py>(f: &FrameState<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = f.consts.py();
    let mut ops = f.instructions[f.pc..].iter().filter(|i| {
        !matches!(
            i.opcode,
            Opcode::Cache | Opcode::ExtendedArg | Opcode::Precall
        )
    });
    if ops.next().map(|i| i.opcode) != Some(Opcode::LoadAssertionError) {
        return Ok(None);
    }
    let Some(next) = ops.next() else {
        return Ok(None);
    };
    match next.opcode {
        Opcode::RaiseVarargs => Ok(Some(
            pyo3::types::PyString::new(py, "assertion error").into_any(),
        )),
        Opcode::LoadConst => {
            let message = f.consts.get_item(next.effect_arg() as usize)?;
            let called = ops.next().map(|i| i.opcode) == Some(Opcode::Call)
                && ops.next().map(|i| i.opcode) == Some(Opcode::RaiseVarargs);
            Ok((called && message.is_instance_of::<pyo3::types::PyString>()).then_some(message))
        }
        _ => Ok(None),
    }
}
