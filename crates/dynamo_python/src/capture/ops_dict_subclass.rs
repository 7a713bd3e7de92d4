//! Instances of user subclasses of `dict` and `OrderedDict` made in the trace
//! (`Registry(gelu=F.gelu)`, `AttrDict(scale=2.0)`, a config class with helper methods).
//!
//! Such an instance is a traced dict (`VarKind::Dict`, its class in `Tracer::dict_classes`,
//! as an `OrderedDict` is): the dict operations the translator models run on its entries, and
//! what the class adds in Python is inlined on the tracker — its methods, a Python
//! `__getitem__` (`super().__getitem__(key)` reaching the dict's own lookup), a `__getattr__`
//! and `__setattr__` (Python, or `dict.__getitem__`/`get`/`__setitem__` assigned to them, the
//! attribute-dict idiom). Returned or live at a graph break it is made again as
//! `cls(entries)`.
//!
//! Admitted classes keep the dict's construction (no `__new__`/`__init__` of their own, so
//! `cls(entries)` makes the same object) and do not override, in Python, anything the
//! translator models natively for dicts (item stores, iteration, `in`, `len`, `keys()`,
//! `get`, `__missing__`, ...): those run as `dict`'s would. Other classes are not admitted
//! and their construction stays a graph break.

use pyo3::prelude::*;
use pyo3::types::PyType;

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// What the translator models natively on dicts: a class overriding one of these in Python
/// is not admitted (see the module docs). `__getitem__` is not here: it is inlined.
const NATIVE_DICT_PROTOCOL: &[&str] = &[
    "__new__",
    "__init__",
    "__setitem__",
    "__delitem__",
    "__contains__",
    "__iter__",
    "__reversed__",
    "__len__",
    "__missing__",
    "__eq__",
    "__ne__",
    "__or__",
    "__ror__",
    "__ior__",
    "__bool__",
    "__class_getitem__",
    "__getattribute__",
    "__delattr__",
    "__copy__",
    "__deepcopy__",
    "__reduce__",
    "__reduce_ex__",
    "keys",
    "values",
    "items",
    "get",
    "pop",
    "popitem",
    "setdefault",
    "update",
    "clear",
    "copy",
    "fromkeys",
    "move_to_end",
];

impl<'py> Tracer<'py> {
    /// `cls(...)` for an admitted dict subclass: a traced dict of that class; None for other
    /// classes.
    pub(super) fn construct_dict_subclass(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let Ok(ty) = cls.cast::<PyType>() else {
            return Ok(None);
        };
        if ty.is(&self.h.dict_type)
            || ty.is(&self.h.ordered_dict_type)
            || !ty.is_subclass(&self.h.dict_type)?
            || !self.admitted_dict_subclass(ty)?
        {
            return Ok(None);
        }
        self.construct_dict(cls, args, kwargs)
    }

    /// Whether instances of `ty` can be traced dicts (see the module docs).
    fn admitted_dict_subclass(&self, ty: &Bound<'py, PyType>) -> PyResult<bool> {
        let builtin_bases = [self.h.dict_type.clone(), self.h.ordered_dict_type.clone()];
        python_layers_leave_alone(ty, &builtin_bases, NATIVE_DICT_PROTOCOL)
    }

    /// The user class of a traced dict, when it has one (see the module docs).
    pub fn user_dict_class(&self, id: VarId) -> Option<Bound<'py, PyAny>> {
        if !matches!(self.kind(id), VarKind::Dict(_)) {
            return None;
        }
        let cls = self.dict_classes.get(&id)?.bind(self.py).clone();
        (!cls.is(&self.h.ordered_dict_type) && !self.dict_defaults.contains_key(&id)).then_some(cls)
    }

    /// `d.name` on a traced dict of a user class: what the class defines in Python (a
    /// method, bound to the tracker; a class constant), then the dict's own methods (None:
    /// the caller's), then the class's `__getattr__`.
    pub(super) fn dict_subclass_attr(&mut self, id: VarId, name: &str) -> CResult<Option<VarId>> {
        let py = self.py;
        let Some(cls) = self.user_dict_class(id) else {
            return Ok(None);
        };
        let key = pyo3::types::PyString::intern(py, name);
        if let Some(found) = self.python_class_entry(&cls, name)? {
            self.guard_class(&cls, name)?;
            if found.is_instance(&self.h.function_type)? {
                return Ok(Some(self.method(
                    id,
                    name,
                    Some(OwnedRef::from_bound(&found)),
                )));
            }
            if self.h.is_constant(&found)? {
                return Ok(Some(self.constant(&found)));
            }
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!(
                    "reading .{name} of a {} made in the trace (a class attribute that is not \
                     a method or a constant)",
                    super::ops_call::describe(&cls)
                ),
            );
        }
        if super::guard_values::class_lookup(&cls, &key).is_some() {
            return Ok(None); // dict's own method
        }
        let Ok(getattr) = cls.getattr("__getattr__") else {
            let message = format!(
                "'{}' object has no attribute '{name}'",
                cls.getattr("__name__")?
            );
            let message = pyo3::types::PyString::new(py, &message).into_any();
            return self.raise_builtin("AttributeError", message);
        };
        self.guard_class(&cls, "__getattr__")?;
        let name_var = self.constant(key.as_any());
        if getattr.is_instance(&self.h.function_type)? {
            let result = self.call_python(&getattr, vec![id, name_var], Vec::new())?;
            return Ok(Some(result));
        }
        let dict = &self.h.dict_type;
        if getattr.is(&dict.getattr("__getitem__")?) {
            return self.subscript(id, name_var).map(Some);
        }
        if getattr.is(&dict.getattr("get")?) {
            let get = self.method(id, "get", None);
            return self
                .call_function(get, vec![name_var], Vec::new())
                .map(Some);
        }
        unsupported(
            BreakKind::UnsupportedOperation,
            format!(
                "reading .{name} of a {} made in the trace (its __getattr__ is not Python)",
                super::ops_call::describe(&cls)
            ),
        )
    }

    /// `d.name = value` on a traced dict of a user class: through a Python `__setattr__`,
    /// or an item store when `dict.__setitem__` is its `__setattr__`; refused otherwise (an
    /// attribute of the instance would not be made again with it). False for other trackers.
    pub(super) fn dict_subclass_setattr(
        &mut self,
        id: VarId,
        name: &str,
        value: Option<VarId>,
    ) -> CResult<bool> {
        let py = self.py;
        let Some(cls) = self.user_dict_class(id) else {
            return Ok(false);
        };
        let Some(value) = value else {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("deleting .{name} of a {}", super::ops_call::describe(&cls)),
            );
        };
        let setattr = cls.getattr("__setattr__")?;
        self.guard_class(&cls, "__setattr__")?;
        let name_var = self.constant(pyo3::types::PyString::new(py, name).as_any());
        if setattr.is_instance(&self.h.function_type)? {
            self.call_python(&setattr, vec![id, name_var, value], Vec::new())?;
            return Ok(true);
        }
        if setattr.is(&self.h.dict_type.getattr("__setitem__")?) {
            self.store_item(id, name_var, value)?;
            return Ok(true);
        }
        unsupported(
            BreakKind::UnreplayableSideEffect,
            format!(
                "setting .{name} of a {} made in the trace (an instance attribute of a dict \
                 subclass)",
                super::ops_call::describe(&cls)
            ),
        )
    }

    /// `super().name` inside a method of a traced dict's or list's class: the next Python
    /// definition along the MRO after `start`, else the dict's (list's) own method. None for
    /// other receivers.
    pub(super) fn dict_subclass_super_attr(
        &mut self,
        receiver: VarId,
        start: &Bound<'py, PyAny>,
        name: &str,
    ) -> CResult<Option<VarId>> {
        let Some(cls) = self
            .user_dict_class(receiver)
            .or_else(|| self.user_list_class(receiver))
        else {
            return Ok(None);
        };
        self.guard_class(&cls, name)?;
        let mut after = false;
        for klass in cls.getattr("__mro__")?.try_iter()? {
            let klass = klass?;
            if !after {
                after = klass.is(start);
                continue;
            }
            let Ok(found) = klass.getattr("__dict__")?.get_item(name) else {
                continue;
            };
            if found.is_instance(&self.h.function_type)? {
                return Ok(Some(self.method(
                    receiver,
                    name,
                    Some(OwnedRef::from_bound(&found)),
                )));
            }
            if klass.is(&self.h.dict_type)
                || klass.is(&self.h.ordered_dict_type)
                || klass.is(&self.h.list_type)
            {
                return Ok(Some(self.method(receiver, name, None)));
            }
            break;
        }
        unsupported(
            BreakKind::SuperCall,
            format!("super().{name} of a dict or list subclass made in the trace"),
        )
    }

    /// The entry `name` of the first Python class along `cls`'s MRO that defines it, when
    /// no builtin base comes first.
    pub(super) fn python_class_entry(
        &self,
        cls: &Bound<'py, PyAny>,
        name: &str,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        const HEAP_TYPE: u64 = 1 << 9;
        for klass in cls.getattr("__mro__")?.try_iter()? {
            let klass = klass?;
            let flags: u64 = klass.getattr("__flags__")?.extract()?;
            if flags & HEAP_TYPE == 0 {
                return Ok(None);
            }
            if let Ok(found) = klass.getattr("__dict__")?.get_item(name) {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// The class a copy (`d.copy()`, `d | other`) of traced dict `id` has: `OrderedDict`'s
    /// (and `defaultdict`'s) make their own class, `dict`'s a plain dict, for subclasses too.
    pub(super) fn class_kept_by_copy(&self, id: VarId) -> PyResult<Option<OwnedRef>> {
        let Some(cls) = self.dict_classes.get(&id) else {
            return Ok(None);
        };
        let keeps = self.dict_defaults.contains_key(&id)
            || cls
                .bind(self.py)
                .cast::<PyType>()
                .map_or(Ok(false), |t| t.is_subclass(&self.h.ordered_dict_type))?;
        Ok(keeps.then(|| cls.clone()))
    }

    /// `getattr(d, name[, default])` and `hasattr(d, name)` on a traced dict of a user
    /// class: the attribute read as `d.name` reads it (inlining the class's `__getattr__`),
    /// an `AttributeError` raised there answered as the builtins do. None for other values.
    pub(super) fn dict_subclass_getattr_builtin(
        &mut self,
        has: bool,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        if self.user_dict_class(args[0]).is_none() {
            return Ok(None);
        }
        let name: String = self.python_value(args[1])?.extract()?;
        if !has && args.len() < 3 {
            return self.get_attr(args[0], &name).map(Some);
        }
        let locations = self.location_stack.len();
        let read = self.get_attr(args[0], &name);
        let true_ = pyo3::types::PyBool::new(py, true);
        let false_ = pyo3::types::PyBool::new(py, false);
        Ok(Some(
            match self.catch_builtin(read, "AttributeError", locations)? {
                Some(_) if has => self.constant(true_.as_any()),
                Some(value) => value,
                None if has => self.constant(false_.as_any()),
                None => args[2],
            },
        ))
    }
}

/// Whether `ty` (of metaclass `type`) adds to `builtin_bases` (and `object`, `typing.Generic`)
/// only Python classes that keep instances without `__slots__` and define none of `native`
/// — what the translator runs natively on the builtin container: a class overriding one of
/// those in Python behaves otherwise. Another builtin base (`defaultdict`, `Counter`'s C
/// parts) is refused too.
pub(super) fn python_layers_leave_alone<'py>(
    ty: &Bound<'py, PyType>,
    builtin_bases: &[Bound<'py, PyAny>],
    native: &[&str],
) -> PyResult<bool> {
    let py = ty.py();
    const HEAP_TYPE: u64 = 1 << 9;
    if !ty.get_type().is(py.get_type::<PyType>()) {
        return Ok(false);
    }
    let object = py.import_module("builtins")?.getattr("object")?;
    let typing_generic = py.import_module("typing")?.getattr("Generic")?;
    for klass in ty.getattr("__mro__")?.try_iter()? {
        let klass = klass?;
        if klass.is(&object)
            || klass.is(&typing_generic)
            || builtin_bases.iter().any(|b| b.is(&klass))
        {
            continue;
        }
        let flags: u64 = klass.getattr("__flags__")?.extract()?;
        if flags & HEAP_TYPE == 0 {
            return Ok(false);
        }
        let own = klass.getattr("__dict__")?;
        if own.contains("__slots__")? {
            return Ok(false);
        }
        for name in native {
            if own.contains(*name)? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}
