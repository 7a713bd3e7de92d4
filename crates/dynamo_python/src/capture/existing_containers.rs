//! Containers that existed before the call (lists, dicts, sets, deques read from sources):
//! one tracker per object however it is reached, which of them the trace may change (their
//! final contents replayed by the generated code), and a real dict's entries read with
//! their guards.

use std::rc::Rc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::break_reasons::BreakKind;
use super::guards::GuardKind;
use super::source::{ItemKey, Source};
use super::translator::{kind_name, unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// The tracker of an existing list, dict, set or deque already reached (through `source` or
    /// another), recording `source` as one more way to it.
    pub(super) fn existing_container(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &Rc<Source>,
    ) -> Option<VarId> {
        let address = value.as_ptr() as usize;
        let existing = self.container_by_object.get(&address)?.0;
        let first = self.source(existing)?;
        let first_id = self.guards.sources.intern(&first);
        let id = self.guards.sources.intern(source);
        if id != first_id {
            let mut ids = Vec::with_capacity(self.container_sources.len());
            for (s, _) in &self.container_sources {
                ids.push(self.guards.sources.intern(s));
            }
            let class = ids
                .iter()
                .position(|&i| i == first_id)
                .map(|at| self.container_sources[at].1)?;
            if !ids.contains(&id) {
                self.container_sources.push((source.clone(), class));
            }
            self.containers_shared = true;
        }
        Some(existing)
    }

    /// Records `id`, a list or dict just read from its source, as the tracker of `value`.
    pub(super) fn note_container(&mut self, value: &Bound<'py, PyAny>, id: VarId) {
        let Some(source) = self.source(id) else {
            return;
        };
        let class = self.container_by_object.len();
        self.container_by_object
            .insert(value.as_ptr() as usize, (id, OwnedRef::from_bound(value)));
        self.container_sources.push((source, class));
    }

    /// Whether `id` is an existing list or dict read from a source (one tracker per object).
    pub fn is_existing_container(&self, id: VarId) -> bool {
        self.source(id).is_some()
            && matches!(self.kind(id), VarKind::List(_) | VarKind::Dict(_))
            && self.existing_container_object(id).is_some()
    }

    /// The real object an existing container's tracker `id` stands for (see
    /// `container_by_object`), if it is one.
    pub(super) fn existing_container_object(&self, id: VarId) -> Option<Bound<'py, PyAny>> {
        self.container_by_object
            .values()
            .find(|(tracker, _)| *tracker == id)
            .map(|(_, object)| object.bind(self.py).clone())
    }

    /// Whether the trace may change the container `id`: one it made, or an existing list or
    /// dict (see `may_change_container`).
    pub fn changeable_container(&self, id: VarId) -> bool {
        self.source(id).is_none() || self.is_existing_container(id)
    }

    /// Allows a change to the list or dict `id`: one made in the trace, or an existing one
    /// (its final contents are then replayed by the generated code). Refuses others.
    pub fn may_change_container(&mut self, id: VarId, what: &str) -> CResult<()> {
        self.note_effect(Some(id));
        if self.private_containers.contains(&id) {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!("{what} on a container of an object copied while tracing"),
            );
        }
        if self.capturable_groups.contains(&id) {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!("{what} on an optimizer's param group (traced with capturable=True)"),
            );
        }
        if self.source(id).is_none() {
            return Ok(());
        }
        if !self.changeable_container(id) {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!(
                    "{what} on {} that existed before the call",
                    kind_name(self.kind(id))
                ),
            );
        }
        if !self.written_containers.contains(&id) {
            self.written_containers.push(id);
        }
        Ok(())
    }

    /// `obj.name` as this trace left `obj`, when the trace changed the dict Python's lookup
    /// would find `name` in: the object's `__dict__` (`m.__dict__["training"] = False`), or
    /// for a module the `_parameters`, `_buffers` or `_modules` dict `nn.Module.__getattr__`
    /// reads (`module._parameters["weight"] = w`, as `torch.func.functional_call` swaps
    /// tensors in and out). The entry that dict's tracker holds: the real dict keeps the old
    /// one until the stores are replayed after the graph. None when no such change was made
    /// (the real object answers as the trace would).
    pub(super) fn attr_in_trace(
        &mut self,
        obj: &Bound<'py, PyAny>,
        name: &str,
    ) -> CResult<Option<VarId>> {
        if self.written_containers.is_empty() {
            return Ok(None);
        }
        let Ok(dict) = obj.getattr("__dict__") else {
            return Ok(None);
        };
        let key = pyo3::types::PyString::new(self.py, name);
        // A data descriptor of the class (a property, a slot) comes before the instance dict.
        let data_descriptor = super::guard_values::class_lookup(obj.get_type().as_any(), &key)
            .is_some_and(|entry| {
                let ty = entry.get_type();
                ty.hasattr("__set__").unwrap_or(true) || ty.hasattr("__delete__").unwrap_or(true)
            });
        // Where Python's lookup would look, in its order: the instance dict (after the
        // class's data descriptors), then a module's tables (`nn.Module.__getattr__`).
        let mut dicts = Vec::new();
        if !data_descriptor {
            dicts.push(("__dict__", dict.clone()));
        }
        // (Only where `nn.Module.__getattr__` is what a missing name runs.)
        let module_getattr = self.h.module_type.getattr("__getattr__")?;
        if obj.is_instance(&self.h.module_type)?
            && obj.get_type().getattr("__getattr__")?.is(&module_getattr)
        {
            for table in super::helpers::MODULE_TABLES {
                if let Ok(real) = dict.get_item(table) {
                    dicts.push((table, real));
                }
            }
        }
        for (which, real) in dicts {
            match self.written_entry(&real, &key)? {
                WrittenEntry::Found(value) => return Ok(Some(value)),
                WrittenEntry::Removed => {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("reading .{name} after this trace removed it from {which}"),
                    )
                }
                WrittenEntry::Unchanged(true) => return Ok(None),
                WrittenEntry::Unchanged(false) | WrittenEntry::Absent => {}
            }
        }
        Ok(None)
    }

    /// The length of the real list or dict `container` as the trace left it: its tracker's,
    /// once the trace reached it (a hook stored into `module._forward_hooks` in the trace is
    /// in the real dict only after the graph).
    pub(super) fn len_in_trace(&self, container: &Bound<'py, PyAny>) -> PyResult<usize> {
        match self
            .container_by_object
            .get(&(container.as_ptr() as usize))
            .map(|&(tracker, _)| self.kind(tracker))
        {
            Some(VarKind::Dict(entries)) => Ok(entries.len()),
            Some(VarKind::List(items)) => Ok(items.len()),
            _ => container.len(),
        }
    }

    /// What the trace's tracker of the real dict `dict` holds under `key`, if the trace
    /// changed that dict (see `WrittenEntry`).
    fn written_entry(
        &self,
        dict: &Bound<'py, PyAny>,
        key: &Bound<'py, pyo3::types::PyString>,
    ) -> CResult<WrittenEntry> {
        let tracker = match self.container_by_object.get(&(dict.as_ptr() as usize)) {
            Some(&(tracker, _)) if self.written_containers.contains(&tracker) => tracker,
            _ => return Ok(WrittenEntry::Unchanged(dict.contains(key)?)),
        };
        let VarKind::Dict(entries) = self.kind(tracker) else {
            return Ok(WrittenEntry::Unchanged(dict.contains(key)?));
        };
        if let Some((_, value)) = entries
            .iter()
            .find(|(k, _)| k.bind(self.py).eq(key).unwrap_or(false))
        {
            return Ok(WrittenEntry::Found(*value));
        }
        Ok(if dict.contains(key)? {
            WrittenEntry::Removed
        } else {
            WrittenEntry::Absent
        })
    }

    /// The entries of a real dict (or dict subclass) read from `source`: its type and keys
    /// are guarded, and each value is wrapped from its item source.
    pub fn dict_entries(
        &mut self,
        dict: &Bound<'py, PyDict>,
        source: Option<&Rc<Source>>,
    ) -> CResult<Vec<(OwnedRef, VarId)>> {
        // In the dict's own order (an `OrderedDict`'s may differ from its table's).
        let keys = super::guard_values::keys_in_order(dict)?;
        if let Some(s) = source {
            self.guards.add(
                s.clone(),
                GuardKind::Type(OwnedRef::from_bound(dict.get_type().as_any())),
            );
            self.guards.add(
                s.clone(),
                GuardKind::Keys(OwnedRef::from_bound(keys.as_any())),
            );
        }
        let mut entries = Vec::with_capacity(keys.len());
        for key in keys.iter() {
            let item = dict.get_item(&key)?.expect("key from this dict");
            let item_source = source.map(|s| Rc::new(Source::Item(s.clone(), ItemKey::of(&key))));
            self.item_of_container = true;
            let item = self.wrap(&item, item_source)?;
            entries.push((OwnedRef::from_bound(&key), item));
        }
        Ok(entries)
    }
}

/// A key of a real dict as the trace sees it (`Tracer::written_entry`).
enum WrittenEntry {
    /// The trace did not change the dict: whether the real one holds the key.
    Unchanged(bool),
    /// The trace changed the dict, and its tracker holds this value under the key.
    Found(VarId),
    /// The trace removed the key, which the real dict still holds.
    Removed,
    /// Neither holds the key.
    Absent,
}
