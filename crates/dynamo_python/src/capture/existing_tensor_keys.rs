//! Dicts that existed before the call, keyed by parameters the frame was given — an
//! optimizer's `state` (a `defaultdict` keyed by parameters), per-parameter settings
//! (`{p: lr}`). A tensor key is found by identity (a tensor hashes by `id`), so what `d[p]`,
//! `p in d` and `d.get(p)` read depends on which tensor `p` is: its identity is guarded
//! (a parameter lives as long as its model), and the value is read through the source
//! `d[<that tensor>]`, guarded as any item read. Other tensors (made anew for each call)
//! are not looked up this way: guarding their identity would compile again on every call.

use std::rc::Rc;

use pyo3::prelude::*;

use super::guards::GuardKind;
use super::source::{ItemKey, ObjectKey, Source};
use super::translator::{CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// What looking a tensor up in an existing dict found.
pub(super) enum TensorKeyLookup {
    /// The value, read through its source.
    Found(VarId),
    /// The tensor is not a key (guarded to stay so).
    Missing,
}

/// An existing dict, its source, and a tensor the frame was given looked up in it.
type TensorKeyOf<'py> = (
    Bound<'py, pyo3::types::PyDict>,
    Rc<Source>,
    Bound<'py, PyAny>,
);

impl<'py> Tracer<'py> {
    /// The dict, its source and the real tensor when `container` is an existing plain dict
    /// (or `OrderedDict`/`defaultdict`, whose `__missing__` only runs for `d[k]` of a missing
    /// key) read from a source and `key` a parameter the frame was given — with the
    /// parameter's identity guarded, as it decides the answer. None for anything else.
    fn tensor_key_of_existing_dict(
        &mut self,
        container: VarId,
        key: VarId,
    ) -> CResult<Option<TensorKeyOf<'py>>> {
        let py = self.py;
        let (VarKind::Object(dict), Some(dict_source)) =
            (self.kind(container), self.source(container))
        else {
            return Ok(None);
        };
        let dict = dict.bind(py).clone();
        if !plain_lookup(&dict)? {
            return Ok(None);
        }
        let Some((tensor, tensor_source)) = self.tensor_given(key) else {
            return Ok(None);
        };
        // Only a parameter's identity is guarded: it lives as long as its model, where a
        // tensor made for each call would compile again on every call.
        let parameter = self.h.torch.getattr("nn")?.getattr("Parameter")?;
        if !tensor.is_instance(&parameter)? {
            return Ok(None);
        }
        self.guards
            .add(tensor_source, GuardKind::Id(OwnedRef::from_bound(&tensor)));
        let dict = dict.cast_into().map_err(PyErr::from)?;
        Ok(Some((dict, dict_source, tensor)))
    }

    /// `d[key]` / `d.get(key)` of a tensor key in an existing dict (see
    /// `tensor_key_of_existing_dict`): the value read through the source `d[<tensor>]`, or
    /// `Missing` (guarded to stay missing). None for other containers and keys.
    pub(super) fn existing_dict_tensor_lookup(
        &mut self,
        container: VarId,
        key: VarId,
    ) -> CResult<Option<TensorKeyLookup>> {
        let Some((dict, dict_source, tensor)) = self.tensor_key_of_existing_dict(container, key)?
        else {
            return Ok(None);
        };
        match dict.get_item(&tensor)? {
            Some(value) => {
                let item_key = ItemKey::Object(ObjectKey {
                    value: OwnedRef::from_bound(&tensor),
                    repr: format!("<tensor at {:#x}>", tensor.as_ptr() as usize),
                });
                let source = Rc::new(Source::Item(dict_source, item_key));
                Ok(Some(TensorKeyLookup::Found(
                    self.wrap(&value, Some(source))?,
                )))
            }
            None => {
                self.guards.add(
                    dict_source,
                    GuardKind::Contains(OwnedRef::from_bound(&tensor), false),
                );
                Ok(Some(TensorKeyLookup::Missing))
            }
        }
    }

    /// `key in d` of a tensor key in an existing dict: the answer, guarded. None for other
    /// containers and keys.
    pub(super) fn existing_dict_has_tensor(
        &mut self,
        container: VarId,
        key: VarId,
    ) -> CResult<Option<bool>> {
        let Some((dict, dict_source, tensor)) = self.tensor_key_of_existing_dict(container, key)?
        else {
            return Ok(None);
        };
        let found = dict.contains(&tensor)?;
        self.guards.add(
            dict_source,
            GuardKind::Contains(OwnedRef::from_bound(&tensor), found),
        );
        Ok(Some(found))
    }
}

/// Whether `dict`'s class looks keys up as `dict` does: `dict`, `OrderedDict`,
/// `defaultdict` (its `__missing__` only runs for `d[k]` of a missing key, which the caller
/// does not trace).
fn plain_lookup(dict: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = dict.py();
    if !dict.is_instance_of::<pyo3::types::PyDict>() {
        return Ok(false);
    }
    let class = dict.get_type();
    let collections = py.import("collections")?;
    Ok(class.is(py.get_type::<pyo3::types::PyDict>())
        || class.is(&collections.getattr("OrderedDict")?)
        || class.is(&collections.getattr("defaultdict")?))
}

/// Whether `value` is a dict looked up as `dict` does (see `plain_lookup`) with a parameter
/// among its keys.
pub(super) fn keyed_by_parameters(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !plain_lookup(value)? {
        return Ok(false);
    }
    let tensor = value
        .py()
        .import("torch")?
        .getattr("nn")?
        .getattr("Parameter")?;
    for key in value.try_iter()? {
        if key?.is_instance(&tensor)? {
            return Ok(true);
        }
    }
    Ok(false)
}
