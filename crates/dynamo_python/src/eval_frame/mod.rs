//! The PEP 523 frame-evaluation hook (CPython 3.11) and the per-code cache.
//!
//! - [`hook`]: the evaluator, the thread-local callback, what happens on a hit or a miss.
//! - [`cache`]: per-code state in `co_extra` (mode, frame layout, guarded entries).
//! - [`run`]: running transformed code in place of a frame's own.
//! - [`cpython311`]: the private CPython 3.11 layouts we depend on, checked at first use.
//! - [`owned`]: strong references released with the GIL held, without deferral.
//! - [`disable`]: the `disable(fn)` wrapper.
//! - [`module_call`]: a compiled module's call without `nn.Module.__call__`'s frames.

pub mod cache;
pub mod cpython311;
pub mod disable;
pub mod hook;
pub mod module_call;
pub mod owned;
pub mod run;

use std::sync::atomic::Ordering;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCode, PyDict, PyList, PyTuple};

use cache::{get_extra, get_or_init_extra, Mode};
use hook::{STATS, STAT_CALLBACKS, STAT_FRAMES, STAT_HITS, STAT_MISSES, STAT_SKIPPED};

/// Sets this thread's callback and returns the previous one (None when off). `None` turns
/// the hook off on this thread; when no thread has one, CPython's evaluator is restored.
#[pyfunction]
#[pyo3(signature = (callback, /))]
fn set_eval_frame(py: Python<'_>, callback: Option<Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
    if let Some(c) = &callback {
        if !c.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "set_eval_frame expects a callable or None, not {}",
                c.get_type().name()?
            )));
        }
        cpython311::check_layouts(py)?;
    }
    hook::set_callback(py, callback.as_ref())
}

/// `function(*args, **kwargs)` with `callback` installed on this thread for the duration of
/// the call, the previous callback restored afterwards (also when the call raises): what a
/// `dynamo_rs.compile`d function does on every call, in one native call.
#[pyfunction]
#[pyo3(signature = (callback, function, args, kwargs=None, /))]
fn call_with_callback<'py>(
    py: Python<'py>,
    callback: &Bound<'py, PyAny>,
    function: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let previous = set_eval_frame(py, Some(callback.clone()))?;
    let result = function.call(args, kwargs.filter(|k| !k.is_empty()));
    let previous = previous.into_bound(py);
    hook::set_callback(py, (!previous.is_none()).then_some(&previous))?;
    result
}

fn code_arg<'py>(code: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // A code object first: asking it for `__code__` would raise (and format) an
    // AttributeError, on every call of a compiled module (`force_intercept`).
    if code.is_instance_of::<PyCode>() {
        return Ok(code.clone());
    }
    let code = match code.getattr("__code__") {
        Ok(inner) => inner,
        Err(_) => code.clone(),
    };
    if !code.is_instance_of::<PyCode>() {
        return Err(PyTypeError::new_err(format!(
            "expected a code object or function, not {}",
            code.get_type().name()?
        )));
    }
    Ok(code)
}

/// Never intercept frames of `code` (a code object or a function) again.
#[pyfunction]
pub fn skip_code(py: Python<'_>, code: &Bound<'_, PyAny>) -> PyResult<()> {
    let code = code_arg(code)?;
    // SAFETY: live code object, GIL held.
    let extra = unsafe { get_or_init_extra(py, code.as_ptr(), &hook::SKIP_PREFIXES)? };
    // SAFETY: the state lives as long as `code`.
    unsafe { (*extra).inner.borrow_mut().mode = Mode::Skip };
    Ok(())
}

/// Intercepts frames of `code` even if its file is skipped (torch's own `nn.Sequential.forward`
/// when a Sequential is compiled), until the next reset. Generators stay skipped. Cheap
/// enough to call on every call of a compiled module, which is how it survives resets.
#[pyfunction]
fn force_intercept(py: Python<'_>, code: &Bound<'_, PyAny>) -> PyResult<()> {
    let code = code_arg(code)?;
    // SAFETY: live code object, GIL held.
    let extra = unsafe { get_or_init_extra(py, code.as_ptr(), &hook::SKIP_PREFIXES)? };
    // SAFETY: the state lives as long as `code`.
    let state = unsafe { &*extra };
    // A forward disabled with `torch.compiler.disable` (its code is torch's disable
    // wrapper, shared by every disabled function) stays disabled.
    if state.layout.flags & cache::CO_GENERATOR_LIKE == 0
        && state.inner.borrow().mode != Mode::Disabled
    {
        let mut inner = state.inner.borrow_mut();
        inner.forced = true;
        if !inner.decided {
            inner.mode = Mode::Default;
        }
    }
    Ok(())
}

/// Drops every cache entry of `code` and returns it to how the hook first saw it.
#[pyfunction]
fn reset_code(code: &Bound<'_, PyAny>) -> PyResult<()> {
    let code = code_arg(code)?;
    // SAFETY: live code object, GIL held.
    let extra = unsafe { get_extra(code.as_ptr()) };
    if !extra.is_null() {
        // SAFETY: the state lives as long as `code`.
        unsafe { (*extra).reset(&hook::skip_prefixes()) };
    }
    Ok(())
}

/// Drops the cache entries of every code object (`dynamo_rs.reset()`).
#[pyfunction]
fn reset_all(_py: Python<'_>) {
    // SAFETY: the GIL is held (`_py`).
    unsafe { cache::reset_all(&hook::skip_prefixes()) };
}

/// The cache entries of `code` as `(check, code)` pairs, most recently used first.
#[pyfunction]
fn cache_entries<'py>(py: Python<'py>, code: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let code = code_arg(code)?;
    let out = PyList::empty(py);
    // SAFETY: live code object, GIL held.
    let extra = unsafe { get_extra(code.as_ptr()) };
    if extra.is_null() {
        return Ok(out);
    }
    // SAFETY: the state lives as long as `code`.
    let entries: Vec<_> = unsafe { (*extra).inner.borrow().entries.clone() };
    for entry in entries {
        out.append((entry.guard.as_python(py), entry.code.bind(py)))?;
    }
    Ok(out)
}

/// How the hook treats `code`: "default", "skip" or "run_only" ("default" if never seen).
#[pyfunction]
fn code_mode(code: &Bound<'_, PyAny>) -> PyResult<&'static str> {
    let code = code_arg(code)?;
    // SAFETY: live code object, GIL held.
    let extra = unsafe { get_extra(code.as_ptr()) };
    if extra.is_null() {
        return Ok("default");
    }
    // SAFETY: the state lives as long as `code`.
    Ok(match unsafe { (*extra).inner.borrow().mode } {
        Mode::Default => "default",
        Mode::Skip => "skip",
        Mode::RunOnly => "run_only",
        Mode::Disabled => "disabled",
    })
}

/// Counters since start (or the last `reset_stats`): frames examined, hits, misses,
/// callback calls, frames skipped; and how many code objects carry our state right now.
#[pyfunction]
fn stats<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, index) in [
        ("frames", STAT_FRAMES),
        ("hits", STAT_HITS),
        ("misses", STAT_MISSES),
        ("callbacks", STAT_CALLBACKS),
        ("skipped", STAT_SKIPPED),
    ] {
        d.set_item(name, STATS[index].load(Ordering::Relaxed))?;
    }
    d.set_item("live_code_states", cache::live_state_count())?;
    Ok(d)
}

#[pyfunction]
fn reset_stats() {
    for stat in &STATS {
        stat.store(0, Ordering::Relaxed);
    }
}

/// Mirrors `dynamo_rs.config` into the hook.
#[pyfunction]
#[pyo3(signature = (*, cache_size_limit=None, suppress_errors=None, skip_prefixes=None))]
fn configure(
    cache_size_limit: Option<usize>,
    suppress_errors: Option<u8>,
    skip_prefixes: Option<Vec<String>>,
) -> PyResult<()> {
    if let Some(limit) = cache_size_limit {
        if limit == 0 {
            return Err(PyValueError::new_err("cache_size_limit must be at least 1"));
        }
        hook::CACHE_SIZE_LIMIT.store(limit, Ordering::Relaxed);
    }
    if let Some(suppress) = suppress_errors {
        if suppress > hook::SUPPRESS_NONE {
            return Err(PyValueError::new_err(
                "suppress_errors mode must be 0, 1 or 2",
            ));
        }
        hook::SUPPRESS_ERRORS.store(suppress, Ordering::Relaxed);
    }
    if let Some(prefixes) = skip_prefixes {
        *hook::SKIP_PREFIXES
            .lock()
            .map_err(|_| PyValueError::new_err("skip prefixes lock poisoned"))? = prefixes;
    }
    Ok(())
}

/// Whether the hook is on for this thread.
#[pyfunction]
fn is_enabled() -> bool {
    hook::is_enabled()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    cache::init_extra_index()?;
    m.add_function(wrap_pyfunction!(set_eval_frame, m)?)?;
    m.add_function(wrap_pyfunction!(call_with_callback, m)?)?;
    m.add_function(wrap_pyfunction!(module_call::call_compiled_module, m)?)?;
    m.add_function(wrap_pyfunction!(skip_code, m)?)?;
    m.add_function(wrap_pyfunction!(force_intercept, m)?)?;
    m.add_function(wrap_pyfunction!(reset_code, m)?)?;
    m.add_function(wrap_pyfunction!(reset_all, m)?)?;
    m.add_function(wrap_pyfunction!(cache_entries, m)?)?;
    m.add_function(wrap_pyfunction!(code_mode, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_stats, m)?)?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(is_enabled, m)?)?;
    m.add_class::<disable::DisabledFunction>()?;
    m.add("SKIP", hook::skip_sentinel(m.py()))?;
    Ok(())
}
