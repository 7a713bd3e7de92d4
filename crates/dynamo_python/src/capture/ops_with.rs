//! `with` blocks. Only grad-mode context managers (`torch.no_grad()`, `torch.enable_grad()`)
//! are traced: entering records `torch._C._set_grad_enabled(mode)` in the graph and flips
//! the real mode while tracing (so fake propagation sees it); the normal exit records the
//! restore. The Converter puts the real mode back after tracing, whatever happened.

use pyo3::prelude::*;

use super::graph::Op;
use super::translator::{kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// `BEFORE_WITH`: pops the context manager, pushes its `__exit__` and what `__enter__`
    /// returned.
    pub(super) fn op_before_with(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let context = self.pop(f)?;
        let VarKind::GradModeContext { enabled } = *self.kind(context) else {
            return unsupported(format!(
                "a with statement on {}",
                kind_name(self.kind(context))
            ));
        };
        let previous = self.grad_enabled;
        self.set_grad_enabled(enabled)?;
        // The block's instructions are covered by the context's cleanup handler.
        if let Some(handler) = f.instructions.get(f.pc).and_then(|i| i.handler) {
            f.grad_mode_handlers.insert(handler.target.index());
        }
        let exit = self.add(VarKind::GradModeExit { previous }, None);
        let entered = self.constant(&self.py.None().into_bound(self.py));
        f.stack.push(exit);
        f.stack.push(entered);
        Ok(Flow::Continue)
    }

    /// Records `torch._C._set_grad_enabled(enabled)` and sets it for the rest of the trace.
    pub fn set_grad_enabled(&mut self, enabled: bool) -> CResult<()> {
        let py = self.py;
        let setter = py
            .import("torch")?
            .getattr("_C")?
            .getattr("_set_grad_enabled")?;
        setter.call1((enabled,))?;
        self.grad_enabled = enabled;
        let arg = super::graph::Arg::Const(OwnedRef::from_bound(
            &enabled.into_pyobject(py)?.to_owned().into_any(),
        ));
        let none = OwnedRef::from_bound(&py.None().into_bound(py));
        self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&setter)),
            "_set_grad_enabled",
            vec![arg],
            Vec::new(),
            none,
        );
        Ok(())
    }

    /// Calling a grad-mode context class or the `__exit__` of an entered one.
    pub fn grad_mode_call(&mut self, callee: VarId) -> CResult<Option<VarId>> {
        match *self.kind(callee) {
            VarKind::GradModeExit { previous } => {
                self.set_grad_enabled(previous)?;
                Ok(Some(self.constant(&self.py.None().into_bound(self.py))))
            }
            _ => Ok(None),
        }
    }

    /// `torch.no_grad()` / `torch.enable_grad()`, or None for any other class.
    pub fn grad_mode_context(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let torch = self.py.import("torch")?;
        let enabled = if cls.is(&torch.getattr("no_grad")?) {
            false
        } else if cls.is(&torch.getattr("enable_grad")?) {
            true
        } else {
            return Ok(None);
        };
        if !args.is_empty() {
            return unsupported("arguments to a grad-mode context manager");
        }
        Ok(Some(self.add(VarKind::GradModeContext { enabled }, None)))
    }
}
