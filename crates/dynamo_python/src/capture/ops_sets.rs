//! Sets made in the trace: `{a, b}`, set comprehensions, `{*xs}`, `set(...)`, and the sets
//! their methods and operators return. Their elements are constants (hashable values known
//! while tracing; a set of tensors would hash by identity), so such a set is a real `set`
//! object that belongs to the trace alone: its methods run on it while tracing, changes
//! included (a tensor is held by identity, as Python holds it, through a stand-in key object
//! per tensor tracker — `memo = set(); if p not in memo: memo.add(p)` in
//! `Module.parameters()`), and the generated code builds a new one with its final elements wherever the
//! set must exist (returned, stored, live at a graph break). A set that existed before the
//! call (of constants, so guarded by its elements) is changed through a copy that stands for
//! it while tracing; the generated code then gives the real set the copy's final elements
//! (`seen.add(key)` on a module-level registry, `warned` sets).

use pyo3::prelude::*;
use pyo3::types::{PyFrozenSet, PySet};

use super::break_reasons::BreakKind;
use super::codegen::Rebuild;
use super::rebuild::{rebuild_plan, Rebuilder};
use super::translator::{kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{DictViewKind, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// Methods that change a set in place.
const MUTATING: &[&str] = &[
    "add",
    "discard",
    "remove",
    "pop",
    "clear",
    "update",
    "difference_update",
    "intersection_update",
    "symmetric_difference_update",
];

/// Methods that read a set (and may return a new one).
const READING: &[&str] = &[
    "union",
    "intersection",
    "difference",
    "symmetric_difference",
    "issubset",
    "issuperset",
    "isdisjoint",
    "copy",
    "__contains__",
    "__len__",
];

impl<'py> Tracer<'py> {
    /// Tracks `set`, made by the trace and held by nobody else, as a set the trace owns.
    pub(super) fn fresh_set(&mut self, set: &Bound<'py, PyAny>) -> VarId {
        let id = self.add(VarKind::Object(OwnedRef::from_bound(set)), None);
        self.fresh_sets
            .insert(set.as_ptr() as usize, (id, OwnedRef::from_bound(set)));
        id
    }

    /// Whether `id` is a set the trace made (see `fresh_set`).
    pub(super) fn is_fresh_set(&self, id: VarId) -> bool {
        match self.kind(id) {
            VarKind::Object(o) if self.source(id).is_none() => self
                .fresh_sets
                .get(&(o.as_ptr() as usize))
                .is_some_and(|(v, _)| *v == id),
            _ => false,
        }
    }

    /// The values of `ids` as elements of a set, new or `into` (one the trace made):
    /// constants, tensors by their stand-in keys, objects compared by identity as
    /// `identity_member`s.
    fn set_elements(
        &mut self,
        ids: &[VarId],
        into: Option<&Bound<'py, PyAny>>,
    ) -> CResult<Vec<Bound<'py, PyAny>>> {
        let empty;
        let into = match into {
            Some(set) => set,
            None => {
                empty = PySet::empty(self.py)?.into_any();
                &empty
            }
        };
        ids.iter()
            .map(|&id| match self.kind(id) {
                VarKind::Unrealized(_) => super::lazy_inputs::unrealized_reached(),
                VarKind::Const(v) => Ok(v.bind(self.py).clone()),
                VarKind::Tensor { .. } => self.tensor_key(id),
                VarKind::Object(_) if self.source(id).is_some() => {
                    match self.identity_member(id, into)? {
                        Some(value) => Ok(value),
                        None => unsupported(
                            BreakKind::UnsupportedOperation,
                            "a set element that is an object compared by value",
                        ),
                    }
                }
                other @ (VarKind::Symbolic { .. }
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
                    format!("a set element that is {}", kind_name(other)),
                ),
            })
            .collect()
    }

    /// An object read from a source that compares by identity (a module, a plain instance,
    /// a function), put in or looked up in the set the trace made, `set`: its real value,
    /// recorded as an identity member — no identity guard, only the guard that the objects
    /// compared stay one or distinct as traced — when every element of the set is such a
    /// member, a constant or a tensor's stand-in, so the answer depends on nothing else.
    /// (A function taking a module walks `named_modules()`, whose `memo` set would otherwise
    /// tie the compiled code to that one module.) None when the identity must be guarded.
    pub(super) fn identity_member(
        &mut self,
        id: VarId,
        set: &Bound<'py, PyAny>,
    ) -> CResult<Option<Bound<'py, PyAny>>> {
        let VarKind::Object(value) = self.kind(id) else {
            return Ok(None);
        };
        let value = value.bind(self.py).clone();
        let Some(source) = self.source(id) else {
            return Ok(None);
        };
        if !super::ops_build::compares_by_identity(&value)?
            || self.fresh_sets.contains_key(&(value.as_ptr() as usize))
        {
            return Ok(None);
        }
        for element in set.try_iter()? {
            let element = element?;
            let address = element.as_ptr() as usize;
            let compared_safely = self.identity_members.contains_key(&address)
                || self.key_tensors.contains_key(&address)
                || self.h.is_constant(&element)?;
            if !compared_safely {
                return Ok(None);
            }
        }
        let address = value.as_ptr() as usize;
        self.note_identity_source(source, address);
        self.identity_members.entry(address).or_insert(id);
        Ok(Some(value))
    }

    /// The objects of `set` standing there by `identity_member` are seen as themselves (the
    /// set is iterated, handed on, kept): their identities are guarded after all.
    pub(super) fn pin_set_members(&self, set: &Bound<'py, PyAny>) -> CResult<()> {
        if !self.fresh_sets.contains_key(&(set.as_ptr() as usize)) {
            return Ok(());
        }
        for element in set.try_iter()? {
            if let Some(&member) = self.identity_members.get(&(element?.as_ptr() as usize)) {
                self.pin_identity(member);
            }
        }
        Ok(())
    }

    /// The stand-in key of a tensor tracker in sets and dicts the trace made: one object per
    /// tensor (graph node: what `is` compares), hashed by identity as the tensor is.
    /// (A deque holds other trackers by stand-ins too, one per tracker.)
    pub(super) fn tensor_key(&mut self, id: VarId) -> CResult<Bound<'py, PyAny>> {
        let which = match *self.kind(id) {
            VarKind::Tensor { node, .. } => StandIn::Tensor(node),
            _ => StandIn::Tracker(id),
        };
        if let Some(key) = self.tensor_keys.get(&which) {
            return Ok(key.bind(self.py).clone());
        }
        let key = self.h.builtins.getattr("object")?.call0()?;
        self.key_tensors.insert(key.as_ptr() as usize, id);
        self.tensor_keys.insert(which, OwnedRef::from_bound(&key));
        Ok(key)
    }

    /// What a dict the trace made holds as the key `id`: a tensor's stand-in (see
    /// `tensor_key`), anything else as its Python value.
    pub(super) fn key_value(&mut self, id: VarId) -> CResult<Bound<'py, PyAny>> {
        match self.kind(id) {
            VarKind::Tensor { .. } => self.tensor_key(id),
            _ => self.python_value(id),
        }
    }

    /// `key` used as a key of a dict tracker: an unhashable one (a list, a dict, a slice)
    /// raises TypeError as Python's dict does — traced, so the code's own handler may catch
    /// it (comparing it with the keys would find nothing, or raise KeyError instead).
    pub(super) fn check_hashable(&mut self, key: &Bound<'py, PyAny>) -> CResult<()> {
        match key.hash() {
            Ok(_) => Ok(()),
            Err(err) => self.raised(err, "an unhashable dict key"),
        }
    }

    /// `KeyError(key)` for a key missing from a dict tracker — a graph break when the key is
    /// a tensor's stand-in (the error would have to hold the tensor).
    pub(super) fn raise_key_error<T>(&mut self, key: Bound<'py, PyAny>) -> CResult<T> {
        if self.key_tensors.contains_key(&(key.as_ptr() as usize)) {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "KeyError of a tensor key (the error would hold the tensor)",
            );
        }
        self.raise_builtin("KeyError", key)
    }

    /// Whether `key` is the stand-in of a tensor tracker (see `tensor_key`).
    pub(super) fn is_tensor_key(&self, key: &OwnedRef) -> bool {
        self.key_tensors.contains_key(&(key.as_ptr() as usize))
    }

    /// Whether a tensor tracker is a key of a dict tracker (or of its `keys()` view): found
    /// by identity, as Python finds a tensor key. None for other items or containers.
    pub(super) fn tensor_in_dict(
        &mut self,
        item: VarId,
        container: VarId,
    ) -> CResult<Option<bool>> {
        let dict = match *self.kind(container) {
            VarKind::DictView {
                dict,
                which: DictViewKind::Keys,
            } => dict,
            _ => container,
        };
        if !matches!(self.kind(item), VarKind::Tensor { .. })
            || !matches!(self.kind(dict), VarKind::Dict(_))
        {
            return Ok(None);
        }
        let key = self.tensor_key(item)?;
        let VarKind::Dict(entries) = self.kind(dict) else {
            return Ok(None);
        };
        Ok(Some(entries.iter().any(|(k, _)| k.bind(self.py).is(&key))))
    }

    /// Whether a tensor tracker, or an object standing as an `identity_member`, is in a set
    /// the trace made (None for other items and containers).
    pub(super) fn member_of_fresh_set(&mut self, item: VarId, set: VarId) -> CResult<Option<bool>> {
        if !self.is_fresh_set(set) {
            return Ok(None);
        }
        let set = self.real(set).expect("a fresh set is an object");
        let key = match self.kind(item) {
            VarKind::Tensor { .. } => self.tensor_key(item)?,
            VarKind::Object(_) => match self.identity_member(item, &set)? {
                Some(value) => value,
                None => return Ok(None),
            },
            // A constant is never one of the objects compared by identity.
            VarKind::Const(value) if self.h.is_constant(&value.bind(self.py)).unwrap_or(false) => {
                value.bind(self.py).clone()
            }
            _ => return Ok(None),
        };
        Ok(Some(set.contains(key)?))
    }

    pub(super) fn op_build_set(&mut self, f: &mut FrameState<'py>, n: u32) -> CResult<Flow> {
        let items = self.popn(f, n as usize)?;
        let elements = self.set_elements(&items, None)?;
        let set = PySet::new(self.py, &elements)?.into_any();
        let id = self.fresh_set(&set);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    /// `SET_ADD` (a set comprehension) and `SET_UPDATE` (`{*xs}`) on the set `depth` down.
    pub(super) fn op_set_add_or_update(
        &mut self,
        f: &mut FrameState<'py>,
        depth: u32,
        update: bool,
    ) -> CResult<Flow> {
        let value = self.pop(f)?;
        let target = self.list_at(f, depth)?;
        let set = if self.is_fresh_set(target) {
            self.real(target).expect("a fresh set is an object")
        } else {
            // A set literal being built when the frame broke, handed to the resume function
            // (`{1, *g()}` with a break inside `g`): an existing set of constants, changed
            // through the copy that stands for it.
            let standing = match self.real(target) {
                Some(real) => self.set_standing_for(&real, true)?,
                None => None,
            };
            let Some((copy, tracker)) = standing else {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "SET_ADD on a set the trace did not make",
                );
            };
            self.note_effect(Some(tracker));
            copy
        };
        let new = if update {
            self.items_of(value)?
        } else {
            vec![value]
        };
        let elements = self.set_elements(&new, Some(&set))?;
        for element in elements {
            set.call_method1("add", (element,))?;
        }
        Ok(Flow::Continue)
    }

    /// `set(iterable)`: a new set of the iterable's items.
    pub(super) fn construct_set(&mut self, args: &[VarId]) -> CResult<VarId> {
        if let Some(&iterable) = args.first().filter(|&&a| self.is_fresh_set(a)) {
            // `set(s)` of a set the trace made: a copy, whatever order its elements are in
            // (the order of a set holding tensors is not known while tracing).
            let set = self.real(iterable).expect("a fresh set is an object");
            let copy = PySet::empty(self.py)?;
            for element in set.try_iter()? {
                copy.add(element?)?;
            }
            return Ok(self.fresh_set(copy.as_any()));
        }
        let items = match args.first() {
            Some(&iterable) => self.items_of(iterable)?,
            None => Vec::new(),
        };
        let elements = self.set_elements(&items, None)?;
        let set = PySet::new(self.py, &elements)?.into_any();
        Ok(self.fresh_set(&set))
    }

    /// `a.keys() | b.keys()` (and `&`, `-`, `^`, with a set on either side): dict key views
    /// combine as the sets of their keys, so each view becomes a fresh set of them and the
    /// operator is a set's. None for other operators and operands.
    pub(super) fn keys_view_set_operator(
        &mut self,
        op: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let name = super::ops_call::function_name(op);
        if !matches!(name.as_str(), "or_" | "and_" | "sub" | "xor") || args.len() != 2 {
            return Ok(None);
        }
        let keys_view = |t: &Self, id: VarId| {
            matches!(
                t.kind(id),
                VarKind::DictView {
                    which: DictViewKind::Keys,
                    ..
                }
            )
        };
        if !args.iter().any(|&a| keys_view(self, a)) {
            return Ok(None);
        }
        let mut operands = Vec::with_capacity(2);
        for &arg in args {
            operands.push(if keys_view(self, arg) {
                self.construct_set(&[arg])?
            } else {
                arg
            });
        }
        self.apply_operator(op, operands).map(Some)
    }

    /// A method of a real set object, `method` bound to it. None when `method` is not a set's.
    pub(super) fn set_method(
        &mut self,
        method: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let Ok(receiver) = method.getattr("__self__") else {
            return Ok(None);
        };
        let is_set = receiver.is_exact_instance_of::<PySet>()
            || receiver.is_exact_instance_of::<PyFrozenSet>();
        if !is_set {
            return Ok(None);
        }
        let name: String = method.getattr("__name__")?.extract()?;
        let mutating = MUTATING.contains(&name.as_str());
        if !mutating && !READING.contains(&name.as_str()) {
            return Ok(None);
        }
        let owned = self
            .fresh_sets
            .get(&(receiver.as_ptr() as usize))
            .is_some_and(|(_, o)| o.as_ptr() == receiver.as_ptr());
        let mut method = method.clone();
        if !owned && name == "pop" {
            // Which element comes out follows the real set's table, which a copy need not
            // share.
            return unsupported(
                BreakKind::UnsupportedOperation,
                "set.pop() on a set that existed before the call",
            );
        }
        if !owned {
            match self.set_standing_for(&receiver, mutating)? {
                Some((copy, tracker)) => {
                    method = copy.getattr(name.as_str())?;
                    if mutating {
                        self.note_effect(Some(tracker));
                    }
                }
                None if mutating => {
                    return unsupported(
                        BreakKind::UnreplayableSideEffect,
                        format!("set.{name} on a set that existed before the call"),
                    );
                }
                None => {}
            }
        } else if mutating {
            let set = self
                .fresh_sets
                .get(&(receiver.as_ptr() as usize))
                .map(|(id, _)| *id);
            self.note_effect(set);
        }
        // Arguments are iterables of constants (or constants): their Python values; a
        // tensor (`add`, `discard`, `remove`) by its stand-in key.
        let mut values = Vec::with_capacity(args.len());
        let mut tensor_argument = false;
        for &arg in args {
            if matches!(self.kind(arg), VarKind::Tensor { .. }) {
                tensor_argument = true;
                values.push(self.tensor_key(arg)?);
                continue;
            }
            if owned {
                if let Some(value) = self.identity_member(arg, &receiver)? {
                    values.push(value);
                    continue;
                }
            }
            if self.contains_tensor(arg) {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("set.{name} with a tensor"),
                );
            }
            values.push(self.python_value(arg)?);
        }
        let result = match method.call1(pyo3::types::PyTuple::new(self.py, values)?) {
            Ok(result) => result,
            Err(err) => {
                let detail = format!("set.{name} raised {err} while tracing");
                if tensor_argument {
                    // The error would hold the tensor's stand-in key.
                    return unsupported(BreakKind::ExceptionWhileTracing, detail);
                }
                // `remove` of a missing member, `pop` of an empty set, an unhashable
                // argument: raised in the trace, where a handler may catch it.
                return self.raised(err, detail);
            }
        };
        if result.is_exact_instance_of::<PySet>() {
            return Ok(Some(self.fresh_set(&result)));
        }
        if self.key_tensors.contains_key(&(result.as_ptr() as usize)) {
            // `pop()` took a tensor: which one follows the tensors' addresses.
            return unsupported(
                BreakKind::UnsupportedOperation,
                "set.pop() on a set holding tensors (which one follows their addresses)",
            );
        }
        if let Some(&member) = self.identity_members.get(&(result.as_ptr() as usize)) {
            // Which object comes out follows their addresses: the one read from its source.
            self.pin_identity(member);
            return Ok(Some(member));
        }
        Ok(Some(self.wrap(&result, None)?))
    }

    /// `s op= t` on a set the trace made: changed in place. None for other left operands.
    pub(super) fn set_in_place(
        &mut self,
        name: &str,
        lhs: VarId,
        rhs: VarId,
    ) -> CResult<Option<VarId>> {
        if !matches!(name, "ior" | "iand" | "isub" | "ixor") {
            return Ok(None);
        }
        let set = if self.is_fresh_set(lhs) {
            self.note_effect(Some(lhs));
            self.real(lhs).expect("a fresh set is an object")
        } else {
            let Some(real) = self.real_unpinned(lhs) else {
                return Ok(None);
            };
            match self.set_standing_for(&real, true)? {
                Some((copy, tracker)) => {
                    self.note_effect(Some(tracker));
                    copy
                }
                None => return Ok(None),
            }
        };
        let other = self.python_value(rhs)?;
        let operator = self.h.operator.getattr(name)?;
        if let Err(err) = operator.call1((&set, other)) {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                format!("operator {name} on a set raised {err} while tracing"),
            );
        }
        Ok(Some(lhs))
    }

    /// The set that stands for the existing set `set` while tracing, with its tracker: the
    /// copy the trace changes instead of it. With `change`, made at the first change (the
    /// set's tracker then holds the copy, and the generated code replays its final elements
    /// into the real set, see `written_containers`); None for a set the trace may not change:
    /// one it did not read from a source, or whose elements are not all constants (then it
    /// is guarded by identity, not by its elements).
    pub(super) fn set_standing_for(
        &mut self,
        set: &Bound<'py, PyAny>,
        change: bool,
    ) -> CResult<Option<(Bound<'py, PyAny>, VarId)>> {
        let py = self.py;
        let address = set.as_ptr() as usize;
        let copy_of = self
            .set_copies
            .iter()
            .find(|(_, copy)| copy.as_ptr() as usize == address)
            .map(|(real, _)| *real);
        let real = copy_of.unwrap_or(address);
        let Some(&(tracker, _)) = self.container_by_object.get(&real) else {
            return Ok(None);
        };
        if let Some(copy) = self.set_copies.get(&real) {
            return Ok(Some((copy.bind(py).clone(), tracker)));
        }
        if !change || !set.is_exact_instance_of::<PySet>() {
            return Ok(None);
        }
        for element in set.try_iter()? {
            if !self.h.is_constant(&element?)? {
                return Ok(None);
            }
        }
        let copy = PySet::new(py, set.try_iter()?.collect::<PyResult<Vec<_>>>()?)?.into_any();
        self.vars[tracker.0 as usize].kind = VarKind::Object(OwnedRef::from_bound(&copy));
        self.set_copies.insert(real, OwnedRef::from_bound(&copy));
        self.written_containers.push(tracker);
        Ok(Some((copy, tracker)))
    }

    /// Whether `id` is the tracker of an existing set the trace changed.
    pub(super) fn is_written_set(&self, id: VarId) -> bool {
        matches!(self.kind(id), VarKind::Object(o)
            if self.set_copies.values().any(|copy| copy.as_ptr() == o.as_ptr()))
    }

    /// Whether the trace knows every element of the set `id` without a further guard: one
    /// it made, or an existing one guarded by its elements (changed by the trace or not).
    /// Its length, truth and membership are then answered from the elements.
    pub(super) fn set_elements_known(&self, id: VarId) -> bool {
        if self.is_fresh_set(id) || self.is_written_set(id) {
            return true;
        }
        matches!(self.kind(id), VarKind::Object(o)
            if self.source(id).is_some()
                && self
                    .container_by_object
                    .get(&(o.as_ptr() as usize))
                    .is_some_and(|(tracker, _)| *tracker == id))
    }

    /// How the generated code makes a set the trace made: a new set of its final elements.
    pub(super) fn fresh_set_rebuild(
        &self,
        id: VarId,
        r: &mut Rebuilder,
    ) -> CResult<Option<Rebuild>> {
        if !self.is_fresh_set(id) {
            return Ok(None);
        }
        let set = self.real(id).expect("a fresh set is an object");
        self.set_elements_rebuild(&set, r).map(Some)
    }

    /// A new set of the elements `set` holds now: `set((...))` of the constants and of the
    /// tensors it holds (the real tensors, which hash by identity as the stand-in keys did) —
    /// returned or stored; not at a graph break.
    pub(super) fn set_elements_rebuild(
        &self,
        set: &Bound<'py, PyAny>,
        r: &mut Rebuilder,
    ) -> CResult<Rebuild> {
        let py = self.py;
        self.pin_set_members(set)?;
        let elements = set.try_iter()?.collect::<PyResult<Vec<_>>>()?;
        let into = OwnedRef::from_bound(&self.h.builtins.getattr("set")?);
        if !elements
            .iter()
            .any(|e| self.key_tensors.contains_key(&(e.as_ptr() as usize)))
        {
            let frozen = PyFrozenSet::new(py, elements)?;
            return Ok(Rebuild::Converted {
                into,
                value: Box::new(Rebuild::Const(OwnedRef::from_bound(frozen.as_any()))),
            });
        }
        if self.reached_stop {
            // At a graph break the set goes to the resume function as an argument, which a
            // set of tensors could only be guarded by its identity: a new compile per call.
            return unsupported(
                BreakKind::UnsupportedOperation,
                "a set of tensors made while tracing, live at a graph break",
            );
        }
        let items = elements
            .iter()
            .map(|e| match self.key_tensors.get(&(e.as_ptr() as usize)) {
                Some(&tensor) => rebuild_plan(self, tensor, r),
                None => Ok(Rebuild::Const(OwnedRef::from_bound(e))),
            })
            .collect::<CResult<Vec<_>>>()?;
        Ok(Rebuild::Converted {
            into,
            value: Box::new(Rebuild::Tuple(items)),
        })
    }

    /// The elements of a set the trace made, for iterating it.
    pub(super) fn fresh_set_items(&mut self, id: VarId) -> CResult<Option<Vec<VarId>>> {
        if !self.is_fresh_set(id) {
            return Ok(None);
        }
        let set = self.real(id).expect("a fresh set is an object");
        let mut items = Vec::new();
        for element in set.try_iter()? {
            let element = element?;
            if self.key_tensors.contains_key(&(element.as_ptr() as usize)) {
                // Python orders such a set by the tensors' addresses, which the trace cannot
                // know.
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "iterating over a set holding tensors (its order follows their addresses)",
                );
            }
            match self.identity_members.get(&(element.as_ptr() as usize)) {
                // The order follows the objects' addresses: their identities are guarded.
                Some(&member) => {
                    self.pin_identity(member);
                    items.push(member);
                }
                None => items.push(self.constant(&element)),
            }
        }
        Ok(Some(items))
    }
}

/// What a stand-in key stands for (see `Tracer::tensor_key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StandIn {
    /// A tensor, by graph node: trackers of the same tensor share one.
    Tensor(super::graph::NodeId),
    /// Another tracker (a deque's item).
    Tracker(VarId),
}
