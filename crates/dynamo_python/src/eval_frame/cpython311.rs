//! CPython 3.11 internals the frame hook reads and writes, and nothing else.
//!
//! `_PyInterpreterFrame` and `PyFrameObject` are private structs (pyo3-ffi models them as
//! opaque), so their 3.11 layouts are restated here from `Include/internal/pycore_frame.h`.
//! [`check_layouts`] verifies them against a live frame before the hook is ever installed.
//! `_PyFrame_MakeAndSetFrameObject` is not exported on 3.11, so [`frame_object`] does what it
//! does (about ten lines of CPython) to hand the callback a real `types.FrameType`.

use std::ffi::{c_char, c_int};
use std::ptr;

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;

/// `struct _PyInterpreterFrame` of CPython 3.11.
#[repr(C)]
#[derive(Debug)]
pub struct InterpreterFrame {
    pub f_func: *mut ffi::PyFunctionObject,
    pub f_globals: *mut ffi::PyObject,
    pub f_builtins: *mut ffi::PyObject,
    pub f_locals: *mut ffi::PyObject,
    pub f_code: *mut ffi::PyObject,
    pub frame_obj: *mut FrameObject,
    pub previous: *mut InterpreterFrame,
    pub prev_instr: *mut u16,
    pub stacktop: c_int,
    pub is_entry: bool,
    pub owner: c_char,
    pub localsplus: [*mut ffi::PyObject; 0],
}

/// `enum _frameowner`: the frame lives inside a generator or coroutine object.
pub const FRAME_OWNED_BY_GENERATOR: c_char = 1;

/// `struct _frame` (`PyFrameObject`) of CPython 3.11.
#[repr(C)]
#[derive(Debug)]
pub struct FrameObject {
    pub ob_base: ffi::PyObject,
    pub f_back: *mut FrameObject,
    pub f_frame: *mut InterpreterFrame,
    pub f_trace: *mut ffi::PyObject,
    pub f_lineno: c_int,
    pub f_trace_lines: c_char,
    pub f_trace_opcodes: c_char,
    pub f_fast_as_locals: c_char,
    pub f_frame_data: [*mut ffi::PyObject; 1],
}

extern "C" {
    // Not declared by pyo3-ffi.
    pub fn PyCell_Get(cell: *mut ffi::PyObject) -> *mut ffi::PyObject;
}

impl InterpreterFrame {
    /// Slot `index` of "localsplus" (locals, then cells, then free variables, then the stack).
    ///
    /// # Safety
    /// `frame` is a live frame and `index < co_nlocalsplus` of its code.
    pub unsafe fn local(frame: *mut InterpreterFrame, index: usize) -> *mut ffi::PyObject {
        // SAFETY: localsplus is a trailing array of at least co_nlocalsplus slots (caller).
        unsafe {
            *ptr::addr_of_mut!((*frame).localsplus)
                .cast::<*mut ffi::PyObject>()
                .add(index)
        }
    }
}

/// Returns the frame object for `frame`, creating it (and linking `frame` to its caller so
/// that `f_back` is right) if there is none yet. Mirrors CPython's
/// `_PyFrame_MakeAndSetFrameObject`: the new object's one reference belongs to
/// `frame->frame_obj`, and CPython's `_PyFrame_Clear` hands it over or frees it when the
/// frame ends.
///
/// # Safety
/// `frame` is a live frame of this thread that has not started executing, and the GIL is held.
pub unsafe fn frame_object<'py>(
    py: Python<'py>,
    frame: *mut InterpreterFrame,
    slots: usize,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: live frame (caller); all pointers read here are owned by CPython and valid.
    unsafe {
        if (*frame).frame_obj.is_null() {
            // The evaluator links `previous` when the frame starts; a frame handed out before
            // that needs it for `f_back` (and CPython's take_ownership reads it at clear time).
            let caller = ffi::PyEval_GetFrame().cast::<FrameObject>();
            (*frame).previous = if caller.is_null() {
                ptr::null_mut()
            } else {
                (*caller).f_frame
            };
            let slots =
                isize::try_from(slots).map_err(|_| PyRuntimeError::new_err("frame too large"))?;
            let f = ffi::_PyObject_GC_NewVar(ptr::addr_of_mut!(ffi::PyFrame_Type), slots)
                .cast::<FrameObject>();
            if f.is_null() {
                return Err(PyErr::fetch(py));
            }
            (*f).f_back = ptr::null_mut();
            (*f).f_trace = ptr::null_mut();
            (*f).f_trace_lines = 1;
            (*f).f_trace_opcodes = 0;
            (*f).f_fast_as_locals = 0;
            (*f).f_lineno = 0;
            (*f).f_frame = frame;
            (*frame).frame_obj = f;
        }
        Ok(Bound::from_borrowed_ptr(py, (*frame).frame_obj.cast()))
    }
}

/// Checks the restated layouts against the running interpreter, using the caller's frame:
/// its frame object must point at an interpreter frame whose code, globals and function are
/// the ones Python reports.
pub fn check_layouts(py: Python<'_>) -> PyResult<()> {
    let sys = py.import("sys")?;
    if sys
        .getattr("version_info")?
        .extract::<(u8, u8, u8, String, u8)>()?
        .0
        != 3
        || sys.getattr("version_info")?.get_item(1)?.extract::<u8>()? != 11
    {
        return Err(PyRuntimeError::new_err(
            "the dynamo_rs frame hook supports CPython 3.11 only",
        ));
    }
    let frame = sys.call_method1("_getframe", (0,))?;
    let code = frame.getattr("f_code")?;
    let globals = frame.getattr("f_globals")?;
    // SAFETY: `frame` is a live PyFrameObject (type checked below) of this thread.
    unsafe {
        if ffi::PyFrame_Check(frame.as_ptr()) == 0 {
            return Err(PyRuntimeError::new_err(
                "sys._getframe() did not return a frame",
            ));
        }
        let f = frame.as_ptr().cast::<FrameObject>();
        let interp = (*f).f_frame;
        let ok = !interp.is_null()
            && (*interp).f_code == code.as_ptr()
            && (*interp).f_globals == globals.as_ptr()
            && (*interp).frame_obj == f
            && !(*interp).f_func.is_null()
            && (*(*interp).f_func).func_code == code.as_ptr();
        if !ok {
            return Err(PyRuntimeError::new_err(
                "this CPython's frame layout differs from the 3.11 layout dynamo_rs was built for",
            ));
        }
    }
    Ok(())
}
