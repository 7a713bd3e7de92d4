//! The per-code cache, stored in the code object's `co_extra` slot and freed with it.
//!
//! Each code object the hook sees gets one [`ExtraState`]: what the hook should do with its
//! frames ([`Mode`]), facts about its frame layout read once from the code object
//! ([`FrameLayout`]), and its [`CacheEntry`]s, most recently hit first. An entry pairs a
//! guard ([`FrameGuard`], a Rust trait object so native guard trees plug in later) with the
//! transformed code to run when the guard passes.

use std::cell::RefCell;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::atomic::{AtomicIsize, Ordering};

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::cpython311::{InterpreterFrame, PyCell_Get};
use super::owned::OwnedRef;

/// What the hook does with a code object's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Look up the cache; call the callback on a miss.
    Default,
    /// Run the original code, never look at the cache (generators, our own and torch's
    /// files, codes the callback asked to skip).
    Skip,
    /// Look up the cache but never call the callback (the cache size limit was reached).
    RunOnly,
    /// Run the original code with the hook off for everything it calls: the wrapper
    /// `torch.compiler.disable` puts around a function (TorchDynamo's recursive disable).
    Disabled,
}

/// The codes of TorchDynamo's wrappers whose frames, and every frame they call, are not
/// compiled (one code object each for every function they wrap): the wrapper
/// `torch.compiler.disable` / `torch._dynamo.disable` puts around a function, as under
/// TorchDynamo; and `torch.compile`'s own, which installs TorchDynamo's frame evaluator over
/// ours for the call — a `torch.compile`d function or module called from code we compiled,
/// or the `torch.compile` that `torch.cond` and other higher-order operations make when run
/// eagerly: with our hook still on for the frames TorchDynamo passes on, the two front ends
/// traced the same frames (and the process could crash).
const TORCH_DISABLING_WRAPPERS: [(&str, &str); 2] = [
    (
        "DisableContext.__call__.<locals>._fn",
        "torch/_dynamo/eval_frame.py",
    ),
    (
        "_TorchDynamoContext.__call__.<locals>.compile_wrapper",
        "torch/_dynamo/eval_frame.py",
    ),
];

/// Facts about a code object's frames, read once when the hook first sees it.
#[derive(Debug)]
pub struct FrameLayout {
    pub argcount: usize,
    pub kwonlyargcount: usize,
    pub has_varargs: bool,
    pub has_varkw: bool,
    /// Names of the keyword-only parameters, passed as vectorcall `kwnames`.
    pub kwonly_names: Option<OwnedRef>,
    /// Name of every "localsplus" slot: fast locals, then cells that are not arguments,
    /// then free variables.
    pub names: Vec<OwnedRef>,
    /// Index of the first free variable in localsplus.
    pub first_free: usize,
    pub stacksize: usize,
    /// `qualname (file:line)`, for messages.
    pub location: String,
    pub qualname: String,
    pub filename: String,
    pub flags: u32,
}

impl FrameLayout {
    pub fn nlocalsplus(&self) -> usize {
        self.names.len()
    }

    /// Number of localsplus slots holding arguments.
    pub fn arg_slots(&self) -> usize {
        self.argcount
            + self.kwonlyargcount
            + usize::from(self.has_varargs)
            + usize::from(self.has_varkw)
    }
}

pub const CO_VARARGS: u32 = 0x04;
pub const CO_VARKEYWORDS: u32 = 0x08;
pub const CO_GENERATOR_LIKE: u32 = 0x20 | 0x80 | 0x200 | 0x100;

/// Decides whether the hook should look at a code object's frames at all: not for
/// generators and coroutines, nor for files under one of `skip_prefixes`.
pub fn initial_mode(layout: &FrameLayout, skip_prefixes: &[String]) -> Mode {
    // The longest matching entry decides: a prefix skips, `!dir` keeps files under `dir`
    // intercepted below a shorter skipped prefix (the site-packages inside the standard
    // library's directory of a non-virtual install), while a longer skipped prefix under it
    // (torch's package) still skips.
    let skipped = skip_prefixes
        .iter()
        .filter_map(|p| match p.strip_prefix('!') {
            Some(kept) => layout
                .filename
                .starts_with(kept)
                .then_some((kept.len(), false)),
            None => layout
                .filename
                .starts_with(p.as_str())
                .then_some((p.len(), true)),
        })
        .max_by_key(|(len, _)| *len)
        .is_some_and(|(_, skip)| skip);
    if TORCH_DISABLING_WRAPPERS.iter().any(|(qualname, file)| {
        layout.qualname == *qualname && layout.filename.replace('\\', "/").ends_with(file)
    }) {
        Mode::Disabled
    } else if layout.flags & CO_GENERATOR_LIKE != 0 || skipped {
        Mode::Skip
    } else {
        Mode::Default
    }
}

impl FrameLayout {
    pub fn read(code: &Bound<'_, PyAny>) -> PyResult<FrameLayout> {
        let flags: u32 = code.getattr("co_flags")?.extract()?;
        let argcount: usize = code.getattr("co_argcount")?.extract()?;
        let kwonlyargcount: usize = code.getattr("co_kwonlyargcount")?.extract()?;
        let varnames = code.getattr("co_varnames")?.cast_into::<PyTuple>()?;
        let cellvars = code.getattr("co_cellvars")?.cast_into::<PyTuple>()?;
        let freevars = code.getattr("co_freevars")?.cast_into::<PyTuple>()?;
        let mut names: Vec<OwnedRef> = varnames.iter().map(|n| OwnedRef::from_bound(&n)).collect();
        // In 3.11 a cell that is also an argument shares the argument's slot.
        for cell in cellvars.iter() {
            if !varnames.contains(&cell)? {
                names.push(OwnedRef::from_bound(&cell));
            }
        }
        let first_free = names.len();
        names.extend(freevars.iter().map(|n| OwnedRef::from_bound(&n)));
        let kwonly_names = if kwonlyargcount > 0 {
            let slice = varnames.get_slice(argcount, argcount + kwonlyargcount);
            Some(OwnedRef::from_bound(slice.as_any()))
        } else {
            None
        };
        let qualname: String = code.getattr("co_qualname")?.extract()?;
        let filename: String = code.getattr("co_filename")?.extract()?;
        let line: i64 = code.getattr("co_firstlineno")?.extract()?;
        Ok(FrameLayout {
            argcount,
            kwonlyargcount,
            has_varargs: flags & CO_VARARGS != 0,
            has_varkw: flags & CO_VARKEYWORDS != 0,
            kwonly_names,
            names,
            first_free,
            stacksize: code.getattr("co_stacksize")?.extract()?,
            location: format!("{qualname} ({filename}:{line})"),
            qualname,
            filename,
            flags,
        })
    }
}

/// A frame that has not started yet, with the layout of its code: what guards look at.
#[derive(Debug)]
pub struct FrameView<'a> {
    pub frame: *mut InterpreterFrame,
    pub layout: &'a FrameLayout,
}

impl FrameView<'_> {
    /// The value of localsplus slot `index`, or null if unbound. Free variables are read
    /// from the function's closure, since `COPY_FREE_VARS` has not run yet.
    ///
    /// # Safety
    /// The frame is live and `index < layout.nlocalsplus()`.
    pub unsafe fn value(&self, index: usize) -> *mut ffi::PyObject {
        // SAFETY: live frame and in-range index (caller); the closure tuple has one cell per
        // free variable.
        unsafe {
            if index >= self.layout.first_free {
                let closure = (*(*self.frame).f_func).func_closure;
                if closure.is_null() {
                    return std::ptr::null_mut();
                }
                let cell =
                    ffi::PyTuple_GET_ITEM(closure, (index - self.layout.first_free) as isize);
                let value = PyCell_Get(cell); // new reference
                if !value.is_null() {
                    ffi::Py_DECREF(value); // the cell keeps it alive
                }
                return value;
            }
            InterpreterFrame::local(self.frame, index)
        }
    }

    /// The frame's variables as a dict, name → value, unbound ones left out: what a
    /// Python-level guard receives as `f_locals`.
    pub fn locals_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (index, name) in self.layout.names.iter().enumerate() {
            // SAFETY: index < nlocalsplus; the frame is live while the view exists.
            let value = unsafe { self.value(index) };
            if !value.is_null() {
                // SAFETY: non-null value owned by the frame or its closure.
                let value = unsafe { Bound::from_borrowed_ptr(py, value) };
                dict.set_item(name.bind(py), value)?;
            }
        }
        Ok(dict)
    }
}

/// Decides whether a cache entry may run for a frame.
pub trait FrameGuard {
    /// `Ok(true)` when the entry's code is valid for `frame`.
    fn check(&self, py: Python<'_>, frame: &FrameView<'_>) -> PyResult<bool>;

    /// The Python object this guard came from, for introspection.
    fn as_python(&self, py: Python<'_>) -> Py<PyAny>;

    /// Why the entry does not apply to `frame`, in words (for the cache-limit warning), if
    /// the guard can say.
    fn failure(&self, _py: Python<'_>, _frame: &FrameView<'_>) -> Option<String> {
        None
    }

    /// Whether the entry can never apply again (an object it checks by identity is gone).
    fn is_dead(&self, _py: Python<'_>) -> bool {
        false
    }
}

/// Turns a check object a callback returned into a native guard, when it is of a kind the
/// registered adapter knows (`None`: not one of its kinds; the hook then calls it from
/// Python). The capture layer registers one at module init ([`register_guard_adapter`]), so
/// the hook knows only the [`FrameGuard`] trait and nothing of how guards are built.
pub type GuardAdapter = fn(&Bound<'_, PyAny>) -> Option<Box<dyn FrameGuard>>;

static GUARD_ADAPTER: std::sync::OnceLock<GuardAdapter> = std::sync::OnceLock::new();

/// Registers the adapter for native guards (once; later calls are ignored).
pub fn register_guard_adapter(adapter: GuardAdapter) {
    let _ = GUARD_ADAPTER.set(adapter);
}

/// The native guard for `check`, if the registered adapter knows its kind.
pub fn native_guard(check: &Bound<'_, PyAny>) -> Option<Box<dyn FrameGuard>> {
    GUARD_ADAPTER.get().and_then(|adapt| adapt(check))
}

/// An entry without guards: valid for every frame.
#[derive(Debug)]
pub struct AlwaysValid;

impl FrameGuard for AlwaysValid {
    fn check(&self, _py: Python<'_>, _frame: &FrameView<'_>) -> PyResult<bool> {
        Ok(true)
    }

    fn as_python(&self, py: Python<'_>) -> Py<PyAny> {
        py.None()
    }
}

/// A Python callable `check(f_locals: dict) -> bool`. It is called with the hook disabled,
/// so nothing it runs is intercepted.
#[derive(Debug)]
pub struct PythonGuard(pub OwnedRef);

impl FrameGuard for PythonGuard {
    fn check(&self, py: Python<'_>, frame: &FrameView<'_>) -> PyResult<bool> {
        let locals = frame.locals_dict(py)?;
        let _disabled = super::hook::HookDisabled::new();
        self.0.bind(py).call1((locals,))?.is_truthy()
    }

    fn as_python(&self, py: Python<'_>) -> Py<PyAny> {
        self.0.bind(py).unbind()
    }
}

pub struct CacheEntry {
    pub guard: Box<dyn FrameGuard>,
    pub code: OwnedRef,
    /// A function object for `code`, called to run it. Its globals, builtins and closure
    /// are those of the frame being replaced, filled in for the duration of each call and
    /// cleared afterwards (unless a frame object outlived the call), so the cache never keeps
    /// a module or closure alive. It is not tracked by the cyclic GC while it holds nothing
    /// (see `run::make_runner`, `run::CallFunction`).
    pub runner: OwnedRef,
}

impl Drop for CacheEntry {
    fn drop(&mut self) {
        // The runner was untracked when made; CPython 3.11's function dealloc untracks
        // unconditionally, so it must be tracked again before the reference that keeps it
        // alive (ours; a frame running it holds another) can be the last one.
        // SAFETY: entries are dropped with the GIL held (they live in code objects' extra
        // state, freed by CPython or by our resets under the GIL); the runner is alive (we
        // still hold our reference) and is a function object, a GC type.
        unsafe {
            let runner = self.runner.as_ptr();
            if ffi::PyObject_GC_IsTracked(runner) == 0 {
                ffi::PyObject_GC_Track(runner.cast());
            }
        }
    }
}

impl std::fmt::Debug for CacheEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheEntry")
            .field("code", &self.code)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub struct ExtraStateInner {
    pub mode: Mode,
    /// Intercepted even though its file is skipped (the forward of a module given to
    /// `dynamo_rs.compile`, e.g. `nn.Sequential.forward`). Cleared by resets, like every
    /// other decision; the compiled module sets it again on its next call.
    pub forced: bool,
    /// Most recently hit first.
    pub entries: Vec<Rc<CacheEntry>>,
    /// Whether the cache-size-limit warning was given for this code.
    pub warned_limit: bool,
    /// Whether `mode` was decided by a failed compile (or the cache limit) rather than by
    /// the skip prefixes: a forced interception does not undo that decision.
    pub decided: bool,
}

#[derive(Debug)]
pub struct ExtraState {
    pub layout: FrameLayout,
    /// Borrowed only for short, Python-free stretches: guards and callbacks may run Python
    /// code that looks at this state through the introspection functions.
    pub inner: RefCell<ExtraStateInner>,
}

impl ExtraState {
    /// Drops every entry and decides the mode afresh from the current skip prefixes
    /// (generators stay skipped; a forced interception is forgotten). The entries are dropped after the borrow ends, since
    /// dropping them may run Python code (finalizers of guard objects).
    pub fn reset(&self, skip_prefixes: &[String]) {
        let entries = {
            let mut inner = self.inner.borrow_mut();
            inner.forced = false;
            inner.mode = initial_mode(&self.layout, skip_prefixes);
            inner.warned_limit = false;
            inner.decided = false;
            std::mem::take(&mut inner.entries)
        };
        drop(entries);
    }
}

static EXTRA_INDEX: AtomicIsize = AtomicIsize::new(-1);

/// Every live `ExtraState` (as an address), so that `reset_all` can reach them; entries are
/// removed by the free function when their code object dies. A set: freeing many code
/// objects (interpreter teardown) stays linear.
static LIVE_STATES: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<usize>>> =
    std::sync::LazyLock::new(Default::default);

/// How many code objects currently carry our state.
pub fn live_state_count() -> usize {
    LIVE_STATES.lock().map(|s| s.len()).unwrap_or(0)
}

/// Resets every code object's cache (`dynamo_rs.reset()`).
///
/// # Safety
/// The GIL is held.
pub unsafe fn reset_all(skip_prefixes: &[String]) {
    let states: Vec<usize> = LIVE_STATES
        .lock()
        .map(|s| s.iter().copied().collect())
        .unwrap_or_default();
    for address in states {
        // A reset may run Python code that frees code objects; only touch states still live.
        let live = LIVE_STATES
            .lock()
            .map(|s| s.contains(&address))
            .unwrap_or(false);
        if live {
            // SAFETY: listed states are alive (removed before being freed); GIL held.
            unsafe { (*(address as *const ExtraState)).reset(skip_prefixes) };
        }
    }
}

/// Called by CPython when a code object with our state dies (GIL held).
unsafe extern "C" fn free_extra_state(state: *mut c_void) {
    if !state.is_null() {
        // Never unwind into CPython.
        let _ = std::panic::catch_unwind(|| {
            if let Ok(mut live) = LIVE_STATES.lock() {
                live.remove(&(state as usize));
            }
            // SAFETY: we stored a Box<ExtraState> there and CPython frees it exactly once.
            drop(unsafe { Box::from_raw(state.cast::<ExtraState>()) });
        });
    }
}

/// Reserves our `co_extra` slot; called once at module initialisation.
pub fn init_extra_index() -> PyResult<()> {
    if EXTRA_INDEX.load(Ordering::Acquire) >= 0 {
        return Ok(());
    }
    // SAFETY: called with the GIL held at import; the free function never unwinds.
    let index = unsafe { ffi::_PyEval_RequestCodeExtraIndex(free_extra_state) };
    if index < 0 {
        return Err(PyRuntimeError::new_err(
            "no free co_extra slot for dynamo_rs",
        ));
    }
    EXTRA_INDEX.store(index as isize, Ordering::Release);
    Ok(())
}

/// The state stored on `code`, or null.
///
/// # Safety
/// `code` is a live code object and the GIL is held.
pub unsafe fn get_extra(code: *mut ffi::PyObject) -> *mut ExtraState {
    let mut extra: *mut c_void = std::ptr::null_mut();
    let index = EXTRA_INDEX.load(Ordering::Relaxed);
    // SAFETY: live code object, GIL held (caller); index came from RequestCodeExtraIndex.
    let status =
        unsafe { ffi::_PyCode_GetExtra(code, index, std::ptr::addr_of_mut!(extra).cast_const()) };
    if status != 0 {
        // SAFETY: GIL held; GetExtra only fails for non-code objects.
        unsafe { ffi::PyErr_Clear() };
        return std::ptr::null_mut();
    }
    extra.cast()
}

/// The state stored on `code`, created on first use.
///
/// # Safety
/// `code` is a live code object and the GIL is held.
pub unsafe fn get_or_init_extra(
    py: Python<'_>,
    code: *mut ffi::PyObject,
    skip_prefixes: &std::sync::Mutex<Vec<String>>,
) -> PyResult<*mut ExtraState> {
    // SAFETY: forwarded contract.
    let existing = unsafe { get_extra(code) };
    if !existing.is_null() {
        return Ok(existing);
    }
    // SAFETY: live code object (caller).
    let code_obj = unsafe { Bound::from_borrowed_ptr(py, code) };
    let prefixes = skip_prefixes.lock().map(|p| p.clone()).unwrap_or_default();
    let layout = FrameLayout::read(&code_obj)?;
    let mode = initial_mode(&layout, &prefixes);
    let state = Box::new(ExtraState {
        layout,
        inner: RefCell::new(ExtraStateInner {
            mode,
            forced: false,
            entries: Vec::new(),
            warned_limit: false,
            decided: false,
        }),
    });
    let ptr = Box::into_raw(state);
    let index = EXTRA_INDEX.load(Ordering::Relaxed);
    // SAFETY: live code object; on success CPython owns `ptr` and frees it with our function.
    if unsafe { ffi::_PyCode_SetExtra(code, index, ptr.cast()) } != 0 {
        // SAFETY: CPython did not take it.
        drop(unsafe { Box::from_raw(ptr) });
        return Err(PyErr::fetch(py));
    }
    if let Ok(mut live) = LIVE_STATES.lock() {
        live.insert(ptr as usize);
    }
    Ok(ptr)
}
