//! Capture: turning a frame into an FX graph, a guard and a code object that calls the graph.
//!
//! [`Converter`] is the frame hook's callback for `dynamo_rs.compile`. For a frame it:
//! 1. translates the bytecode symbolically ([`translator`], one opcode family per `ops_*`
//!    file) over variable trackers ([`vars`]) with sources ([`source`]), building the graph
//!    IR ([`graph`]) and recording guards ([`guards`]);
//! 2. exports the graph to `torch.fx` and hands it to the backend with the real inputs;
//! 3. generates the replacement code ([`codegen`]) and compiles the guard.
//!
//! A frame the translator cannot handle whole is split at a graph break where it can be
//! ([`graph_break`]): the part before becomes a graph, the rest a resume function compiled in
//! turn. Otherwise it runs eagerly (one log line); with `fullgraph=True` the reason is raised
//! as `dynamo_rs.Unsupported` instead.

pub use dynamo_capture::break_reasons;
mod builtins;
pub mod codegen;
mod existing_containers;
mod existing_tensor_keys;
mod frame_state;
mod global_state;
pub mod graph;
mod graph_break;
mod graph_forward;
mod graph_inputs;
mod guard_contents;
mod guard_frozen;
mod guard_groups;
pub mod guard_reference;
pub mod guard_values;
pub mod guards;
pub mod helpers;
mod in_place;
mod iteration;
mod lazy_inputs;
mod model_output;
mod ops_arith;
mod ops_autograd;
mod ops_build;
mod ops_call;
mod ops_checkpoint;
mod ops_compile_region;
mod ops_cond;
mod ops_containers;
mod ops_control;
mod ops_copy;
mod ops_deque;
mod ops_dict_subclass;
mod ops_exceptions;
mod ops_frame_locals;
mod ops_function_attrs;
mod ops_functools;
mod ops_functorch;
mod ops_generators;
mod ops_graph;
mod ops_itertools;
mod ops_lazy_iter;
mod ops_list_subclass;
mod ops_load_store;
mod ops_loops;
mod ops_match;
mod ops_module_call;
mod ops_module_new;
mod ops_module_slice;
mod ops_module_to;
mod ops_nested_compile;
mod ops_numpy;
mod ops_objects;
mod ops_operator_getters;
mod ops_optimizer;
mod ops_sequence_compare;
mod ops_sets;
mod ops_state_context;
mod ops_super;
mod ops_symbolic;
mod ops_tensor_data;
mod ops_tensor_functions;
mod ops_tensor_grad;
mod ops_tensor_method;
mod ops_torch_check;
mod ops_user_operators;
mod ops_with;
mod persist;
mod rebuild;
pub mod shape_guard;
pub mod source;
mod source_table;
mod split_hints;
mod subgraph;
pub mod tensor_check;
pub mod translator;
pub mod vars;
mod wrap_handed_on;

use self::break_reasons::{Break, BreakKind};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors::{BackendCompilerFailed, Unsupported};
use crate::eval_frame::owned::OwnedRef;
use codegen::{CodeGen, Rebuild, Replay};
use graph::{Arg, Op};
use guards::NativeGuard;
use helpers::Helpers;
use in_place::may_mutate_in_place;
pub(crate) use in_place::{node_calls_in_place, node_draws_random};
use source::Source;
use split_hints::SplitHint;
use translator::{frame_state, unsupported, CResult, CaptureError, Tracer};
use vars::VarId;

/// The callback `dynamo_rs.compile` installs: compiles a frame into `(guard, code)`.
///
/// Frozen (no `&mut self`): several threads may compile with one converter at once, and
/// guards read its backend while another thread compiles. Counters sit behind a mutex that
/// is only held for an update.
#[pyclass(module = "dynamo_rs._native", frozen)]
#[derive(Debug)]
pub struct Converter {
    backend: Py<PyAny>,
    fullgraph: bool,
    /// `dynamic=` of `dynamo_rs.compile`: None automatic, True all dimensions symbolic from
    /// the start, False static (see `_shapes.dynamic_dims`).
    dynamic: Option<bool>,
    /// What names the backend and the compile options in the persistent capture cache's
    /// keys (`dynamo_rs/_persist.py`); None: entries of this converter are never persisted
    /// (a backend given as a callable, which no later process can be known to share).
    cache_key: Option<String>,
    /// The backend runs graphs through AOTAutograd's partitioner (`inductor`, `aot_eager`):
    /// a checkpointed function drawing random numbers is recomputed with the same draws,
    /// so it can be captured (see `ops_checkpoint`). Run as it is (`eager`, a callable),
    /// torch's checkpoint operation recomputes with other draws: a graph break instead.
    random_recompute: bool,
    stats: std::sync::Mutex<ConverterStats>,
    /// Where functions inlined into a frame that failed will be split when they run as frames
    /// of their own (see `SplitHint`).
    split_hints: std::sync::Mutex<Vec<SplitHint>>,
    /// The code of the function given to `dynamo_rs.compile`: traced even when nothing of
    /// torch's is among its inputs or globals (its arguments may be objects holding tensors),
    /// as torch.compile always traces the function it is given.
    root_code: std::sync::OnceLock<Py<PyAny>>,
}

/// What a converter has done, for tests, the demo and the benchmarks.
#[derive(Debug, Default)]
struct ConverterStats {
    graphs: usize,
    ops: usize,
    guards: usize,
    /// Frames that ran eagerly, with the reason.
    failures: Vec<(String, String)>,
    /// Graph breaks (frames split in two), with where and why.
    breaks: Vec<(String, String)>,
    /// Seconds spent in each phase of capture, summed over frames.
    phases: HashMap<&'static str, f64>,
    /// Frames traced (a graph break traces a frame twice).
    traces: usize,
    /// Entries read back from the persistent capture cache instead of traced.
    loaded: usize,
    /// Every call of the converter: the frame's qualified name, the seconds it took and what
    /// came of it, for finding where a model's capture time goes.
    frames: Vec<(String, f64, &'static str)>,
}

impl Converter {
    fn stats(&self) -> std::sync::MutexGuard<'_, ConverterStats> {
        // A panic while holding the lock cannot leave the counters inconsistent in a way
        // that matters; keep counting.
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether entries compiled by this converter may run under `other` (the callback now
    /// installed on the thread): the same converter, or one with the same backend (the same
    /// object, or an equal one — torch's inductor wrapper compares its settings).
    pub fn same_backend(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> bool {
        let Ok(other) = other.cast::<Converter>() else {
            return false;
        };
        let other = other.get();
        let (mine, theirs) = (self.backend.bind(py), other.backend.bind(py));
        mine.is(theirs) || mine.eq(theirs).unwrap_or(false)
    }
}

#[pymethods]
impl Converter {
    #[new]
    #[pyo3(signature = (backend, *, fullgraph=false, dynamic=None, cache_key=None, random_recompute=false))]
    fn new(
        backend: Py<PyAny>,
        fullgraph: bool,
        dynamic: Option<bool>,
        cache_key: Option<String>,
        random_recompute: bool,
    ) -> Self {
        Converter {
            backend,
            fullgraph,
            dynamic,
            cache_key,
            random_recompute,
            stats: std::sync::Mutex::new(ConverterStats::default()),
            split_hints: std::sync::Mutex::new(Vec::new()),
            root_code: std::sync::OnceLock::new(),
        }
    }

    /// Names the code of the function this converter was made for (see `root_code`).
    fn set_root_code(&self, code: Py<PyAny>) {
        let _ = self.root_code.set(code);
    }

    /// Graphs compiled.
    #[getter]
    fn graphs(&self) -> usize {
        self.stats().graphs
    }

    /// Operations captured, summed over graphs.
    #[getter]
    fn ops(&self) -> usize {
        self.stats().ops
    }

    /// Guards built, summed over entries.
    #[getter]
    fn guards(&self) -> usize {
        self.stats().guards
    }

    /// Frames that ran eagerly, with the reason.
    #[getter]
    fn failures(&self) -> Vec<(String, String)> {
        self.stats().failures.clone()
    }

    /// Graph breaks: (where, why) for each frame split at one.
    #[getter]
    fn breaks(&self) -> Vec<(String, String)> {
        self.stats().breaks.clone()
    }

    /// Seconds spent in each phase of capture, summed over frames.
    #[getter]
    fn phases(&self) -> HashMap<&'static str, f64> {
        self.stats().phases.clone()
    }

    /// Frames traced (a frame split at a graph break is traced twice).
    #[getter]
    fn traces(&self) -> usize {
        self.stats().traces
    }

    /// Entries read back from the persistent capture cache instead of traced.
    #[getter]
    fn loaded(&self) -> usize {
        self.stats().loaded
    }

    /// Every frame the converter was called for, in order: (qualified name, seconds, outcome
    /// — "graph", "split", "eager", "skipped", or "error").
    #[getter]
    fn frames(&self) -> Vec<(String, f64, &'static str)> {
        self.stats().frames.clone()
    }

    /// The backend graphs are handed to.
    #[getter]
    fn backend(&self, py: Python<'_>) -> Py<PyAny> {
        self.backend.clone_ref(py)
    }

    /// `dynamic=` of `dynamo_rs.compile`.
    #[getter]
    fn dynamic(&self) -> Option<bool> {
        self.dynamic
    }

    /// The persistent capture cache's name for the backend and options (None: not persisted).
    #[getter]
    fn cache_key(&self) -> Option<String> {
        self.cache_key.clone()
    }

    fn __call__(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        frame: &Bound<'_, PyAny>,
        cache_size: usize,
    ) -> PyResult<Py<PyAny>> {
        let start = std::time::Instant::now();
        let (breaks_before, failures_before) = {
            let stats = slf.get().stats();
            (stats.breaks.len(), stats.failures.len())
        };
        // Capture makes many short-lived objects (trackers, fake tensors, FX nodes) and few
        // cycles: the cyclic collector, run every few hundred allocations, would walk the
        // same survivors again and again (10-25% of a large model's capture). It is paused
        // while a frame compiles and resumed after (unless the program had it off).
        // The backend's own compilation runs with the collector on (`with_collector`).
        let gc = py.import_module("gc")?;
        let collecting = gc.call_method0("isenabled")?.is_truthy()?;
        if collecting {
            gc.call_method0("disable")?;
        }
        let paused_before = GC_PAUSED.with(|p| p.replace(collecting));
        let result = Self::compile_frame(slf, py, frame, cache_size);
        GC_PAUSED.with(|p| p.set(paused_before));
        if collecting {
            gc.call_method0("enable")?;
        }
        let outcome = match &result {
            Err(_) => "error",
            Ok(r) if r.is_none(py) => "skipped",
            Ok(r) if r.bind(py).is(crate::eval_frame::hook::skip_sentinel(py)) => {
                if slf.get().stats().failures.len() > failures_before {
                    "eager"
                } else {
                    "skipped"
                }
            }
            Ok(_) if slf.get().stats().breaks.len() > breaks_before => "split",
            Ok(_) => "graph",
        };
        let name = frame
            .getattr("f_code")
            .and_then(|c| c.getattr("co_qualname"))
            .and_then(|n| n.extract::<String>())
            .unwrap_or_default();
        slf.get()
            .stats()
            .frames
            .push((name, start.elapsed().as_secs_f64(), outcome));
        result
    }
}

impl Converter {
    /// The converter's work for one frame (see `__call__`).
    fn compile_frame(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        frame: &Bound<'_, PyAny>,
        cache_size: usize,
    ) -> PyResult<Py<PyAny>> {
        let this = slf.get();
        if cache_size > 0 {
            // Every entry failed: say why (the `dynamo_rs.recompiles` log, the cache-limit
            // warning).
            py.import_module("dynamo_rs._capture")?
                .call_method1("log_recompile", (frame,))?;
        }
        let start = std::time::Instant::now();
        let saved_state = global_state::SavedGlobalState::take(py)?;
        let torch_c = py.import_module("torch")?.getattr("_C")?;
        if torch_c
            .call_method0("_len_torch_function_stack")?
            .extract::<usize>()?
            != 0
            || torch_c
                .call_method0("_len_torch_dispatch_stack")?
                .extract::<usize>()?
                != 0
        {
            // A torch-function or torch-dispatch mode changes what every torch call does,
            // and the trace folds `has_torch_function` to False and the dispatch stack's
            // length to 0: run this call as it is, and compile a later one made without it.
            return Ok(py.None());
        }
        if !torch_c
            .getattr("_functorch")?
            .call_method0("peek_interpreter_stack")?
            .is_none()
        {
            // Inside a functorch transform (`torch.func.grad`, `vmap`, ...) the frame's
            // tensors are the transform's wrappers, which fake tensors and the backends
            // cannot take: this call runs as it is (TorchDynamo traces the transform as a
            // whole instead). Entries made outside one do not match such wrappers either:
            // their dispatch keys differ from the plain tensors the entries were made for.
            return Ok(py.None());
        }
        if !torch_c
            .getattr("_autograd")?
            .call_method1("_top_saved_tensors_default_hooks", (false,))?
            .is_none()
        {
            // Saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`, activation
            // offloading) are user code called on every tensor autograd saves: tracing
            // would call them on fake tensors. The call runs as it is.
            return Ok(py.None());
        }
        if !torch_c
            .getattr("_autograd")?
            .call_method0("_saved_tensors_hooks_is_enabled")?
            .is_truthy()?
        {
            // Inside `disable_saved_tensors_hooks`: `torch.func.grad` traced here would
            // leave the switch as it found it, which no guard records (see `ops_functorch`).
            // The call runs as it is.
            return Ok(py.None());
        }
        if let Some(entry) = this.load_persisted(py, frame, slf.as_any())? {
            return Ok(entry);
        }
        let new_tracer = || -> PyResult<Tracer<'_>> {
            let mut tracer = Tracer::new(py, Helpers::load(py)?)?;
            // The global state the trace sees, taken before tracing changes anything.
            let global_state = py
                .import_module("torch._C._dynamo.guards")?
                .getattr("GlobalStateGuard")?
                .call0()?;
            tracer.guards.global_state = Some(OwnedRef::from_bound(&global_state));
            tracer.entry_state = Some(global_state::SavedGlobalState::take(py)?);
            Ok(tracer)
        };
        // What the trace set of torch's global state for real is put back after each trace.
        let restore_global_state = || saved_state.restore();
        let mut tracer = new_tracer()?;
        this.lap("setup", start);
        let mut split_at = None;
        let mut converted = None;
        if let Some(hint) = this.take_split_hint(frame)? {
            let hinted = this.convert(
                py,
                &mut tracer,
                frame,
                slf.as_any(),
                Some(hint.index),
                &mut None,
            );
            restore_global_state()?;
            match hinted {
                Ok(entry) => {
                    if tracer.reached_stop && entry.is_some() {
                        this.stats()
                            .breaks
                            .push((hint.location.clone(), hint.reason.to_string()));
                        log_graph_break(py, &hint.location, &hint.reason, None)?;
                    }
                    converted = Some(Ok(entry));
                }
                Err(CaptureError::Python(err)) if always_raised(py, &err) => return Err(err),
                // Another path than the one the hint was made on: trace the usual way.
                Err(_) => tracer = new_tracer()?,
            }
        }
        let mut converted = match converted {
            Some(done) => done,
            None => {
                let first = this.convert(py, &mut tracer, frame, slf.as_any(), None, &mut split_at);
                restore_global_state()?;
                first
            }
        };
        if let Err(CaptureError::Python(err)) = &converted {
            if floats_specialized(py, err)? {
                // The backend refused symbolic floats; `_shapes` now keeps this code's
                // floats constant: the same frame, traced again.
                tracer = new_tracer()?;
                split_at = None;
                converted = this.convert(py, &mut tracer, frame, slf.as_any(), None, &mut split_at);
                restore_global_state()?;
            }
        }
        if let (Err(CaptureError::Unsupported(reason)), Some(index), false) =
            (&converted, split_at, this.fullgraph)
        {
            // A graph break: trace again, stop before the instruction, split the frame there.
            let where_ = failure_location(&tracer, frame);
            // What the stopped trace entered for real (autocast, inference mode) is left before the retry
            // enters it again: else it stays on while the retry's graph is compiled and its
            // guard records tensors' dispatch keys.
            tracer.restore_global_state();
            let mut retry = new_tracer()?;
            retry.frame_read_break = tracer.frame_read_break;
            let mut split =
                this.convert(py, &mut retry, frame, slf.as_any(), Some(index), &mut None);
            restore_global_state()?;
            if let Err(CaptureError::Python(err)) = &split {
                if floats_specialized(py, err)? {
                    // As for the whole frame above: the part before the break, floats constant.
                    retry = new_tracer()?;
                    retry.frame_read_break = tracer.frame_read_break;
                    split =
                        this.convert(py, &mut retry, frame, slf.as_any(), Some(index), &mut None);
                    restore_global_state()?;
                }
            }
            match split {
                Ok(Some(entry)) => {
                    this.stats()
                        .breaks
                        .push((where_.clone(), reason.to_string()));
                    log_graph_break(py, &where_, reason, None)?;
                    converted = Ok(Some(entry));
                }
                // Our own consistency checks and the user's own errors always reach the user.
                Err(CaptureError::Python(err)) if always_raised(py, &err) => {
                    return Err(err);
                }
                // The frame cannot be split after all: it runs eagerly, for the first reason.
                Err(err) => {
                    let why = match err {
                        CaptureError::Unsupported(why) => why.to_string(),
                        CaptureError::Python(err) => format!("internal error: {}", err.value(py)),
                        CaptureError::BreakPoint => "internal: stopped twice".into(),
                    };
                    log_graph_break(py, &where_, reason, Some(&why))?;
                    let detail = format!("{}; not split: {why}", reason.detail);
                    converted = Err(CaptureError::Unsupported(Break::new(reason.kind, detail)));
                }
                Ok(None) => {}
            }
        }
        match converted {
            Ok(Some((guard, code))) => Ok((guard, code).into_pyobject(py)?.into_any().unbind()),
            Ok(None) => Ok(crate::eval_frame::hook::skip_sentinel(py).clone().unbind()),
            Err(CaptureError::Python(err)) if always_raised(py, &err) => {
                // Our own consistency checks (the guard self-check) and errors in what the
                // user asked for (a `mark_dynamic` the code cannot honour) always reach the
                // user.
                Err(err)
            }
            Err(err) => {
                let where_ = failure_location(&tracer, frame);
                let suppress = crate::eval_frame::hook::SUPPRESS_ERRORS.load(Ordering::Relaxed);
                let (message, raised) = match err {
                    CaptureError::Unsupported(reason) => (format!("{reason} at {where_}"), None),
                    CaptureError::BreakPoint => {
                        (format!("internal: a trace stopped at {where_}"), None)
                    }
                    CaptureError::Python(err)
                        if err.is_instance_of::<BackendCompilerFailed>(py) =>
                    {
                        // The user's backend failed, not we: raised as torch.compile raises it,
                        // unless every failure is to be a warning.
                        if suppress != crate::eval_frame::hook::SUPPRESS_ALL {
                            return Err(err);
                        }
                        (err.value(py).to_string(), Some(err))
                    }
                    CaptureError::Python(err) => {
                        let message = format!("internal error at {where_}: {}", err.value(py));
                        if suppress == crate::eval_frame::hook::SUPPRESS_NONE {
                            let raised = Unsupported::new_err(message);
                            raised.set_cause(py, Some(err));
                            return Err(raised);
                        }
                        (message, Some(err))
                    }
                };
                if this.fullgraph {
                    return Err(match raised {
                        Some(err) if err.is_instance_of::<BackendCompilerFailed>(py) => err,
                        _ => Unsupported::new_err(message),
                    });
                }
                this.stats().failures.push((where_, message.clone()));
                let logger = py
                    .import_module("logging")?
                    .call_method1("getLogger", ("dynamo_rs",))?;
                logger.call_method1(
                    "warning",
                    (
                        "dynamo_rs could not compile a frame; it runs eagerly: %s",
                        message,
                    ),
                )?;
                Ok(crate::eval_frame::hook::skip_sentinel(py).clone().unbind())
            }
        }
    }
}

/// Whether `err` is `_shapes.FloatsSpecialized`: the backend asked for the frame's floats
/// to be constants.
fn floats_specialized(py: Python<'_>, err: &PyErr) -> PyResult<bool> {
    python_error_is(py, err, "FloatsSpecialized")
}

/// Where a compile failed: the instruction the trace was at, or (a failure after the trace,
/// in the backend) the frame's code.
fn failure_location(tracer: &Tracer<'_>, frame: &Bound<'_, PyAny>) -> String {
    match tracer.location() {
        unknown if unknown == "<unknown>" => frame
            .getattr("f_code")
            .and_then(|code| frame_location(&code))
            .unwrap_or(unknown),
        location => location,
    }
}

/// Whether `err` is the exception class `name` of `dynamo_rs._shapes`.
fn python_error_is(py: Python<'_>, err: &PyErr, name: &str) -> PyResult<bool> {
    let class = py.import_module("dynamo_rs._shapes")?.getattr(name)?;
    Ok(err.get_type(py).is(&class))
}

impl Converter {
    /// Adds the time since `since` to `phase` and returns now.
    fn lap(&self, phase: &'static str, since: std::time::Instant) -> std::time::Instant {
        let now = std::time::Instant::now();
        *self.stats().phases.entry(phase).or_insert(0.0) += (now - since).as_secs_f64();
        now
    }

    fn convert<'py>(
        &self,
        py: Python<'py>,
        tracer: &mut Tracer<'py>,
        frame: &Bound<'py, PyAny>,
        converter: &Bound<'py, PyAny>,
        stop_at: Option<usize>,
        split_at: &mut Option<usize>,
    ) -> CResult<Option<(Py<NativeGuard>, Bound<'py, PyAny>)>> {
        let h = tracer.h.clone();
        let t = std::time::Instant::now();
        let code = frame.getattr("f_code")?;
        let f_locals = frame
            .getattr("f_locals")?
            .cast_into::<PyDict>()
            .map_err(PyErr::from)?;
        let globals = frame
            .getattr("f_globals")?
            .cast_into::<PyDict>()
            .map_err(PyErr::from)?;
        let builtins = frame.getattr("f_builtins")?;
        let grad_enabled = h.torch.call_method0("is_grad_enabled")?.is_truthy()?;
        tracer.guards.grad_mode = Some(grad_enabled);
        tracer.grad_enabled = grad_enabled;

        tracer.root_code = Some(OwnedRef::from_bound(&code));
        tracer.dynamic = self.dynamic;
        tracer.random_recompute = self.random_recompute;
        let mut state = frame_state(&code, globals.clone(), builtins, true)?;
        let argcount: usize = code.getattr("co_argcount")?.extract::<usize>()?
            + code.getattr("co_kwonlyargcount")?.extract::<usize>()?;
        let flags: u32 = code.getattr("co_flags")?.extract()?;
        let nargs = helpers::argument_slots(&code)?;
        // Generators and coroutines (CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE,
        // CO_ASYNC_GENERATOR) cannot be run again as a call.
        tracer.rerun_on_error = flags & (0x20 | 0x80 | 0x100 | 0x200) == 0;
        let nfree = code.getattr("co_freevars")?.len()?;
        let first_free = state.slot_names.len() - nfree;
        let mut any_tensor = false;
        for slot in (0..nargs).chain(first_free..state.slot_names.len()) {
            let name = state.slot_names[slot].clone();
            if let Some(value) = f_locals.get_item(&name)? {
                // Tensor arguments, and the tensors in argument tuples, become graph inputs
                // when first used (`lazy_inputs`): one only handed on at a graph break, or
                // returned, gets no placeholder and no guard.
                let id = if slot < argcount && value.get_type().is(&h.tensor_type) {
                    tracer.unrealized(&value, Rc::new(Source::Local(name)))
                } else {
                    tracer.lazy_tuple_items = slot < nargs;
                    tracer.wrap(&value, Some(Rc::new(Source::Local(name))))?
                };
                // `*args` and `**kwargs` are made fresh for each call: the trace may change
                // them like any container it built (their items keep their sources).
                if slot >= argcount && slot < nargs {
                    tracer.vars[id.0 as usize].source = None;
                }
                any_tensor |= tracer.contains_tensor(id)
                    || tracer.contains_array(id)
                    || is_module_or_class(&h, &value)?;
                state.locals[slot] = Some(id);
            }
        }
        // A frame with nothing of torch's among its inputs or globals runs as it is (most are
        // plain Python helpers called by code that runs eagerly), except a resume function:
        // the rest of a frame split at a graph break, which may make tensors from the values
        // it gets. Modules count (a submodule's `forward` called with an `ImageList` and an
        // `OrderedDict` of features computes with its parameters), and so does a global
        // `torch` module the code names (it may make tensors), as for TorchDynamo.
        let name = code.getattr("co_name")?.extract::<String>()?;
        let is_resume = name.starts_with(graph_break::RESUME_PREFIX);
        let is_root_code = self.root_code.get().is_some_and(|c| c.bind(py).is(&code));
        let torch_related = any_tensor || is_root_code || names_torch_module(&h, &code, &globals)?;
        if (!torch_related && !is_resume) || name.starts_with(graph_break::HANDLER_PREFIX) {
            return Ok(None);
        }
        let slot_names = state.slot_names.clone();
        let prologue = codegen::prologue(&state.instructions)?;
        let t = self.lap("inputs", t);
        tracer.stop_at = stop_at;

        self.stats().traces += 1;
        let no_gc = GcPaused::new();
        let translated = tracer.run(&mut state);
        drop(no_gc);
        let result = match translated {
            Ok(result) => Some(result),
            Err(CaptureError::BreakPoint) => None,
            Err(err) => {
                // A trace that fails costs as much as one that succeeds: counted apart.
                self.lap("failed translation", t);
                if stop_at.is_none() {
                    *split_at = graph_break::split_point(&state, &code)?;
                    if let CaptureError::Unsupported(reason) = &err {
                        self.remember_split_hints(tracer, reason);
                    }
                }
                return Err(err);
            }
        };
        if tracer.generator_left_in_try() {
            return unsupported(
                BreakKind::Generator,
                "a generator left suspended inside its own try or with block (dropping it runs \
                 cleanup code)",
            );
        }
        let t = self.lap("translate", t);
        let frame = Frame {
            code: &code,
            state: &state,
            prologue: &prologue,
            f_locals: &f_locals,
            converter,
        };
        let Some(result) = result else {
            return self.finish_break(py, tracer, frame, t).map(Some);
        };

        if tracer.graph.op_count() == 0 {
            return Ok(None); // nothing to compile: run the frame as it is
        }
        // A frame may return in another grad mode than it was entered in (a resume function
        // that ends a `no_grad` block): the generated code sets it after the graph.
        let return_grad_mode = tracer.end_in_entry_grad_mode()?;
        let (plans, graph) = self.compile_graph(py, tracer, &code, &[result], t)?;
        let t = std::time::Instant::now();
        let mut gen = CodeGen::new(&code, &prologue, slot_names.clone())?;
        // No graph when its only operations were grad-mode switches that change nothing
        // (`with torch.enable_grad():` with grad already on): the result and the replayed
        // stores come from the inputs alone.
        if let Some(compiled) = graph.compiled.clone() {
            gen.call_graph(
                compiled.as_any(),
                &graph.inputs,
                rerun_plan(tracer, &code)?.as_ref(),
            )?;
            gen.keep_outputs_in_local();
        } else {
            gen.set_grad_mode(graph.grad_mode_after)?;
        }
        gen.set_grad_mode(return_grad_mode)?;
        gen.define_shared(&graph.shared)?;
        // The result first: it may read sources the replayed stores change.
        gen.push_rebuilt(&plans[0])?;
        gen.replay(&graph.replays)?;
        let new_code = gen.finish_return()?;
        let t = self.lap("codegen", t);
        let guard = self.build_guard(py, tracer, &graph, &frame)?;
        let t = self.lap("guards", t);
        if let Some(record) = &graph.record {
            self.save_persisted(py, tracer, &frame, record, &graph, &new_code)?;
            self.lap("persistent cache", t);
        }
        Ok(Some((guard, new_code)))
    }

    /// Turns what the trace computed into a compiled graph: how to rebuild each of `roots`
    /// (the values the generated code must produce) from the graph's outputs, the attribute
    /// stores to replay, and the graph itself compiled by the backend (none when the trace
    /// recorded no operation).
    fn compile_graph<'py>(
        &self,
        py: Python<'py>,
        tracer: &mut Tracer<'py>,
        code: &Bound<'py, PyAny>,
        roots: &[VarId],
        t: std::time::Instant,
    ) -> CResult<(Vec<Rebuild>, CompiledGraph<'py>)> {
        let h = tracer.h.clone();
        let grad_enabled = tracer.guards.grad_mode.unwrap_or(true);
        // The graph leaves autocast (inference mode, ...) as the frame found it (at a graph break inside a block).
        tracer.leave_open_states()?;
        let (plans, replays, rebuilder) = rebuild::plan_all(tracer, roots)?;
        let outputs = rebuilder.outputs;
        if outputs.iter().any(|o| tracer.no_grad_leaves.contains(o)) {
            return unsupported(
                BreakKind::UnsupportedCall,
                "a leaf made with requires_grad_() in the graph is handed out (it would not \
                 need gradients)",
            );
        }
        let shared: Vec<(u32, Rebuild)> = rebuilder
            .definitions
            .into_iter()
            .map(|(id, plan)| (id.0, plan))
            .collect();
        let inputs: Vec<Rc<Source>> = tracer.inputs.iter().map(|i| i.source.clone()).collect();
        // Drop grad-mode switches that change nothing (nothing refers to a switch's result)
        // and unused items of tuple results, then export and compile.
        let setter = py
            .import_module("torch")?
            .getattr("_C")?
            .getattr("_set_grad_enabled")?;
        let getitem = h.operator.getattr("getitem")?;
        let mode_of = |n: &graph::Node| match (&n.op, n.args.first()) {
            (Op::CallFunction(f), Some(graph::Arg::Const(mode))) if f.bind(py).is(&setter) => {
                mode.bind(py).extract::<bool>().ok()
            }
            _ => None,
        };
        let switches = tracer
            .graph
            .useless_grad_mode_switches(grad_enabled, mode_of);
        // A graph of nothing but grad-mode switches (a resume function leaving a `no_grad`
        // block after a break): the generated code sets the mode they end in itself.
        let nodes = &tracer.graph.nodes;
        let only_switches = nodes
            .iter()
            .all(|n| matches!(n.op, Op::Placeholder) || mode_of(n).is_some());
        let grad_mode_after = match nodes.iter().rev().find_map(mode_of) {
            Some(last) if only_switches && last != grad_enabled => Some(last),
            _ => None,
        };
        if tracer.graph.op_count_where(&switches) == 0 || only_switches {
            // Nothing computed but grad-mode switches: every output is an input, loaded from
            // where it came from — no graph for the backend, as TorchDynamo compiles none.
            // (Operations whose results go unused still make a graph, as they do under
            // TorchDynamo.)
            let by_output = |k: usize| {
                tracer
                    .inputs
                    .iter()
                    .find(|input| input.node == outputs[k])
                    .map(|input| input.source.clone())
            };
            let plans = plans
                .into_iter()
                .map(|plan| plan.map_outputs(&by_output))
                .collect::<Option<Vec<_>>>();
            let replays = replays
                .into_iter()
                .map(|replay| replay.map_outputs(&by_output))
                .collect::<Option<Vec<_>>>();
            let shared = shared
                .into_iter()
                .map(|(id, plan)| plan.map_outputs(&by_output).map(|p| (id, p)))
                .collect::<Option<Vec<_>>>();
            let (Some(plans), Some(replays), Some(shared)) = (plans, replays, shared) else {
                return unsupported(
                    BreakKind::Internal,
                    "internal: a graph output that is neither computed nor an input",
                );
            };
            return Ok((
                plans,
                CompiledGraph {
                    compiled: None,
                    grad_mode_after,
                    inputs: Vec::new(),
                    replays,
                    shared,
                    record: None,
                },
            ));
        }
        let getitems = tracer.graph.unused_getitems(
            &outputs,
            |n| matches!(&n.op, Op::CallFunction(f) if f.bind(py).is(&getitem)),
        );
        let mut keep: Vec<bool> = switches
            .iter()
            .zip(&getitems)
            .map(|(a, b)| *a && *b)
            .collect();
        // Nodes of traces made only to check something (an autograd.Function's forward the
        // graph calls as a whole), unless something kept refers to them.
        if !tracer.discarded_nodes.is_empty() {
            for range in &tracer.discarded_nodes {
                for i in range.clone() {
                    keep[i] &= matches!(tracer.graph.nodes[i].op, Op::Placeholder);
                }
            }
            tracer.graph.keep_referenced(&mut keep, &outputs);
        }
        let map = tracer.graph.retain(&keep);
        let outputs: Vec<graph::NodeId> = outputs
            .iter()
            .map(|o| map[o.0 as usize].expect("outputs are kept"))
            .collect();
        for input in &mut tracer.inputs {
            input.node = map[input.node.0 as usize].expect("placeholders are kept");
        }

        let t = self.lap("outputs and graph cleanup", t);
        let gm = export(py, tracer, &outputs)?;
        // The graph as the persistent capture cache stores it, taken before the backend
        // sees it (a backend may change the module it is given).
        let record = if self.persists(py)? {
            let record = py
                .import_module("dynamo_rs._persist")?
                .call_method1("graph_record", (&gm,))?;
            (!record.is_none()).then(|| record.unbind())
        } else {
            None
        };
        let t = self.lap("export", t);
        let examples: Vec<_> = tracer
            .inputs
            .iter()
            .map(|i| i.example.bind(py).clone())
            .collect();
        let example_list = PyList::new(py, &examples)?;
        let compiled =
            match with_collector(py, || {
                py.import_module("dynamo_rs._shapes")?.call_method1(
                    "call_backend",
                    (self.backend.bind(py), &gm, &example_list, &tracer.fake_mode),
                )
            }) {
                Ok(c) if c.is_callable() => c,
                Ok(c) => {
                    return Err(CaptureError::Python(BackendCompilerFailed::new_err(
                        format!(
                    "backend {} returned {} ({}), which is not callable, while compiling {}; \
                     a backend must return a callable that runs the graph",
                    backend_name(self.backend.bind(py)),
                    short_repr(&c),
                    c.get_type().name().map(|n| n.to_string()).unwrap_or_default(),
                    frame_location(code)?
                ),
                    )));
                }
                // Not the backend's failure: trace again with floats as constants (see
                // `compile_frame`).
                Err(err) if floats_specialized(py, &err)? => {
                    return Err(CaptureError::Python(err));
                }
                // A limit of fake tensors met inside the backend: a graph break, as under
                // torch.compile (the frame runs eagerly), not the backend's failure.
                Err(err) if python_error_is(py, &err, "BackendFallback")? => {
                    return unsupported(
                        BreakKind::BackendFallback,
                        format!(
                            "backend {} could not compile the graph ({})",
                            backend_name(self.backend.bind(py)),
                            err.value(py)
                        ),
                    );
                }
                Err(err) => {
                    let kind = err
                        .get_type(py)
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default();
                    let text = err.value(py).to_string();
                    let error = if text.is_empty() {
                        kind
                    } else {
                        format!("{kind}: {text}")
                    };
                    let failed = BackendCompilerFailed::new_err(format!(
                        "backend {} raised {error} while compiling {}",
                        backend_name(self.backend.bind(py)),
                        frame_location(code)?
                    ));
                    failed.set_cause(py, Some(err));
                    return Err(CaptureError::Python(failed));
                }
            };
        self.lap("backend", t);
        let compiled = Bound::new(
            py,
            crate::eval_frame::disable::DisabledFunction::wrap(compiled),
        )?;
        let mut stats = self.stats();
        stats.graphs += 1;
        stats.ops += tracer.graph.op_count();
        Ok((
            plans,
            CompiledGraph {
                compiled: Some(compiled.into_any()),
                grad_mode_after: None,
                inputs,
                replays,
                shared,
                record,
            },
        ))
    }

    /// The guard of the entry for `graph`, self-checked on the frame it was built from.
    fn build_guard<'py>(
        &self,
        py: Python<'py>,
        tracer: &mut Tracer<'py>,
        graph: &CompiledGraph<'py>,
        frame: &Frame<'_, 'py>,
    ) -> CResult<Py<NativeGuard>> {
        let (code, f_locals) = (frame.code, frame.f_locals);
        let input_steps: Vec<usize> = graph
            .inputs
            .iter()
            .map(|s| tracer.guards.sources.intern(s) as usize)
            .collect();
        tracer.apply_pins();
        tracer.guards.mutates_in_place = may_mutate_in_place(py, &tracer.graph);
        tracer.guards.shape = shape_guard::build(tracer)?;
        let guard = NativeGuard::build(
            py,
            &tracer.guards,
            &frame.state.slot_names,
            input_steps,
            graph.compiled.as_ref().map(OwnedRef::from_bound),
            Some(OwnedRef::from_bound(frame.converter)),
        )?;
        let guard = Py::new(py, guard)?;
        if self_check_enabled(py)? {
            // Checked in the global state the frame started in, whatever the trace left.
            if let Some(state) = &tracer.entry_state {
                state.restore()?;
            }
            // A guard that fails on the very frame it was built from never holds: every
            // call would recompile. That is a bug in the guards, not in the user's code.
            let failure = guard.bind(py).call_method1("first_failure", (f_locals,))?;
            if !failure.is_none() {
                return Err(CaptureError::Python(crate::errors::InternalCheckFailed::new_err(format!(
                    "internal error: the guard built for {} fails on the frame it was built from: {}",
                    frame_location(code)?,
                    failure
                ))));
            }
        }
        self.stats().guards += tracer.guards.len();
        Ok(guard)
    }
}

/// Errors a compile raises to the user whatever `suppress_errors` says.
fn always_raised(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<crate::errors::InternalCheckFailed>(py)
        || err.is_instance_of::<crate::errors::ConstraintViolation>(py)
}

/// Logs a graph break (once per site and reason) with its code, explanation, hint and the
/// user's source line; `not_split` says why the frame could not be split after all.
fn log_graph_break(
    py: Python<'_>,
    where_: &str,
    reason: &break_reasons::Break,
    not_split: Option<&str>,
) -> PyResult<()> {
    let info = reason.kind.info();
    let detail = match not_split {
        Some(why) => format!("{}; not split: {why}", reason.detail),
        None => reason.detail.clone(),
    };
    py.import_module("dynamo_rs._capture")?.call_method1(
        "log_graph_break",
        (where_, detail, info.code, info.title, info.hint),
    )?;
    Ok(())
}

/// Python's cyclic garbage collector held off while it lives (a translation allocates fakes,
/// sources and graph nodes by the thousand, each 700 of which set off a collection of the
/// young generation: ~3% of a capture), then put back as it was. Only around translation:
/// a backend's compilation (Inductor's) makes cyclic garbage that should be collected.
struct GcPaused {
    was_enabled: bool,
}

impl GcPaused {
    fn new() -> GcPaused {
        // SAFETY: the GIL is held by every caller (the translator runs under it).
        let was_enabled = unsafe { pyo3::ffi::PyGC_Disable() } != 0;
        GcPaused { was_enabled }
    }
}

impl Drop for GcPaused {
    fn drop(&mut self) {
        if self.was_enabled {
            // SAFETY: as in `new`; the guard is dropped on the thread that made it.
            unsafe { pyo3::ffi::PyGC_Enable() };
        }
    }
}

/// The frame being compiled: its code, the trace's state (at its end, or right before a
/// graph break), the code's prologue, its locals as the hook saw them, and the converter.
#[derive(Debug)]
pub struct Frame<'a, 'py> {
    pub code: &'a Bound<'py, PyAny>,
    pub state: &'a translator::FrameState<'py>,
    pub prologue: &'a [dynamo_bytecode::Instruction],
    pub f_locals: &'a Bound<'py, PyDict>,
    pub converter: &'a Bound<'py, PyAny>,
}

/// A graph compiled for one entry: the backend's callable (wrapped so its frames are not
/// intercepted; None when the trace recorded no operation), where its inputs come from, and
/// the attribute stores the generated code replays after calling it.
#[derive(Debug)]
pub struct CompiledGraph<'py> {
    pub compiled: Option<Bound<'py, PyAny>>,
    /// Without a graph (`compiled` is None): the grad mode the generated code must set, when
    /// the trace's only operations were grad-mode switches ending in another mode.
    pub grad_mode_after: Option<bool>,
    pub inputs: Vec<Rc<Source>>,
    pub replays: Vec<Replay>,
    /// Objects made in the trace that several values reach, built first into temps, in order
    /// (see `rebuild`).
    pub shared: Vec<(u32, Rebuild)>,
    /// The graph as the persistent capture cache stores it (`_persist.graph_record`); None
    /// when not persisted.
    pub record: Option<Py<PyAny>>,
}

/// Whether `dynamo_rs.config.guard_self_check` is on.
fn self_check_enabled(py: Python<'_>) -> PyResult<bool> {
    py.import_module("dynamo_rs.config")?
        .getattr("guard_self_check")?
        .is_truthy()
}

/// `qualname (file:line)` of a code object, for messages.
fn frame_location(code: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(format!(
        "{} ({}:{})",
        code.getattr("co_qualname")?,
        code.getattr("co_filename")?,
        code.getattr("co_firstlineno")?
    ))
}

/// `repr(value)`, cut to a line's worth for an error message.
fn short_repr(value: &Bound<'_, PyAny>) -> String {
    let text = value
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into());
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

fn backend_name(backend: &Bound<'_, PyAny>) -> String {
    backend
        .getattr("__name__")
        .or_else(|_| backend.get_type().getattr("__name__"))
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "backend".into())
}

/// Builds the `torch.fx.GraphModule` from the graph IR.
fn export<'py>(
    py: Python<'py>,
    tracer: &Tracer<'py>,
    outputs: &[graph::NodeId],
) -> CResult<Bound<'py, PyAny>> {
    let h = tracer.h.clone();
    let (nodes, outs, fakes) = graph_for_python(py, &h, &tracer.graph.nodes, outputs)?;
    let template = h.forward_template.getattr("__code__")?;
    let forward = graph_forward::forward_code(py, &tracer.graph, outputs, &template)?;
    Ok(h.export
        .call1((nodes, outs, fakes, &tracer.fake_mode, forward))?)
}

/// `nodes` as `_capture.export` takes them: a list of (op, name, target, args, kwargs) with
/// `NodeRef`s for earlier nodes (a submodule's target is `(name, module)`), the outputs' refs
/// and the fake values.
pub(super) fn graph_for_python<'py>(
    py: Python<'py>,
    h: &Helpers<'py>,
    graph_nodes: &[graph::Node],
    outputs: &[graph::NodeId],
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyTuple>, Bound<'py, PyList>)> {
    let to_py = |arg: &Arg| -> PyResult<Bound<'py, PyAny>> { arg_to_python(py, h, arg) };
    let nodes = PyList::empty(py);
    let fakes = PyList::empty(py);
    for node in graph_nodes {
        let (op, target): (&str, Bound<'py, PyAny>) = match &node.op {
            Op::Placeholder => ("placeholder", py.None().into_bound(py)),
            Op::CallFunction(f) => ("call_function", f.bind(py).clone()),
            Op::CallMethod(m) => ("call_method", pyo3::types::PyString::new(py, m).into_any()),
            Op::GetAttr { name, module } => (
                "get_attr",
                (name.as_str(), module.bind(py))
                    .into_pyobject(py)?
                    .into_any(),
            ),
        };
        let args = PyTuple::new(
            py,
            node.args.iter().map(to_py).collect::<PyResult<Vec<_>>>()?,
        )?;
        let kwargs = PyDict::new(py);
        for (k, v) in &node.kwargs {
            kwargs.set_item(k, to_py(v)?)?;
        }
        nodes.append((op, &node.name, target, args, kwargs))?;
        fakes.append(node.fake.bind(py))?;
    }
    let outs = PyTuple::new(
        py,
        outputs
            .iter()
            .map(|n| h.node_ref.call1((n.0 as i64,)))
            .collect::<PyResult<Vec<_>>>()?,
    )?;
    Ok((nodes, outs, fakes))
}

fn arg_to_python<'py>(py: Python<'py>, h: &Helpers<'py>, arg: &Arg) -> PyResult<Bound<'py, PyAny>> {
    let items = |items: &[Arg]| {
        items
            .iter()
            .map(|a| arg_to_python(py, h, a))
            .collect::<PyResult<Vec<_>>>()
    };
    Ok(match arg {
        Arg::Node(n) => h.node_ref.call1((n.0 as i64,))?,
        Arg::Const(v) => v.bind(py).clone(),
        Arg::Tuple(values) => PyTuple::new(py, items(values)?)?.into_any(),
        Arg::List(values) => PyList::new(py, items(values)?)?.into_any(),
        Arg::Slice(values) => py
            .import_module("builtins")?
            .getattr("slice")?
            .call1(PyTuple::new(py, items(values)?)?)?,
        Arg::Dict(entries) => {
            let d = PyDict::new(py);
            for (k, v) in entries {
                d.set_item(k.bind(py), arg_to_python(py, h, v)?)?;
            }
            d.into_any()
        }
    })
}

/// Every kind of graph break: (code, title, explanation, hint), in code order (for
/// `docs/graph-breaks.md`).
#[pyfunction]
fn graph_break_kinds() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    break_reasons::BreakKind::ALL
        .iter()
        .map(|kind| {
            let info = kind.info();
            (info.code, info.title, info.explanation, info.hint)
        })
        .collect()
}

/// Mirrors the capture side of `dynamo_rs.config` (`guard_check = "debug"`).
#[pyfunction]
#[pyo3(signature = (*, guard_check_debug=None))]
fn configure_capture(guard_check_debug: Option<bool>) {
    if let Some(debug) = guard_check_debug {
        guards::DEBUG_CHECKS.store(debug, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What the frame hook runs for a check object a callback returned: our `NativeGuard`s
/// natively, anything else not (the hook calls it from Python).
fn native_guard_adapter(
    check: &Bound<'_, PyAny>,
) -> Option<Box<dyn crate::eval_frame::cache::FrameGuard>> {
    check.is_instance_of::<NativeGuard>().then(|| {
        Box::new(guards::NativeGuardRef(OwnedRef::from_bound(check)))
            as Box<dyn crate::eval_frame::cache::FrameGuard>
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    crate::eval_frame::cache::register_guard_adapter(native_guard_adapter);
    m.add_function(wrap_pyfunction!(configure_capture, m)?)?;
    m.add_class::<Converter>()?;
    m.add_class::<NativeGuard>()?;
    m.add_class::<ops_with::GradModeExit>()?;
    m.add_function(wrap_pyfunction!(graph_break_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(guards::take_graph_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(model_output::model_output_from_fields, m)?)?;
    persist::register(m)?;
    Ok(())
}

/// An `nn.Module` or a subclass of it.
fn is_module_or_class(h: &Helpers<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if value.is_instance(&h.module_type)? {
        return Ok(true);
    }
    Ok(value
        .cast::<pyo3::types::PyType>()
        .is_ok_and(|class| class.is_subclass(&h.module_type).unwrap_or(false)))
}

/// Whether one of the global names `code` reads is `torch` or a module of torch's.
fn names_torch_module(
    h: &Helpers<'_>,
    code: &Bound<'_, PyAny>,
    globals: &Bound<'_, PyDict>,
) -> PyResult<bool> {
    let module_type = h.torch.get_type();
    for name in code.getattr("co_names")?.try_iter()? {
        let Some(value) = globals.get_item(name?)? else {
            continue;
        };
        if value.is(&h.torch) {
            return Ok(true);
        }
        if value.is_instance(&module_type)? {
            if let Ok(module_name) = value.getattr("__name__")?.extract::<String>() {
                if module_name.starts_with("torch.") {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

thread_local! {
    /// Whether this thread's converter paused the cyclic garbage collector while it compiles
    /// a frame (`Converter::__call__`).
    static GC_PAUSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the cyclic garbage collector on if the converter paused it: a backend's
/// compilation (Inductor's lowering) makes cyclic garbage in quantity.
fn with_collector<'py, T>(py: Python<'py>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    if !GC_PAUSED.with(|p| p.get()) {
        return f();
    }
    let gc = py.import_module("gc")?;
    gc.call_method0("enable")?;
    let result = f();
    gc.call_method0("disable")?;
    result
}

/// How the generated code runs the frame again when its graph raises, when the graph holds
/// operations from inside `try` blocks (see `CodeGen::call_graph`).
pub(crate) fn rerun_plan(
    tracer: &Tracer<'_>,
    code: &Bound<'_, PyAny>,
) -> PyResult<Option<codegen::Rerun>> {
    if !tracer.graph_ops_in_try || tracer.state_changing_op.is_some() {
        return Ok(None);
    }
    let parameters = helpers::argument_slots(code)?;
    Ok(Some(codegen::Rerun {
        grad_mode: tracer.guards.grad_mode.unwrap_or(true),
        parameters,
        restore_random: tracer.draws_random,
    }))
}
