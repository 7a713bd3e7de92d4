//! `copy.deepcopy` of values with no tensors inside, and the private objects copies (and
//! modules made in `forward`, see `ops_module_new`) are.
//!
//! The copy is made while tracing (it is what the frame would make) and is *private*: no
//! code but the trace can reach it, so attribute stores on it are made at once instead of
//! being replayed, and it may not leave the trace (handing it back is refused like any
//! object made while tracing). What the copy was made from is guarded: constants and
//! containers by their own guards, an existing object by its type and a snapshot of its
//! `__dict__` (transformers' `get_text_config` deep-copies the model config this way).

use std::rc::Rc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::break_reasons::BreakKind;
use super::guards::GuardKind;
use super::source::Source;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// `copy.copy(value)` when `obj` is `copy.copy` and `value` a plain list, dict or set
    /// (its own `copy()`: a new container holding the same items) or a tuple or constant
    /// (itself, as `copy.copy` returns them); None otherwise (other objects: `copy.copy` is
    /// inlined).
    pub(super) fn shallow_copy_call(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let copy = py.import_module("copy")?.getattr("copy")?;
        if !obj.is(&copy) || args.len() != 1 || !kwargs.is_empty() {
            return Ok(None);
        }
        let value = args[0];
        let itself = match self.kind(value) {
            VarKind::List(_) => false,
            VarKind::Dict(_) if !self.dict_classes.contains_key(&value) => false,
            VarKind::Object(o) if o.bind(py).is_exact_instance_of::<pyo3::types::PySet>() => false,
            VarKind::Tuple(_)
                if !self.tuple_classes.contains_key(&value)
                    && !self.tuple_fields.contains_key(&value) =>
            {
                true
            }
            VarKind::Const(c) if self.h.is_constant(&c.bind(py).clone())? => true,
            _ => return Ok(None),
        };
        if itself {
            return Ok(Some(value));
        }
        let method = self.get_attr(value, "copy")?;
        self.call_function(method, Vec::new(), Vec::new()).map(Some)
    }

    /// `copy.deepcopy(value)` when `obj` is `copy.deepcopy`, or None.
    pub(super) fn deepcopy_call(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let deepcopy = self.py.import_module("copy")?.getattr("deepcopy")?;
        if !obj.is(&deepcopy) || args.len() != 1 || !kwargs.is_empty() {
            return Ok(None);
        }
        let value = args[0];
        if self.contains_tensor(value) {
            return unsupported(
                BreakKind::UnsupportedCall,
                "copy.deepcopy of a value holding tensors",
            );
        }
        self.guard_copied(value)?;
        let original = self.python_value(value)?;
        let copy = match deepcopy.call1((&original,)) {
            Ok(copy) => copy,
            Err(err) => {
                return unsupported(
                    BreakKind::ExceptionWhileTracing,
                    format!("copy.deepcopy raised {err}"),
                )
            }
        };
        if self.h.is_constant(&copy)?
            || copy.is_exact_instance_of::<PyList>()
            || copy.is_exact_instance_of::<PyTuple>()
            || copy.is_exact_instance_of::<PyDict>()
        {
            // Containers become trackers made in the trace, like any built here.
            return self.wrap(&copy, None).map(Some);
        }
        if copy.is(&original) {
            // deepcopy hands back what it does not copy (functions, classes, modules).
            return Ok(Some(value));
        }
        Ok(Some(self.private_object(&copy)))
    }

    /// A tracker for an object only the trace can reach (see the module doc).
    pub fn private_object(&mut self, object: &Bound<'py, PyAny>) -> VarId {
        let object = OwnedRef::from_bound(object);
        self.private_objects
            .insert(object.as_ptr() as usize, object.clone());
        self.add(VarKind::Object(object), None)
    }

    /// Whether `id` is a private object (see the module doc).
    pub fn is_private(&self, id: VarId) -> bool {
        match self.kind(id) {
            VarKind::Object(v) => self.private_objects.contains_key(&(v.as_ptr() as usize)),
            _ => false,
        }
    }

    /// Lists and dicts read from a private object are its own: trackers of them may not be
    /// changed (the object would not see the change; see `may_change_container`).
    pub fn mark_private_containers(&mut self, id: VarId) {
        // Which trackers are containers does not depend on any item's value.
        let inner: Vec<VarId> = match self.kind_unobserved(id) {
            VarKind::List(items) | VarKind::Tuple(items) => items.clone(),
            VarKind::Dict(entries) => entries.iter().map(|(_, v)| *v).collect(),
            _ => return,
        };
        self.private_containers.insert(id);
        for item in inner {
            self.mark_private_containers(item);
        }
    }

    /// Guards what a deep copy of `id` reads, or refuses a value whose contents cannot be
    /// guarded cheaply.
    fn guard_copied(&mut self, id: VarId) -> CResult<()> {
        let py = self.py;
        match self.kind(id) {
            VarKind::Const(_) => Ok(()),
            VarKind::Tuple(items) | VarKind::List(items) => {
                for item in items.clone() {
                    self.guard_copied(item)?;
                }
                Ok(())
            }
            VarKind::Dict(entries) => {
                for (_, item) in entries.clone() {
                    self.guard_copied(item)?;
                }
                Ok(())
            }
            VarKind::Object(_) if self.is_private(id) => Ok(()),
            VarKind::Object(v) => {
                let v = v.bind(py).clone();
                let Some(source) = self.source(id) else {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        "copy.deepcopy of an object the trace cannot guard",
                    );
                };
                let Some(snapshot) = self.plain_state_snapshot(&v)? else {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!(
                            "copy.deepcopy of {} (its copy depends on more than a __dict__ \
                             of constants)",
                            super::ops_call::describe(&v)
                        ),
                    );
                };
                self.guards.add(
                    source.clone(),
                    GuardKind::Type(OwnedRef::from_bound(v.get_type().as_any())),
                );
                self.guards.add(
                    Rc::new(Source::Attr(source, "__dict__".into())),
                    GuardKind::Equals(OwnedRef::from_bound(&snapshot)),
                );
                Ok(())
            }
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::DictView { .. }
            | VarKind::Null
            | VarKind::Method { .. }
            | VarKind::Iter { .. }
            | VarKind::Generator { .. }
            | VarKind::Lazy(_)
            | VarKind::Function(_)
            | VarKind::Partial { .. }
            | VarKind::CellRef(_)
            | VarKind::Super { .. }
            | VarKind::Instance { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)) => unsupported(
                BreakKind::UnsupportedCall,
                format!("copy.deepcopy of {}", super::translator::kind_name(other)),
            ),
        }
    }

    /// A copy of `obj.__dict__` when a deep copy of `obj` is decided by its type and that
    /// dict alone, and the dict holds only constants (and lists, tuples, dicts of them),
    /// which `==` compares by value; else None.
    fn plain_state_snapshot(&self, obj: &Bound<'py, PyAny>) -> CResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        let object = py.import_module("builtins")?.getattr("object")?;
        let ty = obj.get_type();
        for hook in ["__reduce_ex__", "__reduce__", "__getstate__"] {
            if !ty.getattr(hook)?.is(&object.getattr(hook)?) {
                return Ok(None);
            }
        }
        for hook in ["__deepcopy__", "__setstate__", "__slots__"] {
            if ty.hasattr(hook)? {
                return Ok(None);
            }
        }
        let Ok(state) = obj.getattr("__dict__") else {
            return Ok(None);
        };
        if !state.is_exact_instance_of::<PyDict>() || !self.plain_data(&state)? {
            return Ok(None);
        }
        Ok(Some(
            py.import_module("copy")?
                .getattr("deepcopy")?
                .call1((state,))?,
        ))
    }

    /// Constants, and exact lists, tuples and dicts of them.
    fn plain_data(&self, value: &Bound<'py, PyAny>) -> CResult<bool> {
        if self.h.is_constant(value)? {
            return Ok(true);
        }
        if let Ok(dict) = value.cast_exact::<PyDict>() {
            for (k, v) in dict.iter() {
                if !self.plain_data(&k)? || !self.plain_data(&v)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        if value.is_exact_instance_of::<PyList>() || value.is_exact_instance_of::<PyTuple>() {
            for item in value.try_iter()? {
                if !self.plain_data(&item?)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// `obj.name = value` (or `del obj.name`) on a private object: made now.
    pub(super) fn store_private_attr(
        &mut self,
        obj: VarId,
        name: &str,
        value: Option<VarId>,
    ) -> CResult<()> {
        let Some(real) = self.real_unpinned(obj) else {
            return unsupported(
                BreakKind::Internal,
                "internal: a private object without one",
            );
        };
        // Made again after the graph, the module would not have this change.
        self.private_recipes.remove(&(real.as_ptr() as usize));
        let result = match value {
            Some(v) => {
                if self.contains_tensor(v) {
                    return unsupported(
                        BreakKind::UnreplayableSideEffect,
                        format!("storing a tensor into .{name} of an object copied while tracing"),
                    );
                }
                let v = self.python_value(v)?;
                real.setattr(name, v)
            }
            None => real.delattr(name),
        };
        match result {
            Ok(()) => Ok(()),
            Err(err) => unsupported(
                BreakKind::ExceptionWhileTracing,
                format!("setting .{name} raised {err}"),
            ),
        }
    }
}
