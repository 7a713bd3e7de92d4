//! Methods of containers the trace holds — lists, tuples, dicts and their views, `os.environ`,
//! dict-like objects read through guarded lookups — and `dict.fromkeys`. Mutating methods are
//! traced on containers the trace built; on the frame's own they would be side effects to
//! replay.

use std::rc::Rc;

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::break_reasons::BreakKind;
use super::existing_tensor_keys::TensorKeyLookup;
use super::guards::GuardKind;
use super::source::Source;
use super::translator::{kind_name, unsupported, CResult, Tracer};
use super::vars::{dict_set, DictViewKind, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// `dict.fromkeys(keys[, value])` (or `OrderedDict`'s) over constant keys: a traced dict
    /// of that class whose entries all hold the one `value` (the same object, as in Python).
    pub(super) fn dict_fromkeys(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: Vec<VarId>,
    ) -> CResult<VarId> {
        let py = self.py;
        let keys = self.items_of(args[0])?;
        let value = match args.get(1) {
            Some(&v) => v,
            None => self.constant(&py.None().into_bound(py)),
        };
        let seen = PyDict::new(py);
        let mut entries = Vec::with_capacity(keys.len());
        for key in keys {
            if matches!(self.kind(key), VarKind::Tensor { .. }) {
                let k = self.tensor_key(key)?;
                if !seen.contains(&k)? {
                    seen.set_item(&k, py.None())?;
                    entries.push((OwnedRef::from_bound(&k), value));
                }
                continue;
            }
            let VarKind::Const(k) = self.kind(key) else {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!(
                        "dict.fromkeys() with a key that is {}",
                        kind_name(self.kind(key))
                    ),
                );
            };
            let k = k.clone();
            if !self.h.is_constant(&k.bind(py).clone())? {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "dict.fromkeys() with a key that is not a constant",
                );
            }
            // A key given twice keeps its first place (and the one value).
            if seen.contains(k.bind(py))? {
                continue;
            }
            seen.set_item(k.bind(py), py.None())?;
            entries.push((k, value));
        }
        let dict = self.add(VarKind::Dict(entries), None);
        if !cls.is(&self.h.dict_type) {
            self.dict_classes.insert(dict, OwnedRef::from_bound(cls));
        }
        Ok(dict)
    }

    /// `dict(...)` or `collections.OrderedDict(...)` from nothing, a dict, pairs and keywords:
    /// a traced dict (of the class given). None when the arguments are of another kind (a
    /// real mapping object), left to the caller.
    pub(super) fn construct_dict(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        if args.len() > 1 {
            return Ok(None);
        }
        // A key given twice keeps its first place and takes the last value.
        let mut entries: Vec<(OwnedRef, VarId)> = Vec::new();
        if let Some(&arg) = args.first() {
            match self.kind(arg) {
                VarKind::Dict(from) => {
                    for (k, v) in from.clone() {
                        dict_set(py, &mut entries, k, v);
                    }
                }
                VarKind::List(_)
                | VarKind::Tuple(_)
                | VarKind::Iter { .. }
                | VarKind::Generator { .. }
                | VarKind::Lazy(_)
                | VarKind::DictView { .. } => {
                    for pair in self.items_of(arg)? {
                        let kv = match self.kind(pair) {
                            VarKind::Tuple(kv) | VarKind::List(kv) if kv.len() == 2 => {
                                (kv[0], kv[1])
                            }
                            VarKind::Const(c) if c.bind(py).len().ok() == Some(2) => {
                                let c = c.bind(py).clone();
                                let key = self.constant(&c.get_item(0)?);
                                let value = self.constant(&c.get_item(1)?);
                                (key, value)
                            }
                            other @ (VarKind::Tensor { .. }
                            | VarKind::Unrealized(_)
                            | VarKind::Symbolic { .. }
                            | VarKind::Slice(_)
                            | VarKind::Const(_)
                            | VarKind::Object(_)
                            | VarKind::Tuple(_)
                            | VarKind::List(_)
                            | VarKind::Dict(_)
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
                            | VarKind::NdArray(_)) => {
                                return unsupported(
                                    BreakKind::UnsupportedOperation,
                                    format!(
                                        "{}() from an item that is {}",
                                        describe_class(cls),
                                        kind_name(other)
                                    ),
                                )
                            }
                        };
                        let key = self.constant_key(kv.0, cls)?;
                        dict_set(py, &mut entries, key, kv.1);
                    }
                }
                _ => return Ok(None),
            }
        }
        for (name, value) in kwargs {
            let key = OwnedRef::from_bound(pyo3::types::PyString::new(py, name).as_any());
            dict_set(py, &mut entries, key, *value);
        }
        let id = self.add(VarKind::Dict(entries), None);
        if !cls.is(&self.h.dict_type) {
            self.dict_classes.insert(id, OwnedRef::from_bound(cls));
        }
        Ok(Some(id))
    }

    /// `collections.defaultdict(factory, ...)`: a traced dict (see `construct_dict`) whose
    /// missing keys get `factory()` when read (`subscript`). None for other classes.
    pub(super) fn construct_defaultdict(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let defaultdict = self
            .py
            .import_module("collections")?
            .getattr("defaultdict")?;
        if !cls.is(&defaultdict) {
            return Ok(None);
        }
        let Some((&factory, rest)) = args.split_first() else {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "collections.defaultdict() without a factory",
            );
        };
        let no_factory =
            matches!(self.kind(factory), VarKind::Const(c) if c.bind(self.py).is_none());
        if !no_factory && !self.is_callable(factory)? {
            return self.raise_builtin(
                "TypeError",
                pyo3::types::PyString::new(self.py, "first argument must be callable or None")
                    .into_any(),
            );
        }
        let Some(dict) = self.construct_dict(cls, rest, kwargs)? else {
            return Ok(None);
        };
        if !no_factory {
            self.dict_defaults.insert(dict, factory);
        }
        Ok(Some(dict))
    }

    /// The key a traced dict can hold for `key`: a hashable constant, or a tensor's stand-in.
    fn constant_key(&mut self, key: VarId, cls: &Bound<'py, PyAny>) -> CResult<OwnedRef> {
        match self.kind(key) {
            VarKind::Const(k) if self.h.is_constant(&k.bind(self.py).clone())? => Ok(k.clone()),
            VarKind::Tensor { .. } => Ok(OwnedRef::from_bound(&self.tensor_key(key)?)),
            other @ (VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
            | VarKind::Tuple(_)
            | VarKind::List(_)
            | VarKind::Dict(_)
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
                BreakKind::UnsupportedOperation,
                format!(
                    "{}() with a key that is {}",
                    describe_class(cls),
                    kind_name(other)
                ),
            ),
        }
    }

    /// Methods of containers built or read by the trace. Mutating methods are allowed on
    /// containers the trace built (no source); mutating the frame's own would be a side
    /// effect to replay, which is not supported yet.
    pub(super) fn container_method(
        &mut self,
        receiver: VarId,
        name: &str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        if matches!(self.kind(receiver), VarKind::Generator { .. }) {
            return self.generator_method(receiver, name, &args, &kwargs);
        }
        if let Some(result) = self.named_tuple_method(receiver, name, &args, &kwargs)? {
            return Ok(result);
        }
        // Dict methods that take keywords (`update(**kw)`, `move_to_end(k, last=False)`).
        let dict_keywords = matches!(name, "update" | "move_to_end" | "popitem")
            && matches!(self.kind(receiver), VarKind::Dict(_));
        if name == "sort" && args.is_empty() && matches!(self.kind(receiver), VarKind::List(_)) {
            // `list.sort(*, key=None, reverse=False)`, in place.
            if !self.changeable_container(receiver) {
                return unsupported(
                    BreakKind::UnreplayableSideEffect,
                    "sort() of a list that cannot be changed",
                );
            }
            let items = self.items_of(receiver)?;
            let sorted = self.sorted_items(items, &kwargs)?;
            self.may_change_container(receiver, "sort")?;
            if let VarKind::List(items) = &mut self.vars[receiver.0 as usize].kind {
                *items = sorted;
            }
            return Ok(self.constant(&py.None().into_bound(py)));
        }
        if !kwargs.is_empty() && !dict_keywords {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("keyword arguments to {name}()"),
            );
        }
        // Made in the trace, or an existing list/dict whose final contents are replayed.
        let changeable = self.changeable_container(receiver);
        let none = || py.None().into_bound(py);
        let environ = py.import_module("os")?.getattr("environ")?;
        if matches!(self.kind(receiver), VarKind::Object(o) if o.bind(py).is(&environ)) {
            return self.environ_lookup(receiver, &environ, name, &args);
        }
        match (self.kind(receiver), name) {
            (VarKind::Dict(_), "get" | "pop" | "__getitem__") => {
                let key = self.key_value(args[0])?;
                self.check_hashable(&key)?;
                let entries = match self.kind(receiver) {
                    VarKind::Dict(entries) => entries.clone(),
                    _ => Vec::new(),
                };
                let position = entries
                    .iter()
                    .position(|(k, _)| k.bind(py).eq(&key).unwrap_or(false));
                let found = position.map(|i| entries[i].1);
                if let (true, Some(at)) = (name == "pop", position) {
                    self.may_change_container(receiver, "dict.pop")?;
                    self.note_dict_removal(receiver);
                    if let VarKind::Dict(entries) = &mut self.vars[receiver.0 as usize].kind {
                        entries.remove(at);
                    }
                }
                match (found, args.get(1)) {
                    (Some(v), _) => Ok(v),
                    (None, Some(&default)) => Ok(default),
                    (None, None) if name == "get" => Ok(self.constant(&none())),
                    // `d.__getitem__(k)` of a defaultdict runs its `__missing__`, as `d[k]`.
                    (None, None)
                        if name == "__getitem__" && self.dict_defaults.contains_key(&receiver) =>
                    {
                        self.subscript(receiver, args[0])
                    }
                    (None, None) => self.raise_key_error(key),
                }
            }
            (VarKind::Dict(_), "keys" | "values" | "items") => {
                let which = match name {
                    "keys" => DictViewKind::Keys,
                    "values" => DictViewKind::Values,
                    _ => DictViewKind::Items,
                };
                Ok(self.add(
                    VarKind::DictView {
                        dict: receiver,
                        which,
                    },
                    None,
                ))
            }
            (VarKind::Dict(entries), "copy") => {
                let entries = entries.clone();
                let copy = self.add(VarKind::Dict(entries), None);
                if let Some(factory) = self.dict_defaults.get(&receiver).copied() {
                    self.dict_defaults.insert(copy, factory);
                }
                if let Some(cls) = self.class_kept_by_copy(receiver)? {
                    self.dict_classes.insert(copy, cls);
                }
                Ok(copy)
            }
            (VarKind::Dict(_), "move_to_end" | "popitem") if changeable => {
                self.dict_reorder(receiver, name, &args, &kwargs)
            }
            (VarKind::Dict(_), "update" | "setdefault") if changeable => {
                self.may_change_container(receiver, name)?;
                if name == "update" {
                    // `d.update([other], **kwargs)`: a dict or pairs, then the keywords.
                    if args.len() > 1 {
                        return unsupported(
                            BreakKind::ExceptionWhileTracing,
                            "dict.update with more than one positional argument",
                        );
                    }
                    let mut new =
                        match args.first().map(|&a| (a, self.kind(a))) {
                            None => Vec::new(),
                            Some((_, VarKind::Dict(new))) => new.clone(),
                            Some((other, _)) => {
                                // Pairs, as `dict(other)` reads them.
                                let dict_type = self.h.dict_type.clone();
                                let made = self.construct_dict(&dict_type, &[other], &[])?;
                                match made.map(|d| self.kind(d)) {
                                    Some(VarKind::Dict(pairs)) => pairs.clone(),
                                    _ => return unsupported(
                                        BreakKind::UnsupportedOperation,
                                        "dict.update from something that is not a dict or pairs",
                                    ),
                                }
                            }
                        };
                    for (k, v) in &kwargs {
                        new.push((
                            OwnedRef::from_bound(&pyo3::types::PyString::new(py, k).into_any()),
                            *v,
                        ));
                    }
                    if let VarKind::Dict(entries) = &mut self.vars[receiver.0 as usize].kind {
                        for (k, v) in new {
                            dict_set(py, entries, k, v);
                        }
                    }
                    return Ok(self.constant(&none()));
                }
                let key = self.key_value(args[0])?;
                self.check_hashable(&key)?;
                let default = match args.get(1) {
                    Some(&d) => d,
                    None => self.constant(&none()),
                };
                if let VarKind::Dict(entries) = &mut self.vars[receiver.0 as usize].kind {
                    if let Some((_, v)) = entries
                        .iter()
                        .find(|(k, _)| k.bind(py).eq(&key).unwrap_or(false))
                    {
                        return Ok(*v);
                    }
                    entries.push((OwnedRef::from_bound(&key), default));
                }
                Ok(default)
            }
            (VarKind::List(_), "append" | "extend" | "insert" | "pop" | "clear" | "reverse")
                if changeable =>
            {
                self.may_change_container(receiver, name)?;
                let new_items = if name == "extend" {
                    Some(self.items_of(args[0])?)
                } else {
                    None
                };
                let index = match (name, args.first()) {
                    ("insert" | "pop", Some(&i)) => Some(self.python_value(i)?.extract::<i64>()?),
                    _ => None,
                };
                let VarKind::List(items) = &mut self.vars[receiver.0 as usize].kind else {
                    unreachable!()
                };
                let normalize = |i: i64, len: usize| -> usize {
                    if i < 0 {
                        (len as i64 + i).max(0) as usize
                    } else {
                        (i as usize).min(len)
                    }
                };
                let mut popped = None;
                match name {
                    "append" => items.push(args[0]),
                    "extend" => items.extend(new_items.expect("extend items")),
                    "insert" => {
                        let at = normalize(index.unwrap_or(0), items.len());
                        items.insert(at, args[1]);
                    }
                    "pop" => {
                        if items.is_empty() {
                            let message = pyo3::types::PyString::new(py, "pop from empty list");
                            return self.raise_builtin("IndexError", message.into_any());
                        }
                        let at = index.map_or(items.len() - 1, |i| {
                            normalize(i, items.len()).min(items.len() - 1)
                        });
                        popped = Some(items.remove(at));
                    }
                    "clear" => items.clear(),
                    _ => items.reverse(),
                }
                Ok(match popped {
                    Some(v) => v,
                    None => self.constant(&none()),
                })
            }
            (VarKind::List(_), "remove") if changeable && args.len() == 1 => {
                // The first item that is or equals the value, found by Python's own
                // `list.index` on the values (a tensor's `==` is elementwise: a graph break).
                if self.contains_tensor(receiver) || self.contains_tensor(args[0]) {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        "remove() on a list of tensors, or of a tensor",
                    );
                }
                let seq = self.python_value(receiver)?;
                let value = self.python_value(args[0])?;
                let at: usize = match seq.call_method1("index", (value,)) {
                    Ok(i) => i.extract()?,
                    Err(err) if err.is_instance_of::<pyo3::exceptions::PyValueError>(py) => {
                        let message =
                            pyo3::types::PyString::new(py, "list.remove(x): x not in list");
                        return self.raise_builtin("ValueError", message.into_any());
                    }
                    Err(err) => return self.raised(err, "list.remove raised while tracing"),
                };
                self.may_change_container(receiver, name)?;
                if let VarKind::List(items) = &mut self.vars[receiver.0 as usize].kind {
                    items.remove(at);
                }
                Ok(self.constant(&none()))
            }
            (VarKind::List(items) | VarKind::Tuple(items), "index" | "count" | "copy") => {
                if name == "copy" {
                    let items = items.clone();
                    return Ok(self.add(VarKind::List(items), None));
                }
                if self.contains_tensor(receiver) {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("{name}() on a sequence of tensors"),
                    );
                }
                let seq = self.python_value(receiver)?;
                match seq.call_method1(name, self.python_args(&args)?) {
                    Ok(result) => Ok(self.constant(&result)),
                    // `index` of a value not there: raised in the trace.
                    Err(err) => self.raised(err, format!("{name}() raised while tracing")),
                }
            }
            (
                VarKind::Instance {
                    model_output: true, ..
                },
                "to_tuple" | "values" | "keys" | "items" | "get",
            ) => {
                let items = self.model_output_items(receiver);
                let string = |this: &mut Self, k: &str| {
                    this.constant(&pyo3::types::PyString::new(py, k).into_any())
                };
                match name {
                    "to_tuple" | "values" => {
                        let values = items.into_iter().map(|(_, v)| v).collect();
                        Ok(self.add(VarKind::Tuple(values), None))
                    }
                    "keys" => {
                        let keys = items.iter().map(|(k, _)| string(self, k)).collect();
                        Ok(self.add(VarKind::Tuple(keys), None))
                    }
                    "items" => {
                        let mut pairs = Vec::new();
                        for (k, v) in items {
                            let k = string(self, &k);
                            pairs.push(self.add(VarKind::Tuple(vec![k, v]), None));
                        }
                        Ok(self.add(VarKind::Tuple(pairs), None))
                    }
                    _ => {
                        let key: String = self.python_value(args[0])?.extract()?;
                        match (items.iter().find(|(k, _)| *k == key), args.get(1)) {
                            (Some((_, v)), _) => Ok(*v),
                            (None, Some(&default)) => Ok(default),
                            (None, None) => Ok(self.constant(&none())),
                        }
                    }
                }
            }
            (
                VarKind::Object(dict),
                "get" | "__getitem__" | "__contains__" | "keys" | "items" | "values",
            ) => {
                let dict = dict.bind(py).clone();
                self.dict_object_lookup(receiver, &dict, name, &args)
            }
            (other, _) => unsupported(
                BreakKind::UnsupportedCall,
                format!("the method {name}() of {}", kind_name(other)),
            ),
        }
    }

    /// A method a subclass of a named tuple defines in Python (`class Pair(namedtuple(...)):
    /// def total(self): ...`), inlined with the tuple as `self`; None for other methods (the
    /// tuple's own, and those `namedtuple` writes).
    fn named_tuple_method(
        &mut self,
        receiver: VarId,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let Some((cls, attr)) = self.named_tuple_lookup(receiver, name)? else {
            return Ok(None);
        };
        let from_collections = attr
            .getattr("__module__")
            .is_ok_and(|m| m.to_string() == "collections");
        if from_collections && matches!(name, "_replace" | "_asdict") {
            return self.named_tuple_helper(receiver, &cls, name, args, kwargs);
        }
        let own = attr.is_instance(&self.h.function_type)? && !from_collections;
        if !own {
            return Ok(None);
        }
        self.guard_class(&cls, name)?;
        let mut all = vec![receiver];
        all.extend_from_slice(args);
        self.call_python(&attr, all, kwargs.to_vec()).map(Some)
    }

    /// The class of the named tuple `id` and what `name` finds on it statically (without
    /// running a descriptor), or None (not a named tuple, or nothing of that name).
    fn named_tuple_lookup(
        &self,
        id: VarId,
        name: &str,
    ) -> CResult<Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
        let py = self.py;
        let Some(cls) = self.tuple_classes.get(&id) else {
            return Ok(None);
        };
        let cls = cls.bind(py).clone();
        Ok(py
            .import_module("inspect")?
            .call_method1("getattr_static", (&cls, name))
            .ok()
            .map(|attr| (cls, attr)))
    }

    /// `obj.name` on a list, tuple or dict tracker, past what the class defines in Python:
    /// a method of the container (bound to the tracker) when its class has `name`; else the
    /// `AttributeError` eager code gets (raised in the trace, so `try`/`except` and
    /// `hasattr`-style probes see it), when instances of the class cannot have attributes
    /// of their own (no `__dict__`: `tuple`, `list`, `dict`, a `namedtuple`'s class).
    /// An instance of a subclass with a `__dict__` may have one: the graph breaks there.
    pub(super) fn container_attr(&mut self, obj: VarId, name: &str) -> CResult<VarId> {
        let py = self.py;
        let cls = match self.kind(obj) {
            VarKind::Dict(_) => self
                .dict_classes
                .get(&obj)
                .map(|c| c.bind(py).clone())
                .unwrap_or_else(|| self.h.dict_type.clone()),
            VarKind::List(_) => self
                .list_classes
                .get(&obj)
                .map(|c| c.bind(py).clone())
                .unwrap_or_else(|| self.h.list_type.clone()),
            _ => self.class_of_sequence(obj),
        };
        let key = pyo3::types::PyString::intern(py, name);
        if super::guard_values::class_lookup(&cls, &key).is_some() {
            return Ok(self.method(obj, name, None));
        }
        if cls.getattr("__dictoffset__")?.extract::<isize>()? != 0 {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!(
                    "reading .{name} of a {} (an attribute of the instance)",
                    super::ops_call::describe(&cls)
                ),
            );
        }
        let message = format!(
            "'{}' object has no attribute '{name}'",
            cls.getattr("__name__")?
        );
        self.raise_builtin(
            "AttributeError",
            pyo3::types::PyString::new(py, &message).into_any(),
        )
    }

    /// The class of a tuple or list tracker: a named tuple's, else `tuple` or `list`.
    pub(super) fn class_of_sequence(&self, id: VarId) -> Bound<'py, PyAny> {
        match (self.tuple_classes.get(&id), self.kind(id)) {
            (Some(cls), _) => cls.bind(self.py).clone(),
            (None, VarKind::List(_)) => self.h.list_type.clone(),
            (None, _) => self.h.tuple_type.clone(),
        }
    }

    /// `nt.name` for a named tuple of a class that defines `name` in Python (a property, a
    /// method, a static or class method, class data — `namedtuple`'s own helpers and the
    /// tuple's methods are left to the method path): bound as on an instance, the class
    /// entry guarded. None for other values and names.
    pub(super) fn named_tuple_class_attr(
        &mut self,
        obj: VarId,
        name: &str,
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let Some((cls, attr)) = self.named_tuple_lookup(obj, name)? else {
            return Ok(None);
        };
        // What `namedtuple` writes (`_make`, `_replace`, `_asdict`, `__repr__`) and the
        // tuple's own methods (C descriptors) stay with the method path.
        let builtins = py.import_module("builtins")?;
        let function = if attr.is_instance(&builtins.getattr("property")?)? {
            Some(attr.getattr("fget")?)
        } else if attr.is_instance(&builtins.getattr("staticmethod")?)?
            || attr.is_instance(&builtins.getattr("classmethod")?)?
        {
            Some(attr.getattr("__func__")?)
        } else if attr.is_instance(&self.h.function_type)? {
            Some(attr.clone())
        } else {
            None
        };
        let defined_by_user = match &function {
            Some(f) => {
                f.is_instance(&self.h.function_type)?
                    && f.getattr("__module__")
                        .is_ok_and(|m| m.to_string() != "collections")
            }
            // Class data; not a descriptor written in C (a field's accessor, a slot).
            None => !attr.get_type().hasattr("__get__")?,
        };
        if !defined_by_user {
            return Ok(None);
        }
        self.guard_class(&cls, name)?;
        self.bind_class_attribute(obj, &cls, name, &attr).map(Some)
    }

    /// `nt._replace(field=value, ...)` (a new tuple of the same class, the other fields kept)
    /// and `nt._asdict()` (a dict from field names) of a named tuple the trace holds, as
    /// `collections.namedtuple` defines them (the class's entry is guarded).
    fn named_tuple_helper(
        &mut self,
        receiver: VarId,
        cls: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let (Some(fields), VarKind::Tuple(items)) = (
            self.tuple_fields.get(&receiver).cloned(),
            self.kind(receiver),
        ) else {
            return Ok(None);
        };
        let mut items = items.clone();
        if !args.is_empty() || (name == "_asdict" && !kwargs.is_empty()) {
            return Ok(None); // Python's TypeError: the method as it is
        }
        self.guard_class(cls, name)?;
        if name == "_asdict" {
            let entries = fields
                .iter()
                .zip(&items)
                .map(|(f, &v)| (OwnedRef::from_bound(PyString::new(py, f).as_any()), v))
                .collect();
            return Ok(Some(self.add(VarKind::Dict(entries), None)));
        }
        let unexpected: Vec<&str> = kwargs
            .iter()
            .filter(|(k, _)| !fields.contains(k))
            .map(|(k, _)| k.as_str())
            .collect();
        if !unexpected.is_empty() {
            let names = pyo3::types::PyList::new(py, unexpected)?.repr()?;
            let message = format!("Got unexpected field names: {names}");
            return self.raise_builtin("ValueError", PyString::new(py, &message).into_any());
        }
        for (key, value) in kwargs {
            if let Some(i) = fields.iter().position(|f| f == key) {
                items[i] = *value;
            }
        }
        let id = self.add(VarKind::Tuple(items), None);
        self.tuple_fields.insert(id, fields);
        self.tuple_classes.insert(id, OwnedRef::from_bound(cls));
        Ok(Some(id))
    }

    /// `os.environ.get(k)`, `os.environ[k]`, `k in os.environ`: the answer is guarded (the
    /// variable's value, or its absence), so setting the variable later recompiles.
    pub(super) fn environ_lookup(
        &mut self,
        receiver: VarId,
        environ: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
    ) -> CResult<VarId> {
        let py = self.py;
        let Some(source) = self.source(receiver) else {
            return unsupported(
                BreakKind::Environment,
                "os.environ reached without a source",
            );
        };
        if !matches!(name, "get" | "__getitem__" | "__contains__") || args.is_empty() {
            return unsupported(BreakKind::Environment, format!("os.environ.{name}()"));
        }
        let key = self.python_value(args[0])?;
        if !key.is_exact_instance_of::<pyo3::types::PyString>() {
            return unsupported(
                BreakKind::Environment,
                "os.environ looked up with a key that is not a str",
            );
        }
        let present = environ.contains(&key)?;
        if name == "__contains__" || !present {
            self.guards.add(
                source.clone(),
                GuardKind::Contains(OwnedRef::from_bound(&key), present),
            );
        }
        match (name, present) {
            ("__contains__", _) => {
                Ok(self.constant(&present.into_pyobject(py)?.to_owned().into_any()))
            }
            (_, true) => {
                let value = environ.get_item(&key)?;
                let item_source = Rc::new(Source::Item(source, super::source::ItemKey::of(&key)));
                self.wrap(&value, Some(item_source))
            }
            ("get", false) => match args.get(1) {
                Some(&default) => Ok(default),
                None => Ok(self.constant(&py.None().into_bound(py))),
            },
            _ => unsupported(
                BreakKind::Environment,
                format!("os.environ[{key}]: the variable is not set"),
            ),
        }
    }

    /// Read-only lookups on a real dict object: its keys are guarded, and each value read
    /// comes through an item source, so a later change to the dict recompiles.
    pub(super) fn dict_object_lookup(
        &mut self,
        receiver: VarId,
        dict: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
    ) -> CResult<VarId> {
        let py = self.py;
        if let Some(&key) = args.first() {
            // A tensor key, found by identity (an optimizer's state, `{p: lr}`).
            if name == "__contains__" {
                if let Some(found) = self.existing_dict_has_tensor(receiver, key)? {
                    return Ok(self.constant(&found.into_pyobject(py)?.to_owned().into_any()));
                }
            } else if name == "get" {
                match self.existing_dict_tensor_lookup(receiver, key)? {
                    Some(TensorKeyLookup::Found(value)) => return Ok(value),
                    Some(TensorKeyLookup::Missing) => {
                        return Ok(match args.get(1) {
                            Some(&default) => default,
                            None => self.constant(&py.None().into_bound(py)),
                        })
                    }
                    None => {}
                }
            }
        }
        let Some(source) = self.source(receiver) else {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!("{name}() on a dict that is not an input of the frame"),
            );
        };
        // The values are guarded (and loaded) through item sources, which read `d[key]`: with
        // a `__getitem__` of the dict's class written in Python, that is not the dict's own
        // lookup, which is what these methods read (`super().__getitem__(key)` inside such a
        // `__getitem__`, `d.get(key)`): the values are then guarded through the dict's own
        // table (`Source::DictItem`), and not loaded by the generated code. An `__iter__` in
        // Python would make the keys another question too: refused.
        let defines_in_python = |dunder: &str| {
            let key = pyo3::types::PyString::new(py, dunder);
            super::guard_values::class_lookup(dict.get_type().as_any(), &key)
                .is_some_and(|found| found.is_instance(&self.h.function_type).unwrap_or(true))
        };
        // A class that also writes its items through Python (`__setitem__`, `__setattr__`:
        // transformers' `ModelOutput` keeps fields and items in step) still stores them in
        // the table these methods read.
        let own_lookup = defines_in_python("__getitem__");
        let refused = ["__iter__"].into_iter().find(|&d| defines_in_python(d));
        if let Some(dunder) = refused {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!(
                    "{name}() of a dict whose class defines {dunder} in Python (read through \
                     the class, not the dict's own table)"
                ),
            );
        }
        let keys = PyTuple::new(py, dict.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
        // Strings and exact ints (a hook table's handle ids) compare and hash without user
        // code, so the keys guard can compare them on every call.
        if !keys.iter().all(|k| {
            k.is_instance_of::<pyo3::types::PyString>()
                || k.is_exact_instance_of::<pyo3::types::PyInt>()
        }) {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("{name}() on a dict with keys that are not strings or ints"),
            );
        }
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(dict.get_type().as_any())),
        );
        self.guards.add(
            source.clone(),
            GuardKind::Keys(OwnedRef::from_bound(keys.as_any())),
        );
        let item = |this: &mut Self, key: &Bound<'py, PyAny>| -> CResult<VarId> {
            let key_of = super::source::ItemKey::of(key);
            let (value, item_source) = if own_lookup {
                let table = dict.cast::<PyDict>().map_err(PyErr::from)?;
                let value = table
                    .get_item(key)?
                    .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(key.clone().unbind()))?;
                (value, Source::DictItem(source.clone(), key_of))
            } else {
                (dict.get_item(key)?, Source::Item(source.clone(), key_of))
            };
            this.wrap(&value, Some(Rc::new(item_source)))
        };
        match name {
            "keys" => {
                let items = keys.iter().map(|k| self.constant(&k)).collect();
                Ok(self.add(VarKind::Tuple(items), None))
            }
            "values" | "items" => {
                let mut out = Vec::new();
                for key in keys.iter() {
                    let value = item(self, &key)?;
                    out.push(if name == "values" {
                        value
                    } else {
                        let k = self.constant(&key);
                        self.add(VarKind::Tuple(vec![k, value]), None)
                    });
                }
                Ok(self.add(VarKind::Tuple(out), None))
            }
            _ => {
                let Some(&key_var) = args.first() else {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("{name}() without a key"),
                    );
                };
                let key = self.python_value(key_var)?;
                let present = keys.contains(&key)?;
                match (name, present) {
                    ("__contains__", _) => {
                        Ok(self.constant(&present.into_pyobject(py)?.to_owned().into_any()))
                    }
                    (_, true) => item(self, &key),
                    ("get", false) => match args.get(1) {
                        Some(&default) => Ok(default),
                        None => Ok(self.constant(&py.None().into_bound(py))),
                    },
                    // The keys are guarded: the key stays missing (a class with
                    // `__missing__` would answer it instead).
                    ("__getitem__", false) if !dict.get_type().hasattr("__missing__")? => {
                        self.raise_key_error(key)
                    }
                    _ => unsupported(
                        BreakKind::ExceptionWhileTracing,
                        format!("missing key {key} while tracing"),
                    ),
                }
            }
        }
    }

    /// `OrderedDict.move_to_end(key, last=True)`, and `popitem()` of a dict (the last entry)
    /// or an OrderedDict (`last=False`: the first), on a dict tracker the trace may change.
    fn dict_reorder(
        &mut self,
        receiver: VarId,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        let py = self.py;
        let ordered = self.dict_classes.get(&receiver).is_some_and(|cls| {
            cls.bind(py)
                .cast::<pyo3::types::PyType>()
                .is_ok_and(|t| t.is_subclass(&self.h.ordered_dict_type).unwrap_or(false))
        });
        if name == "move_to_end" && !ordered {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "move_to_end on a dict that is not an OrderedDict",
            );
        }
        // `last` positionally after the key (move_to_end) or first (popitem), or by keyword.
        let key_args = usize::from(name == "move_to_end");
        let last_arg = args
            .get(key_args)
            .copied()
            .or_else(|| kwargs.iter().find(|(k, _)| k == "last").map(|(_, v)| *v));
        if args.len() > key_args + 1
            || args.len() < key_args
            || kwargs.iter().any(|(k, _)| k != "last")
            || (last_arg.is_some() && !ordered)
        {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("{name} with these arguments"),
            );
        }
        let last = match last_arg {
            Some(l) => self.truth(l)?,
            None => true,
        };
        let key = match args.first() {
            Some(&k) if name == "move_to_end" => Some(self.key_value(k)?),
            _ => None,
        };
        if let Some(key) = &key {
            self.check_hashable(key)?;
        }
        self.may_change_container(receiver, name)?;
        self.note_dict_removal(receiver);
        let VarKind::Dict(entries) = &mut self.vars[receiver.0 as usize].kind else {
            return unsupported(
                BreakKind::Internal,
                "internal: reordering a dict that is not one",
            );
        };
        match key {
            Some(key) => {
                let Some(at) = entries
                    .iter()
                    .position(|(k, _)| k.bind(py).eq(&key).unwrap_or(false))
                else {
                    return self.raise_key_error(key);
                };
                let entry = entries.remove(at);
                if last {
                    entries.push(entry);
                } else {
                    entries.insert(0, entry);
                }
                Ok(self.constant(&py.None().into_bound(py)))
            }
            None => {
                if entries.is_empty() {
                    let message = if ordered {
                        "dictionary is empty"
                    } else {
                        "popitem(): dictionary is empty"
                    };
                    let message = pyo3::types::PyString::new(py, message).into_any();
                    return self.raise_builtin("KeyError", message);
                }
                let (k, v) = if last {
                    entries.pop().expect("not empty")
                } else {
                    entries.remove(0)
                };
                let k = self.dict_key(k)?;
                Ok(self.add(VarKind::Tuple(vec![k, v]), None))
            }
        }
    }
}

/// `dict`, `OrderedDict`: the class's name, for messages.
fn describe_class(cls: &Bound<'_, PyAny>) -> String {
    cls.getattr("__name__")
        .and_then(|n| n.extract())
        .unwrap_or_else(|_| "dict".into())
}

/// The class when `obj` is `fromkeys` bound to `dict` or `OrderedDict` itself (a subclass's
/// would make an instance of the subclass, which may do more), else None.
pub(super) fn dict_fromkeys_class<'py>(
    obj: &Bound<'py, PyAny>,
    dict_type: &Bound<'py, PyAny>,
    ordered_dict_type: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyAny>> {
    let owner = obj.getattr("__self__").ok()?;
    let plain = owner.is(dict_type) || owner.is(ordered_dict_type);
    let fromkeys = obj
        .getattr("__name__")
        .is_ok_and(|n| n.to_string() == "fromkeys");
    (plain && fromkeys).then_some(owner)
}
