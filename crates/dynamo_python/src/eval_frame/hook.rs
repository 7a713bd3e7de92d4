//! The PEP 523 frame evaluator and the thread-local callback that drives it.
//!
//! `set_eval_frame(callback)` stores the callback for the calling thread only and installs our
//! evaluator interpreter-wide while at least one thread has a callback. For every frame, our
//! evaluator either runs it unchanged (no callback on this thread, generator or
//! class/module-level frames, codes in `Mode::Skip`), runs the transformed code of the first
//! cache entry whose guard passes (moving it to the front), or, on a miss, calls
//! `callback(frame, cache_size)` with the hook disabled and acts on what it returns:
//!
//! - `None`: run the original code this time;
//! - `SKIP` (`dynamo_rs._native.SKIP`): run the original code, now and for every later frame
//!   of this code object;
//! - `(check, code)`: store an entry (`check` is `None` or `check(f_locals) -> bool`) and run
//!   `code` in place of the original.
//!
//! A callback that raises or returns something else is reported as an exception from the
//! call, or, with `config.suppress_errors`, as one warning after which the frame runs
//! unchanged. Past `config.cache_size_limit` entries a code object stops calling the
//! callback (one warning) and only reuses what it has.

use std::cell::Cell;
use std::ptr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::imports::ImportModule;
use pyo3::exceptions::{PyRuntimeWarning, PySystemError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCode, PyTuple};

use super::cache::{
    get_or_init_extra, AlwaysValid, CacheEntry, ExtraState, FrameGuard, FrameLayout, FrameView,
    Mode, PythonGuard,
};
use super::cpython311::{frame_object, InterpreterFrame, FRAME_OWNED_BY_GENERATOR};
use super::owned::OwnedRef;
use super::run::{make_runner, run_entry};

thread_local! {
    /// This thread's callback (a strong reference), or null when the hook is off here.
    static CALLBACK: Cell<*mut ffi::PyObject> = const { Cell::new(ptr::null_mut()) };
    /// The code object of a runner we are about to call: its frame runs as is.
    pub(super) static PENDING: Cell<*mut ffi::PyObject> = const { Cell::new(ptr::null_mut()) };
}

/// Threads that currently have a callback; our evaluator is installed while this is > 0.
static ACTIVE_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Settings, mirrored from `dynamo_rs.config`.
pub static CACHE_SIZE_LIMIT: AtomicUsize = AtomicUsize::new(8);
/// `config.suppress_errors`: which compile failures become one warning (the frame then runs
/// uncompiled) instead of an exception.
pub static SUPPRESS_ERRORS: AtomicU8 = AtomicU8::new(SUPPRESS_OWN);
/// The default (`None`): our own failures are warnings; a failing backend raises, as under
/// torch.compile.
pub const SUPPRESS_OWN: u8 = 0;
/// `True`: every failure is a warning.
pub const SUPPRESS_ALL: u8 = 1;
/// `False`: every failure raises.
pub const SUPPRESS_NONE: u8 = 2;
/// File-name prefixes whose code is never intercepted (our package, torch).
pub static SKIP_PREFIXES: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub fn skip_prefixes() -> Vec<String> {
    SKIP_PREFIXES.lock().map(|p| p.clone()).unwrap_or_default()
}

/// Counters for tests and benchmarks.
pub static STATS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
pub const STAT_FRAMES: usize = 0;
pub const STAT_HITS: usize = 1;
pub const STAT_MISSES: usize = 2;
pub const STAT_CALLBACKS: usize = 3;
pub const STAT_SKIPPED: usize = 4;

fn count(stat: usize) {
    STATS[stat].fetch_add(1, Ordering::Relaxed);
}

/// Turns the hook off on this thread until dropped: what a callback, a guard or a function
/// wrapped by `disable` runs is not intercepted.
#[derive(Debug)]
pub struct HookDisabled(*mut ffi::PyObject);

impl HookDisabled {
    pub fn new() -> HookDisabled {
        HookDisabled(CALLBACK.with(|c| c.replace(ptr::null_mut())))
    }
}

impl Default for HookDisabled {
    fn default() -> Self {
        HookDisabled::new()
    }
}

impl Drop for HookDisabled {
    fn drop(&mut self) {
        // A callback set inside the disabled region is replaced by the outer setting, as if
        // `set_eval_frame(None)` had been called for it.
        let inner = CALLBACK.with(|c| c.replace(self.0));
        if !inner.is_null() {
            if ACTIVE_THREADS.fetch_sub(1, Ordering::AcqRel) == 1 {
                install(false);
            }
            // SAFETY: the GIL is held wherever the hook is disabled; we owned that reference.
            unsafe { ffi::Py_DECREF(inner) };
        }
    }
}

/// The evaluator that was installed before ours (CPython's own unless another PEP 523 user,
/// such as a debugger, came first); frames we do not take over go to it.
/// Stored as an address (0 = none) so the hot path reads it with one atomic load.
static PREVIOUS_EVALUATOR: AtomicUsize = AtomicUsize::new(0);

fn previous_evaluator() -> Option<ffi::_PyFrameEvalFunction> {
    let address = PREVIOUS_EVALUATOR.load(Ordering::Acquire);
    if address == 0 {
        return None;
    }
    // SAFETY: only addresses of `_PyFrameEvalFunction`s are ever stored (see `install`).
    let evaluator = unsafe { std::mem::transmute::<usize, ffi::_PyFrameEvalFunction>(address) };
    Some(evaluator)
}

thread_local! {
    /// The frame this thread is handing to the evaluator we found installed (see
    /// `eval_default`).
    static FORWARDING: Cell<*mut InterpreterFrame> = const { Cell::new(ptr::null_mut()) };
}

/// Runs a frame the way it would have run without us: through the evaluator we found
/// installed, unless that evaluator is the one installed now, over us; if it hands the
/// frame back to us, CPython's runs it (`custom_eval_frame`). TorchDynamo's leaves its evaluator installed after its first use, remembering
/// what it found: ours chains to it, and a `torch.compile` call made under our hook (a
/// `torch.compile`d function, `torch.cond` run eagerly) installs it again over ours, chaining
/// to us — each would hand the frame to the other forever (a crash, after a `torch.cond`
/// that raised). The evaluators before us have had the frame then: CPython's runs it.
///
/// # Safety
/// As for any frame evaluator: GIL held, live frame.
unsafe fn eval_default(
    tstate: *mut ffi::PyThreadState,
    frame: *mut InterpreterFrame,
    throw: i32,
) -> *mut ffi::PyObject {
    // SAFETY: forwarded contract; GIL held, so the current interpreter can be asked for.
    unsafe {
        let top = ffi::_PyInterpreterState_GetEvalFrameFunc(ffi::PyInterpreterState_Get());
        match previous_evaluator() {
            Some(evaluator) if top as usize != evaluator as usize => {
                let outer = FORWARDING.replace(frame);
                let result = evaluator(tstate, frame.cast(), throw);
                FORWARDING.set(outer);
                result
            }
            _ => ffi::_PyEval_EvalFrameDefault(tstate, frame.cast(), throw),
        }
    }
}

/// Our `_PyFrameEvalFunction`. Never unwinds: a Rust panic becomes a `SystemError`.
extern "C" fn custom_eval_frame(
    tstate: *mut ffi::PyThreadState,
    frame: *mut ffi::_PyInterpreterFrame,
    throw: i32,
) -> *mut ffi::PyObject {
    let frame = frame.cast::<InterpreterFrame>();
    if FORWARDING.get() == frame {
        // Handed back by the evaluator we handed it to (see `eval_default`): decided already.
        // SAFETY: the evaluator's contract.
        return unsafe { ffi::_PyEval_EvalFrameDefault(tstate, frame.cast(), throw) };
    }
    // SAFETY: CPython calls the evaluator with the GIL held and a live frame.
    match std::panic::catch_unwind(|| unsafe { eval_frame(tstate, frame, throw) }) {
        Ok(result) => result,
        Err(_) => {
            // SAFETY: GIL held.
            let py = unsafe { Python::assume_attached() };
            PySystemError::new_err("dynamo_rs: internal error in the frame hook (Rust panic)")
                .restore(py);
            ptr::null_mut()
        }
    }
}

/// # Safety
/// GIL held, live frame (the evaluator's contract).
unsafe fn eval_frame(
    tstate: *mut ffi::PyThreadState,
    frame: *mut InterpreterFrame,
    throw: i32,
) -> *mut ffi::PyObject {
    // SAFETY: live frame (contract).
    let code = unsafe { (*frame).f_code };
    if PENDING.with(|p| p.get()) == code {
        PENDING.with(|p| p.set(ptr::null_mut()));
        // The runner's frame holds its arguments now: the references taken out of the
        // frame it replaces are let go (see `run::HANDOFF`).
        // SAFETY: GIL held (contract).
        unsafe { super::run::release_handoff() };
        // SAFETY: forwarded contract.
        return unsafe { eval_default(tstate, frame, throw) };
    }
    let callback = CALLBACK.with(|c| c.get());
    // SAFETY: live frame.
    let plain = unsafe {
        throw != 0 || (*frame).owner == FRAME_OWNED_BY_GENERATOR || !(*frame).f_locals.is_null()
    };
    if callback.is_null() || plain {
        // SAFETY: forwarded contract.
        return unsafe { eval_default(tstate, frame, throw) };
    }
    count(STAT_FRAMES);
    // SAFETY: GIL held (contract).
    let py = unsafe { Python::assume_attached() };
    // SAFETY: live code object.
    let extra = match unsafe { get_or_init_extra(py, code, &SKIP_PREFIXES) } {
        Ok(extra) => extra,
        Err(err) => {
            err.restore(py);
            return ptr::null_mut();
        }
    };
    // SAFETY: the state lives as long as the code object, which the frame keeps alive.
    let extra: &ExtraState = unsafe { &*extra };
    let mode = extra.inner.borrow().mode;
    if mode == Mode::Skip {
        count(STAT_SKIPPED);
        // SAFETY: forwarded contract.
        return unsafe { eval_default(tstate, frame, throw) };
    }
    if mode == Mode::Disabled {
        count(STAT_SKIPPED);
        let _disabled = HookDisabled::new();
        // SAFETY: forwarded contract.
        return unsafe { eval_default(tstate, frame, throw) };
    }
    let view = FrameView {
        frame,
        layout: &extra.layout,
    };
    match lookup(py, extra, &view) {
        Ok(Some(entry)) => {
            count(STAT_HITS);
            // SAFETY: the frame has not started; layout is its code's.
            return unsafe { run_entry(py, frame, &extra.layout, &entry) };
        }
        Ok(None) => {}
        Err(err) => {
            err.restore(py);
            return ptr::null_mut();
        }
    }
    count(STAT_MISSES);
    if mode == Mode::RunOnly {
        // SAFETY: forwarded contract.
        return unsafe { eval_default(tstate, frame, throw) };
    }
    let limit = CACHE_SIZE_LIMIT.load(Ordering::Relaxed);
    if extra.inner.borrow().entries.len() >= limit {
        // Entries for objects that are gone (a class defined in a loop, a model dropped)
        // never match again: they do not count toward the limit. Dropped after the borrow
        // ends (dropping may run Python code).
        let dead: Vec<Rc<CacheEntry>> = {
            let mut inner = extra.inner.borrow_mut();
            let (dead, alive) = std::mem::take(&mut inner.entries)
                .into_iter()
                .partition(|entry| entry.guard.is_dead(py));
            inner.entries = alive;
            dead
        };
        drop(dead);
    }
    let cached = extra.inner.borrow().entries.len();
    if cached >= limit {
        let warn = {
            let mut inner = extra.inner.borrow_mut();
            inner.mode = Mode::RunOnly;
            inner.decided = true;
            !std::mem::replace(&mut inner.warned_limit, true)
        };
        if warn {
            let mut message = format!(
                "dynamo_rs: {} reached config.cache_size_limit ({cached} compiled versions); \
                 it now runs uncompiled when none of them applies",
                extra.layout.location
            );
            let first = extra.inner.borrow().entries.first().cloned();
            if let Some(reason) = first.and_then(|entry| entry.guard.failure(py, &view)) {
                message.push_str(&format!(" (last recompile: {reason})"));
            }
            if let Err(err) = warn_runtime(py, &message) {
                err.restore(py);
                return ptr::null_mut();
            }
        }
        // SAFETY: forwarded contract.
        return unsafe { eval_default(tstate, frame, throw) };
    }
    // SAFETY: callback is this thread's live callback; the frame has not started.
    match unsafe { call_callback(py, callback, frame, extra, cached) } {
        Ok(Decision::RunOriginal) => {}
        Ok(Decision::Skip) => {
            // A frame that cannot be compiled for these inputs stops being compiled; entries
            // already compiled for other inputs stay in use (a layer class whose decoder
            // instances fail keeps its encoder instances' entry).
            let mut inner = extra.inner.borrow_mut();
            inner.decided = true;
            inner.mode = if inner.entries.is_empty() {
                Mode::Skip
            } else {
                Mode::RunOnly
            };
        }
        Ok(Decision::Run(entry)) => {
            // SAFETY: as for a hit.
            return unsafe { run_entry(py, frame, &extra.layout, &entry) };
        }
        Err(err) => {
            let always_raise = err.is_instance_of::<crate::errors::CompileError>(py);
            if always_raise || SUPPRESS_ERRORS.load(Ordering::Relaxed) == SUPPRESS_NONE {
                err.restore(py);
                return ptr::null_mut();
            }
            let message = format!(
                "dynamo_rs: compiling {} failed, running it uncompiled: {}",
                extra.layout.location,
                err.value(py)
            );
            if let Err(err) = warn_runtime(py, &message) {
                err.restore(py);
                return ptr::null_mut();
            }
        }
    }
    // SAFETY: forwarded contract.
    unsafe { eval_default(tstate, frame, throw) }
}

/// The first entry whose guard passes, moved to the front.
fn lookup(
    py: Python<'_>,
    extra: &ExtraState,
    view: &FrameView<'_>,
) -> PyResult<Option<Rc<CacheEntry>>> {
    let mut index = 0;
    loop {
        // Guards may run Python code that inspects this cache, so no borrow is held across
        // a check; entries are reference-counted so one in use cannot be freed.
        let Some(entry) = extra.inner.borrow().entries.get(index).cloned() else {
            return Ok(None);
        };
        if entry.guard.check(py, view)? {
            let mut inner = extra.inner.borrow_mut();
            if let Some(at) = inner.entries.iter().position(|e| Rc::ptr_eq(e, &entry)) {
                if at != 0 {
                    let hit = inner.entries.remove(at);
                    inner.entries.insert(0, hit);
                }
            }
            return Ok(Some(entry));
        }
        index += 1;
    }
}

enum Decision {
    RunOriginal,
    Skip,
    Run(Rc<CacheEntry>),
}

/// # Safety
/// `callback` is live; `frame` is live and has not started; GIL held.
unsafe fn call_callback(
    py: Python<'_>,
    callback: *mut ffi::PyObject,
    frame: *mut InterpreterFrame,
    extra: &ExtraState,
    cache_size: usize,
) -> PyResult<Decision> {
    count(STAT_CALLBACKS);
    let slots = extra.layout.nlocalsplus() + extra.layout.stacksize;
    // SAFETY: forwarded contract.
    let frame_obj = unsafe { frame_object(py, frame, slots)? };
    // SAFETY: the callback is alive: we own a reference through CALLBACK, which the disabled
    // region keeps and restores.
    let callback = unsafe { Bound::from_borrowed_ptr(py, callback) };
    let result = {
        let _disabled = HookDisabled::new();
        callback.call1((frame_obj, cache_size))?
    };
    if result.is_none() {
        return Ok(Decision::RunOriginal);
    }
    if result.is(skip_sentinel(py)) {
        return Ok(Decision::Skip);
    }
    let location = &extra.layout.location;
    let pair = result.cast::<PyTuple>().ok().filter(|t| t.len() == 2).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "the dynamo_rs callback for {location} returned {}; expected None, SKIP or (check, code)",
            type_name(&result)
        ))
    })?;
    let check = pair.get_item(0)?;
    let code = pair.get_item(1)?;
    // SAFETY: live frame and code (the frame holds them).
    let original = unsafe { Bound::from_borrowed_ptr(py, (*frame).f_code) };
    check_compatible(&original, &code, location)?;
    let guard: Box<dyn FrameGuard> = if check.is_none() {
        Box::new(AlwaysValid)
    } else if let Some(native) = super::cache::native_guard(&check) {
        native
    } else if check.is_callable() {
        Box::new(PythonGuard(OwnedRef::from_bound(&check)))
    } else {
        return Err(PyTypeError::new_err(format!(
            "the dynamo_rs callback for {location} returned a check of type {}; expected None or a callable",
            type_name(&check)
        )));
    };
    // Another thread may have compiled an entry for the same inputs while this compile ran
    // (compiling lets other threads run): use it rather than keep two for one case, which
    // would fill the cache towards its limit.
    let view = FrameView {
        frame,
        layout: &extra.layout,
    };
    if cache_size < extra.inner.borrow().entries.len() {
        if let Some(existing) = lookup(py, extra, &view)? {
            return Ok(Decision::Run(existing));
        }
    }
    // SAFETY: live frame.
    let globals = unsafe { (*frame).f_globals };
    // SAFETY: `code` is a live code object (checked above), GIL held, layouts checked at
    // import.
    unsafe { super::cpython311::untrack_names(code.as_ptr()) };
    let entry = Rc::new(CacheEntry {
        guard,
        // SAFETY: `code` is a code object (checked above); `globals` is the live frame's.
        runner: unsafe { make_runner(py, &code, globals)? },
        code: OwnedRef::from_bound(&code),
    });
    extra.inner.borrow_mut().entries.insert(0, entry.clone());
    Ok(Decision::Run(entry))
}

/// The transformed code must accept the same arguments and use the same closure.
fn check_compatible(
    original: &Bound<'_, PyAny>,
    code: &Bound<'_, PyAny>,
    location: &str,
) -> PyResult<()> {
    if !code.is_instance_of::<PyCode>() {
        return Err(PyTypeError::new_err(format!(
            "the dynamo_rs callback for {location} returned {} as code; expected a code object",
            type_name(code)
        )));
    }
    let new = FrameLayout::read(code)?;
    let old = FrameLayout::read(original)?;
    let flag_mask: u32 = 0x04 | 0x08 | super::cache::CO_GENERATOR_LIKE;
    let old_flags: u32 = original.getattr("co_flags")?.extract()?;
    let new_flags: u32 = code.getattr("co_flags")?.extract()?;
    let mismatch = |what: &str| {
        Err(PyTypeError::new_err(format!(
            "the dynamo_rs callback for {location} returned code with a different {what}; the \
             transformed code must take the same arguments and free variables"
        )))
    };
    if (old.argcount, old.kwonlyargcount) != (new.argcount, new.kwonlyargcount)
        || original
            .getattr("co_posonlyargcount")?
            .ne(code.getattr("co_posonlyargcount")?)?
    {
        return mismatch("argument count");
    }
    if old_flags & flag_mask != new_flags & flag_mask {
        return mismatch("kind (*args, **kwargs, generator or coroutine flags)");
    }
    let n = old.arg_slots();
    let old_args = original
        .getattr("co_varnames")?
        .get_item(pyo3::types::PySlice::new(code.py(), 0, n as isize, 1))?;
    let new_args = code
        .getattr("co_varnames")?
        .get_item(pyo3::types::PySlice::new(code.py(), 0, n as isize, 1))?;
    if old_args.ne(new_args)? {
        return mismatch("argument names");
    }
    if original
        .getattr("co_freevars")?
        .ne(code.getattr("co_freevars")?)?
    {
        return mismatch("set of free variables (co_freevars)");
    }
    Ok(())
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn warn_runtime(py: Python<'_>, message: &str) -> PyResult<()> {
    let _disabled = HookDisabled::new();
    PyErr::warn(
        py,
        &py.get_type::<PyRuntimeWarning>(),
        &std::ffi::CString::new(message)?,
        1,
    )
}

/// The object a callback returns to say "never intercept this code again".
pub fn skip_sentinel(py: Python<'_>) -> &Bound<'_, PyAny> {
    static SKIP: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
    SKIP.get_or_init(py, || {
        py.import_module("builtins")
            .and_then(|b| b.getattr("object"))
            .and_then(|o| o.call0())
            .map(Bound::unbind)
            .expect("object() cannot fail")
    })
    .bind(py)
}

/// Sets this thread's callback (None turns the hook off here) and returns the previous one.
pub fn set_callback(py: Python<'_>, callback: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
    let new = callback.map_or(ptr::null_mut(), |c| {
        // CALLBACK owns this reference until replaced.
        // SAFETY: live object, GIL held.
        unsafe { ffi::Py_INCREF(c.as_ptr()) };
        c.as_ptr()
    });
    let old = CALLBACK.with(|c| c.replace(new));
    let was_on = !old.is_null();
    let is_on = !new.is_null();
    if is_on && !was_on && ACTIVE_THREADS.fetch_add(1, Ordering::AcqRel) == 0 {
        install(true);
    }
    if was_on && !is_on && ACTIVE_THREADS.fetch_sub(1, Ordering::AcqRel) == 1 {
        install(false);
    }
    // SAFETY: we owned the old reference; hand it to the caller.
    Ok(unsafe { OwnedRef::from_owned(old) }
        .map_or_else(|| py.None(), |o| o.bind(py).clone().unbind()))
}

fn install(on: bool) {
    // SAFETY: GIL held (called from a pyfunction); the interpreter outlives the module.
    unsafe {
        let interp = ffi::PyInterpreterState_Get();
        let current = ffi::_PyInterpreterState_GetEvalFrameFunc(interp);
        let ours: ffi::_PyFrameEvalFunction = custom_eval_frame;
        if on {
            if current as usize != ours as usize {
                let is_cpython = current as usize == default_evaluator as *const () as usize
                    || current as usize == ffi::_PyEval_EvalFrameDefault as *const () as usize;
                PREVIOUS_EVALUATOR.store(
                    if is_cpython { 0 } else { current as usize },
                    Ordering::Release,
                );
                ffi::_PyInterpreterState_SetEvalFrameFunc(interp, ours);
            }
        } else if current as usize == ours as usize {
            // Only undo our own installation: another PEP 523 user may have chained after us.
            ffi::_PyInterpreterState_SetEvalFrameFunc(
                interp,
                previous_evaluator().unwrap_or(default_evaluator),
            );
        }
    }
}

extern "C" fn default_evaluator(
    tstate: *mut ffi::PyThreadState,
    frame: *mut ffi::_PyInterpreterFrame,
    throw: i32,
) -> *mut ffi::PyObject {
    // SAFETY: the evaluator's contract.
    unsafe { ffi::_PyEval_EvalFrameDefault(tstate, frame, throw) }
}

/// This thread's callback (borrowed; null when the hook is off here). Guards compare it with
/// the callback that compiled their entry: an entry made for one backend is not reused under
/// another.
pub fn current_callback() -> *mut ffi::PyObject {
    CALLBACK.with(|c| c.get())
}

/// Whether a callback is set on this thread.
pub fn is_enabled() -> bool {
    CALLBACK.with(|c| !c.get().is_null())
}

/// Calls `f(*args, **kwargs)` with the hook off on this thread.
pub fn call_disabled<'py>(
    f: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, pyo3::types::PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let _disabled = HookDisabled::new();
    f.call(args, kwargs)
}
