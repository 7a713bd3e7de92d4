//! `with` blocks. Only grad-mode context managers (`torch.no_grad()`, `torch.enable_grad()`)
//! are traced: entering records `torch._C._set_grad_enabled(mode)` in the graph and flips
//! the real mode while tracing (so fake propagation sees it); the normal exit records the
//! restore. The Converter puts the real mode back after tracing, whatever happened.
//!
//! A graph break inside such a block hands the block's `__exit__` to the resume function on
//! its stack: a [`GradModeExit`], which the resume function's own trace recognises again.

use super::break_reasons::BreakKind;
use crate::imports::ImportModule;
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
            return unsupported(
                BreakKind::ContextManager,
                format!("a with statement on {}", kind_name(self.kind(context))),
            );
        };
        let previous = self.grad_enabled;
        self.set_grad_enabled(enabled)?;
        let exit = self.add(VarKind::GradModeExit { previous }, None);
        let entered = self.constant(&self.py.None().into_bound(self.py));
        f.stack.push(exit);
        f.stack.push(entered);
        Ok(Flow::Continue)
    }

    /// Whether an instruction with `handler` is covered only by the cleanup of a grad-mode
    /// `with` block: the handler keeps the block's `__exit__` as its bottom-most value above
    /// the depth it unwinds to, and pushes the raising offset (`lasti`).
    pub(super) fn is_grad_mode_cleanup(
        &self,
        f: &FrameState<'py>,
        handler: dynamo_bytecode::ExceptionHandler,
    ) -> bool {
        let depth = handler.depth as usize;
        handler.lasti
            && depth >= 1
            && f.stack
                .get(depth - 1)
                .is_some_and(|&id| matches!(self.kind(id), VarKind::GradModeExit { .. }))
    }

    /// Records `torch._C._set_grad_enabled(enabled)` and sets it for the rest of the trace.
    pub fn set_grad_enabled(&mut self, enabled: bool) -> CResult<()> {
        let py = self.py;
        let setter = py
            .import_module("torch")?
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

    /// `torch.autocast(device_type, enabled=False)` (or `torch.amp.autocast`,
    /// `torch.cpu.amp.autocast`) while autocast is off for that device: a block that changes
    /// nothing (the guard on torch's global state keeps autocast off), modelled as a grad-mode
    /// block that sets the grad mode it finds. Any other autocast is refused.
    pub fn autocast_context(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let torch = py.import_module("torch")?;
        let amp = torch.getattr("amp")?.getattr("autocast_mode")?;
        let is_autocast = cls.is(&torch.getattr("autocast")?)
            || cls.is(&amp.getattr("autocast")?)
            || cls.is(&torch.getattr("cpu")?.getattr("amp")?.getattr("autocast")?);
        if !is_autocast {
            return Ok(None);
        }
        let constant = |id: VarId| match self.kind(id) {
            VarKind::Const(v) => Some(v.bind(py).clone()),
            _ => None,
        };
        let argument = |position: usize, name: &str| {
            kwargs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| *v)
                .or_else(|| args.get(position).copied())
        };
        let device = argument(0, "device_type").and_then(constant);
        let enabled = argument(2, "enabled").and_then(constant);
        let off = match (&device, &enabled) {
            (Some(device), Some(enabled)) if device.is_instance_of::<pyo3::types::PyString>() => {
                !enabled.is_truthy()?
                    && !torch
                        .call_method1("is_autocast_enabled", (device,))?
                        .is_truthy()?
            }
            _ => false,
        };
        if !off {
            return unsupported(
                BreakKind::ContextManager,
                "torch.autocast that turns autocast on (only enabled=False while it is off is traced)",
            );
        }
        let current = self.grad_enabled;
        Ok(Some(
            self.add(VarKind::GradModeContext { enabled: current }, None),
        ))
    }

    /// `torch.no_grad()` / `torch.enable_grad()`, or None for any other class.
    pub fn grad_mode_context(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let torch = self.py.import_module("torch")?;
        let enabled = if cls.is(&torch.getattr("no_grad")?) {
            false
        } else if cls.is(&torch.getattr("enable_grad")?) {
            true
        } else {
            return Ok(None);
        };
        if !args.is_empty() {
            return unsupported(
                BreakKind::ContextManager,
                "arguments to a grad-mode context manager",
            );
        }
        Ok(Some(self.add(VarKind::GradModeContext { enabled }, None)))
    }
}

/// The `__exit__` of a grad-mode `with` block split by a graph break, as the generated code
/// hands it to the resume function: calling it puts grad mode back to what it was before the
/// block. One object per mode (`GradModeExit::get`), so a resume function's guard on it is
/// an identity check.
#[pyclass(module = "dynamo_rs._native", frozen)]
#[derive(Debug)]
pub struct GradModeExit {
    #[pyo3(get)]
    previous: bool,
}

#[pymethods]
impl GradModeExit {
    /// `__exit__(exc_type, exc, traceback)`: restores the mode; never swallows an exception.
    #[pyo3(signature = (*_args))]
    fn __call__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        py.import_module("torch")?
            .getattr("_C")?
            .call_method1("_set_grad_enabled", (self.previous,))?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "<exit of a grad-mode block: restores grad mode {}>",
            self.previous
        )
    }
}

impl GradModeExit {
    /// The one object restoring `previous`.
    pub fn get(py: Python<'_>, previous: bool) -> PyResult<Bound<'_, GradModeExit>> {
        static EXITS: pyo3::sync::PyOnceLock<[Py<GradModeExit>; 2]> = pyo3::sync::PyOnceLock::new();
        let exits = EXITS.get_or_try_init(py, || -> PyResult<_> {
            Ok([
                Py::new(py, GradModeExit { previous: false })?,
                Py::new(py, GradModeExit { previous: true })?,
            ])
        })?;
        Ok(exits[usize::from(previous)].bind(py).clone())
    }

    pub fn previous(&self) -> bool {
        self.previous
    }
}
