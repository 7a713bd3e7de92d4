//! Values a graph break hands to a resume function that are made anew on every call, wrapped
//! by what they are rather than by their identity (which never holds twice): bound methods
//! of Python functions, of tensors and builtin containers, of constants
//! (`"loss {}".format`), and the iterators the generated code makes again
//! (`_polyfills.ResumeIterator`). Each returns None for a value that is none of these.

use std::rc::Rc;

use pyo3::prelude::*;

use super::guards::GuardKind;
use super::source::Source;
use super::translator::{CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// A Python function bound to an object, read from `source` (the `__exit__` of a context
    /// manager a graph break handed to a resume function, a callback passed in): the function
    /// with its receiver, each from its own source. Binding makes a new method object each
    /// time, so identity would never hold; the function is guarded by identity instead, and
    /// the receiver as any value.
    pub(super) fn wrap_bound_method(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &Rc<Source>,
    ) -> CResult<Option<VarId>> {
        if !value.get_type().is(&self.h.method_type) {
            return Ok(None);
        }
        let func = value.getattr("__func__")?;
        if !func.is_instance_of::<pyo3::types::PyFunction>() {
            return Ok(None);
        }
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(&self.h.method_type)),
        );
        let func_source = Rc::new(Source::Attr(source.clone(), "__func__".into()));
        // The same function object can get other code (`fn.__code__ = other.__code__`), and
        // calling the method inlines the code it has now (see `call_python_from`).
        let code = func.getattr("__code__")?;
        self.guards.add(
            Rc::new(Source::Attr(func_source.clone(), "__code__".into())),
            GuardKind::Id(OwnedRef::from_bound(&code)),
        );
        self.guards
            .add(func_source, GuardKind::Id(OwnedRef::from_bound(&func)));
        let receiver_source = Rc::new(Source::Attr(source.clone(), "__self__".into()));
        let receiver = self.wrap(&value.getattr("__self__")?, Some(receiver_source))?;
        let name: String = func.getattr("__name__")?.extract()?;
        Ok(Some(self.method(
            receiver,
            &name,
            Some(OwnedRef::from_bound(&func)),
        )))
    }

    /// A builtin method of a constant read from `source` (`"loss {}".format` handed on at a
    /// break inside its arguments: `.item()`): a new object on every call, the same method
    /// of the same constant — guarded by both, never by identity.
    pub(super) fn wrap_constant_method(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &Rc<Source>,
    ) -> CResult<Option<VarId>> {
        let Some((receiver, name)) = super::rebuild::constant_bound_method(self, value)? else {
            return Ok(None);
        };
        let attr = |n: &str| Rc::new(Source::Attr(source.clone(), n.to_string()));
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(value.get_type().as_any())),
        );
        self.guards.add(
            attr("__self__"),
            GuardKind::Equals(OwnedRef::from_bound(&receiver)),
        );
        let name = pyo3::types::PyString::new(self.py, &name);
        self.guards.add(
            attr("__name__"),
            GuardKind::Equals(OwnedRef::from_bound(name.as_any())),
        );
        Ok(Some(self.add(
            VarKind::Object(OwnedRef::from_bound(value)),
            Some(source.clone()),
        )))
    }

    /// An iterator a graph break handed on (`_polyfills.ResumeIterator`, made by the code
    /// before the break from the items it had left): an iterator over its items, each read
    /// through `it.items[k]`. Its position is guarded (it starts where the break left it). How
    /// far the trace takes it is not written back: the object is the resume function's alone
    /// (made for the call, rebuilt anew at a later break).
    pub(super) fn wrap_resume_iterator(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &Rc<Source>,
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let class = py
            .import_module("dynamo_rs._polyfills")?
            .getattr("ResumeIterator")?;
        if !value.get_type().is(&class) {
            return Ok(None);
        }
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(&class)),
        );
        let position = value.getattr("pos")?;
        self.guards.add(
            Rc::new(Source::Attr(source.clone(), "pos".into())),
            GuardKind::Equals(OwnedRef::from_bound(&position)),
        );
        let items_source = Rc::new(Source::Attr(source.clone(), "items".into()));
        let items = self.wrap(&value.getattr("items")?, Some(items_source))?;
        let VarKind::Tuple(items) = self.kind(items) else {
            return Ok(None);
        };
        let start: usize = position.extract()?;
        let remaining = items.get(start..).unwrap_or_default().to_vec();
        Ok(Some(self.add(
            VarKind::Iter {
                items: remaining,
                next: 0,
                watched: Vec::new(),
                handed_on: false,
                exhausted: false,
            },
            None,
        )))
    }

    /// A tensor's or a builtin container's bound method read from `source` (`y.add`,
    /// `outs.append`, handed to a resume function when a graph break fell inside the call's
    /// arguments): the method of the receiver's tracker (a tensor becomes a graph input like
    /// any tensor). Guarded by the method's type and name, not identity (each call binds a
    /// new method object).
    pub(super) fn wrap_tensor_method(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &Rc<Source>,
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let builtin_method = value.get_type().into_any();
        let Some(receiver) = super::helpers::builtin_method_receiver(value)? else {
            return Ok(None);
        };
        let container = [
            &self.h.list_type,
            &self.h.dict_type,
            &py.get_type::<pyo3::types::PySet>().into_any(),
            &py.import_module("collections")?.getattr("deque")?,
            &py.import_module("collections")?.getattr("OrderedDict")?,
        ]
        .into_iter()
        .any(|t| receiver.get_type().is(t));
        if !container && !receiver.is_instance(&self.h.tensor_type)? {
            return Ok(None);
        }
        let name = value.getattr("__name__")?;
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(&builtin_method)),
        );
        self.guards.add(
            Rc::new(Source::Attr(source.clone(), "__name__".into())),
            GuardKind::Equals(OwnedRef::from_bound(&name)),
        );
        let receiver_source = Rc::new(Source::Attr(source.clone(), "__self__".into()));
        let receiver = self.wrap(&receiver, Some(receiver_source))?;
        Ok(Some(self.method(
            receiver,
            &name.extract::<String>()?,
            None,
        )))
    }
}
