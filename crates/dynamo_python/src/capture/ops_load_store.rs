//! Loads and stores: locals, constants, globals, attributes, methods, closure cells, and the
//! stack shuffles `COPY` and `SWAP`.

use super::break_reasons::BreakKind;
use std::cell::RefCell;
use std::rc::Rc;

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::source::{ItemKey, Source};
use super::translator::{unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{Cell, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    pub(super) fn op_copy(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let Some(&value) = f
            .stack
            .len()
            .checked_sub(n as usize)
            .and_then(|i| f.stack.get(i))
        else {
            return unsupported(BreakKind::Internal, "COPY past the bottom of the stack");
        };
        f.stack.push(value);
        Ok(Flow::Continue)
    }

    pub(super) fn op_swap(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let len = f.stack.len();
        if (n as usize) > len || n == 0 {
            return unsupported(BreakKind::Internal, "SWAP past the bottom of the stack");
        }
        f.stack.swap(len - 1, len - n as usize);
        Ok(Flow::Continue)
    }

    pub(super) fn op_load_fast(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        match f.locals.get(i as usize).copied().flatten() {
            Some(value) => {
                f.stack.push(value);
                Ok(Flow::Continue)
            }
            None => unsupported(
                BreakKind::UndefinedName,
                format!("reads the unbound local {:?}", f.slot_names.get(i as usize)),
            ),
        }
    }

    pub(super) fn op_store_fast(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let value = self.pop(f)?;
        if f.is_root {
            if let Some(cell) = self.handed_cell(f, i, value)? {
                // A resume function's prologue storing the cell it was handed (the original
                // frame's own) into its cell slot: the variable lives in that real cell.
                f.cells.insert(i as usize, cell);
                return Ok(Flow::Continue);
            }
        }
        f.locals[i as usize] = Some(value);
        Ok(Flow::Continue)
    }

    /// The cell `value` is, when it is a real cell object stored into a cell variable's slot
    /// (`STORE_FAST` there: how a resume function takes the cells it is handed, see
    /// `dynamo_bytecode::resume`), read through its source.
    fn handed_cell(
        &mut self,
        f: &FrameState<'py>,
        slot: u32,
        value: VarId,
    ) -> CResult<Option<Cell>> {
        let VarKind::Object(object) = self.kind_unobserved(value) else {
            return Ok(None);
        };
        let object = object.bind(self.py).clone();
        let cell_type = self.py.import_module("types")?.getattr("CellType")?;
        if !object.get_type().is(&cell_type) {
            return Ok(None);
        }
        let name = &f.slot_names[slot as usize];
        let cellvars = f.code.getattr("co_cellvars")?;
        if !cellvars.contains(name)? {
            return Ok(None);
        }
        Ok(Some(Cell::Real(
            OwnedRef::from_bound(&object),
            self.source(value),
        )))
    }

    pub(super) fn op_delete_fast(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        f.locals[i as usize] = None;
        Ok(Flow::Continue)
    }

    pub(super) fn op_load_const(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let value = f.consts.get_item(i as usize)?;
        let id = if self.h.is_constant(&value)? {
            self.constant(&value)
        } else {
            // Code objects and other compiler constants.
            self.add(VarKind::Object(OwnedRef::from_bound(&value)), None)
        };
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_load_global(&mut self, f: &mut FrameState<'py>, arg: u32) -> CResult<Flow> {
        let name = f.names.get_item((arg >> 1) as usize)?.to_string();
        if arg & 1 == 1 {
            let null = self.add(VarKind::Null, None);
            f.stack.push(null);
        }
        if let Some(stored) = self.stored_global(f.globals.as_any(), &name) {
            f.stack.push(stored);
            return Ok(Flow::Continue);
        }
        let value = match f.globals.get_item(&name)? {
            Some(v) => v,
            None => match self.lookup_builtin(&f.builtins, &name)? {
                Some(v) => v,
                None => {
                    return unsupported(
                        BreakKind::UndefinedName,
                        format!("reads the undefined global {name:?}"),
                    )
                }
            },
        };
        let source = Rc::new(Source::Global {
            globals: OwnedRef::from_bound(f.globals.as_any()),
            builtins: OwnedRef::from_bound(&f.builtins),
            name,
            root: f.is_root,
        });
        let id = self.wrap(&value, Some(source))?;
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    /// `STORE_GLOBAL name`: recorded (see `Tracer::global_stores`), replayed after the graph.
    pub(super) fn op_store_global(&mut self, f: &mut FrameState<'py>, arg: u32) -> CResult<Flow> {
        self.note_effect(None);
        let name = f.names.get_item(arg as usize)?.to_string();
        let value = self.pop(f)?;
        if !self.rebuildable(value) {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!(
                    "storing {} into the global {name}",
                    super::translator::kind_name(self.kind(value))
                ),
            );
        }
        self.global_stores
            .push((OwnedRef::from_bound(f.globals.as_any()), name, value));
        Ok(Flow::Continue)
    }

    /// The value this trace last stored into `globals[name]`, if any.
    pub fn stored_global(&self, globals: &Bound<'py, PyAny>, name: &str) -> Option<VarId> {
        self.global_stores
            .iter()
            .rev()
            .find(|(g, n, _)| g.as_ptr() == globals.as_ptr() && n == name)
            .map(|(_, _, v)| *v)
    }

    fn lookup_builtin(
        &self,
        builtins: &Bound<'py, PyAny>,
        name: &str,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match builtins.cast::<PyDict>() {
            Ok(d) => d.get_item(name),
            Err(_) => Ok(builtins.getattr(name).ok()),
        }
    }

    pub(super) fn op_load_attr(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let name = f.names.get_item(i as usize)?.to_string();
        let obj = self.pop(f)?;
        let value = self.get_attr(obj, &name)?;
        f.stack.push(value);
        Ok(Flow::Continue)
    }

    /// `LOAD_METHOD`: pushes NULL and the attribute; methods of tracked values stay bound to
    /// the tracker so the receiver keeps its source (or stays symbolic, for tensors).
    pub(super) fn op_load_method(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let name = f.names.get_item(i as usize)?.to_string();
        let obj = self.pop(f)?;
        let null = self.add(VarKind::Null, None);
        f.stack.push(null);
        let value = self.get_attr(obj, &name)?;
        f.stack.push(value);
        Ok(Flow::Continue)
    }

    /// `obj.name` for any tracker.
    pub fn get_attr(&mut self, obj: VarId, name: &str) -> CResult<VarId> {
        let value = self.read_attr(obj, name)?;
        if name == "param_groups" {
            self.optimizer_param_groups(obj, value)?;
        }
        if self.is_private(obj) {
            self.mark_private_containers(value);
        }
        if self.reached_through_module(obj)? {
            self.mark_module_reached(value);
        }
        Ok(value)
    }

    /// Whether `obj` is an `nn.Module` or was read through one's attributes.
    fn reached_through_module(&self, obj: VarId) -> PyResult<bool> {
        if self.module_reached.contains(&obj) {
            return Ok(true);
        }
        match self.kind(obj) {
            VarKind::Object(value) => value.bind(self.py).is_instance(&self.h.module_type),
            _ => Ok(false),
        }
    }

    /// Marks `id` (and the items of a container) as read through a module.
    fn mark_module_reached(&mut self, id: VarId) {
        if !self.module_reached.insert(id) {
            return;
        }
        // Which trackers are containers does not depend on any item's value.
        let inner: Vec<VarId> = match self.kind_unobserved(id) {
            VarKind::List(items) | VarKind::Tuple(items) => items.clone(),
            VarKind::Dict(entries) => entries.iter().map(|(_, v)| *v).collect(),
            _ => return,
        };
        for item in inner {
            self.mark_module_reached(item);
        }
    }

    fn read_attr(&mut self, obj: VarId, name: &str) -> CResult<VarId> {
        let py = self.py;
        match self.kind(obj) {
            VarKind::Unrealized(_) => super::lazy_inputs::unrealized_reached(),
            VarKind::Tensor { fake, .. } => {
                let fake = fake.bind(py).clone();
                self.tensor_attr(obj, &fake, name)
            }
            VarKind::Instance { .. } => self.instance_attr(obj, name),
            VarKind::Function(_) => self.function_attr(obj, name),
            VarKind::Const(value) | VarKind::Object(value) => {
                let value = value.bind(py).clone();
                // A running frame's `f_locals`, `f_lineno`, `f_back` change as it runs (and
                // the frame is a new object on every call).
                if value.get_type().name()? == "frame" && value.get_type().module()? == "builtins" {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("reading .{name} of a frame object"),
                    );
                }
                // A store earlier in this trace decides what the read sees (`module.NAME`
                // after a `global NAME` store in that module's code, too).
                if value.is_instance_of::<pyo3::types::PyModule>() {
                    if let Ok(globals) = value.getattr("__dict__") {
                        if let Some(stored) = self.stored_global(&globals, name) {
                            return Ok(stored);
                        }
                    }
                }
                if name == "_buffers" && self.buffer_stores.contains(&(value.as_ptr() as usize)) {
                    return unsupported(
                        BreakKind::UnreplayableSideEffect,
                        "reading the buffers of a module after this trace replaced one of them",
                    );
                }
                match self.mutated_attr(&value, name) {
                    Some(Some(stored)) => return Ok(stored),
                    Some(None) => {
                        return unsupported(
                            BreakKind::UnreplayableSideEffect,
                            format!("reading .{name} after deleting it"),
                        )
                    }
                    None => {}
                }
                // A descriptor written in Python (`__get__` reading the instance's
                // `__dict__`, a lazily computed value) is inlined on the tracked object, as a
                // property is below: run on the real object it would not see this trace's
                // stores, and its answer would be fixed for every later call. The class
                // entry is guarded, and for a non-data descriptor the instance dict staying
                // without `name`.
                if let Some((entry, get, data)) = self.python_descriptor_entry(&value, name)? {
                    let ty = value.get_type().into_any();
                    self.guard_class(&ty, name)?;
                    self.guard_renaming_lookup(&value, self.source(obj), name)?;
                    if !data {
                        self.guard_not_in_instance_dict(&value, self.source(obj), name)?;
                    }
                    return self.inline_descriptor_get(obj, &ty, name, &entry, &get);
                }
                // A computed attribute (a property, `__getattr__`) of an object this trace
                // has stored to would run on the real object, which does not have the stores
                // yet (they are replayed after the graph).
                if self
                    .mutations
                    .iter()
                    .any(|m| m.object.as_ptr() == value.as_ptr())
                {
                    let in_dict = match value.getattr("__dict__") {
                        Ok(d) => d.contains(name)?,
                        Err(_) => false,
                    };
                    // Methods and plain class data bind without running code; a property or
                    // another descriptor runs its getter on the real object.
                    let name_str = pyo3::types::PyString::new(py, name);
                    let plain_class_entry =
                        super::guard_values::class_lookup(value.get_type().as_any(), &name_str)
                            .is_some_and(|entry| {
                                entry.is_instance(&self.h.function_type).unwrap_or(false)
                                    || !entry.get_type().hasattr("__get__").unwrap_or(true)
                            });
                    // A property written in Python is inlined on the tracked object, so its
                    // reads see this trace's stores (the class entry is guarded).
                    if let Some(fget) = self.python_property_getter(&value, name)? {
                        self.guard_class(&value.get_type().into_any(), name)?;
                        self.guard_renaming_lookup(&value, self.source(obj), name)?;
                        return self.call_python(&fget, vec![obj], Vec::new());
                    }
                    if !in_dict && !plain_class_entry && !self.module_table_entry(&value, name)? {
                        return unsupported(
                            BreakKind::UnsupportedOperation,
                            format!(
                            "reading the computed attribute .{name} of an object this trace changed"
                        ),
                        );
                    }
                }
                // A property written in Python is inlined, never run on the real object while
                // tracing nor read as a source on every call: its getter may compute (a
                // parametrization's weight, spectral norm's power iteration updating buffers)
                // or change state, which must happen once per call, in the trace's order.
                // What the getter reads is guarded; the class entry is.
                if !value.is_instance_of::<pyo3::types::PyType>() {
                    if let Some(fget) = self.python_property_getter(&value, name)? {
                        let ty = value.get_type();
                        self.guard_class(ty.as_any(), name)?;
                        self.guard_renaming_lookup(&value, self.source(obj), name)?;
                        // Read as `type(obj).name.fget`, so its code is guarded too
                        // (`fget.__code__ = ...` recompiles).
                        let getter_source = Rc::new(Source::Attr(
                            Rc::new(Source::Attr(
                                super::ops_objects::class_source(&ty),
                                name.into(),
                            )),
                            "fget".into(),
                        ));
                        return self.call_python_from(
                            &fget,
                            Some(getter_source),
                            vec![obj],
                            Vec::new(),
                        );
                    }
                }
                if let Some(entry) = self.attr_in_trace(&value, name)? {
                    return Ok(entry);
                }
                let attr = match value.getattr(name) {
                    Ok(a) => a,
                    Err(err) => {
                        let detail = format!("getattr(..., {name:?}) raised {err}");
                        return self.getattr_failed(obj, name, err, detail);
                    }
                };
                // A class attribute made by a Python descriptor's `__get__(None, cls)` may be a
                // new object on every read (`lazy_property`): the class entry is guarded
                // instead, and the value taken as it comes.
                if let Ok(ty) = value.cast::<pyo3::types::PyType>() {
                    let key = pyo3::types::PyString::new(py, name);
                    if let Some(entry) = super::guard_values::class_lookup(ty.as_any(), &key) {
                        if super::ops_objects::python_descriptor_get(&entry)?.is_some() {
                            self.guard_class(ty.as_any(), name)?;
                            return self.wrap(&attr, None);
                        }
                    }
                }
                // Read-only lookups on a real dict (registries, config tables) stay tracked so
                // that what they read is guarded through item sources.
                // Only the dict's own C methods: a subclass may override them in Python, and
                // then the override is inlined like any method.
                if value.is_instance_of::<PyDict>()
                    && matches!(
                        name,
                        "get" | "keys" | "items" | "values" | "__getitem__" | "__contains__"
                    )
                    && attr.get_type().name()? == "builtin_function_or_method"
                    && attr
                        .getattr("__self__")
                        .map(|s| s.is(&value))
                        .unwrap_or(false)
                {
                    return Ok(self.method(obj, name, None));
                }
                // `os.environ`'s lookups are answered with guards (see `environ_lookup`).
                if value.is(&py.import_module("os")?.getattr("environ")?) {
                    return Ok(self.method(obj, name, None));
                }
                // A Python method keeps its tracked receiver; its code comes from the class,
                // whose contents are guarded (a method patched later recompiles).
                if attr.is_instance(&self.h.method_type)? && attr.getattr("__self__")?.is(&value) {
                    let func = attr.getattr("__func__")?;
                    if Self::in_instance_dict(&value, name) {
                        // A method bound once and stored on the instance (`self.forward =
                        // self.forward_split_cat`, timm's FasterNet): that bound method is
                        // what the name holds, guarded by identity (it fixes both its
                        // function and its receiver).
                        if let Some(s) = self.source(obj) {
                            self.guards.add(
                                self.attr_source(&value, s, name),
                                super::guards::GuardKind::Id(OwnedRef::from_bound(&attr)),
                            );
                        }
                        return Ok(self.method(obj, name, Some(OwnedRef::from_bound(&func))));
                    }
                    if !value.is_instance_of::<pyo3::types::PyType>() {
                        self.guard_class(&value.get_type().into_any(), name)?;
                        self.guard_not_in_instance_dict(&value, self.source(obj), name)?;
                    }
                    if let Some(s) = self.source(obj) {
                        // The method's code is fixed by the receiver's class.
                        self.guards.add(
                            s,
                            super::guards::GuardKind::Type(OwnedRef::from_bound(
                                value.get_type().as_any(),
                            )),
                        );
                    }
                    return Ok(self.method(obj, name, Some(OwnedRef::from_bound(&func))));
                }
                // A classmethod read through an instance (`self.from_config(...)`): the bound
                // method is a new object on every read, so it is not guarded by identity; its
                // receiver is the instance's class, fixed by the instance's type guard, and its
                // code by the class's contents.
                if attr.is_instance(&self.h.method_type)?
                    && !value.is_instance_of::<pyo3::types::PyType>()
                    && attr.getattr("__self__")?.is(value.get_type())
                {
                    let ty = value.get_type();
                    self.guard_class(ty.as_any(), name)?;
                    self.guard_not_in_instance_dict(&value, self.source(obj), name)?;
                    if let Some(s) = self.source(obj) {
                        self.guards.add(
                            s,
                            super::guards::GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
                        );
                    }
                    let receiver = self.add(
                        VarKind::Object(OwnedRef::from_bound(ty.as_any())),
                        Some(super::ops_objects::class_source(&ty)),
                    );
                    let func = attr.getattr("__func__")?;
                    return Ok(self.method(receiver, name, Some(OwnedRef::from_bound(&func))));
                }
                // A property that returns a plain object may build a new one on each access
                // (`config.per_layer_config`): an identity guard would never pass again, so the
                // getter is inlined instead and what it reads is guarded.
                if !h_is_simple(&self.h, &attr)? {
                    let static_attr = py
                        .import_module("inspect")?
                        .call_method1("getattr_static", (value.get_type(), name))
                        .ok();
                    if let Some(prop) = static_attr.filter(|p| {
                        p.is_instance_of::<pyo3::types::PyAny>()
                            && p.get_type()
                                .name()
                                .map(|n| n == "property")
                                .unwrap_or(false)
                    }) {
                        let getter = prop.getattr("fget")?;
                        if getter.is_instance(&self.h.function_type)? {
                            return self.call_python(&getter, vec![obj], Vec::new());
                        }
                    }
                }
                // Attributes of a constant are fixed by the constant's own guard; a built-in method
                // bound to the receiver is a new object on every access, fixed by the receiver's
                // type. Neither needs (or survives) a guard of its own.
                let bound_builtin = matches!(
                    attr.get_type().name()?.to_string().as_str(),
                    "builtin_function_or_method" | "method-wrapper"
                ) && attr
                    .getattr("__self__")
                    .map(|s| s.is(&value))
                    .unwrap_or(false);
                if matches!(self.kind(obj), VarKind::Const(_)) || bound_builtin {
                    if let (true, Some(s)) = (bound_builtin, self.source(obj)) {
                        self.guards.add(
                            s,
                            super::guards::GuardKind::Type(OwnedRef::from_bound(
                                value.get_type().as_any(),
                            )),
                        );
                    }
                    let method = self.wrap(&attr, None)?;
                    if bound_builtin {
                        self.bound_builtin_receivers
                            .insert(method, (obj, name.to_string()));
                    }
                    return Ok(method);
                }
                let source = self.source(obj).map(|s| self.attr_source(&value, s, name));
                if source.is_none() && attr.is_instance(&self.h.tensor_type)? {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("reads tensor attribute {name:?} of an object with no source"),
                    );
                }
                // An int attribute of a plain object handed to the frame (a cache's
                // `cumulative_length`, a step counter) is subject to automatic dynamic shapes
                // as the frame's own int arguments are: once it changes between compiles it
                // becomes symbolic, instead of one recompile per value. Modules' ints (layer
                // indices, sizes), those of objects read through modules (a model's config:
                // `num_hidden_layers` sizes its cache) and those of classes and Python
                // modules stay specialised, as under TorchDynamo — and so do the ints in
                // what is read from them (see `Tracer::wrap`).
                let specialized = value.is_instance_of::<pyo3::types::PyType>()
                    || value.is_instance_of::<pyo3::types::PyModule>();
                let through_module = self.reached_through_module(obj)?;
                let mut static_ints = specialized || through_module;
                if let Some(s) = &source {
                    if attr.is_exact_instance_of::<pyo3::types::PyInt>()
                        && s.is_rooted_in_locals()
                        && !static_ints
                    {
                        if let Some(id) = self.int_input(&attr, s.clone(), false)? {
                            return Ok(id);
                        }
                        static_ints = true; // decided: a constant
                    }
                }
                // Floats read from classes and Python modules (`math.pi`, a class constant)
                // stay constants, with what is read from them; so do those of torch's own
                // layers (a BatchNorm's `eps` and `momentum`: a hundred reads in a ResNet,
                // never changed).
                let static_floats = specialized
                    || (attr.is_exact_instance_of::<pyo3::types::PyFloat>()
                        && through_module
                        && value.is_instance(&self.h.module_type)?
                        && value
                            .get_type()
                            .module()
                            .is_ok_and(|m| m.to_string().starts_with("torch.nn.")));
                let outer = (self.static_floats, self.static_ints);
                self.static_floats = outer.0 || static_floats;
                self.static_ints = outer.1 || static_ints;
                let wrapped = self.wrap(&attr, source);
                (self.static_floats, self.static_ints) = outer;
                wrapped
            }
            VarKind::Tuple(items)
                if self
                    .tuple_fields
                    .get(&obj)
                    .is_some_and(|f| f.iter().any(|n| n == name)) =>
            {
                let fields = &self.tuple_fields[&obj];
                let at = fields.iter().position(|n| n == name).expect("checked");
                match items.get(at) {
                    Some(&item) => Ok(item),
                    None => unsupported(
                        BreakKind::ExceptionWhileTracing,
                        format!("named field {name} out of range"),
                    ),
                }
            }
            VarKind::NdArray(_) => self.ndarray_attr(obj, name),
            VarKind::Tuple(_) | VarKind::List(_) | VarKind::Dict(_) => {
                if let Some(attr) = self.dict_subclass_attr(obj, name)? {
                    return Ok(attr);
                }
                if let Some(attr) = self.list_subclass_attr(obj, name)? {
                    return Ok(attr);
                }
                if let Some(attr) = self.named_tuple_class_attr(obj, name)? {
                    return Ok(attr);
                }
                self.container_attr(obj, name)
            }
            VarKind::Generator { .. }
                if super::ops_generators::GENERATOR_METHODS.contains(&name) =>
            {
                Ok(self.method(obj, name, None))
            }
            VarKind::Super { cls, receiver } => {
                let (cls, receiver) = (cls.bind(py).clone(), *receiver);
                // An instance made while tracing: look `name` up statically along its class's MRO,
                // after `cls`.
                if let Some(inst_cls) = self.instance_class(receiver) {
                    self.guard_class(&inst_cls, name)?;
                    let mro = inst_cls.getattr("__mro__")?;
                    let mut after = false;
                    for klass in mro.try_iter()? {
                        let klass = klass?;
                        if !after {
                            after = klass.is(&cls);
                            continue;
                        }
                        let Ok(found) = klass.getattr("__dict__")?.get_item(name) else {
                            continue;
                        };
                        if found.is_instance(&self.h.function_type)? {
                            return Ok(self.add(
                                VarKind::Method {
                                    receiver,
                                    name: name.to_string(),
                                    func: Some(OwnedRef::from_bound(&found)),
                                },
                                None,
                            ));
                        }
                        let object = py.import_module("builtins")?.getattr("object")?;
                        if klass.is(&object) && name == "__init__" {
                            // object.__init__() with no arguments: a no-op.
                            let noop = py.eval(c"lambda self: None", None, None)?;
                            return Ok(self.add(
                                VarKind::Method {
                                    receiver,
                                    name: name.to_string(),
                                    func: Some(OwnedRef::from_bound(&noop)),
                                },
                                None,
                            ));
                        }
                        return unsupported(
                            BreakKind::SuperCall,
                            format!("super().{name} of an object made while tracing"),
                        );
                    }
                    return unsupported(BreakKind::SuperCall, format!("super().{name}: not found"));
                }
                if let Some(attr) = self.dict_subclass_super_attr(receiver, &cls, name)? {
                    return Ok(attr);
                }
                let Some(real_receiver) = self.real_unpinned(receiver) else {
                    return unsupported(
                        BreakKind::SuperCall,
                        "super() on a value without a Python object",
                    );
                };
                // What super() finds depends on the receiver's class and the classes after
                // `cls` in its MRO: guard the receiver's type and its contents (a change to
                // any base changes the version tag of the classes derived from it).
                let receiver_type = real_receiver.get_type();
                if !real_receiver.is_instance_of::<pyo3::types::PyType>() {
                    self.guard_class(receiver_type.as_any(), name)?;
                    if let Some(s) = self.source(receiver) {
                        self.guards.add(
                            s,
                            super::guards::GuardKind::Type(OwnedRef::from_bound(
                                receiver_type.as_any(),
                            )),
                        );
                    }
                }
                let sup = py
                    .import_module("builtins")?
                    .getattr("super")?
                    .call1((&cls, &real_receiver))?;
                let attr = match sup.getattr(name) {
                    Ok(a) => a,
                    Err(err) => {
                        return unsupported(
                            BreakKind::SuperCall,
                            format!("super().{name} raised {err}"),
                        )
                    }
                };
                if attr.is_instance(&self.h.method_type)?
                    && attr.getattr("__self__")?.is(&real_receiver)
                {
                    let func = attr.getattr("__func__")?;
                    return Ok(self.add(
                        VarKind::Method {
                            receiver,
                            name: name.to_string(),
                            func: Some(OwnedRef::from_bound(&func)),
                        },
                        None,
                    ));
                }
                // `super().get(...)` in a dict subclass reaches dict's own lookup.
                if real_receiver.is_instance_of::<PyDict>()
                    && matches!(
                        name,
                        "get" | "keys" | "items" | "values" | "__getitem__" | "__contains__"
                    )
                    && attr.get_type().name()? == "builtin_function_or_method"
                {
                    return Ok(self.add(
                        VarKind::Method {
                            receiver,
                            name: name.to_string(),
                            func: None,
                        },
                        None,
                    ));
                }
                // Data found on a class after `cls`: read through that class, so that what it
                // holds (a mutable table) is guarded and not taken for a fresh object.
                let mut owner = None;
                let mut after = false;
                for klass in receiver_type.getattr("__mro__")?.try_iter()? {
                    let klass = klass?;
                    if !after {
                        after = klass.is(&cls);
                        continue;
                    }
                    if let Ok(found) = klass.getattr("__dict__")?.get_item(name) {
                        // Only the class's own object is read back through the class: what
                        // `super()` bound from it (a method-wrapper) is made anew each time.
                        if found.is(&attr) {
                            owner = Some(klass);
                        }
                        break;
                    }
                }
                let source = match owner.as_ref().map(|k| k.cast::<pyo3::types::PyType>()) {
                    Some(Ok(ty)) => Some(Rc::new(Source::Attr(
                        super::ops_objects::class_source(ty),
                        name.to_string(),
                    ))),
                    _ => None,
                };
                self.wrap(&attr, source)
            }
            // `it.__next__` / `it.__iter__` of an iterator the trace made: called, as
            // `next(it)` / `iter(it)` (see `iteration_dunder_call`).
            VarKind::Iter { .. } if name == "__next__" || name == "__iter__" => {
                Ok(self.method(obj, name, None))
            }
            // The object a method is bound to (`yield from next.__self__` in `heapq.merge`).
            &VarKind::Method { receiver, .. } if name == "__self__" => Ok(receiver),
            other @ (VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::DictView { .. }
            | VarKind::Null
            | VarKind::Method { .. }
            | VarKind::Iter { .. }
            | VarKind::Generator { .. }
            | VarKind::Lazy(_)
            | VarKind::Partial { .. }
            | VarKind::CellRef(_)
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)) => unsupported(
                BreakKind::UnsupportedOperation,
                format!(
                    "attribute {name:?} of {}",
                    super::translator::kind_name(other)
                ),
            ),
        }
    }

    /// The source of `value.name`. A module's submodules, parameters and buffers are read
    /// through its `_modules`/`_parameters`/`_buffers` dicts, as `nn.Module.__getattr__`
    /// does, so guards and generated code skip that Python-level `__getattr__`.
    fn attr_source(&self, value: &Bound<'py, PyAny>, base: Rc<Source>, name: &str) -> Rc<Source> {
        if value.is_instance(&self.h.module_type).unwrap_or(false) {
            if let Ok(dict) = value.getattr("__dict__") {
                let in_instance_dict = dict.contains(name).unwrap_or(true);
                if !in_instance_dict {
                    for table in super::helpers::MODULE_TABLES {
                        let holds = dict
                            .get_item(table)
                            .and_then(|t| t.contains(name))
                            .unwrap_or(false);
                        if holds {
                            let table = Rc::new(Source::Attr(base, table.to_string()));
                            return Rc::new(Source::Item(table, ItemKey::Str(name.to_string())));
                        }
                    }
                }
            }
        }
        Rc::new(Source::Attr(base, name.to_string()))
    }

    /// Whether `module.name` is found by `nn.Module.__getattr__` in its parameters, buffers
    /// or submodules, which the plain attribute stores a trace replays never touch.
    fn module_table_entry(&self, value: &Bound<'py, PyAny>, name: &str) -> CResult<bool> {
        if !value.is_instance(&self.h.module_type)? {
            return Ok(false);
        }
        let module_getattr = self.h.module_type.getattr("__getattr__")?;
        if !value.get_type().getattr("__getattr__")?.is(&module_getattr) {
            return Ok(false);
        }
        let dict = value.getattr("__dict__")?;
        for table in super::helpers::MODULE_TABLES {
            if dict
                .get_item(table)
                .and_then(|t| t.contains(name))
                .unwrap_or(false)
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Attributes of a symbolic tensor: metadata is constant (shapes are static), methods stay
    /// bound to the tensor.
    /// The class of the tensor `var` (None if it is not a tensor): a graph input's is its
    /// example's (the tensor guard checks the exact type: a Parameter stays a Parameter);
    /// what the graph computes is a Tensor.
    pub(super) fn tensor_class(&self, var: VarId) -> Option<Bound<'py, PyAny>> {
        let VarKind::Tensor { node, .. } = *self.kind(var) else {
            return None;
        };
        Some(match self.inputs.iter().find(|i| i.node == node) {
            Some(input) => input.example.bind(self.py).get_type().into_any(),
            None => self.h.tensor_type.clone(),
        })
    }

    fn tensor_attr(
        &mut self,
        tensor: VarId,
        fake: &Bound<'py, PyAny>,
        name: &str,
    ) -> CResult<VarId> {
        if name == "__class__" {
            if let Some(class) = self.tensor_class(tensor) {
                return self.wrap(&class, None);
            }
        }
        if name == "shape" {
            if let Some(sizes) = self.tensor_sizes(tensor, fake, false)? {
                return Ok(sizes);
            }
        }
        match name {
            "shape" | "dtype" | "device" | "ndim" | "is_cuda" | "is_sparse" | "layout"
            | "is_quantized" | "is_meta" | "is_nested" | "itemsize" => {
                let value = fake.getattr(name)?;
                let value = if name == "device" {
                    self.real_device(tensor, value)?
                } else {
                    value
                };
                Ok(self.constant(&value))
            }
            "requires_grad" => {
                let value = fake.getattr(name)?;
                Ok(self.constant(&value))
            }
            // The element count times the element size (symbolic when a size is).
            "nbytes" => {
                let count = self.tensor_method(tensor, "numel", Vec::new(), Vec::new())?;
                let size = self.constant(&fake.getattr("itemsize")?);
                let mul = self.h.operator.getattr("mul")?;
                self.apply_operator(&mul, vec![count, size])
            }
            // Views computed by a property: a `getattr` node (as TorchDynamo records them).
            "T" | "mT" | "H" | "mH" | "real" | "imag" => {
                let getattr = self.h.builtins.getattr("getattr")?;
                let attr = self.constant(&pyo3::types::PyString::new(self.py, name).into_any());
                self.graph_call(
                    super::graph::Op::CallFunction(OwnedRef::from_bound(&getattr)),
                    "getattr",
                    vec![tensor, attr],
                    Vec::new(),
                )
            }
            "grad" => self.tensor_grad(tensor),
            // The tensor's data without its autograd history: an alias of its storage
            // that does not require grad. A graph node (as TorchDynamo records it), so
            // in-place changes made through it reach the tensor when the graph runs, and the
            // aliasing checks see them by the fake's storage.
            "data" => {
                let get_data = self
                    .h
                    .torch
                    .getattr("_C")?
                    .getattr("_autograd")?
                    .getattr("_get_data_attr")?;
                self.graph_call(
                    super::graph::Op::CallFunction(OwnedRef::from_bound(&get_data)),
                    "_get_data_attr",
                    vec![tensor],
                    Vec::new(),
                )
            }
            _ => match fake.getattr(name) {
                Ok(attribute) if attribute.is_callable() => Ok(self.method(tensor, name, None)),
                Err(err) if err.is_instance_of::<pyo3::exceptions::PyAttributeError>(self.py) => {
                    self.missing_tensor_attr(tensor, name)
                }
                _ => unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("the tensor attribute .{name}"),
                ),
            },
        }
    }

    /// `tensor.name` where tensors have no such attribute: the `AttributeError` eager code
    /// gets, raised in the trace (so a `try`/`except AttributeError` or `hasattr`-style probe
    /// around it is traced), when that is certain on every call — the tensor is a plain
    /// `Tensor`/`Parameter` (its class is guarded by the tensor check) whose class has no such
    /// attribute, and, for a tensor the frame was given, whose own `__dict__` lacks it (guarded
    /// to stay so). A tensor made in the trace has no instance attributes (setting one breaks
    /// the graph).
    fn missing_tensor_attr(&mut self, tensor: VarId, name: &str) -> CResult<VarId> {
        let py = self.py;
        let give_up = || {
            unsupported(
                BreakKind::UnsupportedOperation,
                format!("the tensor attribute .{name}"),
            )
        };
        if !matches!(self.kind(tensor), VarKind::Tensor { .. }) {
            return give_up();
        }
        let input = self.tensor_given(tensor);
        let plain_tensor = self.h.tensor_type.clone();
        let class = match &input {
            Some((real, _)) => real.get_type().into_any(),
            None => plain_tensor.clone(),
        };
        let parameter = self.h.torch.getattr("nn")?.getattr("Parameter")?;
        let attribute = pyo3::types::PyString::new(py, name);
        if !(class.is(&plain_tensor) || class.is(&parameter))
            || super::guard_values::class_lookup(&class, &attribute).is_some()
        {
            return give_up();
        }
        if let Some((real, source)) = input {
            let has_own = super::guard_values::instance_dict_of(&real)
                .map(|dict| dict.contains(&attribute))
                .transpose()?
                .unwrap_or(false);
            if has_own {
                // An attribute the user set on the tensor (`t.scale = 2.0`, a function
                // `t.add_one = f`): read from it as from any object, guarded by its source.
                let value = real.getattr(name)?;
                let source = Rc::new(Source::Attr(source, name.to_string()));
                return self.wrap(&value, Some(source));
            }
            self.guards.add(
                source,
                super::guards::GuardKind::InstanceDictLacks(name.to_string()),
            );
        }
        let message = format!(
            "'{}' object has no attribute '{name}'",
            class.getattr("__name__")?
        );
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("name", name)?;
        let error = self
            .h
            .builtins
            .getattr("AttributeError")?
            .call((message.as_str(),), Some(&kwargs))?;
        self.raised(
            PyErr::from_value(error),
            format!("AttributeError: {message}"),
        )
    }

    /// Fake tensors report their device; keep it (the tensor guard pins it).
    fn real_device(&self, _tensor: VarId, device: Bound<'py, PyAny>) -> CResult<Bound<'py, PyAny>> {
        Ok(device)
    }

    pub(super) fn op_make_cell(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let slot = i as usize;
        let initial = f.locals.get(slot).copied().flatten();
        let cell = Rc::new(RefCell::new(initial));
        // A cell the frame's prologue makes (before its RESUME): the generated code, which
        // runs that prologue, has it too. A resume function makes its cells after RESUME, in
        // code the generated code does not run: those exist only in the trace.
        let resume = f
            .instructions
            .iter()
            .position(|ins| ins.opcode == dynamo_bytecode::opcode::Opcode::Resume);
        if f.is_root {
            let made_by_prologue = resume.is_some_and(|at| f.pc <= at);
            self.root_cells
                .insert(Rc::as_ptr(&cell) as usize, made_by_prologue.then_some(i));
        }
        f.cells.insert(slot, Cell::Traced(cell));
        Ok(Flow::Continue)
    }

    pub(super) fn op_load_closure(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let slot = i as usize;
        if f.is_root && !f.cells.contains_key(&slot) {
            // A free variable of the compiled frame handed on to a comprehension or a nested
            // function (a decorator's wrapper filtering its kwargs with a dict comprehension
            // over a captured name): a cell holding what the frame's own cell holds; from
            // here on the frame reads and writes it too.
            let Some(value) = f.locals.get(slot).copied().flatten() else {
                return unsupported(BreakKind::ClosureCell, "LOAD_CLOSURE of an empty cell");
            };
            let cell = Rc::new(RefCell::new(Some(value)));
            self.root_free_cells.insert(Rc::as_ptr(&cell) as usize, i);
            f.cells.insert(slot, Cell::Traced(cell));
        }
        let Some(cell) = f.cells.get(&slot).cloned() else {
            return unsupported(
                BreakKind::ClosureCell,
                "LOAD_CLOSURE of a cell the translator did not create",
            );
        };
        let id = self.add(VarKind::CellRef(cell), None);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_load_deref(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let slot = i as usize;
        let value = match f.cells.get(&slot).cloned() {
            Some(Cell::Traced(cell)) => match *cell.borrow() {
                Some(v) => v,
                None => return unsupported(BreakKind::ClosureCell, "reads an empty closure cell"),
            },
            // Written earlier in this trace (replayed after the graph).
            Some(Cell::Real(cell, _))
                if self
                    .mutated_attr(&cell.bind(self.py), "cell_contents")
                    .is_some() =>
            {
                match self.mutated_attr(&cell.bind(self.py), "cell_contents") {
                    Some(Some(v)) => v,
                    _ => return unsupported(BreakKind::ClosureCell, "reads an empty closure cell"),
                }
            }
            Some(Cell::Real(cell, cell_source)) => {
                let contents = match cell.bind(self.py).getattr("cell_contents") {
                    Ok(c) => c,
                    Err(_) => {
                        return unsupported(BreakKind::ClosureCell, "reads an empty closure cell")
                    }
                };
                let source = match cell_source {
                    Some(s) => Rc::new(Source::Attr(s, "cell_contents".into())),
                    None => Rc::new(Source::Cell(cell.clone())),
                };
                self.wrap(&contents, Some(source))?
            }
            // A free variable of the compiled frame itself: its value came in with the frame.
            None if f.is_root => match f.locals.get(slot).copied().flatten() {
                Some(v) => v,
                None => {
                    return unsupported(BreakKind::ClosureCell, "reads an unbound free variable")
                }
            },
            None => {
                return unsupported(
                    BreakKind::ClosureCell,
                    "reads a closure cell the translator does not know",
                )
            }
        };
        f.stack.push(value);
        Ok(Flow::Continue)
    }

    pub(super) fn op_store_deref(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        self.note_effect(None);
        let value = self.pop(f)?;
        match f.cells.get(&(i as usize)).cloned() {
            Some(Cell::Traced(cell)) => {
                if let Some(&slot) = self.root_free_cells.get(&(Rc::as_ptr(&cell) as usize)) {
                    // The compiled frame's own free variable (shared with the code that
                    // made its closure): written into the real cell after the graph.
                    if !self.rebuildable(value) {
                        return unsupported(
                            BreakKind::UnreplayableSideEffect,
                            "writes a free variable of the compiled frame with a value the \
                             generated code cannot make",
                        );
                    }
                    self.deref_stores.push((slot, value));
                }
                *cell.borrow_mut() = Some(value);
                Ok(Flow::Continue)
            }
            // A cell of a function from outside the trace (`nonlocal` in a closure it calls):
            // stored like an attribute, `cell.cell_contents = value`, replayed after the graph
            // through the cell's own source.
            // A free variable of the compiled frame itself (a closure compiled on its own):
            // later reads see the value, the generated code stores it into the frame's cell.
            None if f.is_root && f.locals.get(i as usize).is_some() && self.rebuildable(value) => {
                f.locals[i as usize] = Some(value);
                self.deref_stores.push((i, value));
                Ok(Flow::Continue)
            }
            // Only through the cell's source: which cell it is must be guarded. A function
            // or partial made in the trace is made again for the replay (a resume function
            // rebinding a closure's variable: `op = partial(f, dim=1)`).
            Some(Cell::Real(cell, Some(source)))
                if self.rebuildable(value)
                    || matches!(
                        self.kind(value),
                        VarKind::Function(_) | VarKind::Partial { .. }
                    ) =>
            {
                self.mutations.push(super::translator::Mutation {
                    source,
                    object: cell,
                    name: "cell_contents".into(),
                    value: Some(value),
                });
                Ok(Flow::Continue)
            }
            _ => unsupported(
                BreakKind::UnreplayableSideEffect,
                "writes a closure cell shared with code outside the trace",
            ),
        }
    }
}

/// Values that are guarded by value, as graph inputs, or item by item (not by identity).
fn h_is_simple(h: &super::helpers::Helpers<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(h.is_constant(value)?
        || value.is_instance(&h.tensor_type)?
        || value.get_type().is(&h.tuple_type)
        || value.get_type().is(&h.list_type)
        || value.get_type().is(&h.dict_type)
        || value.is_instance(&h.module_type)?
        || value.is_callable())
}
