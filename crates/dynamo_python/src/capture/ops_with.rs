//! `with` blocks. Context managers of user classes with Python `__enter__`/`__exit__` are
//! inlined (`user_context_enter`). Grad-mode context managers (`torch.no_grad()`,
//! `torch.enable_grad()`, `set_grad_enabled`, and `nullcontext()` as one that keeps the
//! mode) are modelled: entering records `torch._C._set_grad_enabled(mode)` in the graph and flips
//! the real mode while tracing (so fake propagation sees it); the normal exit records the
//! restore. The Converter puts the real mode back after tracing, whatever happened.
//!
//! A graph break inside such a block hands the block's `__exit__` to the resume function on
//! its stack: a [`GradModeExit`], which the resume function's own trace recognises again.

use super::break_reasons::BreakKind;
use crate::imports::ImportModule;
use pyo3::prelude::*;

use super::graph::Op;
use super::ops_call::describe;
use super::translator::{kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{GradModeEntry, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// `BEFORE_WITH`: pops the context manager, pushes its `__exit__` and what `__enter__`
    /// returned.
    pub(super) fn op_before_with(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let context = self.pop(f)?;
        if let VarKind::StateContext(super::vars::StateContextVar::Context { spec }) =
            *self.kind(context)
        {
            let exit = self.state_enter(spec)?;
            let entered = self.constant(&self.py.None().into_bound(self.py));
            f.stack.push(exit);
            f.stack.push(entered);
            return Ok(Flow::Continue);
        }
        // An existing profiler range (`@record_function("name")` decorating a function,
        // whose wrapper runs `with self:`): changes nothing the graph computes, entered as
        // one made in the trace is (`grad_mode_context`).
        let existing_range = match self.kind(context) {
            VarKind::Object(o) => o.bind(self.py).get_type().is(&self
                .py
                .import_module("torch.autograd.profiler")?
                .getattr("record_function")?),
            _ => false,
        };
        let on_enter = match *self.kind(context) {
            VarKind::GradModeContext { on_enter } => Some(on_enter),
            _ if existing_range => Some(GradModeEntry::Keep),
            _ => None,
        };
        let Some(on_enter) = on_enter else {
            let (exit, entered) = self.user_context_enter(context)?;
            f.stack.push(exit);
            f.stack.push(entered);
            return Ok(Flow::Continue);
        };
        let previous = match on_enter {
            GradModeEntry::Set(enabled) => {
                let previous = self.grad_enabled;
                self.set_grad_enabled(enabled)?;
                previous
            }
            GradModeEntry::Keep => self.grad_enabled,
            GradModeEntry::AlreadySet { previous } => previous,
        };
        let exit = self.add(VarKind::GradModeExit { previous }, None);
        let entered = self.constant(&self.py.None().into_bound(self.py));
        f.stack.push(exit);
        f.stack.push(entered);
        Ok(Flow::Continue)
    }

    /// `with obj:` on an object of a class whose `__enter__` and `__exit__` are Python
    /// functions: `__enter__` is inlined now, and its bound `__exit__` goes on the stack,
    /// where the normal end of the block calls it (inlined too) with three Nones. The block's
    /// body is traced as any code: the handler that would call `__exit__` with an exception
    /// runs only if something raises, and what raises while tracing is refused there
    /// (`WITH_EXCEPT_START`). An operation of the graph raising at run time leaves the
    /// block without `__exit__`, as under TorchDynamo — and without the stores of the trace,
    /// which are replayed after the graph, so `__enter__`'s changes are not left behind.
    fn user_context_enter(&mut self, context: VarId) -> CResult<(VarId, VarId)> {
        let py = self.py;
        let cls = match self.kind(context) {
            VarKind::Instance { cls, .. } => cls.bind(py).clone(),
            VarKind::Object(o) => o.bind(py).get_type().into_any(),
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Tuple(_)
            | VarKind::List(_)
            | VarKind::Dict(_)
            | VarKind::DictView { .. }
            | VarKind::Null
            | VarKind::Method { .. }
            | VarKind::Iter { .. }
            | VarKind::Generator { .. }
            | VarKind::Lazy(_)
            | VarKind::Function(_)
            | VarKind::Partial { .. }
            | VarKind::CellRef(_)
            | VarKind::Super { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)) => {
                return unsupported(
                    BreakKind::ContextManager,
                    format!("a with statement on {}", kind_name(other)),
                )
            }
        };
        for name in ["__enter__", "__exit__"] {
            let traceable = cls
                .getattr(name)
                .is_ok_and(|m| m.is_instance(&self.h.function_type).unwrap_or(false));
            if !traceable {
                return unsupported(
                    BreakKind::ContextManager,
                    format!(
                        "a with statement on {} (its {name} is not Python code)",
                        describe(&cls)
                    ),
                );
            }
        }
        let enter = self.get_attr(context, "__enter__")?;
        let entered = self.call_function(enter, Vec::new(), Vec::new())?;
        let exit = self.get_attr(context, "__exit__")?;
        self.with_exits.insert(exit);
        Ok((exit, entered))
    }

    /// Whether an instruction with `handler` is covered only by the cleanup of a grad-mode
    /// `with` block (or of a user context manager's, see `user_context_enter`): the handler
    /// keeps the block's `__exit__` as its bottom-most value above the depth it unwinds to,
    /// and pushes the raising offset (`lasti`).
    pub(super) fn is_grad_mode_cleanup(
        &self,
        f: &FrameState<'py>,
        handler: dynamo_bytecode::ExceptionHandler,
    ) -> bool {
        let depth = handler.depth as usize;
        handler.lasti
            && depth >= 1
            && f.stack.get(depth - 1).is_some_and(|&id| {
                matches!(
                    self.kind(id),
                    VarKind::GradModeExit { .. }
                        | VarKind::StateContext(super::vars::StateContextVar::Exit { .. })
                ) || self.with_exits.contains(&id)
            })
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

    /// Ends the graph in the grad mode the frame was entered in, recording the switch back
    /// when the trace is in another one (a break inside a `no_grad` block, a resume function
    /// that leaves such a block): backends expect graphs that leave the mode as they found
    /// it, and AOTAutograd, compiling a graph for the mode it is entered in, loses a switch
    /// that outlives the graph. Returns the mode the trace was in, which the generated code
    /// sets after the graph, or None when it is the entry mode.
    pub fn end_in_entry_grad_mode(&mut self) -> CResult<Option<bool>> {
        let entry = self.guards.grad_mode.unwrap_or(true);
        let now = self.grad_enabled;
        if now == entry {
            return Ok(None);
        }
        self.set_grad_enabled(entry)?;
        Ok(Some(now))
    }

    /// Calling the `__exit__` of an entered grad-mode context, a grad-mode context as a
    /// decorator (`torch.no_grad()(fn)`), or a function it decorated.
    pub fn grad_mode_call(
        &mut self,
        callee: VarId,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        match *self.kind(callee) {
            VarKind::GradModeExit { previous } => {
                self.set_grad_enabled(previous)?;
                Ok(Some(self.constant(&self.py.None().into_bound(self.py))))
            }
            VarKind::GradModeContext { on_enter } => {
                let ([func], []) = (args, kwargs) else {
                    return unsupported(
                        BreakKind::ContextManager,
                        "calling a grad-mode context manager with other than one function",
                    );
                };
                if matches!(on_enter, GradModeEntry::AlreadySet { .. })
                    || !self.is_callable(*func)?
                {
                    return unsupported(
                        BreakKind::ContextManager,
                        "a grad-mode context manager as a decorator of this",
                    );
                }
                let func = *func;
                Ok(Some(
                    self.add(VarKind::GradModeWrapped { on_enter, func }, None),
                ))
            }
            VarKind::GradModeWrapped { on_enter, func } => {
                let previous = self.grad_enabled;
                if let GradModeEntry::Set(enabled) = on_enter {
                    self.set_grad_enabled(enabled)?;
                }
                let result = self.call_function(func, args.to_vec(), kwargs.to_vec())?;
                if self.grad_enabled != previous {
                    self.set_grad_enabled(previous)?;
                }
                Ok(Some(result))
            }
            _ => Ok(None),
        }
    }

    /// `torch.no_grad()`, `torch.enable_grad()`, `torch.set_grad_enabled(mode)` with a
    /// constant mode, `contextlib.nullcontext()`, a profiler's `record_function(name)`; None
    /// for any other class.
    pub fn grad_mode_context(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let torch = py.import_module("torch")?;
        let on_enter = if cls.is(&torch.getattr("no_grad")?) {
            GradModeEntry::Set(false)
        } else if cls.is(&torch.getattr("enable_grad")?) {
            GradModeEntry::Set(true)
        } else if cls.is(&torch.getattr("set_grad_enabled")?) {
            let mode = match (args, kwargs) {
                ([mode], []) => *mode,
                ([], [(name, mode)]) if name == "mode" => *mode,
                _ => return Ok(None),
            };
            let VarKind::Const(mode) = self.kind(mode) else {
                return unsupported(
                    BreakKind::ContextManager,
                    "torch.set_grad_enabled with a mode that is not a constant",
                );
            };
            let mode = mode.bind(py).is_truthy()?;
            // As in eager, the call alone switches the mode.
            let previous = self.grad_enabled;
            self.set_grad_enabled(mode)?;
            let on_enter = GradModeEntry::AlreadySet { previous };
            return Ok(Some(self.add(VarKind::GradModeContext { on_enter }, None)));
        } else if cls.is(&py.import_module("contextlib")?.getattr("nullcontext")?) {
            let no_result = match (args, kwargs) {
                ([], []) => true,
                ([r], []) | ([], [(_, r)]) => {
                    matches!(self.kind(*r), VarKind::Const(v) if v.bind(py).is_none())
                }
                _ => false,
            };
            if !no_result {
                return Ok(None);
            }
            GradModeEntry::Keep
        } else if cls.is(&py
            .import_module("torch.autograd.profiler")?
            .getattr("record_function")?)
        {
            // A profiler range (`Optimizer.step`'s wrapper opens one): changes nothing the
            // graph computes; the compiled code records no range, as under TorchDynamo.
            let constant = |v: &VarId| matches!(self.kind(*v), VarKind::Const(_));
            if !args.iter().all(constant) || !kwargs.iter().all(|(_, v)| constant(v)) {
                return Ok(None);
            }
            return Ok(Some(self.add(
                VarKind::GradModeContext {
                    on_enter: GradModeEntry::Keep,
                },
                None,
            )));
        } else {
            return Ok(None);
        };
        if !args.is_empty() || !kwargs.is_empty() {
            return unsupported(
                BreakKind::ContextManager,
                "arguments to a grad-mode context manager",
            );
        }
        Ok(Some(self.add(VarKind::GradModeContext { on_enter }, None)))
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
