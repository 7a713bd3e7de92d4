//! Objects and their attributes: instances of user classes made inside the trace (their
//! attributes are trackers, their methods come from the class), attribute stores, and
//! attribute stores on objects that existed before the call, which the transformed code
//! replays after the graph (side effects).

use super::break_reasons::BreakKind;
use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

use std::rc::Rc;

use super::source::Source;
use super::translator::{kind_name, unsupported, CResult, Flow, FrameState, Mutation, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// `STORE_ATTR`: `TOS.name = TOS1`.
    pub(super) fn op_store_attr(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let name = f.names.get_item(i as usize)?.to_string();
        let obj = self.pop(f)?;
        let value = self.pop(f)?;
        self.set_attribute(obj, &name, Some(value))
            .map(|_| Flow::Continue)
    }

    /// `obj.name = value` (or `del obj.name` with None) as the statement or `setattr`
    /// does it: through the class's own `__setattr__`/`__delattr__` when a traced instance's
    /// class has one (a frozen dataclass's, which raises), else a plain store.
    pub(super) fn set_attribute(
        &mut self,
        obj: VarId,
        name: &str,
        value: Option<VarId>,
    ) -> CResult<()> {
        let py = self.py;
        if self.model_output_store(obj, name, value, false)? {
            return Ok(());
        }
        // A module's stand-in (see `ops_module_new`) records its stores as they are.
        if let Some(cls) = self
            .instance_class(obj)
            .filter(|_| !self.is_module_stand_in(obj).unwrap_or(false))
        {
            let slot = if value.is_some() {
                "__setattr__"
            } else {
                "__delattr__"
            };
            let own = cls.getattr(slot)?;
            if !own.is(&self.h.builtins.getattr("object")?.getattr(slot)?) {
                let name = self.constant(pyo3::types::PyString::new(py, name).as_any());
                let mut args = vec![obj, name];
                args.extend(value);
                self.call_python(&own, args, Vec::new())?;
                return Ok(());
            }
        }
        if self.dict_subclass_setattr(obj, name, value)? {
            return Ok(());
        }
        self.store_attr(obj, name, value)
    }

    /// `e.__traceback__ = tb` (and `__cause__`, `__context__`, `__suppress_context__`) on an
    /// exception the trace raised: the exception object exists only inside the trace, so
    /// the store is made on it directly (contextlib's `__exit__` restores the traceback of
    /// the exception a `with` block raised before passing it on).
    fn exception_state_store(
        &mut self,
        obj: VarId,
        name: &str,
        value: Option<VarId>,
    ) -> CResult<bool> {
        const STATE: [&str; 4] = [
            "__traceback__",
            "__cause__",
            "__context__",
            "__suppress_context__",
        ];
        let (Some(value), true) = (value, STATE.contains(&name)) else {
            return Ok(false);
        };
        let VarKind::Object(exception) = self.kind(obj) else {
            return Ok(false);
        };
        let exception = exception.bind(self.py).clone();
        let base = self.h.builtins.getattr("BaseException")?;
        if self.source(obj).is_some() || !exception.is_instance(&base)? {
            return Ok(false);
        }
        let value = self.python_value(value)?;
        exception.setattr(name, value)?;
        Ok(true)
    }

    pub(super) fn op_delete_attr(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let name = f.names.get_item(i as usize)?.to_string();
        let obj = self.pop(f)?;
        self.set_attribute(obj, &name, None)?;
        Ok(Flow::Continue)
    }

    /// A store to (or delete of) `name` that a data descriptor on the class takes, as
    /// `object.__setattr__` lets it: a property's setter or deleter, or a Python descriptor's
    /// `__set__`/`__delete__`, inlined (AttributeError without one); other data descriptors
    /// refused, `__slots__` members left to the plain store. False when no descriptor is
    /// involved.
    fn descriptor_store(&mut self, obj: VarId, name: &str, value: Option<VarId>) -> CResult<bool> {
        let py = self.py;
        let cls = match self.kind(obj) {
            VarKind::Instance { cls, .. } => cls.bind(py).clone(),
            VarKind::Object(o) => o.bind(py).get_type().into_any(),
            _ => return Ok(false),
        };
        let Ok(attr) = py
            .import_module("inspect")?
            .call_method1("getattr_static", (&cls, name))
        else {
            return Ok(false);
        };
        let types = py.import_module("types")?;
        if attr.is_instance(&types.getattr("MemberDescriptorType")?)? {
            return Ok(false);
        }
        if attr.is_instance(&self.h.builtins.getattr("property")?)? {
            self.guard_class(&cls, name)?;
            let accessor = attr.getattr(if value.is_some() { "fset" } else { "fdel" })?;
            if accessor.is_none() {
                let verb = if value.is_some() { "setter" } else { "deleter" };
                let message = format!(
                    "property '{name}' of '{}' object has no {verb}",
                    cls.getattr("__name__")?
                );
                return self.raise_builtin(
                    "AttributeError",
                    pyo3::types::PyString::new(py, &message).into_any(),
                );
            }
            let mut args = vec![obj];
            args.extend(value);
            self.call_python(&accessor, args, Vec::new())?;
            return Ok(true);
        }
        let attr_type = attr.get_type();
        // A data descriptor written in Python (a validating field, a `__set_name__` store
        // under another name): its `__set__`/`__delete__` inlined, on the descriptor read
        // from the class (guarded), as `object.__setattr__` calls it.
        let accessor = attr_type.getattr(if value.is_some() {
            "__set__"
        } else {
            "__delete__"
        });
        if let (Ok(accessor), Some(source)) = (accessor, class_entry_source(&cls, name)) {
            if accessor.is_instance_of::<pyo3::types::PyFunction>() {
                self.guard_class(&cls, name)?;
                let descriptor = self.wrap(&attr, Some(source))?;
                let mut args = vec![descriptor, obj];
                args.extend(value);
                self.call_python(&accessor, args, Vec::new())?;
                return Ok(true);
            }
        }
        if attr_type.hasattr("__set__")? || attr_type.hasattr("__delete__")? {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!("a store to {name}, which a data descriptor of the class handles"),
            );
        }
        Ok(false)
    }

    pub(super) fn store_attr(
        &mut self,
        obj: VarId,
        name: &str,
        value: Option<VarId>,
    ) -> CResult<()> {
        let py = self.py;
        if matches!(self.kind(obj), VarKind::Tensor { .. }) {
            match name {
                "grad" => return self.store_tensor_grad(obj, value),
                "data" => return self.store_tensor_data(obj, value),
                _ => {}
            }
        }
        if self.exception_state_store(obj, name, value)? {
            return Ok(());
        }
        if self.descriptor_store(obj, name, value)? {
            return Ok(());
        }
        if matches!(self.kind(obj), VarKind::Function(_)) {
            self.note_effect(Some(obj));
            return self.store_function_attr(obj, name, value);
        }
        if let VarKind::Instance { cls, .. } = self.kind(obj) {
            let cls = cls.bind(py).clone();
            if !slot_or_dict_attribute(&cls, name)? {
                let message = format!(
                    "'{}' object has no attribute '{name}'",
                    cls.getattr("__name__")?
                );
                return self
                    .raise_builtin("AttributeError", PyString::new(py, &message).into_any());
            }
        }
        self.note_effect(Some(obj));
        match &mut self.vars[obj.0 as usize].kind {
            VarKind::Instance {
                attrs,
                model_output: false,
                ..
            } => {
                // As in an instance `__dict__`: a name set again keeps its place (the order
                // is visible through `vars()`), a deleted one leaves it.
                let at = attrs.iter().position(|(n, _)| n == name);
                match (at, value) {
                    (Some(i), Some(v)) => attrs[i].1 = v,
                    (None, Some(v)) => attrs.push((name.to_string(), v)),
                    (Some(i), None) => {
                        attrs.remove(i);
                    }
                    (None, None) => {
                        return unsupported(
                            BreakKind::UnreplayableSideEffect,
                            format!("deleting .{name}, which the object does not have"),
                        )
                    }
                }
                if let Some(&dict) = self.instance_dicts.get(&obj) {
                    let key = OwnedRef::from_bound(PyString::new(py, name).as_any());
                    if value.is_none() {
                        self.note_dict_removal(dict);
                    }
                    if let VarKind::Dict(entries) = &mut self.vars[dict.0 as usize].kind {
                        match value {
                            Some(v) => super::vars::dict_set(py, entries, key, v),
                            None => {
                                entries.retain(|(k, _)| k.bind(py).ne(key.bind(py)).unwrap_or(true))
                            }
                        }
                    }
                }
                return Ok(());
            }
            VarKind::Instance { .. } => {
                return unsupported(
                    BreakKind::ModelOutput,
                    "setting an attribute of a ModelOutput",
                )
            }
            _ => {}
        }
        if self.is_private(obj) {
            return self.store_private_attr(obj, name, value);
        }
        let (Some(source), Some(real)) = (self.source(obj), self.real_unpinned(obj)) else {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!("setting .{name} of {}", kind_name(self.kind(obj))),
            );
        };
        // Only plain attribute stores can be replayed as they are.
        let object_setattr = py
            .import_module("builtins")?
            .getattr("object")?
            .getattr("__setattr__")?;
        if self.module_stored_back(&real, &source, name, value)? {
            return Ok(());
        }
        let plain_module_store = self.plain_module_store(&real, &source, name, value)?;
        if !plain_module_store
            && (!real.get_type().getattr("__setattr__")?.is(&object_setattr)
                || real.is_instance(&self.h.module_type)?)
        {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!(
                    "setting .{name} of {} (custom __setattr__)",
                    super::ops_call::describe(&real)
                ),
            );
        }
        if value.is_none() {
            // `del obj.name` raises unless the attribute is there: after an earlier store in
            // this trace, or in the object's own `__dict__` (guarded to stay there).
            let in_dict = match real.getattr("__dict__") {
                Ok(d) => d.contains(name)?,
                Err(_) => false,
            };
            let stored_before = match self.mutated_attr(&real, name) {
                Some(Some(_)) => true,
                Some(None) => {
                    return unsupported(
                        BreakKind::UnreplayableSideEffect,
                        format!("deleting .{name} twice"),
                    )
                }
                None => false,
            };
            if !in_dict && !stored_before {
                return unsupported(
                    BreakKind::UnreplayableSideEffect,
                    format!("deleting .{name}, which is not in the object's __dict__"),
                );
            }
            // Whether the object has the attribute when the transformed code runs decides
            // what replaying the delete must do: guard it by its `__dict__`.
            let dict_source = Rc::new(Source::Attr(source.clone(), "__dict__".into()));
            let key = OwnedRef::from_bound(&pyo3::types::PyString::intern(py, name).into_any());
            self.guards.add(
                dict_source,
                super::guards::GuardKind::Contains(key, in_dict),
            );
            if !in_dict {
                // Stored by this trace, then deleted: nothing to replay.
                let object = real.as_ptr();
                self.mutations
                    .retain(|m| !(m.object.as_ptr() == object && m.name == name));
                return Ok(());
            }
        }
        if let Some(v) = value {
            if !self.rebuildable(v) {
                return unsupported(
                    BreakKind::UnreplayableSideEffect,
                    format!(
                        "storing {} into .{name} of an existing object",
                        kind_name(self.kind(v))
                    ),
                );
            }
        }
        self.mutations.push(Mutation {
            source,
            object: OwnedRef::from_bound(&real),
            name: name.to_string(),
            value,
        });
        Ok(())
    }

    /// Whether `module.name = value` is what `object.__setattr__` would do: `nn.Module`'s own
    /// `__setattr__` only treats parameters, modules, and tensors under a buffer's name
    /// specially. So: a module whose class keeps `Module.__setattr__`, a value that is no
    /// parameter or module (a tensor the graph computed, a constant, a container), and a
    /// name that is none of its parameters, buffers or submodules (guarded to stay so).
    fn plain_module_store(
        &mut self,
        real: &Bound<'py, PyAny>,
        source: &Rc<super::source::Source>,
        name: &str,
        value: Option<VarId>,
    ) -> CResult<bool> {
        let py = self.py;
        if !real.is_instance(&self.h.module_type)? {
            return Ok(false);
        }
        let module_setattr = self.h.module_type.getattr("__setattr__")?;
        if !real.get_type().getattr("__setattr__")?.is(&module_setattr) {
            return Ok(false);
        }
        let Some(value) = value else {
            return Ok(false); // `Module.__delattr__` has its own rules
        };
        if self.buffer_store(real, source, name, value)? {
            return Ok(true);
        }
        let plain_value = match self.kind(value) {
            VarKind::Tensor { .. } => self.source(value).is_none(),
            VarKind::Const(_) | VarKind::Tuple(_) | VarKind::List(_) | VarKind::Dict(_) => true,
            VarKind::Object(o) => {
                let o = o.bind(py);
                !o.is_instance(&self.h.module_type)? && !o.is_instance(&self.h.tensor_type)?
            }
            _ => false,
        };
        if !plain_value {
            return Ok(false);
        }
        let dict = real.getattr("__dict__")?;
        for table in super::helpers::MODULE_TABLES {
            let Ok(entries) = dict.get_item(table) else {
                return Ok(false);
            };
            let key = pyo3::types::PyString::intern(py, name).into_any();
            if entries.contains(&key)? {
                return Ok(false);
            }
            self.guards.add(
                Rc::new(super::source::Source::Attr(source.clone(), table.into())),
                super::guards::GuardKind::Contains(OwnedRef::from_bound(&key), false),
            );
        }
        Ok(true)
    }

    /// The getter of `name` when it is a `property` with a Python `fget` on the class of
    /// `value`, found as Python would find it: the class keeps the default
    /// `__getattribute__` (a property is a data descriptor, so the instance dict does not
    /// hide it), or one that only renames names it does not rename (see
    /// `renaming_lookup`; the caller guards it with `guard_renaming_lookup`).
    pub(super) fn python_property_getter(
        &self,
        value: &Bound<'py, PyAny>,
        name: &str,
    ) -> CResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        let Some(entry) = self.ordinary_class_entry(value, name)? else {
            return Ok(None);
        };
        let property = py.import_module("builtins")?.getattr("property")?;
        if !entry.get_type().is(&property) {
            return Ok(None);
        }
        let fget = entry.getattr("fget")?;
        Ok(fget.is_instance(&self.h.function_type)?.then_some(fget))
    }

    /// What `name` finds along the MRO of `value`'s class, when attribute lookup on `value`
    /// is the ordinary one (see `ordinary_getattribute`, `renaming_lookup`); None otherwise.
    fn ordinary_class_entry(
        &self,
        value: &Bound<'py, PyAny>,
        name: &str,
    ) -> CResult<Option<Bound<'py, PyAny>>> {
        let ty = value.get_type();
        if !self.ordinary_getattribute(&ty)? && !self.renaming_lookup(value, name)? {
            return Ok(None);
        }
        let key = PyString::new(self.py, name);
        Ok(super::guard_values::class_lookup(ty.as_any(), &key))
    }

    /// Whether instances of `ty` look attributes up as `object` does — class descriptors,
    /// then the instance dict, then class data — through object's `__getattribute__`,
    /// `nn.Module`'s, or the slot of a builtin base that does the same (`dict`, `list`,
    /// `tuple`, `set`, `int`, `str`, `deque`, exceptions, ...): a subclass of `dict` with a
    /// property reads it like any class.
    fn ordinary_getattribute(&self, ty: &Bound<'py, PyType>) -> PyResult<bool> {
        let py = self.py;
        let getattribute = ty.getattr("__getattribute__")?;
        let builtins = py.import_module("builtins")?;
        if getattribute.is(&builtins.getattr("object")?.getattr("__getattribute__")?)
            || getattribute.is(&self.h.module_type.getattr("__getattribute__")?)
        {
            return Ok(true);
        }
        if getattribute.get_type().name()? != "wrapper_descriptor" {
            return Ok(false);
        }
        let owner = getattribute.getattr("__objclass__")?;
        let collections = py.import_module("collections")?;
        for generic in [
            "dict",
            "list",
            "tuple",
            "set",
            "frozenset",
            "int",
            "float",
            "str",
        ]
        .iter()
        .map(|n| builtins.getattr(*n))
        .chain(
            ["defaultdict", "deque"]
                .iter()
                .map(|n| collections.getattr(*n)),
        )
        .chain(std::iter::once(builtins.getattr("BaseException")))
        {
            if owner.is(&generic?) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The class entry `name` finds for `value` when it is a descriptor written in Python
    /// (a class defining `__get__`, not a property or function) that ordinary lookup runs:
    /// the class keeps object's `__getattribute__` (or only renames), and the descriptor is
    /// a data descriptor (`__set__`/`__delete__`: it wins over the instance dict) or the
    /// instance dict lacks `name`. With its `__get__` and whether it is a data descriptor.
    /// `functools.cached_property` is left out: its `__get__` takes a lock, which a trace
    /// does not enter, and stores its value in the instance once (then a plain read).
    #[allow(clippy::type_complexity)]
    pub(super) fn python_descriptor_entry(
        &self,
        value: &Bound<'py, PyAny>,
        name: &str,
    ) -> CResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>, bool)>> {
        let py = self.py;
        if value.is_instance_of::<PyType>() {
            return Ok(None);
        }
        let Some(entry) = self.ordinary_class_entry(value, name)? else {
            return Ok(None);
        };
        let Some(get) = python_descriptor_get(&entry)? else {
            return Ok(None);
        };
        let cached_property = py.import_module("functools")?.getattr("cached_property")?;
        if entry.is_instance(&cached_property)? {
            return Ok(None);
        }
        let entry_type = entry.get_type();
        let data = entry_type.hasattr("__set__")? || entry_type.hasattr("__delete__")?;
        if !data && Self::in_instance_dict(value, name) {
            return Ok(None);
        }
        Ok(Some((entry, get, data)))
    }

    /// Whether `getattr(value, name)` is object's own lookup although the class has its own
    /// `__getattribute__`: one that only renames through the class's `attribute_map`
    /// (`_capture.renamed_attributes`: transformers' configurations), `name` not renamed,
    /// and the instance holding no `attribute_map` or `_heterogeneity_spec` of its own
    /// (which those `__getattribute__`s read).
    fn renaming_lookup(&self, value: &Bound<'py, PyAny>, name: &str) -> CResult<bool> {
        let renames = self
            .py
            .import_module("dynamo_rs._capture")?
            .call_method1("renamed_attributes", (value.get_type(),))?;
        let Ok(renames) = renames.cast::<pyo3::types::PyDict>() else {
            return Ok(false);
        };
        if renames.contains(name)? {
            return Ok(false);
        }
        let Some(dict) = super::guard_values::instance_dict_of(value) else {
            return Ok(false);
        };
        Ok(!dict.contains("attribute_map")? && !dict.contains("_heterogeneity_spec")?)
    }

    /// Guards what `renaming_lookup` relied on, when the class of `value` has its own
    /// `__getattribute__`: each class's `__getattribute__` along the MRO (the renaming ones
    /// call each other through `super()`), `name` still not in the class's `attribute_map`,
    /// and (for an object with a source) no `attribute_map` or `_heterogeneity_spec` in its
    /// instance dict.
    pub(super) fn guard_renaming_lookup(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: Option<Rc<Source>>,
        name: &str,
    ) -> CResult<()> {
        let py = self.py;
        let ty = value.get_type();
        if self.ordinary_getattribute(&ty)? {
            return Ok(());
        }
        for klass in ty.mro().iter() {
            let own = klass.getattr("__dict__")?;
            if own.contains("__getattribute__")? && !klass.is(py.get_type::<PyAny>().as_any()) {
                self.guard_class(&klass, "__getattribute__")?;
            }
        }
        self.guards.add(
            Rc::new(Source::Attr(class_source(&ty), "attribute_map".into())),
            super::guards::GuardKind::Contains(
                OwnedRef::from_bound(pyo3::types::PyString::intern(py, name).as_any()),
                false,
            ),
        );
        for own in ["attribute_map", "_heterogeneity_spec"] {
            self.guard_not_in_instance_dict(value, source.clone(), own)?;
        }
        Ok(())
    }

    /// Whether `module.name = module.name` stores a submodule back into its own slot (after
    /// `self.classifier = self.classifier.to(dtype)` that converted nothing): through
    /// `Module.__setattr__` that changes nothing when no global module-registration hook is
    /// installed and the name is only in `_modules`. Guarded so; nothing to replay.
    fn module_stored_back(
        &mut self,
        real: &Bound<'py, PyAny>,
        source: &Rc<super::source::Source>,
        name: &str,
        value: Option<VarId>,
    ) -> CResult<bool> {
        use super::source::{ItemKey, Source};
        let py = self.py;
        let Some(value) = value else {
            return Ok(false);
        };
        let VarKind::Object(stored) = self.kind(value) else {
            return Ok(false);
        };
        let stored = stored.bind(py).clone();
        if !real.is_instance(&self.h.module_type)?
            || !real
                .get_type()
                .getattr("__setattr__")?
                .is(&self.h.module_type.getattr("__setattr__")?)
        {
            return Ok(false);
        }
        let slot = Rc::new(Source::Item(
            Rc::new(Source::Attr(source.clone(), "_modules".into())),
            ItemKey::Str(name.to_string()),
        ));
        if self.source(value).map(|s| s.describe()) != Some(slot.describe()) {
            return Ok(false);
        }
        let dict = real.getattr("__dict__")?;
        let key = pyo3::types::PyString::intern(py, name).into_any();
        let current = dict
            .get_item("_modules")
            .ok()
            .and_then(|m| m.get_item(&key).ok());
        if !current.is_some_and(|c| c.is(&stored)) || dict.contains(&key)? {
            return Ok(false);
        }
        for table in ["_parameters", "_buffers"] {
            match dict.get_item(table) {
                Ok(entries) if !entries.contains(&key)? => {}
                _ => return Ok(false),
            }
        }
        let module_py = py.import_module("torch.nn.modules.module")?;
        let hooks = module_py.getattr("_global_module_registration_hooks")?;
        if hooks.len()? != 0 {
            return Ok(false);
        }
        let hooks_source = Rc::new(Source::Attr(
            Rc::new(Source::Object(
                OwnedRef::from_bound(module_py.as_any()),
                "torch.nn.modules.module".into(),
            )),
            "_global_module_registration_hooks".into(),
        ));
        self.guards
            .add(hooks_source, super::guards::GuardKind::Len(0));
        for table in ["__dict__", "_parameters", "_buffers"] {
            self.guards.add(
                Rc::new(Source::Attr(source.clone(), table.into())),
                super::guards::GuardKind::Contains(OwnedRef::from_bound(&key), false),
            );
        }
        Ok(true)
    }

    /// Whether `module.name = tensor` replaces one of the module's buffers with a tensor the
    /// graph computed (a cache a model refreshes when the input size changes, as timm's
    /// ConViT's `rel_indices`): `Module.__setattr__` registers it as that buffer, which
    /// replaying the store after the graph does the same way; reads of `module.name` later
    /// in the trace see the stored tensor, and the `_buffers` dict itself is not read again
    /// in this trace. Guarded: the name stays a buffer and no parameter or submodule.
    fn buffer_store(
        &mut self,
        real: &Bound<'py, PyAny>,
        source: &Rc<super::source::Source>,
        name: &str,
        value: VarId,
    ) -> CResult<bool> {
        let py = self.py;
        if !matches!(self.kind(value), VarKind::Tensor { .. }) {
            return Ok(false);
        }
        // `self.buf = op(..., out=self.buf)` (spectral norm's power method) stores the buffer
        // back into its own slot: nothing changes but what the guards below pin down.
        let own_slot = Rc::new(super::source::Source::Item(
            Rc::new(super::source::Source::Attr(
                source.clone(),
                "_buffers".into(),
            )),
            super::source::ItemKey::Str(name.to_string()),
        ));
        let stored_back = match self.source(value) {
            None => false,
            Some(s) if s.describe() == own_slot.describe() => true,
            Some(_) => return Ok(false),
        };
        let dict = real.getattr("__dict__")?;
        let key = pyo3::types::PyString::intern(py, name).into_any();
        let mut tables = Vec::new();
        for table in super::helpers::MODULE_TABLES {
            let Ok(entries) = dict.get_item(table) else {
                return Ok(false);
            };
            if !entries.is_exact_instance_of::<pyo3::types::PyDict>() {
                return Ok(false);
            }
            tables.push((table, entries.contains(&key)?));
        }
        if tables
            != [
                ("_parameters", false),
                ("_buffers", true),
                ("_modules", false),
            ]
        {
            return Ok(false);
        }
        for (table, present) in tables {
            self.guards.add(
                Rc::new(super::source::Source::Attr(source.clone(), table.into())),
                super::guards::GuardKind::Contains(OwnedRef::from_bound(&key), present),
            );
        }
        if !stored_back {
            self.buffer_stores.insert(real.as_ptr() as usize);
        }
        Ok(true)
    }

    /// The value a previous store in this trace gave `obj.name`, if any (`Some(None)`: deleted).
    pub fn mutated_attr(&self, obj: &Bound<'py, PyAny>, name: &str) -> Option<Option<VarId>> {
        self.mutations
            .iter()
            .rev()
            .find(|m| m.object.as_ptr() == obj.as_ptr() && m.name == name)
            .map(|m| m.value)
    }

    /// Whether the transformed code can build `id` (for side effects and return values).
    pub fn rebuildable(&self, id: VarId) -> bool {
        match self.kind(id) {
            VarKind::Tensor { .. } | VarKind::Const(_) => true,
            // A symbolic int (a counter made dynamic) is a graph output, as a tensor is.
            VarKind::Symbolic { .. } => true,
            VarKind::Object(_) => true,
            VarKind::Tuple(items) | VarKind::List(items) => {
                items.iter().all(|&i| self.rebuildable(i))
            }
            VarKind::Dict(entries) => entries.iter().all(|(_, v)| self.rebuildable(*v)),
            VarKind::Instance { attrs, .. } => attrs.iter().all(|(_, v)| self.rebuildable(*v)),
            _ => false,
        }
    }

    /// Whether calling `cls` should make a traced instance: a plain Python class (no custom
    /// metaclass, `__new__` or `__setattr__`, not a torch, module or builtin type).
    pub fn is_plain_class(&self, cls: &Bound<'py, PyAny>) -> PyResult<bool> {
        let py = self.py;
        let Ok(cls) = cls.cast::<PyType>() else {
            return Ok(false);
        };
        let builtins = py.import_module("builtins")?;
        let object = builtins.getattr("object")?;
        // `type` or `abc.ABCMeta` (whose instances are made by object.__new__ as well).
        let metaclass = cls.get_type();
        if !metaclass.is(&builtins.getattr("type")?)
            && !metaclass.is(&py.import_module("abc")?.getattr("ABCMeta")?)
        {
            return Ok(false);
        }
        let module: String = cls
            .getattr("__module__")
            .and_then(|m| m.extract())
            .unwrap_or_default();
        if module == "builtins" || is_torch_module(&module) {
            return Ok(false);
        }
        let mro = cls.getattr("__mro__")?;
        if mro.len()? < 2 || !mro.get_item(mro.len()? - 1)?.is(&object) {
            return Ok(false);
        }
        // Every base must be a Python class deriving directly from object's layout.
        for base in mro.try_iter()? {
            let base = base?;
            if base.is(&object) {
                continue;
            }
            let base_module: String = base
                .getattr("__module__")
                .and_then(|m| m.extract())
                .unwrap_or_default();
            // `__slots__` are fine: `object.__new__(cls)` gives their layout, and the traced
            // instance keeps slot values as attributes (see `slot_only_instances`).
            if base_module == "builtins" || is_torch_module(&base_module) {
                return Ok(false);
            }
        }
        // A frozen dataclass's generated `__setattr__`/`__delattr__` (they raise; `__init__`
        // stores through `object.__setattr__`) are traced as any Python method.
        let frozen_dataclass = cls
            .getattr("__dataclass_params__")
            .and_then(|p| p.getattr("frozen"))
            .is_ok_and(|f| f.is_truthy().unwrap_or(false));
        let generated = |slot: &str| -> PyResult<bool> {
            let own = cls.getattr(slot)?;
            Ok(own.is_instance(&self.h.function_type)?
                && own.getattr("__code__")?.getattr("co_filename")?.to_string() == "<string>")
        };
        let plain_setattr = cls
            .getattr("__setattr__")?
            .is(&object.getattr("__setattr__")?)
            || (frozen_dataclass && generated("__setattr__")? && generated("__delattr__")?);
        Ok(cls.getattr("__new__")?.is(&object.getattr("__new__")?)
            && plain_setattr
            && cls
                .getattr("__getattribute__")?
                .is(&object.getattr("__getattribute__")?))
    }

    /// `object.__new__(cls)` (also as `cls.__new__(cls)`) of a plain class: a traced instance
    /// with no attributes, `__init__` not run. None for other calls.
    pub(super) fn object_new(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let object_new = self.h.builtins.getattr("object")?.getattr("__new__")?;
        if args.len() == 1 && kwargs.is_empty() {
            // `dict.__new__(dict)`, `list.__new__(list)`: an empty one (their `__init__`
            // only fills it).
            let h = self.h.clone();
            for (container, empty) in [(&h.dict_type, true), (&h.list_type, false)] {
                let new = container.getattr("__new__")?;
                let of_itself = matches!(self.kind(args[0]),
                    VarKind::Const(c) | VarKind::Object(c) if c.bind(py).is(container));
                if func.eq(&new)? && of_itself {
                    let kind = if empty {
                        VarKind::Dict(Vec::new())
                    } else {
                        VarKind::List(Vec::new())
                    };
                    return Ok(Some(self.add(kind, None)));
                }
            }
        }
        if !func.is(&object_new) || args.len() != 1 || !kwargs.is_empty() {
            return Ok(None);
        }
        let cls = match self.kind(args[0]) {
            VarKind::Const(c) | VarKind::Object(c) => c.bind(py).clone(),
            _ => return Ok(None),
        };
        if !self.is_plain_class(&cls)? {
            return Ok(None);
        }
        self.pin_identity(args[0]);
        Ok(Some(self.add(
            VarKind::Instance {
                cls: OwnedRef::from_bound(&cls),
                attrs: Vec::new(),
                model_output: false,
            },
            None,
        )))
    }

    /// `cls(*args, **kwargs)` for a plain class: a traced instance, `__init__` inlined.
    pub fn construct(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let instance = self.add(
            VarKind::Instance {
                cls: OwnedRef::from_bound(cls),
                attrs: Vec::new(),
                model_output: false,
            },
            None,
        );
        self.guard_class(cls, "__init__")?;
        let init = cls.getattr("__init__")?;
        let object_init = py
            .import_module("builtins")?
            .getattr("object")?
            .getattr("__init__")?;
        if init.is(&object_init) {
            if !args.is_empty() || !kwargs.is_empty() {
                return unsupported(
                    BreakKind::ExceptionWhileTracing,
                    format!("{}() takes no arguments", super::ops_call::describe(cls)),
                );
            }
            return Ok(instance);
        }
        if !init.is_instance(&self.h.function_type)? {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "constructing {} (its __init__ is not Python)",
                    super::ops_call::describe(cls)
                ),
            );
        }
        let mut all = vec![instance];
        all.extend(args);
        let result = self.call_python(&init, all, kwargs)?;
        if !matches!(self.kind(result), VarKind::Const(v) if v.bind(py).is_none()) {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                "__init__ returned something other than None",
            );
        }
        Ok(instance)
    }

    /// `cls(**fields)` for a transformers `ModelOutput` dataclass: its fields, in order.
    pub fn construct_model_output(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let fields = py
            .import_module("dataclasses")?
            .call_method1("fields", (cls,))?;
        let mut attrs: Vec<(String, VarId)> = Vec::new();
        for (i, field) in fields.try_iter()?.enumerate() {
            let field = field?;
            let name: String = field.getattr("name")?.extract()?;
            let value = match (args.get(i), kwargs.iter().find(|(k, _)| *k == name)) {
                (Some(&v), None) => v,
                (None, Some((_, v))) => *v,
                (None, None) => {
                    let default = field.getattr("default")?;
                    let missing = py.import_module("dataclasses")?.getattr("MISSING")?;
                    if default.is(&missing) {
                        return unsupported(
                            BreakKind::ModelOutput,
                            format!("ModelOutput field {name} without a value"),
                        );
                    }
                    self.wrap(&default, None)?
                }
                (Some(_), Some(_)) => {
                    return unsupported(
                        BreakKind::ModelOutput,
                        format!("ModelOutput field {name} given twice"),
                    )
                }
            };
            attrs.push((name, value));
        }
        if kwargs
            .iter()
            .any(|(k, _)| !attrs.iter().any(|(n, _)| n == k))
        {
            return unsupported(BreakKind::ModelOutput, "unknown ModelOutput field");
        }
        if self.first_field_unpacked(&attrs) {
            return unsupported(
                BreakKind::ModelOutput,
                "a ModelOutput whose only field could be unpacked into (name, value) pairs",
            );
        }
        // What the trace assumes of the construction, and what the generated code relies
        // on to make the object without calling the class.
        for step in super::model_output::CONSTRUCTION_STEPS {
            self.guard_class(cls, step)?;
        }
        Ok(self.add(
            VarKind::Instance {
                cls: OwnedRef::from_bound(cls),
                attrs,
                model_output: true,
            },
            None,
        ))
    }

    /// Whether `__post_init__` would treat the first field as an iterator of `(name, value)`
    /// pairs (or a dict) to set fields from: it does when every other field is None and the
    /// first is neither a tensor nor None, and then looks at its items — which the trace
    /// does not model. Scalars, strings and sequences whose first item is not a pair are
    /// stored as they are (the case modelled).
    fn first_field_unpacked(&self, fields: &[(String, VarId)]) -> bool {
        let py = self.py;
        let is_none = |v: VarId| matches!(self.kind(v), VarKind::Const(c) if c.bind(py).is_none());
        let Some(&(_, first)) = fields.first() else {
            return false;
        };
        if fields[1..].iter().any(|&(_, v)| !is_none(v)) {
            return false;
        }
        match self.kind(first) {
            VarKind::Tensor { .. } | VarKind::Symbolic { .. } => false,
            VarKind::Const(c) => {
                let c = c.bind(py);
                !(c.is_none()
                    || c.is_instance_of::<pyo3::types::PyString>()
                    || c.is_instance_of::<pyo3::types::PyBool>()
                    || c.is_instance_of::<pyo3::types::PyInt>()
                    || c.is_instance_of::<pyo3::types::PyFloat>())
            }
            VarKind::Tuple(items) | VarKind::List(items) => match items.first() {
                None => true,
                Some(&item) => !matches!(
                    self.kind(item),
                    VarKind::Tensor { .. } | VarKind::Symbolic { .. }
                ),
            },
            _ => true,
        }
    }

    /// The fields of a ModelOutput that are not None, in order (what `to_tuple()` gives).
    pub fn model_output_items(&self, id: VarId) -> Vec<(String, VarId)> {
        match self.kind(id) {
            VarKind::Instance {
                attrs,
                model_output: true,
                ..
            } => {
                let attribute_only = self.model_output_attribute_only.get(&id);
                attrs
                    .iter()
                    .filter(|(_, v)| !matches!(self.kind(*v), VarKind::Const(c) if c.bind(self.py).is_none()))
                    .filter(|(n, _)| !attribute_only.is_some_and(|names| names.contains(n)))
                    .cloned()
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// `instance.name` for a traced instance.
    pub fn instance_attr(&mut self, obj: VarId, name: &str) -> CResult<VarId> {
        let py = self.py;
        let VarKind::Instance {
            cls,
            attrs,
            model_output,
        } = self.kind(obj)
        else {
            return unsupported(
                BreakKind::Internal,
                "internal: instance_attr on a non-instance",
            );
        };
        if let Some((_, v)) = attrs.iter().find(|(n, _)| n == name) {
            return Ok(*v);
        }
        if name == "__dict__" && !*model_output && !slot_only(&cls.bind(py).clone())? {
            if let Some(&dict) = self.instance_dicts.get(&obj) {
                return Ok(dict);
            }
            let entries = attrs
                .iter()
                .map(|(n, v)| (OwnedRef::from_bound(PyString::new(py, n).as_any()), *v))
                .collect();
            let dict = self.add(VarKind::Dict(entries), None);
            self.private_containers.insert(dict);
            self.instance_dicts.insert(obj, dict);
            return Ok(dict);
        }
        let (cls, model_output) = (cls.bind(py).clone(), *model_output);
        // Everything below is read from the class.
        self.guard_class(&cls, name)?;
        if model_output && matches!(name, "to_tuple" | "keys" | "values" | "items" | "get") {
            return Ok(self.method(obj, name, None));
        }
        if name == "__class__" {
            return self.wrap(&cls, None);
        }
        let attr = match py
            .import_module("inspect")?
            .call_method1("getattr_static", (&cls, name))
        {
            Ok(a) => a,
            Err(_) => {
                // Python's fallback: the class's `__getattr__` (inlined), else AttributeError
                // (which the traced code may catch).
                let fallback = cls.getattr("__getattr__").ok();
                if fallback
                    .as_ref()
                    .is_some_and(|f| f.is_instance(&self.h.function_type).unwrap_or(false))
                {
                    let fallback = fallback.expect("checked");
                    let name = self.constant(pyo3::types::PyString::new(py, name).as_any());
                    return self.call_python(&fallback, vec![obj, name], Vec::new());
                }
                if fallback.is_some() {
                    return unsupported(
                        BreakKind::ExceptionWhileTracing,
                        format!(
                            "{} has no attribute {name:?} (and a __getattr__ that is not Python code)",
                            super::ops_call::describe(&cls)
                        ),
                    );
                }
                let type_name = cls.getattr("__name__")?;
                let message = format!("'{type_name}' object has no attribute '{name}'");
                return self.raise_builtin(
                    "AttributeError",
                    pyo3::types::PyString::new(py, &message).into_any(),
                );
            }
        };
        if attr.is_instance(&py.import_module("types")?.getattr("MemberDescriptorType")?)? {
            // A `__slots__` member the instance has not been given.
            let message = format!(
                "'{}' object has no attribute '{name}'",
                cls.getattr("__name__")?
            );
            return self.raise_builtin("AttributeError", PyString::new(py, &message).into_any());
        }
        self.bind_class_attribute(obj, &cls, name, &attr)
    }

    /// What `obj.name` gives when `attr` is the entry `name` finds on `cls`, the class of
    /// the traced value `obj`, and the instance has nothing of that name: a method bound to
    /// `obj`, a property's getter or a Python descriptor's `__get__` inlined on it, the
    /// function of a static method, a class method bound to the class, or class data read
    /// through the class. The caller has guarded the class entry.
    pub(super) fn bind_class_attribute(
        &mut self,
        obj: VarId,
        cls: &Bound<'py, PyAny>,
        name: &str,
        attr: &Bound<'py, PyAny>,
    ) -> CResult<VarId> {
        let py = self.py;
        let (cls, attr) = (cls.clone(), attr.clone());
        let builtins = py.import_module("builtins")?;
        if attr.is_instance(&self.h.function_type)? {
            return Ok(self.method(obj, name, Some(OwnedRef::from_bound(&attr))));
        }
        if attr.is_instance(&builtins.getattr("property")?)? {
            let getter = attr.getattr("fget")?;
            return self.call_python(&getter, vec![obj], Vec::new());
        }
        if attr.is_instance(&builtins.getattr("staticmethod")?)? {
            return self.wrap(&attr.getattr("__func__")?, None);
        }
        if attr.is_instance(&builtins.getattr("classmethod")?)? {
            let cls_var = self.wrap(&cls, None)?;
            let func = attr.getattr("__func__")?;
            return Ok(self.method(cls_var, name, Some(OwnedRef::from_bound(&func))));
        }
        if let Some(get) = python_descriptor_get(&attr)? {
            // A descriptor written in Python (torch.distributions' `lazy_property`): the
            // class entry is guarded above.
            return self.inline_descriptor_get(obj, &cls, name, &attr, &get);
        }
        if attr.is_instance(&py.import_module("types")?.getattr("GetSetDescriptorType")?)? {
            // A field of the C object (`__weakref__`, `__dict__`): the descriptor itself is
            // not the attribute. No weak reference to an object made in the trace exists.
            if name == "__weakref__" && matches!(self.kind(obj), VarKind::Instance { .. }) {
                return Ok(self.constant(&py.None().into_bound(py)));
            }
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!(".{name} of an object made while tracing (a field of the C object)"),
            );
        }
        // Class data (constants, nested classes, functions from elsewhere), read through the
        // class so that what it holds is guarded like any other read.
        let value = cls.getattr(name)?;
        let source = match cls.cast::<PyType>() {
            Ok(ty) => Some(std::rc::Rc::new(super::source::Source::Attr(
                class_source(ty),
                name.to_string(),
            ))),
            Err(_) => None,
        };
        self.wrap(&value, source)
    }

    /// `obj.name` through a descriptor written in Python, `entry` of `cls`: its
    /// `get(entry, obj, cls)` inlined, on the descriptor read through the class — one tracker
    /// for it, so a store the trace made to the descriptor's own state (a `__set__` keeping
    /// values in a dict of its own) is what this read sees. The caller guards the entry.
    pub(super) fn inline_descriptor_get(
        &mut self,
        obj: VarId,
        cls: &Bound<'py, PyAny>,
        name: &str,
        entry: &Bound<'py, PyAny>,
        get: &Bound<'py, PyAny>,
    ) -> CResult<VarId> {
        let descriptor = self.wrap(entry, class_entry_source(cls, name))?;
        let class = self.wrap(cls, None)?;
        self.call_python(get, vec![descriptor, obj, class], Vec::new())
    }

    /// Records that the trace depends on what class `cls` gives for `name` (a method it
    /// inlines, the `__init__` it runs): the entry found along the MRO is guarded by
    /// identity, so a method patched on the class or a base later recompiles. (Version tags
    /// of classes would say "something changed" more cheaply, but torch resets them: FX
    /// tracing patches and restores `nn.Module` on every compile.)
    pub fn guard_class(&mut self, cls: &Bound<'py, PyAny>, name: &str) -> CResult<()> {
        let Ok(ty) = cls.cast::<PyType>() else {
            return Ok(());
        };
        let key = pyo3::types::PyString::intern(self.py, name);
        let Some(found) = super::guard_values::class_lookup(ty.as_any(), &key) else {
            return Ok(());
        };
        let source = Rc::new(Source::ClassAttr(class_source(ty), name.to_string()));
        if found.is_instance(&self.h.function_type)? {
            // A method's code can be replaced in place (`Class.method.__code__ = ...`).
            self.guards.add(
                Rc::new(Source::Attr(source.clone(), "__code__".into())),
                super::guards::GuardKind::Id(OwnedRef::from_bound(&found.getattr("__code__")?)),
            );
        }
        self.guards.add(
            source,
            super::guards::GuardKind::Id(OwnedRef::from_bound(&found)),
        );
        Ok(())
    }

    /// Records that `name`, which the trace found on the class of `value` (a method it
    /// inlines, `forward` of a module it calls), is not shadowed by the object's own
    /// `__dict__`: an instance attribute of that name set later (`obj.method = other`,
    /// `module.forward = ...`) takes precedence over a method and must recompile.
    /// Classes (their own dicts are what `guard_class` reads) and objects without a
    /// `__dict__` (slots) need nothing.
    pub(super) fn guard_not_in_instance_dict(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: Option<Rc<Source>>,
        name: &str,
    ) -> CResult<()> {
        if let (Some(source), Some(_)) = (source, super::guard_values::instance_dict_of(value)) {
            self.guards.add(
                source,
                super::guards::GuardKind::InstanceDictLacks(name.to_string()),
            );
        }
        Ok(())
    }

    /// Whether `value`'s own `__dict__` holds `name` (an attribute set on the instance).
    pub(super) fn in_instance_dict(value: &Bound<'py, PyAny>, name: &str) -> bool {
        super::guard_values::instance_dict_of(value)
            .is_some_and(|d| d.contains(name).unwrap_or(false))
    }

    /// `isinstance`/`issubclass`-style checks and `type()` for instances use their class.
    pub fn instance_class(&self, id: VarId) -> Option<Bound<'py, PyAny>> {
        match self.kind(id) {
            VarKind::Instance { cls, .. } => Some(cls.bind(self.py).clone()),
            _ => None,
        }
    }
}

/// The `__get__` of `attr`'s class when it is Python code: a descriptor written in Python
/// (not a function, property, classmethod or staticmethod, which are handled as such).
pub fn python_descriptor_get<'py>(attr: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let ty = attr.get_type();
    if ty.is(attr.py().get_type::<pyo3::types::PyFunction>()) {
        return Ok(None);
    }
    match ty.getattr("__get__") {
        Ok(get) if get.is_instance_of::<pyo3::types::PyFunction>() => Ok(Some(get)),
        _ => Ok(None),
    }
}

/// The entry `name` of class `cls`, found along its MRO and read through the class (what
/// `Tracer::guard_class` guards); None when `cls` is not a class.
pub fn class_entry_source(cls: &Bound<'_, PyAny>, name: &str) -> Option<Rc<Source>> {
    let ty = cls.cast::<PyType>().ok()?;
    Some(Rc::new(Source::ClassAttr(
        class_source(ty),
        name.to_string(),
    )))
}

/// The source of a class the guard holds itself.
pub fn class_source(ty: &Bound<'_, PyType>) -> std::rc::Rc<super::source::Source> {
    let name = ty
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    std::rc::Rc::new(super::source::Source::Object(
        OwnedRef::from_bound(ty.as_any()),
        format!("<class {name}>"),
    ))
}

/// Whether `module` is torch itself or one of its submodules (whose classes keep state the
/// translator does not model), not merely a name starting with "torch": torchvision's and
/// torchaudio's plain classes (`ImageList`) are user-level Python like any other.
/// Whether classes of `module` are torch's own, made by torch's rules rather than as
/// plain Python objects.
fn is_torch_module(module: &str) -> bool {
    // Pure-Python helpers whose classes are traced like the user's (as TorchDynamo inlines
    // them): distributions, `torch.func.functional_call`'s `NamedMemberAccessor`, pytree specs
    // (`tree_map`, `tree_flatten`), `GradScaler`'s per-device `_MultiDeviceReplicator`.
    const TRACED: [&str; 4] = [
        "torch.distributions.",
        "torch.nn.utils.",
        "torch.utils._pytree",
        "torch.amp.grad_scaler",
    ];
    (module == "torch" || module.starts_with("torch."))
        && !TRACED.iter().any(|prefix| module.starts_with(prefix))
}

/// Whether instances of `cls` have no `__dict__`: every class of its MRO declares
/// `__slots__` (without `"__dict__"`).
fn slot_only(cls: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(cls.getattr("__dictoffset__")?.extract::<isize>()? == 0)
}

/// Whether an instance of `cls` can hold `name` as its own attribute: it has a `__dict__`,
/// or `name` is one of its `__slots__`.
fn slot_or_dict_attribute(cls: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    if !slot_only(cls)? {
        return Ok(true);
    }
    let py = cls.py();
    let member = py
        .import_module("inspect")?
        .call_method1("getattr_static", (cls, name))
        .ok();
    let member_type = py.import_module("types")?.getattr("MemberDescriptorType")?;
    Ok(member.is_some_and(|m| m.is_instance(&member_type).unwrap_or(false)))
}
