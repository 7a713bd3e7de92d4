//! `disable(fn)`: a callable that runs `fn` with the frame hook off on this thread, so neither
//! `fn` nor anything it calls is intercepted. Compiled graphs are wrapped in it.

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::hook::call_disabled;

#[pyclass(module = "dynamo_rs._native", dict, weakref)]
#[derive(Debug)]
pub struct DisabledFunction {
    /// The wrapped callable (`__wrapped__` is set in the instance dict by
    /// `functools.update_wrapper`).
    wrapped: Py<PyAny>,
}

impl DisabledFunction {
    /// Wraps a callable known to be callable (a compiled graph).
    pub fn wrap(wrapped: Bound<'_, PyAny>) -> DisabledFunction {
        DisabledFunction {
            wrapped: wrapped.unbind(),
        }
    }
}

#[pymethods]
impl DisabledFunction {
    #[new]
    fn new(wrapped: Bound<'_, PyAny>) -> PyResult<Self> {
        if !wrapped.is_callable() {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "disable() expects a callable, not {}",
                wrapped.get_type().name()?
            )));
        }
        Ok(DisabledFunction {
            wrapped: wrapped.unbind(),
        })
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        call_disabled(self.wrapped.bind(py), args, kwargs)
    }

    /// The callable run with the hook off.
    #[getter]
    fn wrapped_callable(&self, py: Python<'_>) -> Py<PyAny> {
        self.wrapped.clone_ref(py)
    }

    /// Binds like a function when used as a method.
    fn __get__<'py>(
        slf: Bound<'py, Self>,
        instance: Option<Bound<'py, PyAny>>,
        _owner: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match instance {
            None => Ok(slf.into_any()),
            Some(obj) => {
                let types = slf.py().import_module("types")?;
                types.getattr("MethodType")?.call1((slf, obj))
            }
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "<dynamo_rs.disable({})>",
            self.wrapped.bind(py).repr()?
        ))
    }
}
