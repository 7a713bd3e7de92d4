//! Importing modules from Rust without `builtins.__import__`.
//!
//! `Python::import` goes through `PyImport_Import`, which looks `__import__` up in the
//! builtins of the *calling frame's* globals. The translator runs inside the frame hook,
//! whose caller may be a frame with restricted builtins — a `namedtuple`'s `__new__` is
//! compiled from source with `__builtins__ = {}` — and then every import fails with
//! `KeyError: '__import__'`. Modules are looked up in `sys.modules` first (the common case,
//! and cheaper) and otherwise imported by the import machinery itself.

use pyo3::prelude::*;
use pyo3::types::{PyModule, PyString};

pub trait ImportModule<'py> {
    /// The module `name` (dotted names give the submodule, not the package).
    fn import_module(self, name: &str) -> PyResult<Bound<'py, PyModule>>;
}

impl<'py> ImportModule<'py> for Python<'py> {
    fn import_module(self, name: &str) -> PyResult<Bound<'py, PyModule>> {
        let name = PyString::new(self, name);
        if let Some(module) = loaded(self, &name)? {
            return Ok(module);
        }
        // SAFETY: `name` is a live str; the NULL globals/locals/fromlist are documented as
        // accepted (an absolute import at level 0). The result is a new reference or NULL
        // with an exception set, which `from_owned_ptr_or_err` takes over.
        let package = unsafe {
            Bound::from_owned_ptr_or_err(
                self,
                pyo3::ffi::PyImport_ImportModuleLevelObject(
                    name.as_ptr(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                ),
            )?
        };
        drop(package); // the top-level package for a dotted name: read the submodule below
        match loaded(self, &name)? {
            Some(module) => Ok(module),
            None => Err(pyo3::exceptions::PyImportError::new_err(format!(
                "no module named {name} after importing it"
            ))),
        }
    }
}

/// `sys.modules[name]` if it is there (and a module).
fn loaded<'py>(
    py: Python<'py>,
    name: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyModule>>> {
    // SAFETY: the interpreter is initialised and the GIL held (`py`): `PyImport_GetModuleDict`
    // returns a borrowed reference to `sys.modules`, which the interpreter keeps alive.
    let modules = unsafe { pyo3::ffi::PyImport_GetModuleDict() };
    if modules.is_null() {
        return Ok(None);
    }
    // SAFETY: `modules` is a live dict (above), `name` a live str; the result is a borrowed
    // reference or NULL (absent, or an error set by a key's `__eq__`).
    let found = unsafe { pyo3::ffi::PyDict_GetItemWithError(modules, name.as_ptr()) };
    if found.is_null() {
        return match PyErr::take(py) {
            Some(err) => Err(err),
            None => Ok(None),
        };
    }
    // SAFETY: non-NULL borrowed reference, still owned by `sys.modules`; taken as a new one.
    let found = unsafe { Bound::from_borrowed_ptr(py, found) };
    Ok(found.cast_into::<PyModule>().ok())
}
