//! Compiled code called from traced code: a function or module already given to
//! `dynamo_rs.compile` or `torch.compile` is traced into the calling graph through the
//! original it wraps — the inner compile's backend and options unused, as TorchDynamo treats
//! nested compiles — instead of breaking the graph at its call.

use pyo3::prelude::*;
use std::rc::Rc;

use super::source::Source;
use super::translator::{CResult, Tracer};
use super::vars::VarId;
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// The Python function a compiled function wraps when `obj` is the wrapper
/// `dynamo_rs.compile` or `torch.compile` made around it, or None.
pub(super) fn compiled_original<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    let Ok(function) = obj.cast::<pyo3::types::PyFunction>() else {
        return Ok(None);
    };
    let Ok(dict) = function
        .getattr(pyo3::intern!(py, "__dict__"))?
        .cast_into::<pyo3::types::PyDict>()
    else {
        return Ok(None);
    };
    let Some(original) = dict.get_item("_torchdynamo_orig_callable")? else {
        return Ok(None);
    };
    if !original.is_instance_of::<pyo3::types::PyFunction>() || super::ops_call::torch_disabled(obj)
    {
        return Ok(None);
    }
    let ours = dict.contains("_dynamo_rs_converter")?;
    let torch_compiled = || -> PyResult<bool> {
        let code = function.getattr(pyo3::intern!(py, "__code__"))?;
        let qualname: String = code.getattr("co_qualname")?.extract()?;
        let file: String = code.getattr("co_filename")?.extract()?;
        Ok(
            qualname == "_TorchDynamoContext.__call__.<locals>.compile_wrapper"
                && file
                    .replace('\\', "/")
                    .ends_with("torch/_dynamo/eval_frame.py"),
        )
    };
    Ok((ours || torch_compiled()?).then_some(original))
}

impl<'py> Tracer<'py> {
    /// The module an `OptimizedModule` of `dynamo_rs.compile` or `torch.compile` wraps,
    /// wrapped through its source (the wrapper's class guarded), when `module` is one: a
    /// compiled module called from traced code is traced into this graph, as TorchDynamo
    /// does. None for other modules.
    pub(super) fn compiled_module_original(
        &mut self,
        module_var: VarId,
        module: &Bound<'py, PyAny>,
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let cls = module.get_type();
        let ours = py
            .import_module("dynamo_rs.compiler")?
            .getattr("OptimizedModule")?;
        let torch_compiled = py
            .import_module("torch._dynamo.eval_frame")
            .and_then(|m| m.getattr("OptimizedModule"));
        let compiled = cls.is(&ours) || torch_compiled.is_ok_and(|t| cls.is(&t));
        if !compiled {
            return Ok(None);
        }
        let Ok(inner) = module.getattr("_orig_mod") else {
            return Ok(None);
        };
        let source = self.source(module_var);
        if let Some(s) = &source {
            self.guards.add(
                s.clone(),
                super::guards::GuardKind::Type(OwnedRef::from_bound(cls.as_any())),
            );
        } else {
            self.pin_identity(module_var);
        }
        let source = source.map(|s| Rc::new(Source::Attr(s, "_orig_mod".into())));
        self.wrap(&inner, source).map(Some)
    }
}
