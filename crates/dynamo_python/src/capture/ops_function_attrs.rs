//! Attributes of functions made in the trace: `__name__`, `__qualname__`, `__doc__`,
//! `__module__`, `__annotations__`, `__dict__` and whatever the code stores on them.
//! `functools.wraps` reads and sets them (`update_wrapper`: the wrapped function's names,
//! its `__dict__`, `__wrapped__`), decorators mark functions (`fn.is_hook = True`). What the
//! trace stores is kept beside the function tracker and set again on the function the
//! generated code makes when it escapes.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::PyString;

use super::break_reasons::BreakKind;
use super::codegen::Rebuild;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// The attributes of a function made in the trace that differ from what its code says.
#[derive(Debug, Default, Clone)]
pub struct FunctionAttrs {
    /// `__name__`, `__qualname__`, `__doc__`, `__module__` or `__annotations__` as stored
    /// (the function's own slots, not in its `__dict__`).
    pub slots: Vec<(String, VarId)>,
    /// The function's `__dict__`: a dict tracker made in the trace, once read or stored to.
    pub dict: Option<VarId>,
}

/// Names a function keeps in slots of its own rather than in its `__dict__`, which the
/// trace models.
const SLOT_NAMES: [&str; 5] = [
    "__name__",
    "__qualname__",
    "__doc__",
    "__module__",
    "__annotations__",
];

impl<'py> Tracer<'py> {
    /// `function.name` of a function made in the trace.
    pub(super) fn function_attr(&mut self, id: VarId, name: &str) -> CResult<VarId> {
        let py = self.py;
        let VarKind::Function(function) = self.kind(id) else {
            return unsupported(
                BreakKind::Internal,
                "internal: function_attr of a non-function",
            );
        };
        let function = function.clone();
        let attrs = self.function_attrs.get(&id).cloned().unwrap_or_default();
        if let Some((_, value)) = attrs.slots.iter().find(|(n, _)| n == name) {
            return Ok(*value);
        }
        if name == "__dict__" {
            return Ok(self.function_dict(id));
        }
        if let Some(dict) = attrs.dict {
            if let VarKind::Dict(entries) = self.kind(dict) {
                let key = PyString::new(py, name);
                if let Some((_, value)) = entries
                    .iter()
                    .find(|(k, _)| k.bind(py).eq(&key).unwrap_or(false))
                {
                    return Ok(*value);
                }
            }
        }
        let code = function.code.bind(py).clone();
        let none = || py.None().into_bound(py);
        let value = match name {
            "__name__" => code.getattr("co_name")?,
            "__qualname__" => code.getattr("co_qualname")?,
            "__code__" => code.clone(),
            // As CPython's PyFunction_New: the first constant when it is a str.
            "__doc__" => match code.getattr("co_consts")?.get_item(0) {
                Ok(first) if first.is_instance_of::<PyString>() => first,
                _ => none(),
            },
            "__module__" => match function.globals.bind(py).get_item("__name__") {
                Ok(module) => module,
                Err(_) => none(),
            },
            "__defaults__" => {
                return Ok(match function.defaults {
                    Some(d) => d,
                    None => self.constant(&none()),
                })
            }
            "__kwdefaults__" => {
                return Ok(match function.kwdefaults {
                    Some(d) => d,
                    None => self.constant(&none()),
                })
            }
            // Made empty on first read, then the same dict (as CPython does).
            "__annotations__" => {
                let dict = self.add(VarKind::Dict(Vec::new()), None);
                self.function_attrs
                    .entry(id)
                    .or_default()
                    .slots
                    .push((name.to_string(), dict));
                return Ok(dict);
            }
            _ => {
                let function_type = py.import_module("types")?.getattr("FunctionType")?;
                if function_type.hasattr(name)? {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("the attribute {name:?} of a function made in the trace"),
                    );
                }
                let message = format!("'function' object has no attribute '{name}'");
                return self
                    .raise_builtin("AttributeError", PyString::new(py, &message).into_any());
            }
        };
        Ok(self.constant(&value))
    }

    /// Whether a function made in the trace has the attribute `name` (for `hasattr`).
    pub(super) fn function_has_attr(&self, id: VarId, name: &str) -> CResult<bool> {
        let py = self.py;
        let attrs = self.function_attrs.get(&id);
        if attrs.is_some_and(|a| a.slots.iter().any(|(n, _)| n == name)) {
            return Ok(true);
        }
        if let Some(VarKind::Dict(entries)) = attrs.and_then(|a| a.dict).map(|d| self.kind(d)) {
            let key = PyString::new(py, name);
            if entries
                .iter()
                .any(|(k, _)| k.bind(py).eq(&key).unwrap_or(false))
            {
                return Ok(true);
            }
        }
        Ok(py
            .import_module("types")?
            .getattr("FunctionType")?
            .hasattr(name)?)
    }

    /// `function.name = value` (`value` None: `del function.name`) on a function made in
    /// the trace.
    pub(super) fn store_function_attr(
        &mut self,
        id: VarId,
        name: &str,
        value: Option<VarId>,
    ) -> CResult<()> {
        let py = self.py;
        if SLOT_NAMES.contains(&name) {
            let Some(value) = value else {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("del of the {name} of a function"),
                );
            };
            // CPython takes only a str as a name (TypeError otherwise), anything as the rest.
            if matches!(name, "__name__" | "__qualname__")
                && !matches!(self.kind(value), VarKind::Const(v) if v.bind(py).is_instance_of::<PyString>())
            {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("setting the {name} of a function to something that is not a str"),
                );
            }
            let slots = &mut self.function_attrs.entry(id).or_default().slots;
            match slots.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value,
                None => slots.push((name.to_string(), value)),
            }
            return Ok(());
        }
        let writable = py
            .import_module("types")?
            .getattr("FunctionType")?
            .hasattr(name)?;
        if writable {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("setting the {name} of a function made in the trace"),
            );
        }
        let dict = self.function_dict(id);
        let key = OwnedRef::from_bound(PyString::new(py, name).as_any());
        match value {
            Some(value) => {
                if let VarKind::Dict(entries) = &mut self.vars[dict.0 as usize].kind {
                    super::vars::dict_set(py, entries, key, value);
                }
            }
            None => {
                let found = match self.kind(dict) {
                    VarKind::Dict(entries) => entries
                        .iter()
                        .position(|(k, _)| k.bind(py).eq(key.bind(py)).unwrap_or(false)),
                    _ => None,
                };
                let Some(at) = found else {
                    return self
                        .raise_builtin("AttributeError", PyString::new(py, name).into_any());
                };
                self.note_dict_removal(dict);
                if let VarKind::Dict(entries) = &mut self.vars[dict.0 as usize].kind {
                    entries.remove(at);
                }
            }
        }
        Ok(())
    }

    /// The `__dict__` of a function made in the trace: a dict tracker made on first use.
    fn function_dict(&mut self, id: VarId) -> VarId {
        if let Some(dict) = self.function_attrs.get(&id).and_then(|a| a.dict) {
            return dict;
        }
        let dict = self.add(VarKind::Dict(Vec::new()), None);
        self.function_attrs.entry(id).or_default().dict = Some(dict);
        dict
    }
}

/// `made`, the plan that makes a function again, followed by setting what the trace stored
/// on it (see `FunctionAttrs`); `made` itself when nothing was stored.
pub(super) fn with_function_attrs(
    tracer: &Tracer<'_>,
    id: VarId,
    made: Rebuild,
    plan: &mut dyn FnMut(VarId) -> CResult<Rebuild>,
) -> CResult<Rebuild> {
    let py = tracer.py;
    let Some(attrs) = tracer.function_attrs.get(&id) else {
        return Ok(made);
    };
    let mut slots = Vec::with_capacity(attrs.slots.len());
    for (name, value) in &attrs.slots {
        slots.push((name.clone(), plan(*value)?));
    }
    let dict = match attrs.dict {
        Some(d) => plan(d)?,
        None => Rebuild::Dict(Vec::new()),
    };
    let setter = py
        .import_module("dynamo_rs._capture")?
        .getattr("set_function_attributes")?;
    Ok(Rebuild::Call {
        func: Box::new(Rebuild::Const(OwnedRef::from_bound(&setter))),
        args: vec![made, dict],
        kwargs: slots,
    })
}

/// Type of the side table kept by the tracer.
pub type FunctionAttrTable = HashMap<VarId, FunctionAttrs>;
