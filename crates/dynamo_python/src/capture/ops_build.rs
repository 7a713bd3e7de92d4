//! Building and unpacking containers: `BUILD_*`, `LIST_APPEND`/`EXTEND`, `MAP_ADD`,
//! `DICT_UPDATE`/`MERGE`, `UNPACK_SEQUENCE`/`EX`, and string formatting of known values.
//! Containers built in the trace are trackers of trackers, so they may hold tensors.

use super::break_reasons::BreakKind;
use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::translator::{kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    pub(super) fn op_build_tuple(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let items = self.popn(f, n as usize)?;
        let id = self.add(VarKind::Tuple(items), None);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_build_list(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let items = self.popn(f, n as usize)?;
        let id = self.add(VarKind::List(items), None);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_build_map(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let flat = self.popn(f, 2 * n as usize)?;
        // A key given twice keeps its first place and takes the last value (`{k: 1, k: 2}`,
        // and keys equal across types: `{1: a, 1.0: b, True: c}` is `{1: c}`).
        let mut entries = Vec::new();
        for pair in flat.chunks(2) {
            let key = self.key(pair[0])?;
            super::vars::dict_set(self.py, &mut entries, key, pair[1]);
        }
        let id = self.add(VarKind::Dict(entries), None);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_build_const_key_map(
        &mut self,
        f: &mut FrameState<'py>,
        n: u32,
    ) -> CResult<Flow> {
        let keys = self.pop(f)?;
        let values = self.popn(f, n as usize)?;
        let keys = self.python_value(keys)?;
        let mut entries = Vec::new();
        for (k, v) in keys.try_iter()?.zip(values) {
            super::vars::dict_set(self.py, &mut entries, OwnedRef::from_bound(&k?), v);
        }
        let id = self.add(VarKind::Dict(entries), None);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    fn key(&mut self, id: VarId) -> CResult<OwnedRef> {
        match self.kind(id) {
            VarKind::Const(v) => Ok(v.clone()),
            // A tensor hashes by identity: its stand-in, handed back as the tensor.
            VarKind::Tensor { .. } => Ok(OwnedRef::from_bound(&self.tensor_key(id)?)),
            // A class, function or other object that compares by identity (a dispatch table
            // `{nn.Linear: ..., torch.sin: ...}`, a module or an enum member as a key): the
            // object itself, its identity guarded.
            VarKind::Object(v) if compares_by_identity(&v.bind(self.py).clone())? => {
                self.pin_identity(id);
                Ok(v.clone())
            }
            other @ (VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
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
                format!("a dict key that is {}", kind_name(other)),
            ),
        }
    }

    /// Why a slice tracker with these bounds cannot be used as a value (folded into a
    /// constant slice, or passed to a graph operation), if it cannot: constants and symbolic
    /// sizes can (a symbolic one is specialised or stays symbolic), and so can immutable
    /// integers reached as objects (NumPy's, guarded by identity); tensors cannot (read with
    /// `__index__`, a data-dependent `.item()`); nor can other objects, whose `__index__`
    /// could answer differently on the next call with the object unchanged.
    pub(super) fn slice_bound_check(&self, parts: &[VarId]) -> CResult<()> {
        for &part in parts {
            let usable = match self.kind(part) {
                VarKind::Const(_) | VarKind::Symbolic { .. } => true,
                VarKind::Object(v) => self.immutable_integer(&v.bind(self.py).clone())?,
                _ => false,
            };
            if usable {
                continue;
            }
            if self.contains_tensor(part) {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "a slice with tensor bounds",
                );
            }
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("a slice bound that is {}", kind_name(self.kind(part))),
            );
        }
        Ok(())
    }

    /// An `int` (subclasses included: `operator.index` takes their value, not their
    /// `__index__`) or a NumPy integer scalar.
    fn immutable_integer(&self, value: &Bound<'py, PyAny>) -> CResult<bool> {
        Ok(
            value.is_instance_of::<pyo3::types::PyInt>()
                || super::helpers::is_numpy_integer(value)?,
        )
    }

    pub(super) fn op_build_slice(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let parts = self.popn(f, n as usize)?;
        let py = self.py;
        // Constant bounds make a constant slice (an immutable integer object, guarded by
        // identity, by its value). Others (symbolic sizes, tensors, objects with `__index__`)
        // keep the slice a tracker: what uses it decides (`slice_bound_check`) — a tensor
        // indexed by tensor bounds breaks the graph there, after the bounds' arithmetic
        // joined the graph before.
        let mut values = Vec::with_capacity(parts.len());
        for &part in &parts {
            match self.kind(part) {
                VarKind::Const(v) => values.push(v.bind(py).clone()),
                VarKind::Object(v) if self.immutable_integer(&v.bind(py).clone())? => {
                    self.pin_identity(part);
                    values.push(self.h.operator.getattr("index")?.call1((v.bind(py),))?);
                }
                _ => {
                    let id = self.add(VarKind::Slice(parts), None);
                    f.stack.push(id);
                    return Ok(Flow::Continue);
                }
            }
        }
        let slice = py
            .import_module("builtins")?
            .getattr("slice")?
            .call1(pyo3::types::PyTuple::new(py, values)?)?;
        let id = self.constant(&slice);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_build_string(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let parts = self.popn(f, n as usize)?;
        let mut out = String::new();
        for p in parts {
            out.push_str(&self.python_value(p)?.str()?.to_string());
        }
        let id = self.constant(PyString::new(self.py, &out).as_any());
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_format_value(&mut self, f: &mut FrameState<'py>, flags: u32) -> CResult<Flow> {
        let spec = if flags & 0x04 != 0 {
            Some(self.pop(f)?)
        } else {
            None
        };
        let value = self.pop(f)?;
        if self.contains_tensor(value) {
            return unsupported(
                BreakKind::TensorValueNeeded,
                "formatting a tensor into a string",
            );
        }
        self.refuse_formatting_symbolic_floats(&[value])?;
        if let Some(type_name) = self.formatted_by_python(value)? {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!(
                    "formatting a {type_name} object, whose __format__/__str__/__repr__ is Python \
                     code (it reads state the guards do not cover)"
                ),
            );
        }
        let py = self.py;
        let mut v = self.python_value(value)?;
        v = match flags & 0x03 {
            1 => v.str()?.into_any(),
            2 => v.repr()?.into_any(),
            3 => py
                .import_module("builtins")?
                .getattr("ascii")?
                .call1((v,))?,
            _ => v,
        };
        let spec = match spec {
            Some(s) => self.python_value(s)?,
            None => PyString::new(py, "").into_any(),
        };
        let formatted = py
            .import_module("builtins")?
            .getattr("format")?
            .call1((v, spec))?;
        let id = self.constant(&formatted);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    /// The type name of an existing object inside `id` (itself, or an item of a tuple, list
    /// or dict) that formats through Python code — its string can change while the object
    /// stays the same, so it is not folded into a constant.
    fn formatted_by_python(&self, id: VarId) -> CResult<Option<String>> {
        let py = self.py;
        match self.kind(id) {
            VarKind::Object(v) => {
                let ty = v.bind(py).get_type();
                if v.bind(py).is_instance_of::<pyo3::types::PyType>() {
                    return Ok(None);
                }
                let dunders = ["__format__", "__str__", "__repr__"];
                Ok(
                    match super::helpers::python_dunder(&ty, &dunders, &self.h.function_type) {
                        Some(_) => Some(ty.name()?.to_string()),
                        None => None,
                    },
                )
            }
            VarKind::Tuple(items) | VarKind::List(items) => {
                for &item in items {
                    if let Some(found) = self.formatted_by_python(item)? {
                        return Ok(Some(found));
                    }
                }
                Ok(None)
            }
            VarKind::Dict(entries) => {
                for (_, v) in entries {
                    if let Some(found) = self.formatted_by_python(*v)? {
                        return Ok(Some(found));
                    }
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// The list at `depth` below the top of the stack, for in-place list opcodes.
    /// The value `depth` down the stack (`LIST_APPEND`, `SET_ADD`, ... name their container so).
    pub(super) fn list_at(&mut self, f: &FrameState<'py>, depth: u32) -> CResult<VarId> {
        match f
            .stack
            .len()
            .checked_sub(depth as usize)
            .and_then(|i| f.stack.get(i))
        {
            Some(&id) => Ok(id),
            None => unsupported(BreakKind::Internal, "stack underflow while translating"),
        }
    }

    /// The container `depth` down the stack, which an opcode is about to change in place:
    /// one the trace made, or an existing list or dict (a resume function gets the
    /// containers its frame was building as arguments), changed as the trace changes any
    /// existing container (`may_change_container`).
    fn owned_at(&mut self, f: &FrameState<'py>, depth: u32, opcode: &str) -> CResult<VarId> {
        let id = self.list_at(f, depth)?;
        if self.source(id).is_some() {
            // A literal or comprehension being built when the frame broke, handed to the
            // resume function (`{**f()}`, `[*a, *g()]` with a break inside `g`): an existing
            // list or dict, whose final contents the generated code writes back.
            self.may_change_container(id, opcode)?;
        }
        Ok(id)
    }

    pub(super) fn op_list_append(&mut self, f: &mut FrameState<'py>, depth: u32) -> CResult<Flow> {
        let value = self.pop(f)?;
        let list = self.owned_at(f, depth, "LIST_APPEND")?;
        match &mut self.vars[list.0 as usize].kind {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::List(items) => items.push(value),
            VarKind::Tensor { .. }
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
            | VarKind::Tuple(_)
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
            | VarKind::NdArray(_) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "LIST_APPEND on something that is not a traced list",
                )
            }
        }
        Ok(Flow::Continue)
    }

    pub(super) fn op_list_extend(&mut self, f: &mut FrameState<'py>, depth: u32) -> CResult<Flow> {
        let iterable = self.pop(f)?;
        let new_items = self.items_of(iterable)?;
        let list = self.owned_at(f, depth, "LIST_EXTEND")?;
        match &mut self.vars[list.0 as usize].kind {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::List(items) => items.extend(new_items),
            VarKind::Tensor { .. }
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
            | VarKind::Tuple(_)
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
            | VarKind::NdArray(_) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "LIST_EXTEND on something that is not a traced list",
                )
            }
        }
        Ok(Flow::Continue)
    }

    pub(super) fn op_list_to_tuple(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let list = self.pop(f)?;
        let items = self.items_of(list)?;
        let id = self.add(VarKind::Tuple(items), None);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_map_add(&mut self, f: &mut FrameState<'py>, depth: u32) -> CResult<Flow> {
        let value = self.pop(f)?;
        let key = self.pop(f)?;
        let key = self.key(key)?;
        let dict = self.owned_at(f, depth, "MAP_ADD")?;
        let py = self.py;
        match &mut self.vars[dict.0 as usize].kind {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            // A comprehension's repeated key keeps its first place and takes the last value.
            VarKind::Dict(entries) => super::vars::dict_set(py, entries, key, value),
            VarKind::Tensor { .. }
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
            | VarKind::Tuple(_)
            | VarKind::List(_)
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
            | VarKind::NdArray(_) => {
                return unsupported(
                    BreakKind::Internal,
                    "MAP_ADD on something that is not a traced dict",
                )
            }
        }
        Ok(Flow::Continue)
    }

    /// The entries of a mapping that is not a dict, as `dict.update` reads them: its
    /// `keys()`, then `mapping[key]` for each (both traced: a Python `keys`/`__getitem__` is
    /// inlined). Keys must be known values.
    fn mapping_entries(&mut self, mapping: VarId) -> CResult<Vec<(OwnedRef, VarId)>> {
        // (Called for objects and instances only.)
        let class = if let VarKind::Instance { cls, .. } = self.kind(mapping) {
            cls.bind(self.py).clone()
        } else {
            // Which `keys` runs is the class's: its type guarded, not its identity.
            let Some(object) = self.real_unpinned(mapping) else {
                return unsupported(BreakKind::Internal, "mapping entries of a non-object");
            };
            let class = object.get_type().into_any();
            if let Some(source) = self.source(mapping) {
                let class = OwnedRef::from_bound(&class);
                self.guards
                    .add(source, super::guards::GuardKind::Type(class));
            }
            self.guard_class(&class, "keys")?;
            class
        };
        let abc_keys = self
            .py
            .import_module("collections.abc")?
            .getattr("Mapping")?
            .getattr("keys")?;
        // `Mapping.keys` makes a `KeysView`, whose iteration is the mapping's own.
        let keys = if class.getattr("keys").is_ok_and(|k| k.is(&abc_keys)) {
            mapping
        } else {
            let keys = self.get_attr(mapping, "keys")?;
            self.call_function(keys, Vec::new(), Vec::new())?
        };
        let mut entries = Vec::new();
        for key in self.items_of(keys)? {
            let value = self.subscript(mapping, key)?;
            entries.push((self.key(key)?, value));
        }
        Ok(entries)
    }

    pub(super) fn op_dict_update(&mut self, f: &mut FrameState<'py>, depth: u32) -> CResult<Flow> {
        let update = self.pop(f)?;
        let new_entries = match self.kind(update) {
            VarKind::Dict(entries) => entries.clone(),
            // `f(**mapping)`, `{**mapping}` of a mapping that is not a dict (a `UserDict`, a
            // tokenizer's `BatchEncoding`): Python reads its `keys()`, then each item.
            VarKind::Object(_) | VarKind::Instance { .. } => self.mapping_entries(update)?,
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Tuple(_)
            | VarKind::List(_)
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
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("dict update from {}", kind_name(other)),
                )
            }
        };
        let dict = self.owned_at(f, depth, "DICT_UPDATE")?;
        let py = self.py;
        match &mut self.vars[dict.0 as usize].kind {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::Dict(entries) => {
                for (k, v) in new_entries {
                    super::vars::dict_set(py, entries, k, v);
                }
            }
            VarKind::Tensor { .. }
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
            | VarKind::Tuple(_)
            | VarKind::List(_)
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
            | VarKind::NdArray(_) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "DICT_UPDATE on something that is not a traced dict",
                )
            }
        }
        Ok(Flow::Continue)
    }

    pub(super) fn op_unpack_sequence(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let seq = self.pop(f)?;
        let items = self.items_of(seq)?;
        if items.len() != n as usize {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("unpacking {} values into {n}", items.len()),
            );
        }
        f.stack.extend(items.into_iter().rev());
        Ok(Flow::Continue)
    }

    pub(super) fn op_unpack_ex(&mut self, f: &mut FrameState<'py>, arg: u32) -> CResult<Flow> {
        let before = (arg & 0xff) as usize;
        let after = (arg >> 8) as usize;
        let seq = self.pop(f)?;
        let items = self.items_of(seq)?;
        if items.len() < before + after {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                "not enough values to unpack",
            );
        }
        let middle = self.add(
            VarKind::List(items[before..items.len() - after].to_vec()),
            None,
        );
        let mut out: Vec<VarId> = items[..before].to_vec();
        out.push(middle);
        out.extend_from_slice(&items[items.len() - after..]);
        f.stack.extend(out.into_iter().rev());
        Ok(Flow::Continue)
    }
}

/// Whether `value` equals only itself: a class, a Python or builtin function, or an object
/// whose class keeps `object`'s `__eq__` (an `nn.Module`, a plain `Enum` member — which
/// hashes by its name, the same for the life of the process). As a dict key it is found
/// again only by the same object, whatever its hash.
pub fn compares_by_identity(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if value.is_instance_of::<pyo3::types::PyType>()
        || value.is_instance_of::<pyo3::types::PyFunction>()
        || value.is_instance_of::<pyo3::types::PyCFunction>()
    {
        return Ok(true);
    }
    let object = value.py().get_type::<pyo3::types::PyAny>();
    Ok(value
        .get_type()
        .getattr("__eq__")?
        .is(object.getattr("__eq__")?))
}

/// What makes an instance of a named tuple class from a plain tuple: `cls._make` for a
/// `namedtuple`, the class itself for a struct sequence (`torch.return_types.topk`).
pub fn named_tuple_maker<'py>(cls: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match cls.getattr("_make") {
        Ok(make) => Ok(make),
        Err(_) => Ok(cls.clone()),
    }
}

/// The field names of a `torch.return_types` struct sequence class, when every field is a
/// tuple item (the counts agree).
fn struct_sequence_fields(cls: &Bound<'_, PyAny>) -> PyResult<Option<Vec<String>>> {
    let all: usize = cls.getattr("n_fields")?.extract()?;
    let visible: usize = cls.getattr("n_sequence_fields")?.extract()?;
    if all != visible {
        return Ok(None);
    }
    cls.getattr("__match_args__")?.extract().map(Some)
}

/// The field names of `value` when it is a named tuple whose class behaves as a plain tuple
/// with named fields — a `collections.namedtuple` (or `typing.NamedTuple`) class, or a
/// subclass of one that adds methods and properties but overrides none of the tuple's own
/// behaviour and keeps no instance `__dict__`, or a `torch.return_types` struct sequence —
/// so that it can be traced as a tuple of its items. None for anything else.
pub fn named_tuple_input_fields(value: &Bound<'_, PyAny>) -> PyResult<Option<Vec<String>>> {
    let py = value.py();
    let cls = value.get_type();
    let tuple = py.get_type::<pyo3::types::PyTuple>();
    if cls.is(&tuple) || !value.is_instance(tuple.as_any())? {
        return Ok(None);
    }
    if value
        .getattr("__dict__")
        .is_ok_and(|d| d.len().map_or(true, |n| n > 0))
    {
        return Ok(None);
    }
    const TUPLE_BEHAVIOUR: [&str; 22] = [
        "__getitem__",
        "__iter__",
        "__len__",
        "__contains__",
        "__getattribute__",
        "__getattr__",
        "__setattr__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__hash__",
        "__bool__",
        "__add__",
        "__radd__",
        "__mul__",
        "__rmul__",
        "__reversed__",
        "__init__",
        "__class_getitem__",
    ];
    let mut maker = None;
    for klass in cls.getattr("__mro__")?.try_iter()? {
        let klass = klass?;
        if klass.is(&tuple) {
            break;
        }
        let dict = klass.getattr("__dict__")?;
        for name in TUPLE_BEHAVIOUR {
            if dict.contains(name)? {
                return Ok(None);
            }
        }
        if maker.is_none() && dict.contains("__new__")? {
            maker = Some(klass);
        }
    }
    if cls.getattr("__module__")?.to_string() == "torch.return_types" {
        return struct_sequence_fields(cls.as_any());
    }
    let Some(maker) = maker else {
        return Ok(None);
    };
    let dict = maker.getattr("__dict__")?;
    if !dict.contains("_make")? || !dict.contains("_fields")? {
        return Ok(None);
    }
    let fields: Vec<String> = cls.getattr("_fields")?.extract()?;
    // Each field still read by `namedtuple`'s accessor (not a property put over it).
    let getattr_static = py.import_module("inspect")?.getattr("getattr_static")?;
    for field in &fields {
        let accessor = getattr_static.call1((&cls, field))?;
        if !accessor
            .get_type()
            .is(dict.get_item(&fields[0])?.get_type())
        {
            return Ok(None);
        }
    }
    Ok(Some(fields))
}

impl<'py> Tracer<'py> {
    /// `P(a, b=...)` for a `collections.namedtuple` class (or a subclass that keeps its
    /// `__new__` and adds no `__init__`): a tuple tracker with the class's field names,
    /// defaults filled in; None for other classes.
    pub(super) fn construct_named_tuple(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let Ok(ty) = cls.cast::<pyo3::types::PyType>() else {
            return Ok(None);
        };
        if !ty.is_subclass(&self.h.tuple_type)? {
            return Ok(None);
        }
        // The class along the MRO that defines `__new__` must be the one `namedtuple` made
        // (it defines `_make` and `_fields` next to it).
        let mut maker_class = None;
        for klass in ty.getattr("__mro__")?.try_iter()? {
            let klass = klass?;
            let dict = klass.getattr("__dict__")?;
            if dict.contains("__init__")? {
                return Ok(None);
            }
            if dict.contains("__new__")? {
                maker_class = Some(klass);
                break;
            }
        }
        let Some(maker_class) = maker_class else {
            return Ok(None);
        };
        let dict = maker_class.getattr("__dict__")?;
        if !dict.contains("_make")? || !dict.contains("_fields")? {
            return Ok(None);
        }
        let fields: Vec<String> = cls.getattr("_fields")?.extract()?;
        let defaults = cls.getattr("_field_defaults")?;
        let mut items = Vec::with_capacity(fields.len());
        for (i, field) in fields.iter().enumerate() {
            let given = kwargs.iter().find(|(k, _)| k == field).map(|(_, v)| *v);
            let value = match (args.get(i), given) {
                (Some(&v), None) => v,
                (None, Some(v)) => v,
                (None, None) => match defaults.get_item(field) {
                    Ok(default) => self.wrap(&default, None)?,
                    Err(_) => {
                        return unsupported(
                            BreakKind::ExceptionWhileTracing,
                            format!("{}() without a value for {field}", ty.name()?),
                        )
                    }
                },
                (Some(_), Some(_)) => {
                    return unsupported(
                        BreakKind::ExceptionWhileTracing,
                        format!("{}() got {field} twice", ty.name()?),
                    )
                }
            };
            items.push(value);
        }
        if args.len() > fields.len() || kwargs.iter().any(|(k, _)| !fields.contains(k)) {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                format!("{}() with arguments that fit no field", ty.name()?),
            );
        }
        let id = self.add(VarKind::Tuple(items), None);
        self.tuple_fields.insert(id, fields);
        self.tuple_classes.insert(id, OwnedRef::from_bound(cls));
        Ok(Some(id))
    }
}

impl<'py> Tracer<'py> {
    /// A named tuple made from a sequence: `torch.return_types.topk((values, indices))` (a
    /// struct sequence, as torch's pytree rebuilds one) and `tuple.__new__(cls, items)` for
    /// a `namedtuple` class (its generated `__new__` and `_make` call it): a tuple tracker
    /// with the class's field names. None for other calls.
    pub(super) fn construct_tuple_of_class(
        &mut self,
        callee: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        if !kwargs.is_empty() {
            return Ok(None);
        }
        let tuple_new = self.h.tuple_type.getattr("__new__")?;
        let (cls, sequence) = match args {
            [cls, sequence] if callee.is(&tuple_new) => match self.real(*cls) {
                Some(cls) => (cls, *sequence),
                None => return Ok(None),
            },
            [sequence] => (callee.clone(), *sequence),
            _ => return Ok(None),
        };
        let Ok(ty) = cls.cast::<pyo3::types::PyType>() else {
            return Ok(None);
        };
        if ty.is(&self.h.tuple_type) || !ty.is_subclass(&self.h.tuple_type)? {
            return Ok(None);
        }
        let fields: Vec<String> = if ty.getattr("__module__")?.to_string() == "torch.return_types" {
            match struct_sequence_fields(ty.as_any())? {
                Some(fields) => fields,
                None => return Ok(None),
            }
        } else if callee.is(&tuple_new) {
            // Only a class `namedtuple` made (or a subclass keeping its `__new__`): its
            // instances are plain tuples with named fields.
            let Ok(fields) = ty.getattr("_fields") else {
                return Ok(None);
            };
            if ty.getattr("_make").is_err() {
                return Ok(None);
            }
            fields.extract()?
        } else {
            return Ok(None);
        };
        let items = self.items_of(sequence)?;
        if items.len() != fields.len() {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                format!(
                    "{}() given {} items for {} fields",
                    ty.name()?,
                    items.len(),
                    fields.len()
                ),
            );
        }
        let id = self.add(VarKind::Tuple(items), None);
        self.tuple_fields.insert(id, fields);
        self.tuple_classes
            .insert(id, OwnedRef::from_bound(ty.as_any()));
        Ok(Some(id))
    }
}
