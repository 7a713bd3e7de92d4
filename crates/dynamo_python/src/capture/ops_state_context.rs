//! `with` blocks of context managers that switch a piece of torch's global state for the
//! code inside them, made in the trace with constant arguments:
//! - `torch.autocast(device_type, dtype=..., enabled=..., cache_enabled=...)` (also
//!   `torch.amp.autocast`, `torch.cpu.amp.autocast`);
//! - `torch.inference_mode(mode)` (also as a decorator: its `clone()` makes one);
//! - `torch.nn.attention.sdpa_kernel(backends, set_priority)`.
//!
//! Entering records a node `enter(*values)` in the graph, leaving records `exit(<that node>)`:
//! for autocast and inference mode the nodes TorchDynamo makes (`torch.amp._enter_autocast`,
//! `torch.autograd.grad_mode._enter_inference_mode`, ...), which every backend understands
//! (AOTAutograd runs them while it traces, so their effect ends up in its graph); for
//! `sdpa_kernel` two helpers of ours that restore the backends found when the graph runs
//! (`dynamo_rs._state_contexts`). The trace enters the same context for real, so fake tensors
//! get what it gives (autocast's dtypes, inference mode's grad mode; the shape rules and fake
//! memos stand aside while autocast is on), and leaves it where the block ends; whatever is
//! still entered when the trace stops is left then.
//!
//! A graph break inside the block: the graph leaves the contexts as it found them (exit nodes
//! for the open blocks), and the block's `__exit__` on the stack is made again by the
//! generated code as a real context entered there (`_state_contexts.enter`), so that the
//! instruction that broke runs in it. Then the generated code leaves it and hands the resume
//! function a new context with the block's arguments (`state_handoff`), which the resume
//! function's prologue enters itself (`ResumeLayout::stack_contexts`), as TorchDynamo's does:
//! its trace takes the object as a context (`state_context_input`, the arguments guarded),
//! enters it in its graph and leaves it where the block ends — the graphs TorchDynamo makes.
//! Run as it is, the resume function enters the block like the original code.
//!
//! `torch.autocast(enabled=False)` while autocast is already off changes nothing and stays a
//! no-op block (`GradModeEntry::Keep`), as before.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::break_reasons::BreakKind;
use super::codegen::Rebuild;
use super::graph::{Arg, NodeId, Op};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{GradModeEntry, StateContextVar, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// Which global state a context switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateKind {
    Autocast,
    InferenceMode,
    SdpaKernel,
}

impl StateKind {
    /// The name `dynamo_rs._state_contexts` knows the kind by.
    fn key(self) -> &'static str {
        match self {
            StateKind::Autocast => "autocast",
            StateKind::InferenceMode => "inference_mode",
            StateKind::SdpaKernel => "sdpa_kernel",
        }
    }

    fn from_key(key: &str) -> Option<StateKind> {
        [
            StateKind::Autocast,
            StateKind::InferenceMode,
            StateKind::SdpaKernel,
        ]
        .into_iter()
        .find(|k| k.key() == key)
    }

    /// What the user wrote, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            StateKind::Autocast => "torch.autocast",
            StateKind::InferenceMode => "torch.inference_mode",
            StateKind::SdpaKernel => "sdpa_kernel",
        }
    }

    /// The functions of the graph nodes that enter and leave a block:
    /// `exit(enter(*values))`.
    fn node_functions<'py>(
        self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let (module, enter, exit) = match self {
            StateKind::Autocast => ("torch.amp", "_enter_autocast", "_exit_autocast"),
            StateKind::InferenceMode => (
                "torch.autograd.grad_mode",
                "_enter_inference_mode",
                "_exit_inference_mode",
            ),
            StateKind::SdpaKernel => (
                "dynamo_rs._state_contexts",
                "enter_sdpa_kernel",
                "exit_sdpa_kernel",
            ),
        };
        let module = py.import_module(module)?;
        Ok((module.getattr(enter)?, module.getattr(exit)?))
    }
}

/// A context made in the trace (or given to the frame): its kind and the arguments its
/// enter node takes.
#[derive(Debug)]
pub struct StateSpec {
    pub kind: StateKind,
    pub values: OwnedRef,
    /// Grad mode outside the block, when entering it can change grad mode (inference mode):
    /// what the code after a graph break inside it puts back after leaving the real one it
    /// entered (see `state_handoff`).
    pub grad_outside: Option<bool>,
}

/// A block the trace has entered and not yet left.
#[derive(Debug)]
pub struct OpenStateContext {
    pub spec: usize,
    /// The enter node, whose result the exit node takes.
    pub enter: NodeId,
    /// What entering it for real while tracing returned (what the exit function takes).
    pub token: OwnedRef,
    /// The tracer's grad mode before the block (put back when it is left).
    pub grad_before: bool,
}

impl<'py> Tracer<'py> {
    /// A context manager of one of the kinds made with constant arguments:
    /// `torch.autocast(...)` or `torch.inference_mode(...)` (`obj` is the class), or
    /// `sdpa_kernel(...)` (`obj` is the function); None for other callables.
    pub fn state_context(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let torch = self.h.torch.clone();
        let amp = torch.getattr("amp")?.getattr("autocast_mode")?;
        let cpu_autocast = torch.getattr("cpu")?.getattr("amp")?.getattr("autocast")?;
        let kind = if obj.is(&torch.getattr("autocast")?)
            || obj.is(&amp.getattr("autocast")?)
            || obj.is(&cpu_autocast)
        {
            StateKind::Autocast
        } else if obj.is(&torch
            .getattr("autograd")?
            .getattr("grad_mode")?
            .getattr("inference_mode")?)
        {
            StateKind::InferenceMode
        } else if obj.is(&self.h.sdpa_kernel) {
            StateKind::SdpaKernel
        } else {
            return Ok(None);
        };
        // `sdpa_kernel`'s backends are enum objects, in a list: read as Python values (their
        // identity guarded); the others' arguments are plain constants.
        if kind != StateKind::SdpaKernel
            && !args
                .iter()
                .chain(kwargs.iter().map(|(_, v)| v))
                .all(|&a| matches!(self.kind(a), VarKind::Const(_)))
        {
            return unsupported(
                BreakKind::ContextManager,
                format!("{} with arguments that are not constants", kind.describe()),
            );
        }
        let positional = self.python_args(args)?;
        let keywords = self.python_kwargs(kwargs)?;
        // Made as the call would make it, so bad arguments fail here as in eager.
        let made = match obj.call(&positional, Some(&keywords)) {
            Ok(made) => made,
            Err(err) => {
                let detail = format!("{}(...) raised {err}", kind.describe());
                return self.raised(err, detail);
            }
        };
        let values = match kind {
            StateKind::Autocast => {
                match self.autocast_values(obj, &cpu_autocast, &positional, &keywords)? {
                    Some(values) => values,
                    None => {
                        // Changes nothing (the guard on torch's global state keeps autocast
                        // off).
                        let on_enter = GradModeEntry::Keep;
                        return Ok(Some(self.add(VarKind::GradModeContext { on_enter }, None)));
                    }
                }
            }
            StateKind::InferenceMode => {
                let mode = made.getattr("mode")?;
                if !mode.is_instance_of::<pyo3::types::PyBool>() {
                    // `torch.inference_mode(fn)` decorates a function.
                    return Ok(None);
                }
                PyTuple::new(py, [mode])?
            }
            StateKind::SdpaKernel => sdpa_kernel_values(py, &positional, &keywords)?,
        };
        Ok(Some(self.state_context_var(kind, values, None)))
    }

    fn state_context_var(
        &mut self,
        kind: StateKind,
        values: Bound<'py, PyTuple>,
        source: Option<std::rc::Rc<super::source::Source>>,
    ) -> VarId {
        self.state_specs.push(StateSpec {
            kind,
            values: OwnedRef::from_bound(values.as_any()),
            grad_outside: None,
        });
        let spec = self.state_specs.len() - 1;
        self.add(
            VarKind::StateContext(StateContextVar::Context { spec }),
            source,
        )
    }

    /// The arguments `torch.amp._enter_autocast` takes, bound to the signature of
    /// `torch.amp.autocast` (device_type, dtype, enabled, cache_enabled), defaults filled; None
    /// when the block would change nothing (`enabled=False` while autocast is off).
    fn autocast_values(
        &mut self,
        cls: &Bound<'py, PyAny>,
        cpu_autocast: &Bound<'py, PyAny>,
        positional: &Bound<'py, PyTuple>,
        keywords: &Bound<'py, pyo3::types::PyDict>,
    ) -> CResult<Option<Bound<'py, PyTuple>>> {
        let py = self.py;
        let inspect = py.import_module("inspect")?;
        let signature = inspect.call_method1("signature", (cls,))?;
        let bound = signature.call_method("bind", positional, Some(keywords))?;
        bound.call_method0("apply_defaults")?;
        let arguments = bound.getattr("arguments")?;
        let device = if cls.is(cpu_autocast) {
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
            && !self
                .h
                .torch
                .call_method1("is_autocast_enabled", (&device,))?
                .is_truthy()?;
        Ok((enabled || !off_already).then_some(values))
    }

    /// `BEFORE_WITH` on a state context: enters it (the graph node, and for real); returns
    /// the block's `__exit__`.
    pub(super) fn state_enter(&mut self, spec: usize) -> CResult<VarId> {
        let py = self.py;
        let kind = self.state_specs[spec].kind;
        let values = self.state_specs[spec].values.bind(py).clone();
        let (enter, _) = kind.node_functions(py)?;
        let token = match enter.call1(values.cast::<PyTuple>().map_err(PyErr::from)?) {
            Ok(token) => token,
            Err(err) => {
                let detail = format!("entering {} raised {err}", kind.describe());
                return self.raised(err, detail);
            }
        };
        let args = values
            .try_iter()?
            .map(|v| Ok(Arg::Const(OwnedRef::from_bound(&v?))))
            .collect::<PyResult<Vec<_>>>()?;
        let name = enter.getattr("__name__")?.to_string();
        let node = self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&enter)),
            &name,
            args,
            Vec::new(),
            OwnedRef::from_bound(&token),
        );
        // Global state: a generator run ahead of its consumer may not change it.
        self.note_effect(None);
        let grad_before = self.grad_enabled;
        if kind == StateKind::InferenceMode {
            // `inference_mode(mode)` sets grad mode to `not mode` (and back on leaving).
            self.grad_enabled = !values.get_item(0)?.is_truthy()?;
            self.state_specs[spec].grad_outside = Some(grad_before);
        }
        self.open_states.push(OpenStateContext {
            spec,
            enter: node,
            token: OwnedRef::from_bound(&token),
            grad_before,
        });
        Ok(self.add(VarKind::StateContext(StateContextVar::Exit { spec }), None))
    }

    /// `torch.is_inference_mode_enabled()` inside an inference-mode block of the trace: the
    /// innermost block's mode (a constant, as TorchDynamo folds it). Elsewhere the answer
    /// depends on the caller, which no guard covers: None (a graph node, as before).
    pub(super) fn inference_mode_query(
        &mut self,
        obj: &Bound<'py, PyAny>,
    ) -> CResult<Option<VarId>> {
        let Some(open) = self
            .open_states
            .iter()
            .rev()
            .find(|o| self.state_specs[o.spec].kind == StateKind::InferenceMode)
        else {
            return Ok(None);
        };
        if !obj.is(&self.h.torch.getattr("is_inference_mode_enabled")?) {
            return Ok(None);
        }
        let mode = self.state_specs[open.spec]
            .values
            .bind(self.py)
            .get_item(0)?;
        Ok(Some(self.constant(&mode)))
    }

    /// Calling a state context's `__exit__` (the normal end of its block): leaves the
    /// innermost block, which must be this one. None for other callees.
    pub(super) fn state_exit_call(&mut self, callee: VarId) -> CResult<Option<VarId>> {
        let py = self.py;
        if self.is_real_state_exit(callee)? {
            // The resume function of a graph break inside a block: the block was entered by
            // the code before it (see the module docs).
            return unsupported(
                BreakKind::ContextManager,
                "leaving a torch.autocast, inference_mode or sdpa_kernel block entered before \
                 this frame (after a graph break inside the block)",
            );
        }
        let VarKind::StateContext(var) = *self.kind(callee) else {
            return Ok(None);
        };
        let spec = match var {
            StateContextVar::Exit { spec } => spec,
            StateContextVar::Context { spec } => {
                let what = self.state_specs[spec].kind.describe();
                return unsupported(
                    BreakKind::ContextManager,
                    format!("{what} used as a decorator"),
                );
            }
        };
        if self.open_states.last().map(|o| o.spec) != Some(spec) {
            return unsupported(
                BreakKind::ContextManager,
                "leaving a torch.autocast, inference_mode or sdpa_kernel block other than the \
                 innermost",
            );
        }
        self.leave_innermost_state()?;
        Ok(Some(self.constant(&py.None().into_bound(py))))
    }

    /// Whether `callee` is the bound `__exit__` of a real context of these kinds.
    fn is_real_state_exit(&self, callee: VarId) -> PyResult<bool> {
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
        Ok(receiver.is_instance(&self.h.autocast_type)?
            || receiver.is_instance(&self.h.state_context_type)?)
    }

    /// Records the exit node of the innermost open block and leaves it for real.
    fn leave_innermost_state(&mut self) -> CResult<()> {
        let py = self.py;
        let Some(open) = self.open_states.pop() else {
            return Ok(());
        };
        self.note_effect(None);
        let (_, exit) = self.state_specs[open.spec].kind.node_functions(py)?;
        exit.call1((open.token.bind(py),))?;
        self.grad_enabled = open.grad_before;
        let name = exit.getattr("__name__")?.to_string();
        self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&exit)),
            &name,
            vec![Arg::Node(open.enter)],
            Vec::new(),
            OwnedRef::from_bound(&py.None().into_bound(py)),
        );
        Ok(())
    }

    /// Before a graph is made of the trace so far (at a graph break): it leaves the global
    /// state as the frame found it.
    pub(super) fn leave_open_states(&mut self) -> CResult<()> {
        while !self.open_states.is_empty() {
            self.leave_innermost_state()?;
        }
        Ok(())
    }

    /// Leaves, for real only, the blocks a trace that stopped left entered (the Tracer is
    /// being dropped, or traces again). Grad mode stays as it is: leaving inference mode
    /// would put back the grad mode it found, while the Converter restores the frame's own
    /// (before or after this runs).
    pub(super) fn restore_global_state(&mut self) {
        if self.open_states.is_empty() {
            return;
        }
        let py = self.py;
        let grad = self.h.torch.call_method0("is_grad_enabled");
        while let Some(open) = self.open_states.pop() {
            let left = self.state_specs[open.spec]
                .kind
                .node_functions(py)
                .and_then(|(_, exit)| exit.call1((open.token.bind(py),)));
            if let Err(err) = left {
                err.write_unraisable(py, None);
            }
        }
        let restored = grad.and_then(|grad| {
            self.h
                .torch
                .getattr("_C")?
                .call_method1("_set_grad_enabled", (grad,))
        });
        if let Err(err) = restored {
            err.write_unraisable(py, None);
        }
    }

    /// The function the generated code passes an open block's `__exit__` through before
    /// calling a resume function: it leaves the block and returns a new context with the
    /// block's arguments, which the resume function enters (see
    /// `ResumeLayout::stack_contexts`). Runs with the frame hook off.
    pub(super) fn state_handoff(&self, spec: usize) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        let handoff = py
            .import_module("dynamo_rs._state_contexts")?
            .getattr("handoff")?;
        let spec = &self.state_specs[spec];
        let mut parts = vec![
            handoff,
            pyo3::types::PyString::new(py, spec.kind.key()).into_any(),
        ];
        for value in spec.values.bind(py).try_iter()? {
            parts.push(value?);
        }
        parts.push(match spec.grad_outside {
            Some(mode) => pyo3::types::PyBool::new(py, mode).to_owned().into_any(),
            None => py.None().into_bound(py),
        });
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

    /// A context of these kinds the frame is given (not entered): a `torch.autocast` object,
    /// or the `StateContext` a resume function gets from a graph break inside a block
    /// (`state_handoff`). The trace can enter it as if made in the trace with the same
    /// arguments — which are guarded. None for other values.
    pub(super) fn state_context_input(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &std::rc::Rc<super::source::Source>,
    ) -> CResult<Option<VarId>> {
        use super::guards::GuardKind;
        use super::source::Source;
        let py = self.py;
        let value_type = value.get_type();
        let (kind, cls, attrs): (_, _, &[&str]) = if value_type.is(&self.h.autocast_type) {
            let cls = self.h.autocast_type.clone();
            let attrs = &["device", "fast_dtype", "_enabled", "_cache_enabled"];
            (StateKind::Autocast, cls, attrs)
        } else if value_type.is(&self.h.state_context_type) {
            let key = value.getattr("kind")?.to_string();
            let Some(kind) = StateKind::from_key(&key) else {
                return Ok(None);
            };
            (kind, self.h.state_context_type.clone(), &["kind", "values"])
        } else {
            return Ok(None);
        };
        self.guards
            .add(source.clone(), GuardKind::Type(OwnedRef::from_bound(&cls)));
        let mut read = Vec::new();
        for name in attrs {
            let Ok(attr) = value.getattr(*name) else {
                return Ok(None);
            };
            self.guards.add(
                std::rc::Rc::new(Source::Attr(source.clone(), (*name).into())),
                GuardKind::Equals(OwnedRef::from_bound(&attr)),
            );
            read.push(attr);
        }
        let values = match kind {
            StateKind::Autocast => PyTuple::new(py, read)?,
            _ => read[1]
                .clone()
                .cast_into::<PyTuple>()
                .map_err(PyErr::from)?,
        };
        Ok(Some(self.state_context_var(
            kind,
            values,
            Some(source.clone()),
        )))
    }

    /// How the generated code makes a state context tracker again: a context as the call
    /// made it; the `__exit__` of an open block by entering a real context (at a graph break
    /// the graph has left it: see the module docs).
    pub(super) fn state_context_rebuild(&self, var: StateContextVar) -> CResult<Rebuild> {
        let py = self.py;
        let (spec, helper) = match var {
            StateContextVar::Context { spec } => (spec, "make"),
            StateContextVar::Exit { spec } => (spec, "enter"),
        };
        // Run with the frame hook off: torch's own frames have nothing to compile.
        let helper = Bound::new(
            py,
            crate::eval_frame::disable::DisabledFunction::wrap(
                py.import_module("dynamo_rs._state_contexts")?
                    .getattr(helper)?,
            ),
        )?
        .into_any();
        let spec = &self.state_specs[spec];
        let kind = pyo3::types::PyString::new(py, spec.kind.key()).into_any();
        let mut args = vec![Rebuild::Const(OwnedRef::from_bound(&kind))];
        for value in spec.values.bind(py).try_iter()? {
            args.push(Rebuild::Const(OwnedRef::from_bound(&value?)));
        }
        Ok(Rebuild::Call {
            func: Box::new(Rebuild::Const(OwnedRef::from_bound(&helper))),
            args,
            kwargs: Vec::new(),
        })
    }
}

/// `sdpa_kernel(backends, set_priority=False)`'s arguments as its enter node takes them: the
/// backends' names without repeats (as `sdpa_kernel` keeps them), and `set_priority`.
fn sdpa_kernel_values<'py>(
    py: Python<'py>,
    positional: &Bound<'py, PyTuple>,
    keywords: &Bound<'py, pyo3::types::PyDict>,
) -> CResult<Bound<'py, PyTuple>> {
    let backends = match positional.get_item(0) {
        Ok(b) => b,
        Err(_) => keywords.as_any().get_item("backends")?,
    };
    let set_priority = match positional.get_item(1) {
        Ok(p) => p,
        Err(_) => match keywords.get_item("set_priority")? {
            Some(p) => p,
            None => pyo3::types::PyBool::new(py, false).to_owned().into_any(),
        },
    };
    let list = if backends.is_instance_of::<pyo3::types::PyList>() {
        backends
    } else {
        pyo3::types::PyList::new(py, [backends])?.into_any()
    };
    let mut names: Vec<String> = Vec::new();
    for backend in list.try_iter()? {
        let name = backend?.getattr("name")?.to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(PyTuple::new(
        py,
        [PyTuple::new(py, names)?.into_any(), set_priority],
    )?)
}
