//! Running a transformed code object in place of a frame's own.
//!
//! The frame CPython prepared is laid out for the original code, so the transformed code runs
//! in a frame of its own: we call a function object made for it (the entry's *runner*) with
//! the arguments the original frame was given, read back from its argument slots. CPython
//! binds them again exactly as for the original call (positional, keyword-only, `*args`,
//! `**kwargs`; defaults are already applied), the new code's own `MAKE_CELL` and
//! `COPY_FREE_VARS` prologue creates cells and loads the closure, and the new frame links to
//! the caller, so tracebacks and `f_back` look as if the original had run. The original frame
//! is then discarded by CPython as usual.
//!
//! The runner takes the original function's globals, builtins and closure for the call
//! (see `CallFunction`), and the hook lets the runner's frame through uninterpreted by
//! recognising its code (see `hook::PENDING`).
//!
//! The arguments are taken out of the original frame (which never runs) and let go of once
//! the runner's frame has bound its own references (see [`HANDOFF`]): otherwise the original
//! frame would keep every argument alive until the call returns — for the resume function of
//! a graph break, the activations it was handed, which its code may drop long before.

use std::ptr;

use pyo3::exceptions::PySystemError;
use pyo3::ffi;
use pyo3::prelude::*;

use super::cache::{CacheEntry, FrameLayout};
use super::cpython311::InterpreterFrame;
use super::hook::PENDING;
use super::owned::OwnedRef;

thread_local! {
    /// The argument references taken out of the frame being replaced, for the call under
    /// way: released by the hook when the runner's frame starts (it holds its own by then),
    /// or by `call` if binding failed before that.
    pub(super) static HANDOFF: std::cell::RefCell<Vec<*mut ffi::PyObject>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Releases the references of [`HANDOFF`].
///
/// # Safety
/// GIL held.
pub(super) unsafe fn release_handoff() {
    let taken = HANDOFF.with(|h| std::mem::take(&mut *h.borrow_mut()));
    for value in taken {
        // SAFETY: each is a reference `run_entry` took out of a frame (GIL held).
        unsafe { ffi::Py_XDECREF(value) };
    }
}

/// Makes the runner function for `code`, with nothing borrowed yet.
///
/// # Safety
/// `code` is a code object and `globals` a live dict; the GIL is held.
pub unsafe fn make_runner(
    py: Python<'_>,
    code: &Bound<'_, PyAny>,
    globals: *mut ffi::PyObject,
) -> PyResult<OwnedRef> {
    // SAFETY: GIL held; `code` is a code object (validated by the caller) and `globals` the
    // live globals dict of the frame being replaced.
    unsafe {
        let func = ffi::PyFunction_New(code.as_ptr(), globals);
        let func = OwnedRef::from_owned(func).ok_or_else(|| PyErr::fetch(py))?;
        let f = func.as_ptr().cast::<ffi::PyFunctionObject>();
        // Hold nothing between calls: these are filled in by `run_entry`.
        for field in [
            ptr::addr_of_mut!((*f).func_globals),
            ptr::addr_of_mut!((*f).func_builtins),
            ptr::addr_of_mut!((*f).func_closure),
        ] {
            let old = *field;
            *field = ptr::null_mut();
            ffi::Py_XDECREF(old);
        }
        // Invisible to the cyclic GC (`gc.get_objects()`, which CPython's test_descr counts):
        // nothing the runner refers to refers back to it, so it is never part of a cycle.
        // `CacheEntry`'s drop tracks it again before it can be freed.
        ffi::PyObject_GC_UnTrack(func.as_ptr().cast());
        Ok(func)
    }
}

/// The function one call runs: the entry's shared runner with the frame's globals, builtins
/// and closure put in for the call, or a function made for this call alone.
///
/// The shared runner is used when nothing else holds it (reference count 1: the entry's);
/// otherwise — a call of the same entry further up the stack is running it, or a frame
/// object kept from an earlier call (a traceback, `sys._getframe()`) still refers to it — a
/// new function is made, so that a frame never borrows what its function does not own. After
/// the call, the shared runner lets go of the three objects unless a frame object outlived the
/// call and still needs them; it then keeps them (and is tracked by the GC, as any function
/// holding a module is) until it is used again.
struct CallFunction {
    func: *mut ffi::PyObject,
    /// Whether `func` is the entry's shared runner (else our own new reference).
    shared: bool,
}

impl CallFunction {
    /// # Safety
    /// GIL held; `code` is the entry's code; the three objects are live (closure may be null).
    unsafe fn new(
        runner: *mut ffi::PyObject,
        code: *mut ffi::PyObject,
        globals: *mut ffi::PyObject,
        builtins: *mut ffi::PyObject,
        closure: *mut ffi::PyObject,
    ) -> Option<CallFunction> {
        // SAFETY: caller's contract; every field set takes a new reference and the previous
        // value's reference is released.
        unsafe {
            let (func, shared) = if ffi::Py_REFCNT(runner) == 1 {
                (runner, true)
            } else {
                let func = ffi::PyFunction_New(code, globals);
                if func.is_null() {
                    return None;
                }
                (func, false)
            };
            let f = func.cast::<ffi::PyFunctionObject>();
            for (field, value) in [
                (ptr::addr_of_mut!((*f).func_globals), globals),
                (ptr::addr_of_mut!((*f).func_builtins), builtins),
                (ptr::addr_of_mut!((*f).func_closure), closure),
            ] {
                let old = *field;
                ffi::Py_XINCREF(value);
                *field = value;
                ffi::Py_XDECREF(old);
            }
            Some(CallFunction { func, shared })
        }
    }
}

impl Drop for CallFunction {
    fn drop(&mut self) {
        // SAFETY: GIL held (the call ran under it); `func` is alive: the entry holds the
        // shared runner, and we hold our own function until the decref below.
        unsafe {
            if !self.shared {
                ffi::Py_DECREF(self.func);
                return;
            }
            if ffi::Py_REFCNT(self.func) > 1 {
                // A frame object from this call outlived it and refers to the runner: the
                // runner keeps its globals, builtins and closure for that frame.
                if ffi::PyObject_GC_IsTracked(self.func) == 0 {
                    ffi::PyObject_GC_Track(self.func.cast());
                }
                return;
            }
            let f = self.func.cast::<ffi::PyFunctionObject>();
            for field in [
                ptr::addr_of_mut!((*f).func_globals),
                ptr::addr_of_mut!((*f).func_builtins),
                ptr::addr_of_mut!((*f).func_closure),
            ] {
                let old = *field;
                *field = ptr::null_mut();
                ffi::Py_XDECREF(old);
            }
        }
    }
}

/// Runs `entry`'s code with the arguments of `frame`, returning a new reference or null with
/// an exception set, as a frame evaluator does.
///
/// # Safety
/// `frame` is live, has not started, and belongs to a code object with layout `layout`; the
/// GIL is held.
pub unsafe fn run_entry(
    py: Python<'_>,
    frame: *mut InterpreterFrame,
    layout: &FrameLayout,
    entry: &CacheEntry,
) -> *mut ffi::PyObject {
    // SAFETY: live frame (caller); arguments occupy the first `arg_slots()` localsplus slots
    // and are all bound in a frame that has not started.
    unsafe {
        let Some(function) = CallFunction::new(
            entry.runner.as_ptr(),
            entry.code.as_ptr(),
            (*frame).f_globals,
            (*frame).f_builtins,
            (*(*frame).f_func).func_closure,
        ) else {
            return ptr::null_mut();
        };
        let runner = function.func;
        let positional = layout.argcount;
        let kwonly = layout.kwonlyargcount;
        let mut args: smallvec_like::Args = smallvec_like::Args::new();
        for i in 0..positional + kwonly {
            let value = InterpreterFrame::local(frame, i);
            if value.is_null() {
                return unbound_argument(py, layout, i);
            }
            args.push(value);
        }
        let argument_slots =
            positional + kwonly + usize::from(layout.has_varargs) + usize::from(layout.has_varkw);
        if !layout.has_varargs && !layout.has_varkw {
            let kwnames = layout
                .kwonly_names
                .as_ref()
                .map_or(ptr::null_mut(), OwnedRef::as_ptr);
            let taken = take_arguments(frame, argument_slots);
            return call(runner, entry, args.as_slice(), positional, kwnames, taken);
        }
        // Rebuild `*args` and `**kwargs` as separate arguments.
        let mut slot = positional + kwonly;
        let mut kw_values: Vec<*mut ffi::PyObject> = args.as_slice()[positional..].to_vec();
        let mut all: Vec<*mut ffi::PyObject> = args.as_slice()[..positional].to_vec();
        if layout.has_varargs {
            let star = InterpreterFrame::local(frame, slot);
            slot += 1;
            if star.is_null() {
                return unbound_argument(py, layout, slot - 1);
            }
            for i in 0..ffi::PyTuple_GET_SIZE(star) {
                all.push(ffi::PyTuple_GET_ITEM(star, i));
            }
        }
        let nargs = all.len();
        let mut names: Vec<*mut ffi::PyObject> = Vec::new();
        if let Some(kwonly_names) = &layout.kwonly_names {
            for i in 0..ffi::PyTuple_GET_SIZE(kwonly_names.as_ptr()) {
                names.push(ffi::PyTuple_GET_ITEM(kwonly_names.as_ptr(), i));
            }
        }
        if layout.has_varkw {
            let dict = InterpreterFrame::local(frame, slot);
            if dict.is_null() {
                return unbound_argument(py, layout, slot);
            }
            let mut pos: ffi::Py_ssize_t = 0;
            let mut key: *mut ffi::PyObject = ptr::null_mut();
            let mut value: *mut ffi::PyObject = ptr::null_mut();
            while ffi::PyDict_Next(dict, &mut pos, &mut key, &mut value) != 0 {
                names.push(key);
                kw_values.push(value);
            }
        }
        all.extend(kw_values);
        let kwnames = if names.is_empty() {
            None
        } else {
            // The dict and the frame keep every name alive; the tuple takes its own references.
            let tuple = ffi::PyTuple_New(names.len() as isize);
            if tuple.is_null() {
                return ptr::null_mut();
            }
            for (i, name) in names.iter().enumerate() {
                ffi::Py_INCREF(*name);
                ffi::PyTuple_SET_ITEM(tuple, i as isize, *name);
            }
            OwnedRef::from_owned(tuple)
        };
        let taken = take_arguments(frame, argument_slots);
        call(
            runner,
            entry,
            &all,
            nargs,
            kwnames.as_ref().map_or(ptr::null_mut(), OwnedRef::as_ptr),
            taken,
        )
    }
}

/// The references of the first `slots` localsplus slots of `frame` (all bound), taken out;
/// none while someone holds the frame's frame object (the callback that compiled it keeps
/// it, a test reads its `f_locals` afterwards): the frame must still show its arguments.
///
/// # Safety
/// `frame` is live, has not started, and has at least `slots` localsplus slots.
unsafe fn take_arguments(frame: *mut InterpreterFrame, slots: usize) -> Vec<*mut ffi::PyObject> {
    // SAFETY: caller's contract; a frame object, if any, is live while the frame is.
    unsafe {
        let frame_obj = (*frame).frame_obj;
        if !frame_obj.is_null() && ffi::Py_REFCNT(frame_obj.cast()) > 1 {
            return Vec::new();
        }
        (0..slots)
            .map(|i| InterpreterFrame::take_local(frame, i))
            .collect()
    }
}

/// # Safety
/// GIL held; `args` are live objects; `kwnames` names the trailing `args.len() - nargs`.
unsafe fn call(
    runner: *mut ffi::PyObject,
    entry: &CacheEntry,
    args: &[*mut ffi::PyObject],
    nargs: usize,
    kwnames: *mut ffi::PyObject,
    taken: Vec<*mut ffi::PyObject>,
) -> *mut ffi::PyObject {
    let previous = PENDING.with(|p| p.replace(entry.code.as_ptr()));
    // `args` borrow from `taken` (or from what its objects hold), alive until released.
    let previous_handoff = HANDOFF.with(|h| std::mem::replace(&mut *h.borrow_mut(), taken));
    // SAFETY: caller's contract; vectorcall borrows the argument array for the call.
    let result = unsafe { ffi::PyObject_Vectorcall(runner, args.as_ptr(), nargs, kwnames) };
    // Normally the hook cleared both on entering the runner's frame; not if binding failed.
    PENDING.with(|p| p.set(previous));
    // SAFETY: GIL held.
    unsafe { release_handoff() };
    HANDOFF.with(|h| *h.borrow_mut() = previous_handoff);
    result
}

fn unbound_argument(py: Python<'_>, layout: &FrameLayout, slot: usize) -> *mut ffi::PyObject {
    let name = layout
        .names
        .get(slot)
        .map(|n| n.bind(py).to_string())
        .unwrap_or_default();
    PySystemError::new_err(format!(
        "dynamo_rs: argument {name:?} of {} is unbound when the frame starts",
        layout.location
    ))
    .restore(py);
    ptr::null_mut()
}

/// A fixed-capacity argument buffer that spills to the heap, so the common call (a handful
/// of arguments) allocates nothing.
mod smallvec_like {
    use pyo3::ffi;

    pub struct Args {
        inline: [*mut ffi::PyObject; 8],
        len: usize,
        heap: Vec<*mut ffi::PyObject>,
    }

    impl Args {
        pub fn new() -> Args {
            Args {
                inline: [std::ptr::null_mut(); 8],
                len: 0,
                heap: Vec::new(),
            }
        }

        pub fn push(&mut self, value: *mut ffi::PyObject) {
            if self.len < self.inline.len() && self.heap.is_empty() {
                self.inline[self.len] = value;
                self.len += 1;
            } else {
                if self.heap.is_empty() {
                    self.heap.extend_from_slice(&self.inline[..self.len]);
                }
                self.heap.push(value);
            }
        }

        pub fn as_slice(&self) -> &[*mut ffi::PyObject] {
            if self.heap.is_empty() {
                &self.inline[..self.len]
            } else {
                &self.heap
            }
        }
    }
}
