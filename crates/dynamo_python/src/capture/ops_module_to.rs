//! `module.to(dtype)` / `module.to(device)` called in `forward` on a module whose every
//! parameter and buffer already has that dtype and device (transformers' Switch Transformers
//! router casts its classifier to float32 on every call): `Module.to` then changes nothing and
//! returns the module, so the trace does the same — instead of inlining `Module._apply`,
//! whose `param.data = ...` stores and `try` blocks it cannot follow.
//!
//! "Changes nothing" holds while what it was decided from holds, so that is guarded: the
//! module tree's structure (the keys of every `_parameters`, `_buffers` and `_modules`),
//! every module's type (none overrides `_apply`), every tensor's metadata (dtype and device
//! among them), parameters without gradients, and torch's two `__future__` switches that
//! make `Module.to` replace parameters even when nothing converts.

use std::rc::Rc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::guards::GuardKind;
use super::source::{ItemKey, Source};
use super::translator::{CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// Guards to add, by source.
type SourceGuards = Vec<(Rc<Source>, GuardKind)>;

/// `torch.__future__` switches under which `Module.to` makes new parameters.
const FUTURE_SWITCHES: [&str; 2] = [
    "_overwrite_module_params_on_conversion",
    "_swap_module_params_on_conversion",
];

impl<'py> Tracer<'py> {
    /// The receiver itself when `func` is `torch.nn.Module.to` and the call converts nothing
    /// (see the module documentation); None to trace the call as any other.
    pub(super) fn module_to_without_change(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let torch = py.import_module("torch")?;
        // `module.float()` and its kin are `to` with one dtype or device, for this purpose:
        // they convert a subset of what `to(dtype)` converts (floating-point tensors only),
        // so "`to` would change nothing" implies they change nothing.
        let mut implied: Option<Vec<Bound<'py, PyAny>>> = None;
        if !func.is(&self.h.module_type.getattr("to")?) {
            let shorthand = [
                ("float", "float32"),
                ("double", "float64"),
                ("half", "float16"),
                ("bfloat16", "bfloat16"),
                ("cpu", "cpu"),
            ]
            .into_iter()
            .find(|(method, _)| {
                self.h
                    .module_type
                    .getattr(*method)
                    .is_ok_and(|m| m.is(func))
            });
            let Some((method, target)) = shorthand else {
                return Ok(None);
            };
            if args.len() != 1 || !kwargs.is_empty() {
                return Ok(None);
            }
            implied = Some(vec![if method == "cpu" {
                pyo3::types::PyString::new(py, target).into_any()
            } else {
                torch.getattr(target)?
            }]);
        }
        let Some((&receiver, rest)) = args.split_first() else {
            return Ok(None);
        };
        let (VarKind::Object(module), Some(source)) = (self.kind(receiver), self.source(receiver))
        else {
            return Ok(None);
        };
        let module = module.bind(py).clone();
        // Constant arguments only (a dtype, a device, a string): `.to(other_tensor)` and
        // anything computed take the long way.
        let constant = |id: &VarId| matches!(self.kind(*id), VarKind::Const(_));
        if !rest.iter().all(constant) || !kwargs.iter().all(|(_, v)| constant(v)) {
            return Ok(None);
        }
        let positional = match implied {
            Some(values) => values,
            None => rest
                .iter()
                .map(|&a| self.python_value(a))
                .collect::<CResult<Vec<_>>>()?,
        };
        let named = PyDict::new(py);
        for (name, value) in kwargs {
            named.set_item(name, self.python_value(*value)?)?;
        }
        let Ok(parsed) = torch
            .getattr("_C")?
            .getattr("_nn")?
            .getattr("_parse_to")?
            .call(PyTuple::new(py, positional)?, Some(&named))
        else {
            return Ok(None); // bad arguments: the real call raises
        };
        let (device, dtype, _non_blocking, memory_format): (
            Bound<'py, PyAny>,
            Bound<'py, PyAny>,
            Bound<'py, PyAny>,
            Bound<'py, PyAny>,
        ) = parsed.extract()?;
        if !memory_format.is_none() {
            return Ok(None);
        }
        if !dtype.is_none() {
            let converts_to = dtype.getattr("is_floating_point")?.is_truthy()?
                || dtype.getattr("is_complex")?.is_truthy()?;
            if !converts_to {
                return Ok(None); // `Module.to` refuses integer dtypes
            }
        }
        let future = py.import_module("torch.__future__")?;
        for switch in FUTURE_SWITCHES {
            if future.getattr(switch)?.is_truthy()? {
                return Ok(None);
            }
        }
        let Some(guards) = self.unchanged_by_to(&module, &source, &device, &dtype)? else {
            return Ok(None);
        };
        let future_source = Rc::new(Source::Object(
            OwnedRef::from_bound(future.as_any()),
            "torch.__future__".into(),
        ));
        for switch in FUTURE_SWITCHES {
            self.guards.add(
                Rc::new(Source::Attr(future_source.clone(), switch.into())),
                GuardKind::Equals(OwnedRef::from_bound(&future.getattr(switch)?)),
            );
        }
        for (source, kind) in guards {
            self.guards.add(source, kind);
        }
        Ok(Some(receiver))
    }

    /// The guards under which `Module.to(device, dtype)` leaves the tree under `root`
    /// unchanged, or None if it would change something (or could not be told).
    fn unchanged_by_to(
        &self,
        root: &Bound<'py, PyAny>,
        root_source: &Rc<Source>,
        device: &Bound<'py, PyAny>,
        dtype: &Bound<'py, PyAny>,
    ) -> CResult<Option<SourceGuards>> {
        let py = self.py;
        let module_apply = self.h.module_type.getattr("_apply")?;
        let tensor_type = &self.h.tensor_type;
        let none = py.None().into_bound(py);
        let mut guards = Vec::new();
        let mut pending = vec![(root.clone(), root_source.clone())];
        while let Some((module, source)) = pending.pop() {
            let module_type = module.get_type();
            if !module.is_instance(&self.h.module_type)?
                || !module_type.getattr("_apply")?.is(&module_apply)
            {
                return Ok(None);
            }
            guards.push((
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(module_type.as_any())),
            ));
            let dict = module.getattr("__dict__")?;
            for table in super::helpers::MODULE_TABLES {
                let Ok(entries) = dict.get_item(table) else {
                    return Ok(None);
                };
                let Ok(entries) = entries.cast_exact::<PyDict>() else {
                    return Ok(None);
                };
                let table_source = Rc::new(Source::Attr(source.clone(), table.into()));
                let keys = PyTuple::new(py, entries.keys())?;
                if !keys
                    .iter()
                    .all(|k| k.is_exact_instance_of::<pyo3::types::PyString>())
                {
                    return Ok(None);
                }
                guards.push((
                    table_source.clone(),
                    GuardKind::Keys(OwnedRef::from_bound(keys.as_any())),
                ));
                for (key, value) in entries.iter() {
                    let name: String = key.extract()?;
                    let item_source =
                        Rc::new(Source::Item(table_source.clone(), ItemKey::Str(name)));
                    if value.is_none() {
                        guards.push((item_source, GuardKind::Equals(OwnedRef::from_bound(&none))));
                        continue;
                    }
                    if table == "_modules" {
                        pending.push((value, item_source));
                        continue;
                    }
                    if !value.is_instance(tensor_type)? {
                        return Ok(None);
                    }
                    let converts = (!dtype.is_none()
                        && (value.call_method0("is_floating_point")?.is_truthy()?
                            || value.call_method0("is_complex")?.is_truthy()?)
                        && !value.getattr("dtype")?.eq(dtype)?)
                        || (!device.is_none() && !value.getattr("device")?.eq(device)?);
                    if converts {
                        return Ok(None);
                    }
                    if table == "_parameters" {
                        // A gradient is converted too: only parameters without one.
                        if !value.getattr("grad")?.is_none() {
                            return Ok(None);
                        }
                        guards.push((
                            Rc::new(Source::Attr(item_source.clone(), "grad".into())),
                            GuardKind::Equals(OwnedRef::from_bound(&none)),
                        ));
                    }
                    guards.push((item_source, GuardKind::Tensor(OwnedRef::from_bound(&value))));
                }
            }
        }
        Ok(Some(guards))
    }
}
