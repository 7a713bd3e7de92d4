//! `OwnedRef`: a strong reference to a Python object that is released on drop.
//!
//! The frame hook keeps Python objects in state that outlives any PyO3 call (the per-code
//! cache, freed by CPython when the code object dies). PyO3's `Py<T>` defers the decref when
//! it cannot see that the GIL is held, which is the case inside CPython's frame evaluator and
//! its free functions; `OwnedRef` decrefs at once instead.
//!
//! Invariant: an `OwnedRef` is only created, cloned and dropped by a thread that holds the GIL.
//! Everything in `eval_frame` runs under the GIL: CPython calls the frame evaluator and the
//! code-extra free function with it held, and the pyfunctions run attached.

use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;

pub struct OwnedRef(NonNull<ffi::PyObject>);

// SAFETY: the pointer is only dereferenced, incref'd or decref'd with the GIL held (the module
// invariant above), which serialises every access across threads.
unsafe impl Send for OwnedRef {}
// SAFETY: as for Send: shared access never touches the object without the GIL.
unsafe impl Sync for OwnedRef {}

impl OwnedRef {
    /// Takes a new strong reference to `ptr`.
    ///
    /// # Safety
    /// `ptr` is a valid object or null, and the GIL is held.
    pub unsafe fn from_borrowed(ptr: *mut ffi::PyObject) -> Option<OwnedRef> {
        let ptr = NonNull::new(ptr)?;
        // SAFETY: valid object, GIL held (caller's contract).
        unsafe { ffi::Py_INCREF(ptr.as_ptr()) };
        Some(OwnedRef(ptr))
    }

    /// Adopts a strong reference the caller owns.
    ///
    /// # Safety
    /// `ptr` is a valid object whose reference the caller gives up, or null.
    pub unsafe fn from_owned(ptr: *mut ffi::PyObject) -> Option<OwnedRef> {
        NonNull::new(ptr).map(OwnedRef)
    }

    pub fn from_bound(obj: &Bound<'_, PyAny>) -> OwnedRef {
        // SAFETY: a Bound is a valid object and proves the GIL is held.
        unsafe { OwnedRef::from_borrowed(obj.as_ptr()) }.expect("Bound is never null")
    }

    pub fn as_ptr(&self) -> *mut ffi::PyObject {
        self.0.as_ptr()
    }

    pub fn bind<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        // SAFETY: the object is alive while we hold our reference; `py` proves the GIL.
        unsafe { Bound::from_borrowed_ptr(py, self.as_ptr()) }
    }
}

impl Clone for OwnedRef {
    fn clone(&self) -> OwnedRef {
        // SAFETY: the object is alive (we own a reference); GIL held per the module invariant.
        unsafe { ffi::Py_INCREF(self.as_ptr()) };
        OwnedRef(self.0)
    }
}

impl Drop for OwnedRef {
    fn drop(&mut self) {
        // SAFETY: we own one reference; GIL held per the module invariant.
        unsafe { ffi::Py_DECREF(self.as_ptr()) };
    }
}

impl std::fmt::Debug for OwnedRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OwnedRef({:p})", self.0)
    }
}
