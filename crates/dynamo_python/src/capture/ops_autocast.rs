//! `with torch.autocast(device_type, dtype=..., enabled=..., cache_enabled=...)` blocks
//! inside traced code (also `torch.amp.autocast`, `torch.cpu.amp.autocast`), with constant
//! arguments.
//!
//! Entering records `torch.amp._enter_autocast(device_type, dtype, enabled, cache_enabled)`
//! in the graph, leaving records `torch.amp._exit_autocast(<that node>)`: the nodes
//! TorchDynamo makes, which every backend understands (AOTAutograd runs them while it traces,
//! so the casts end up in its graph). The trace enters the same autocast for real, so fake
//! tensors get the dtypes autocast gives (the shape rules and fake memos stand aside while
//! autocast is on), and leaves it where the block ends; whatever is still entered when the
//! trace stops is left then.
//!
//! A graph break inside the block: the graph leaves autocast as it found it (exit nodes for
//! the open blocks), and the block's `__exit__` on the stack is made again by the generated
//! code as a real `torch.autocast` entered there (`dynamo_rs._autocast.enter`), so that the
//! instruction that broke runs in it. Then the generated code leaves it and hands the resume
//! function a new autocast with the block's arguments (`autocast_handoff`), which the resume
//! function's prologue enters itself (`ResumeLayout::stack_contexts`), as TorchDynamo's
//! does: its trace takes the object as a context (`autocast_input`, the arguments guarded),
//! enters it in its graph and leaves it where the block ends — the graphs TorchDynamo makes.
//! Run as it is, the resume function enters the block like the original code.
//!
//! `enabled=False` while autocast is already off changes nothing and stays a no-op block
//! (`GradModeEntry::Keep`), as before.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::break_reasons::BreakKind;
use super::codegen::Rebuild;
use super::graph::{Arg, NodeId, Op};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{AutocastVar, GradModeEntry, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// An autocast block the trace has entered and not yet left.
#[derive(Debug)]
pub struct OpenAutocast {
    pub spec: usize,
    /// The `_enter_autocast` node, whose result `_exit_autocast` takes.
    pub enter: NodeId,
    /// The autocast entered for real while tracing.
    pub mode: OwnedRef,
}

impl<'py> Tracer<'py> {
    /// `torch.autocast(...)` (or `torch.amp.autocast`, `torch.cpu.amp.autocast`) with
    /// constant arguments: a context the trace can enter; None for other classes.
    pub fn autocast_context(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let torch = py.import_module("torch")?;
        let amp = torch.getattr("amp")?.getattr("autocast_mode")?;
        let cpu_autocast = torch.getattr("cpu")?.getattr("amp")?.getattr("autocast")?;
        let is_autocast = cls.is(&torch.getattr("autocast")?)
            || cls.is(&amp.getattr("autocast")?)
            || cls.is(&cpu_autocast);
        if !is_autocast {
            return Ok(None);
        }
        if !args
            .iter()
            .chain(kwargs.iter().map(|(_, v)| v))
            .all(|&a| matches!(self.kind(a), VarKind::Const(_)))
        {
            return unsupported(
                BreakKind::ContextManager,
                "torch.autocast with arguments that are not constants",
            );
        }
        // The arguments as `torch.amp._enter_autocast` takes them: bound to the signature of
        // `torch.amp.autocast` (device_type, dtype, enabled, cache_enabled), defaults filled.
        let positional = self.python_args(args)?;
        let keywords = self.python_kwargs(kwargs)?;
        let inspect = py.import_module("inspect")?;
        let signature = inspect.call_method1("signature", (cls,))?;
        let bound = match signature.call_method("bind", positional, Some(&keywords)) {
            Ok(bound) => bound,
            Err(err) => {
                let detail = format!("torch.autocast(...) raised {err}");
                return self.raised(err, detail);
            }
        };
        bound.call_method0("apply_defaults")?;
        let arguments = bound.getattr("arguments")?;
        let device = if cls.is(&cpu_autocast) {
            pyo3::types::PyString::new(py, "cpu").into_any()
        } else {
            arguments.get_item("device_type")?
        };
        let values = PyTuple::new(
            py,
            [
                device.clone(),
                arguments.get_item("dtype")?,
                arguments.get_item("enabled")?,
                arguments.get_item("cache_enabled")?,
            ],
        )?;
        let enabled = values.get_item(2)?.is_truthy()?;
        let off_already = device.is_instance_of::<pyo3::types::PyString>()
            && !torch
                .call_method1("is_autocast_enabled", (&device,))?
                .is_truthy()?;
        if !enabled && off_already {
            // Changes nothing (the guard on torch's global state keeps autocast off).
            let on_enter = GradModeEntry::Keep;
            return Ok(Some(self.add(VarKind::GradModeContext { on_enter }, None)));
        }
        // Made as the call would make it, so bad arguments fail here as in eager.
        if let Err(err) = cls.call(self.python_args(args)?, Some(&self.python_kwargs(kwargs)?)) {
            let detail = format!("torch.autocast(...) raised {err}");
            return self.raised(err, detail);
        }
        self.autocast_specs
            .push(OwnedRef::from_bound(values.as_any()));
        let spec = self.autocast_specs.len() - 1;
        Ok(Some(self.add(
            VarKind::Autocast(AutocastVar::Context { spec }),
            None,
        )))
    }

    /// `BEFORE_WITH` on an autocast context: enters it (the graph node, and for real);
    /// returns the block's `__exit__`.
    pub(super) fn autocast_enter(&mut self, spec: usize) -> CResult<VarId> {
        let py = self.py;
        let values = self.autocast_specs[spec].bind(py).clone();
        let amp = py.import_module("torch")?.getattr("amp")?;
        let enter = amp.getattr("_enter_autocast")?;
        let mode = match enter.call1(values.cast::<PyTuple>().map_err(PyErr::from)?) {
            Ok(mode) => mode,
            Err(err) => {
                let detail = format!("entering torch.autocast raised {err}");
                return self.raised(err, detail);
            }
        };
        let args = values
            .try_iter()?
            .map(|v| Ok(Arg::Const(OwnedRef::from_bound(&v?))))
            .collect::<PyResult<Vec<_>>>()?;
        let node = self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&enter)),
            "_enter_autocast",
            args,
            Vec::new(),
            OwnedRef::from_bound(&mode),
        );
        // Global state: a generator run ahead of its consumer may not change it.
        self.note_effect(None);
        self.autocast_open.push(OpenAutocast {
            spec,
            enter: node,
            mode: OwnedRef::from_bound(&mode),
        });
        Ok(self.add(VarKind::Autocast(AutocastVar::Exit { spec }), None))
    }

    /// Calling an autocast `__exit__` (the normal end of its block): leaves the innermost
    /// block, which must be this one. None for other callees.
    pub(super) fn autocast_call(&mut self, callee: VarId) -> CResult<Option<VarId>> {
        let py = self.py;
        if self.is_real_autocast_exit(callee)? {
            // The resume function of a graph break inside a block: the block was entered by
            // the code before it (see the module docs).
            return unsupported(
                BreakKind::ContextManager,
                "leaving a torch.autocast block entered before this frame (after a graph \
                 break inside the block)",
            );
        }
        let VarKind::Autocast(var) = *self.kind(callee) else {
            return Ok(None);
        };
        let spec = match var {
            AutocastVar::Exit { spec } => spec,
            AutocastVar::Context { .. } => {
                return unsupported(
                    BreakKind::ContextManager,
                    "torch.autocast used as a decorator",
                )
            }
        };
        if self.autocast_open.last().map(|o| o.spec) != Some(spec) {
            return unsupported(
                BreakKind::ContextManager,
                "leaving a torch.autocast block other than the innermost",
            );
        }
        self.leave_innermost_autocast()?;
        Ok(Some(self.constant(&py.None().into_bound(py))))
    }

    /// Whether `callee` is the bound `__exit__` of a real `torch.autocast`.
    fn is_real_autocast_exit(&self, callee: VarId) -> PyResult<bool> {
        let py = self.py;
        let receiver = match self.kind(callee) {
            VarKind::Method { receiver, name, .. } if name == "__exit__" => {
                match self.kind(*receiver) {
                    VarKind::Object(o) => o.bind(py).clone(),
                    _ => return Ok(false),
                }
            }
            // Only bound methods: this is asked of every call.
            VarKind::Object(o) if o.bind(py).is_instance(&self.h.method_type)? => {
                let method = o.bind(py);
                if method.getattr("__name__")?.to_string() != "__exit__" {
                    return Ok(false);
                }
                method.getattr("__self__")?
            }
            _ => return Ok(false),
        };
        let autocast = py
            .import_module("torch")?
            .getattr("amp")?
            .getattr("autocast_mode")?
            .getattr("autocast")?;
        receiver.is_instance(&autocast)
    }

    /// Records `_exit_autocast` for the innermost open block and leaves it for real.
    fn leave_innermost_autocast(&mut self) -> CResult<()> {
        let py = self.py;
        let Some(open) = self.autocast_open.pop() else {
            return Ok(());
        };
        self.note_effect(None);
        let exit = py
            .import_module("torch")?
            .getattr("amp")?
            .getattr("_exit_autocast")?;
        exit.call1((open.mode.bind(py),))?;
        self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&exit)),
            "_exit_autocast",
            vec![Arg::Node(open.enter)],
            Vec::new(),
            OwnedRef::from_bound(&py.None().into_bound(py)),
        );
        Ok(())
    }

    /// Before a graph is made of the trace so far (at a graph break): it leaves autocast as
    /// the frame found it.
    pub(super) fn leave_open_autocasts(&mut self) -> CResult<()> {
        while !self.autocast_open.is_empty() {
            self.leave_innermost_autocast()?;
        }
        Ok(())
    }

    /// Leaves, for real only, the blocks a trace that stopped left entered (the Tracer is
    /// being dropped).
    pub(super) fn restore_autocast_state(&mut self) {
        while let Some(open) = self.autocast_open.pop() {
            let py = self.py;
            let left = py
                .import_module("torch")
                .and_then(|t| t.getattr("amp"))
                .and_then(|amp| amp.getattr("_exit_autocast"))
                .and_then(|exit| exit.call1((open.mode.bind(py),)));
            if let Err(err) = left {
                err.write_unraisable(py, None);
            }
        }
    }

    /// The function the generated code passes an open block's `__exit__` through before
    /// calling a resume function: it leaves the block and returns a new `torch.autocast`
    /// with the block's arguments, which the resume function enters (see
    /// `ResumeLayout::stack_contexts`). Runs with the frame hook off.
    pub(super) fn autocast_handoff(&self, spec: usize) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        let handoff = py
            .import_module("dynamo_rs._autocast")?
            .getattr("handoff")?;
        let values = self.autocast_specs[spec].bind(py).clone();
        let mut parts = vec![handoff];
        for value in values.try_iter()? {
            parts.push(value?);
        }
        let bound = py
            .import_module("functools")?
            .getattr("partial")?
            .call1(PyTuple::new(py, parts)?)?;
        Ok(Bound::new(
            py,
            crate::eval_frame::disable::DisabledFunction::wrap(bound),
        )?
        .into_any())
    }

    /// A `torch.autocast` object the frame is given (not entered): a context the trace can
    /// enter, as if made in the trace with the same arguments — which are guarded. A resume
    /// function gets one from a graph break inside a block (`autocast_handoff`). None for
    /// other values.
    pub(super) fn autocast_input(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &std::rc::Rc<super::source::Source>,
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let autocast = self.h.autocast_type.clone();
        if !value.get_type().is(&autocast) {
            return Ok(None);
        }
        use super::guards::GuardKind;
        use super::source::Source;
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(&autocast)),
        );
        let mut values = Vec::new();
        for name in ["device", "fast_dtype", "_enabled", "_cache_enabled"] {
            let Ok(attr) = value.getattr(name) else {
                return Ok(None);
            };
            self.guards.add(
                std::rc::Rc::new(Source::Attr(source.clone(), name.into())),
                GuardKind::Equals(OwnedRef::from_bound(&attr)),
            );
            values.push(attr);
        }
        let values = PyTuple::new(py, values)?;
        self.autocast_specs
            .push(OwnedRef::from_bound(values.as_any()));
        let spec = self.autocast_specs.len() - 1;
        Ok(Some(self.add(
            VarKind::Autocast(AutocastVar::Context { spec }),
            Some(source.clone()),
        )))
    }

    /// How the generated code makes an autocast tracker again: a context as the call made
    /// it; the `__exit__` of an open block by entering a real autocast (at a graph break the
    /// graph has left it: see the module docs).
    pub(super) fn autocast_rebuild(&self, var: AutocastVar) -> CResult<Rebuild> {
        let py = self.py;
        let (spec, helper) = match var {
            AutocastVar::Context { spec } => (spec, "make"),
            AutocastVar::Exit { spec } => (spec, "enter"),
        };
        // Run with the frame hook off: torch.autocast's own frames have nothing to compile.
        let helper = Bound::new(
            py,
            crate::eval_frame::disable::DisabledFunction::wrap(
                py.import_module("dynamo_rs._autocast")?.getattr(helper)?,
            ),
        )?
        .into_any();
        let args = self.autocast_specs[spec]
            .bind(py)
            .try_iter()?
            .map(|v| Ok(Rebuild::Const(OwnedRef::from_bound(&v?))))
            .collect::<CResult<_>>()?;
        Ok(Rebuild::Call {
            func: Box::new(Rebuild::Const(OwnedRef::from_bound(&helper))),
            args,
            kwargs: Vec::new(),
        })
    }
}
