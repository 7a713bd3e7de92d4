//! transformers' `ModelOutput` dataclasses made by the traced code: what the trace assumes of
//! their construction, and how the generated code makes one again after the graph.
//!
//! `cls(**fields)` runs the dataclass `__init__`, which stores each field through
//! `ModelOutput.__setattr__` (the instance's `__dict__`, and the ordered-dict item when the
//! value is not None), then `__post_init__` (a dozen `dataclasses.fields` calls, checks, the
//! same items again): about 12 µs per call, a quarter of a compiled GPT-2 call with a no-op
//! backend. For classes whose construction is exactly that, the state it leaves is known —
//! every field in `__dict__` in order, the non-None ones as items in order — and
//! [`model_output_from_fields`] makes it directly (0.5 µs). Any class that changes a step
//! (its own `__new__`, `__init__`, `__post_init__`, `__setattr__`, `__setitem__`, a
//! metaclass) is made by calling it.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use super::vars::VarId;
use crate::imports::ImportModule;

/// The class attributes a `ModelOutput`'s construction runs; the trace guards each, so a
/// class patched later (`Out.__post_init__ = ...`) recompiles.
pub const CONSTRUCTION_STEPS: [&str; 5] = [
    "__new__",
    "__init__",
    "__post_init__",
    "__setattr__",
    "__setitem__",
];

/// Whether `cls(**fields)` is the standard construction described in the module docs: the
/// ordered dict's `__new__`, the `__init__` that `@dataclass` generated for a dataclass with
/// the same fields (all set by `__init__`), and `ModelOutput`'s own `__post_init__`,
/// `__setattr__` and `__setitem__`.
pub fn is_standard(cls: &Bound<'_, PyType>) -> PyResult<bool> {
    let py = cls.py();
    let model_output = py
        .import_module("transformers.utils.generic")?
        .getattr("ModelOutput")?;
    if !cls.get_type().is(py.get_type::<PyType>()) {
        return Ok(false);
    }
    for name in ["__post_init__", "__setattr__", "__setitem__"] {
        if !cls.getattr(name)?.is(model_output.getattr(name)?) {
            return Ok(false);
        }
    }
    if !cls
        .getattr("__new__")?
        .is(py.get_type::<PyDict>().getattr("__new__")?)
    {
        return Ok(false);
    }
    // The class that defines `__init__`: `@dataclass` wrote it (its qualified name and the
    // `<string>` it was compiled from) for the same fields.
    let Some(owner) = cls
        .getattr("__mro__")?
        .cast_into::<PyTuple>()?
        .iter()
        .find(|c| {
            c.getattr("__dict__")
                .and_then(|d| d.contains("__init__"))
                .unwrap_or(false)
        })
    else {
        return Ok(false);
    };
    let init = cls.getattr("__init__")?;
    let generated = init.getattr("__qualname__").is_ok_and(|q| {
        owner
            .getattr("__qualname__")
            .is_ok_and(|o| q.to_string() == format!("{o}.__init__"))
    }) && init
        .getattr("__code__")
        .and_then(|c| c.getattr("co_filename"))
        .is_ok_and(|f| f.to_string() == "<string>");
    if !generated {
        return Ok(false);
    }
    let dataclasses = py.import_module("dataclasses")?;
    let field_names = |c: &Bound<'_, PyAny>| -> PyResult<Vec<String>> {
        let mut names = Vec::new();
        for field in dataclasses.call_method1("fields", (c,))?.try_iter()? {
            let field = field?;
            if !field.getattr("init")?.is_truthy()? {
                return Ok(Vec::new());
            }
            names.push(field.getattr("name")?.extract()?);
        }
        Ok(names)
    };
    let own = field_names(cls.as_any())?;
    Ok(!own.is_empty() && own == field_names(&owner)?)
}

/// `cls(**dict(zip(names, values)))` for a class [`is_standard`] accepted, without running
/// its Python: a new instance (`dict.__new__`, as `OrderedDict.__new__` is), every field set
/// in its `__dict__` in order, and the fields that are not None stored as items in order.
///
/// Fields named in `attribute_only` are set as attributes but not stored as items (a None
/// field the traced code gave a value through `ModelOutput.__setattr__`).
#[pyfunction(signature = (cls, names, *values, attribute_only = None))]
pub fn model_output_from_fields<'py>(
    cls: &Bound<'py, PyType>,
    names: &Bound<'py, PyTuple>,
    values: &Bound<'py, PyTuple>,
    attribute_only: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyAny>> {
    static STEPS: PyOnceLock<(Py<PyAny>, Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
    let py = cls.py();
    let (new, set_attr, set_item) = STEPS.get_or_try_init(py, || -> PyResult<_> {
        let ordered_dict = py.import_module("collections")?.getattr("OrderedDict")?;
        Ok((
            py.get_type::<PyDict>().getattr("__new__")?.unbind(),
            py.import_module("builtins")?
                .getattr("object")?
                .getattr("__setattr__")?
                .unbind(),
            ordered_dict.getattr("__setitem__")?.unbind(),
        ))
    })?;
    if names.len() != values.len() {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "model_output_from_fields: one value per field name",
        ));
    }
    let object = new.bind(py).call1((cls,))?;
    for (name, value) in names.iter().zip(values.iter()) {
        set_attr.bind(py).call1((&object, &name, &value))?;
    }
    for (name, value) in names.iter().zip(values.iter()) {
        let skipped = match attribute_only {
            Some(skipped) => skipped.contains(&name)?,
            None => false,
        };
        if !value.is_none() && !skipped {
            set_item.bind(py).call1((&object, &name, &value))?;
        }
    }
    Ok(object)
}

impl<'py> super::translator::Tracer<'py> {
    /// `out.name = value` or `out[name] = value` on a ModelOutput made in the trace (whose
    /// `__setattr__`/`__setitem__` are `ModelOutput`'s: guarded where it was made), as those
    /// do it: a field that is an item given a new value that is not None has its item
    /// replaced in place; `out[k] = v` of a None field appends an item, and so does
    /// `out.k = v` in today's transformers (older ones set the attribute only: recorded in
    /// `model_output_attribute_only`, left out of `to_tuple()`) — modelled when it lands
    /// after every item, where the field order the tracker keeps puts it. Other stores (None
    /// over an item, an item appended out of field order) are refused. False when `obj` is
    /// not such a ModelOutput.
    pub(super) fn model_output_store(
        &mut self,
        obj: VarId,
        name: &str,
        value: Option<VarId>,
        item_store: bool,
    ) -> super::translator::CResult<bool> {
        use super::vars::VarKind;
        let py = self.py;
        let VarKind::Instance {
            attrs,
            model_output: true,
            ..
        } = self.kind(obj)
        else {
            return Ok(false);
        };
        let is_none =
            |t: &Self, v: VarId| matches!(t.kind(v), VarKind::Const(c) if c.bind(py).is_none());
        let Some(at) = attrs.iter().position(|(n, _)| n == name) else {
            return super::translator::unsupported(
                super::break_reasons::BreakKind::ModelOutput,
                format!("storing .{name}, not a field, on a ModelOutput made in the trace"),
            );
        };
        let is_item = !is_none(self, attrs[at].1);
        let last_item = attrs.iter().rposition(|&(_, v)| !is_none(self, v));
        let new_value_none = value.is_none_or(|v| is_none(self, v));
        let attribute_only = self
            .model_output_attribute_only
            .get(&obj)
            .is_some_and(|names| names.iter().any(|n| n == name));
        let appends = item_store
            || self
                .py
                .import_module("dynamo_rs._capture")?
                .call_method0("model_output_setattr_adds_items")?
                .is_truthy()?;
        let kept = match (is_item && !attribute_only, new_value_none) {
            (true, false) => true,
            (false, false) if appends => !attribute_only && last_item.is_none_or(|last| last < at),
            (false, false) => {
                if !attribute_only {
                    self.model_output_attribute_only
                        .entry(obj)
                        .or_default()
                        .push(name.to_string());
                }
                true
            }
            _ => false,
        };
        if !kept {
            return super::translator::unsupported(
                super::break_reasons::BreakKind::ModelOutput,
                format!(
                    "a store to .{name} of a ModelOutput made in the trace that makes its \
                     attributes and items differ"
                ),
            );
        }
        let value = value.expect("not None: checked");
        if let VarKind::Instance { attrs, .. } = &mut self.vars[obj.0 as usize].kind {
            attrs[at].1 = value;
        }
        Ok(true)
    }
}
