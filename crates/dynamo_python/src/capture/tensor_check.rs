//! The tensor-metadata checks of guards, made by `cpp/tensor_check.cpp` (the metadata is only
//! reachable through libtorch's C++ classes): type, dispatch keys, dtype, device, sizes,
//! strides and `requires_grad`, as torch's `TensorGuards` compares them, at a fraction of its
//! cost per tensor. Also that the tensors are distinct objects, as `TensorGuards` refused a
//! tensor given twice (the graph has one input for each).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use pyo3::prelude::*;

use super::guard_values::TensorMeta;
use crate::eval_frame::owned::OwnedRef;

/// A size or stride the check leaves open (a dynamic dimension); `kOpen` in the C++ file.
const OPEN: i64 = i64::MIN;

extern "C" {
    fn dynamo_rs_tensor_expect(
        tensor: *mut pyo3::ffi::PyObject,
        sizes: *const i64,
        strides: *const i64,
        ndim: usize,
    ) -> *mut std::ffi::c_void;
    fn dynamo_rs_tensor_expect_free(expected: *mut std::ffi::c_void);
    fn dynamo_rs_tensor_check(
        expected: *const *mut std::ffi::c_void,
        tensors: *const *mut pyo3::ffi::PyObject,
        n: usize,
    ) -> usize;
}

/// What each of a list of tensors must look like.
#[derive(Debug, Default)]
pub struct TensorChecks {
    /// One C++ expectation per tensor (owned: freed on drop).
    expected: Vec<*mut std::ffi::c_void>,
    /// The tensors' Python types, which the expectations compare by address: kept alive here.
    types: Vec<OwnedRef>,
    /// The tensors' addresses at the last check that passed: while they are the same, the
    /// tensors are still distinct objects without comparing them with each other.
    last_passed: Vec<AtomicUsize>,
}

// SAFETY: the expectations are immutable after construction and only read by the C++ check,
// which runs with the GIL held; the raw pointers are owned by this value alone.
unsafe impl Send for TensorChecks {}
// SAFETY: as above: shared access only reads them, under the GIL.
unsafe impl Sync for TensorChecks {}

impl Drop for TensorChecks {
    fn drop(&mut self) {
        for expected in self.expected.drain(..) {
            // SAFETY: made by `dynamo_rs_tensor_expect`, freed once (drained).
            unsafe { dynamo_rs_tensor_expect_free(expected) };
        }
    }
}

impl TensorChecks {
    /// Expectations for `tensors` as they are now, with the sizes and strides of `metas`
    /// (one each; `None` for a dynamic dimension, left open).
    pub fn new(
        py: Python<'_>,
        tensors: &[Bound<'_, PyAny>],
        metas: &[TensorMeta],
    ) -> PyResult<TensorChecks> {
        let tensor_type = py.import("torch")?.getattr("Tensor")?;
        let mut checks = TensorChecks::default();
        for (tensor, meta) in tensors.iter().zip(metas) {
            let (sizes, strides) = (&meta.shape, &meta.stride);
            if !tensor.is_instance(&tensor_type)? || sizes.len() != strides.len() {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "a tensor guard was asked to check a {}",
                    tensor.get_type().name()?
                )));
            }
            let open = |v: &Vec<Option<i64>>| v.iter().map(|d| d.unwrap_or(OPEN)).collect();
            let (sizes, strides): (Vec<i64>, Vec<i64>) = (open(sizes), open(strides));
            // SAFETY: `tensor` is a live torch.Tensor instance (checked above) and the GIL is
            // held; the arrays have `sizes.len()` items and are only read during the call.
            let expected = unsafe {
                dynamo_rs_tensor_expect(
                    tensor.as_ptr(),
                    sizes.as_ptr(),
                    strides.as_ptr(),
                    sizes.len(),
                )
            };
            if expected.is_null() {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "the metadata of a tensor the guard checks could not be read",
                ));
            }
            checks.expected.push(expected);
            checks
                .types
                .push(OwnedRef::from_bound(tensor.get_type().as_any()));
            checks.last_passed.push(AtomicUsize::new(0));
        }
        Ok(checks)
    }

    pub fn is_empty(&self) -> bool {
        self.expected.is_empty()
    }

    /// Whether `tensors` (one per expectation, in order) all match and are distinct objects.
    pub fn passes(&self, tensors: &[Bound<'_, PyAny>]) -> bool {
        if tensors.len() != self.expected.len() {
            return false;
        }
        let pointers: Vec<*mut pyo3::ffi::PyObject> = tensors.iter().map(|t| t.as_ptr()).collect();
        // SAFETY: every pointer is a live object (held by `tensors`), the expectations are
        // live, both arrays have `len` items, and the GIL is held. Objects of other types
        // are refused by their type before anything else is read.
        let first_failing = unsafe {
            dynamo_rs_tensor_check(self.expected.as_ptr(), pointers.as_ptr(), pointers.len())
        };
        if first_failing != pointers.len() {
            return false;
        }
        let same_as_last = pointers
            .iter()
            .zip(&self.last_passed)
            .all(|(p, last)| *p as usize == last.load(Relaxed));
        if same_as_last {
            return true;
        }
        let mut sorted: Vec<usize> = pointers.iter().map(|p| *p as usize).collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return false;
        }
        for (p, last) in pointers.iter().zip(&self.last_passed) {
            last.store(*p as usize, Relaxed);
        }
        true
    }
}
