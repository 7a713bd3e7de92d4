//! The pieces of torch's global state a trace may change for real and that outlive it: the
//! grad mode (grad-mode blocks flip it while tracing), the deterministic-algorithms setting
//! (`torch.use_deterministic_algorithms(...)` runs while tracing to get its result, and goes
//! into the graph), the default dtype (`torch.set_default_dtype(...)`, likewise) and the
//! float32 matmul precision (`torch.set_float32_matmul_precision(...)`).
//!
//! They are taken before a frame is traced and put back after every trace, whatever it did:
//! the graph sets them again when it runs, at the point of the program that set them. Left
//! as the trace had them, the graph's code before that point — and the frame run eagerly when
//! tracing gave up — would run with the state the rest of the frame sets. TorchDynamo puts
//! back the same state around its traces.

use crate::imports::ImportModule;
use pyo3::prelude::*;

pub(super) struct SavedGlobalState<'py> {
    torch: Bound<'py, PyAny>,
    grad_enabled: Bound<'py, PyAny>,
    deterministic: bool,
    deterministic_warn_only: bool,
    default_dtype: Bound<'py, PyAny>,
    matmul_precision: Bound<'py, PyAny>,
    /// Switches `torch.func.grad` makes while it runs (see `ops_functorch`).
    inplace_requires_grad_allowed: bool,
    saved_tensors_hooks_enabled: bool,
    fwd_grad_enabled: bool,
}

impl<'py> SavedGlobalState<'py> {
    pub(super) fn take(py: Python<'py>) -> PyResult<Self> {
        let torch = py.import_module("torch")?.into_any();
        Ok(SavedGlobalState {
            grad_enabled: torch.call_method0("is_grad_enabled")?,
            deterministic: torch
                .call_method0("are_deterministic_algorithms_enabled")?
                .is_truthy()?,
            deterministic_warn_only: torch
                .call_method0("is_deterministic_algorithms_warn_only_enabled")?
                .is_truthy()?,
            default_dtype: torch.call_method0("get_default_dtype")?,
            matmul_precision: torch.call_method0("get_float32_matmul_precision")?,
            inplace_requires_grad_allowed: torch
                .getattr("_C")?
                .getattr("_functorch")?
                .call_method0("get_inplace_requires_grad_allowed")?
                .is_truthy()?,
            saved_tensors_hooks_enabled: torch
                .getattr("_C")?
                .getattr("_autograd")?
                .call_method0("_saved_tensors_hooks_is_enabled")?
                .is_truthy()?,
            fwd_grad_enabled: torch
                .getattr("_C")?
                .call_method0("_is_fwd_grad_enabled")?
                .is_truthy()?,
            torch,
        })
    }

    /// Puts the state back; only what the trace changed is set (each setter costs a call).
    pub(super) fn restore(&self) -> PyResult<()> {
        let torch = &self.torch;
        let functorch = torch.getattr("_C")?.getattr("_functorch")?;
        let capture = torch.py().import_module("dynamo_rs._capture")?;
        if !functorch.call_method0("peek_interpreter_stack")?.is_none()
            || capture.getattr("_OPEN_DUAL_LEVELS")?.is_truthy()?
        {
            // A trace stopped inside `torch.vmap` or `torch.func.grad` (see
            // `ops_functorch`): the levels it entered for real are left (frames are traced
            // outside every transform), and the switches it made put back.
            capture.call_method0("leave_functorch_transforms")?;
        }
        if functorch
            .call_method0("get_inplace_requires_grad_allowed")?
            .is_truthy()?
            != self.inplace_requires_grad_allowed
        {
            functorch.call_method1(
                "set_inplace_requires_grad_allowed",
                (self.inplace_requires_grad_allowed,),
            )?;
        }
        let c = torch.getattr("_C")?;
        if c.call_method0("_is_fwd_grad_enabled")?.is_truthy()? != self.fwd_grad_enabled {
            c.call_method1("_set_fwd_grad_enabled", (self.fwd_grad_enabled,))?;
        }
        let autograd = torch.getattr("_C")?.getattr("_autograd")?;
        let hooks_enabled = autograd
            .call_method0("_saved_tensors_hooks_is_enabled")?
            .is_truthy()?;
        if hooks_enabled != self.saved_tensors_hooks_enabled && self.saved_tensors_hooks_enabled {
            autograd.call_method0("_saved_tensors_hooks_enable")?;
        }
        torch
            .getattr("_C")?
            .call_method1("_set_grad_enabled", (&self.grad_enabled,))?;
        let deterministic = torch
            .call_method0("are_deterministic_algorithms_enabled")?
            .is_truthy()?;
        let warn_only = torch
            .call_method0("is_deterministic_algorithms_warn_only_enabled")?
            .is_truthy()?;
        if (deterministic, warn_only) != (self.deterministic, self.deterministic_warn_only) {
            let kwargs = pyo3::types::PyDict::new(torch.py());
            kwargs.set_item("warn_only", self.deterministic_warn_only)?;
            torch.call_method(
                "use_deterministic_algorithms",
                (self.deterministic,),
                Some(&kwargs),
            )?;
        }
        let dtype = torch.call_method0("get_default_dtype")?;
        if !dtype.is(&self.default_dtype) {
            torch.call_method1("set_default_dtype", (&self.default_dtype,))?;
        }
        let precision = torch.call_method0("get_float32_matmul_precision")?;
        if !precision.eq(&self.matmul_precision)? {
            torch.call_method1("set_float32_matmul_precision", (&self.matmul_precision,))?;
        }
        Ok(())
    }
}
