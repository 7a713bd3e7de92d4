//! Instances of user subclasses of `list` (`LogitsProcessorList`, a processor list with a
//! `__call__`, a list with helper methods), made in the trace or given to the frame.
//!
//! Such an instance is a traced list (`VarKind::List`, its class in `Tracer::list_classes`):
//! the list operations the translator models run on its items, and what the class adds in
//! Python is inlined on the tracker — its methods (an override of a list method such as
//! `clear` included: it is found on the class first, as Python finds it), `__call__`, class
//! constants; `super().append(x)` reaches the list's own. One given to the frame is read like
//! a plain list (its type and length guarded, each item from its index, an empty instance
//! `__dict__`), and what the trace changes is replayed into the object itself. Returned or
//! live at a graph break, one made in the trace is made again as `cls(items)`.
//!
//! Admitted classes keep the list's construction (no `__new__`/`__init__` of their own, so
//! `cls(items)` makes the same object), keep no attributes of their own (no `__slots__`, no
//! `__getattr__`/`__setattr__`), and do not override, in Python, a protocol the translator
//! runs natively on lists (indexing, iteration, `len`, `in`, `==`, `+`, `*`, ...). Other
//! classes stay objects.

use pyo3::prelude::*;
use pyo3::types::PyType;

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// What the translator runs natively on lists: a class overriding one of these in Python is
/// not admitted (see the module docs). Named methods (`append`, `clear`, ...) may be
/// overridden: a call finds the class's own first.
const NATIVE_LIST_PROTOCOL: &[&str] = &[
    "__new__",
    "__init__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__contains__",
    "__iter__",
    "__reversed__",
    "__len__",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__add__",
    "__radd__",
    "__iadd__",
    "__mul__",
    "__rmul__",
    "__imul__",
    "__bool__",
    "__hash__",
    "__getattribute__",
    "__getattr__",
    "__setattr__",
    "__delattr__",
    "__copy__",
    "__deepcopy__",
    "__reduce__",
    "__reduce_ex__",
];

impl<'py> Tracer<'py> {
    /// Whether instances of `ty`, a strict subclass of `list`, can be traced lists (see the
    /// module docs).
    pub fn admitted_list_subclass(&self, ty: &Bound<'py, PyType>) -> PyResult<bool> {
        if ty.is(&self.h.list_type) || !ty.is_subclass(&self.h.list_type)? {
            return Ok(false);
        }
        let builtin_bases = [self.h.list_type.clone()];
        super::ops_dict_subclass::python_layers_leave_alone(
            ty,
            &builtin_bases,
            NATIVE_LIST_PROTOCOL,
        )
    }

    /// `cls()` / `cls(iterable)` for an admitted list subclass: a traced list of that class
    /// holding the iterable's items; None for other classes and calls.
    pub(super) fn construct_list_subclass(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let Ok(ty) = cls.cast::<PyType>() else {
            return Ok(None);
        };
        if !kwargs.is_empty() || args.len() > 1 || !self.admitted_list_subclass(ty)? {
            return Ok(None);
        }
        let items = match args.first() {
            Some(&iterable) => self.items_of(iterable)?,
            None => Vec::new(),
        };
        let id = self.add(VarKind::List(items), None);
        self.list_classes.insert(id, OwnedRef::from_bound(cls));
        Ok(Some(id))
    }

    /// The user class of a traced list, when it has one (see the module docs).
    pub fn user_list_class(&self, id: VarId) -> Option<Bound<'py, PyAny>> {
        if !matches!(self.kind(id), VarKind::List(_)) {
            return None;
        }
        Some(self.list_classes.get(&id)?.bind(self.py).clone())
    }

    /// `l.name` on a traced list of a user class: what the class defines in Python (a
    /// method, bound to the tracker; a class constant), then the list's own methods (None:
    /// the caller's); an `AttributeError` for anything else.
    pub(super) fn list_subclass_attr(&mut self, id: VarId, name: &str) -> CResult<Option<VarId>> {
        let py = self.py;
        let Some(cls) = self.user_list_class(id) else {
            return Ok(None);
        };
        if let Some(found) = self.python_class_entry(&cls, name)? {
            self.guard_class(&cls, name)?;
            if found.is_instance(&self.h.function_type)? {
                let method = OwnedRef::from_bound(&found);
                return Ok(Some(self.method(id, name, Some(method))));
            }
            if self.h.is_constant(&found)? {
                return Ok(Some(self.constant(&found)));
            }
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!(
                    "reading .{name} of a {} (a class attribute that is not a method or a \
                     constant)",
                    super::ops_call::describe(&cls)
                ),
            );
        }
        let key = pyo3::types::PyString::intern(py, name);
        if super::guard_values::class_lookup(&cls, &key).is_some() {
            return Ok(None); // list's own method
        }
        let message = format!(
            "'{}' object has no attribute '{name}'",
            cls.getattr("__name__")?
        );
        let message = pyo3::types::PyString::new(py, &message).into_any();
        self.raise_builtin("AttributeError", message)
    }
}
