//! `collections.deque` made in the trace (`deque(xs, maxlen=n)`, a work queue, a window of
//! the last n values). Like the sets of `ops_sets`, such a deque is a real `deque` object
//! that belongs to the trace alone, so its own methods give Python's answers — `maxlen`
//! trimming, `rotate`, `appendleft`, the errors of `pop` on an empty deque. It holds
//! constants as themselves and any other value (a tensor, a list the trace tracks) through
//! the stand-in object of its tracker, mapped back whenever an item comes out. Where the
//! deque must exist after the trace (returned, stored, live at a graph break) the generated
//! code builds a new one of its final items with its `maxlen`. A deque that existed before
//! the call (an argument, one handed to a resume function at a graph break) is guarded by
//! its type, length, `maxlen` and items, and traced through such a copy made when it is
//! first read; if the trace changes it, the generated code gives the real deque the copy's
//! final items (`written_containers`), as the same object.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::break_reasons::BreakKind;
use super::guards::GuardKind;
use super::source::{ItemKey, Source};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use std::rc::Rc;

/// Methods that change a deque in place.
const MUTATING: &[&str] = &[
    "append",
    "appendleft",
    "extend",
    "extendleft",
    "pop",
    "popleft",
    "rotate",
    "clear",
    "insert",
    "reverse",
];

/// Methods that only read it (the equality-based ones only on deques of constants, as a
/// stand-in compares by identity where the value it stands for may not).
const READING: &[&str] = &["copy", "__len__", "index", "count", "remove"];

impl<'py> Tracer<'py> {
    /// `collections.deque(...)` or a method of a deque the trace made (see the module doc);
    /// None for any other call.
    pub(super) fn deque_call(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let deque_type = self.h.deque_type.clone();
        if obj.is(&deque_type) {
            return self.construct_deque(&deque_type, args, kwargs).map(Some);
        }
        let Ok(receiver) = obj.getattr("__self__") else {
            return Ok(None);
        };
        let Some(deque) = self.fresh_deque_of(&receiver) else {
            return Ok(None);
        };
        let name: String = obj.getattr("__name__")?.extract()?;
        let mutating = MUTATING.contains(&name.as_str());
        if !mutating && !READING.contains(&name.as_str()) {
            return Ok(None);
        }
        if !kwargs.is_empty() {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("deque.{name} with keyword arguments"),
            );
        }
        if matches!(name.as_str(), "index" | "count" | "remove")
            && self.deque_holds_stand_ins(deque)?
        {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("deque.{name} on a deque holding values other than constants"),
            );
        }
        if mutating {
            self.note_effect(Some(deque));
            self.note_deque_written(deque);
        }
        let mut values = Vec::with_capacity(args.len());
        for &arg in args {
            let value = if matches!(name.as_str(), "extend" | "extendleft") {
                let items = self.items_of(arg)?;
                let elements = self.deque_elements(&items)?;
                PyList::new(self.py, elements)?.into_any()
            } else {
                self.deque_element(arg)?
            };
            values.push(value);
        }
        let result = match obj.call1(PyTuple::new(self.py, values)?) {
            Ok(result) => result,
            Err(err) => return self.deque_error(err, &format!("deque.{name}")),
        };
        if result.get_type().is(&deque_type) {
            return Ok(Some(self.fresh_deque(&result)));
        }
        Ok(Some(self.deque_item(&result)))
    }

    /// `deque(iterable=(), maxlen=None)`: a new deque the trace owns.
    fn construct_deque(
        &mut self,
        deque_type: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        let mut iterable = args.first().copied();
        let mut maxlen = args.get(1).copied();
        for (name, value) in kwargs {
            match name.as_str() {
                "iterable" if iterable.is_none() => iterable = Some(*value),
                "maxlen" if maxlen.is_none() => maxlen = Some(*value),
                _ => {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("collections.deque() with the keyword {name:?}"),
                    )
                }
            }
        }
        if args.len() > 2 {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "collections.deque() with more than two arguments",
            );
        }
        let items = match iterable {
            Some(iterable) => self.items_of(iterable)?,
            None => Vec::new(),
        };
        let elements = self.deque_elements(&items)?;
        let maxlen = match maxlen {
            Some(m) => match self.kind(m) {
                VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
                VarKind::Const(v) => v.bind(self.py).clone(),
                VarKind::Tensor { .. }
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
                | VarKind::NdArray(_) => {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        "collections.deque() with a maxlen not known while tracing",
                    )
                }
            },
            None => self.py.None().into_bound(self.py),
        };
        let deque = match deque_type.call1((PyList::new(self.py, elements)?, &maxlen)) {
            Ok(deque) => deque,
            Err(err) => return self.deque_error(err, "collections.deque()"),
        };
        Ok(self.fresh_deque(&deque))
    }

    /// Tracks `deque`, made by the trace and held by nobody else.
    fn fresh_deque(&mut self, deque: &Bound<'py, PyAny>) -> VarId {
        self.track_deque(deque, None)
    }

    fn track_deque(&mut self, deque: &Bound<'py, PyAny>, source: Option<Rc<Source>>) -> VarId {
        let id = self.add(VarKind::Object(OwnedRef::from_bound(deque)), source);
        self.fresh_deques
            .insert(deque.as_ptr() as usize, (id, OwnedRef::from_bound(deque)));
        id
    }

    /// An exact deque read from `source`: guarded by its type, length, `maxlen` and items,
    /// and traced through a copy (see the module doc). None for anything else.
    pub(super) fn wrap_existing_deque(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &Rc<Source>,
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let deque_type = self.h.deque_type.clone();
        if !value.get_type().is(&deque_type) {
            return Ok(None);
        }
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(deque_type.as_any())),
        );
        let len = value.len()?;
        self.guards.add(source.clone(), GuardKind::Len(len));
        let maxlen = value.getattr("maxlen")?;
        let maxlen_source = Rc::new(Source::Attr(source.clone(), "maxlen".to_string()));
        self.wrap(&maxlen, Some(maxlen_source))?;
        let mut items = Vec::with_capacity(len);
        for (i, item) in value.try_iter()?.enumerate() {
            let item_source = Rc::new(Source::Item(source.clone(), ItemKey::Int(i as i64)));
            items.push(self.wrap(&item?, Some(item_source))?);
        }
        let elements = self.deque_elements(&items)?;
        let copy = deque_type.call1((PyList::new(py, elements)?, &maxlen))?;
        let id = self.track_deque(&copy, Some(source.clone()));
        self.note_container(value, id);
        Ok(Some(id))
    }

    /// Records a change to the deque `id`: one read from a source has its final items
    /// replayed into it.
    fn note_deque_written(&mut self, id: VarId) {
        if self.source(id).is_some() && !self.written_containers.contains(&id) {
            self.written_containers.push(id);
        }
    }

    /// The tracker of `obj` if it is a deque the trace made.
    fn fresh_deque_of(&self, obj: &Bound<'py, PyAny>) -> Option<VarId> {
        self.fresh_deques
            .get(&(obj.as_ptr() as usize))
            .filter(|(_, d)| d.as_ptr() == obj.as_ptr())
            .map(|(id, _)| *id)
    }

    /// Whether `id` is a deque the trace made or an existing one's copy (see the module doc).
    pub(super) fn is_fresh_deque(&self, id: VarId) -> bool {
        match self.kind(id) {
            VarKind::Object(o) => self.fresh_deque_of(&o.bind(self.py).clone()) == Some(id),
            _ => false,
        }
    }

    /// What a deque holds for the tracker `id`: a constant as itself, anything else as the
    /// tracker's stand-in.
    fn deque_element(&mut self, id: VarId) -> CResult<Bound<'py, PyAny>> {
        match self.kind(id) {
            VarKind::Const(v) => Ok(v.bind(self.py).clone()),
            _ => self.tensor_key(id),
        }
    }

    fn deque_elements(&mut self, ids: &[VarId]) -> CResult<Vec<Bound<'py, PyAny>>> {
        ids.iter().map(|&id| self.deque_element(id)).collect()
    }

    /// The tracker of an item that came out of a deque the trace made.
    fn deque_item(&mut self, item: &Bound<'py, PyAny>) -> VarId {
        match self.key_tensors.get(&(item.as_ptr() as usize)) {
            Some(&id) => id,
            None => self.constant(item),
        }
    }

    fn deque_holds_stand_ins(&self, id: VarId) -> CResult<bool> {
        Ok(self.fresh_deque_trackers(id).next().is_some())
    }

    /// The trackers a deque the trace made holds through stand-ins.
    pub(super) fn fresh_deque_trackers(&self, id: VarId) -> impl Iterator<Item = VarId> + '_ {
        let deque = self.real_unpinned(id).expect("a fresh deque is an object");
        let items: Vec<Bound<'py, PyAny>> = deque
            .try_iter()
            .map(|items| items.filter_map(Result::ok).collect())
            .unwrap_or_default();
        items
            .into_iter()
            .filter_map(|item| self.key_tensors.get(&(item.as_ptr() as usize)).copied())
    }

    /// The items of a deque the trace made, in order (None for anything else).
    pub(super) fn fresh_deque_items(&mut self, id: VarId) -> CResult<Option<Vec<VarId>>> {
        if !self.is_fresh_deque(id) {
            return Ok(None);
        }
        let deque = self.real_unpinned(id).expect("a fresh deque is an object");
        let mut items = Vec::new();
        for item in deque.try_iter()? {
            items.push(self.deque_item(&item?));
        }
        Ok(Some(items))
    }

    /// `q[i]` on a deque the trace made (None for anything else).
    pub(super) fn deque_getitem(&mut self, deque: VarId, index: VarId) -> CResult<Option<VarId>> {
        if !self.is_fresh_deque(deque) {
            return Ok(None);
        }
        let real = self
            .real_unpinned(deque)
            .expect("a fresh deque is an object");
        let index = self.python_value(index)?;
        match real.get_item(&index) {
            Ok(item) => Ok(Some(self.deque_item(&item))),
            Err(err) => self.deque_error(err, "deque indexing"),
        }
    }

    /// `q[i] = value` on a deque the trace made; false for anything else.
    pub(super) fn deque_setitem(
        &mut self,
        deque: VarId,
        index: VarId,
        value: VarId,
    ) -> CResult<bool> {
        if !self.is_fresh_deque(deque) {
            return Ok(false);
        }
        self.note_effect(Some(deque));
        self.note_deque_written(deque);
        let real = self
            .real_unpinned(deque)
            .expect("a fresh deque is an object");
        let index = self.python_value(index)?;
        let element = self.deque_element(value)?;
        if let Err(err) = real.set_item(&index, element) {
            return self.deque_error(err, "deque item assignment");
        }
        Ok(true)
    }

    /// What an operation on a deque the trace owns raised, `what` it was: the same error
    /// raised in the traced code (the traced code may catch it) for Python's own error
    /// classes, anything else a graph break.
    fn deque_error<T>(&mut self, err: PyErr, what: &str) -> CResult<T> {
        let py = self.py;
        let class = err.get_type(py);
        let builtin = class
            .getattr("__module__")
            .is_ok_and(|m| m.to_string() == "builtins");
        if !builtin {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                format!("{what} raised {err} while tracing"),
            );
        }
        let name = class.name()?.to_string();
        let message = err.value(py).str()?.into_any();
        self.raise_builtin(&name, message)
    }

    /// The real deque of `id` for a trace-time evaluation (`==`, `str()`): refused while it
    /// holds stand-ins, which are not the values they stand for.
    pub(super) fn check_deque_as_value(&self, id: VarId) -> CResult<()> {
        if self.is_fresh_deque(id) && self.deque_holds_stand_ins(id)? {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "a deque holding values other than constants used as a Python value",
            );
        }
        Ok(())
    }

    /// What the generated code needs to make a deque the trace made (None for anything
    /// else): its items in order — a tracker for each stand-in, the constants as themselves —
    /// and its `maxlen`, for `deque(items, maxlen)`.
    pub(super) fn fresh_deque_contents(&self, id: VarId) -> CResult<Option<DequeContents>> {
        if !self.is_fresh_deque(id) {
            return Ok(None);
        }
        let deque = self.real_unpinned(id).expect("a fresh deque is an object");
        let mut items = Vec::new();
        for item in deque.try_iter()? {
            let item = item?;
            items.push(match self.key_tensors.get(&(item.as_ptr() as usize)) {
                Some(&tracker) => DequeItem::Tracked(tracker),
                None => DequeItem::Constant(OwnedRef::from_bound(&item)),
            });
        }
        Ok(Some(DequeContents {
            items,
            maxlen: OwnedRef::from_bound(&deque.getattr("maxlen")?),
        }))
    }
}

/// One item of a deque the trace made, as the generated code rebuilds it.
pub enum DequeItem {
    Tracked(VarId),
    Constant(OwnedRef),
}

/// The items and `maxlen` of a deque the trace made (see `fresh_deque_contents`).
pub struct DequeContents {
    pub items: Vec<DequeItem>,
    pub maxlen: OwnedRef,
}
