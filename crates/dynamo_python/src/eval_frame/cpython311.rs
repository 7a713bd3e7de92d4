//! CPython 3.11 internals the frame hook reads and writes, and nothing else.
//!
//! `_PyInterpreterFrame` and `PyFrameObject` are private structs (pyo3-ffi models them as
//! opaque), so their 3.11 layouts are restated here from `Include/internal/pycore_frame.h`.
//! [`check_layouts`] verifies them against a live frame before the hook is ever installed.
//! `_PyFrame_MakeAndSetFrameObject` is not exported on 3.11, so [`frame_object`] does what it
//! does (about ten lines of CPython) to hand the callback a real `types.FrameType`.

use std::ffi::{c_char, c_int};
use std::ptr;

use crate::imports::ImportModule;
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

/// The start of `struct PyCodeObject` of CPython 3.11 (`Include/cpython/code.h`), up to the
/// names of locals, cells and free variables.
#[repr(C)]
#[derive(Debug)]
pub struct CodeObjectHead {
    pub ob_base: ffi::PyVarObject,
    pub co_consts: *mut ffi::PyObject,
    pub co_names: *mut ffi::PyObject,
    pub co_exceptiontable: *mut ffi::PyObject,
    pub co_flags: c_int,
    pub co_warmup: i16,
    pub co_linearray_entry_size: i16,
    pub co_argcount: c_int,
    pub co_posonlyargcount: c_int,
    pub co_kwonlyargcount: c_int,
    pub co_stacksize: c_int,
    pub co_firstlineno: c_int,
    pub co_nlocalsplus: c_int,
    pub co_nlocals: c_int,
    pub co_nplaincellvars: c_int,
    pub co_ncellvars: c_int,
    pub co_nfreevars: c_int,
    pub co_localsplusnames: *mut ffi::PyObject,
}

extern "C" {
    // Not declared by pyo3-ffi.
    pub fn PyCell_Get(cell: *mut ffi::PyObject) -> *mut ffi::PyObject;
    // Untracks a tuple whose items can never be part of a cycle (what the GC does to such
    // tuples on its next pass); exported by CPython 3.11 (Include/cpython/tupleobject.h).
    fn _PyTuple_MaybeUntrack(tuple: *mut ffi::PyObject);
}

/// Lets the cyclic GC forget the names tuple of a code object we made (all strings, never in
/// a cycle): CPython's own code objects come from the compiler with theirs untracked, and
/// one made at run time would otherwise show in `gc.get_objects()` until the next
/// collection (CPython's test_descr counts those objects).
///
/// # Safety
/// `code` is a live code object; the GIL is held; [`check_layouts`] has passed.
pub unsafe fn untrack_names(code: *mut ffi::PyObject) {
    // SAFETY: caller's contract; the layout was verified against a live code object.
    unsafe {
        let names = (*code.cast::<CodeObjectHead>()).co_localsplusnames;
        if !names.is_null() && ffi::PyTuple_CheckExact(names) != 0 {
            _PyTuple_MaybeUntrack(names);
        }
    }
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

impl InterpreterFrame {
    /// Takes the value out of localsplus slot `index`, leaving it unbound: the caller owns
    /// the reference the frame held (null if the slot was unbound).
    ///
    /// # Safety
    /// `frame` is a live frame that has not started and `index < co_nlocalsplus` of its code.
    pub unsafe fn take_local(frame: *mut InterpreterFrame, index: usize) -> *mut ffi::PyObject {
        // SAFETY: as for `local`; the slot is ours to clear, the frame never runs its code.
        unsafe {
            let slot = ptr::addr_of_mut!((*frame).localsplus)
                .cast::<*mut ffi::PyObject>()
                .add(index);
            std::mem::replace(&mut *slot, ptr::null_mut())
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
/// Whether [`check_layouts`] has passed in this process (the layouts are the interpreter's, so
/// once is enough; `set_eval_frame` runs on every call of a compiled function).
static LAYOUTS_CHECKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn check_layouts(py: Python<'_>) -> PyResult<()> {
    if LAYOUTS_CHECKED.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    check_layouts_now(py)?;
    LAYOUTS_CHECKED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

fn check_layouts_now(py: Python<'_>) -> PyResult<()> {
    let sys = py.import_module("sys")?;
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
        // The code object's head: its counts and names must match what Python reports.
        let head = code.as_ptr().cast::<CodeObjectHead>();
        let names = (*head).co_localsplusnames;
        let varnames = code.getattr("co_varnames")?;
        let ok = (*head).co_consts == code.getattr("co_consts")?.as_ptr()
            && (*head).co_argcount == code.getattr("co_argcount")?.extract::<c_int>()?
            && (*head).co_nlocals == code.getattr("co_nlocals")?.extract::<c_int>()?
            && (*head).co_firstlineno == code.getattr("co_firstlineno")?.extract::<c_int>()?
            && !names.is_null()
            && ffi::PyTuple_CheckExact(names) != 0
            && ffi::PyTuple_GET_SIZE(names) as c_int == (*head).co_nlocalsplus
            && (varnames.len()? == 0
                || ffi::PyTuple_GET_ITEM(names, 0) == varnames.get_item(0)?.as_ptr());
        if !ok {
            return Err(PyRuntimeError::new_err(
                "this CPython's code object layout differs from the 3.11 layout dynamo_rs was built for",
            ));
        }
    }
    Ok(())
}
