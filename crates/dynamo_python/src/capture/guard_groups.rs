//! Leaf attribute reads of one object, checked together by its instance dict's version tag.
//!
//! A module's guard reads many plain attributes from its instance dict and compares each with
//! what the trace saw (`stride == (2, 2)`, `eps == 1e-05`, `training == False`): over a third
//! of resnet18's checks. While the object's type keeps its version tag and its instance dict
//! is the same dict at the same version tag as at the last pass, every key maps to the same
//! value object as then (CPython 3.11 gives a dict a new, globally unique tag on every change;
//! see `DictReadCache`), so a check answered by the value's identity, or by the equality of a
//! deeply immutable value, holds again. A group is a set of such reads from one object:
//! leaves (no other step reads through them, none is a graph input or an alias's first
//! source) whose checks are all `Equals` of a deeply immutable value or `Id`. The first
//! member the walk reaches decides for all of them: skipped when the tags are those of the
//! last pass that evaluated them, evaluated one by one otherwise (and remembered when the
//! whole guard then passes).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyComplex, PyFloat, PyInt, PyString, PyTuple};

use super::guard_values::{instance_dict_of, DictTagMemo, KnownLookup};
use crate::eval_frame::owned::OwnedRef;

pub struct InstanceDictGroup {
    /// The step whose value is the object read from.
    pub parent: usize,
    /// The type's address, checked with its version tag (see `KnownLookup::ty`).
    ty: usize,
    tag: u32,
    /// The class's renaming table (a transformers configuration's `attribute_map`), whose
    /// contents decide which key a name reads.
    renames: Option<OwnedRef>,
    dict: AtomicUsize,
    dict_tag: AtomicU64,
    renames_tag: AtomicU64,
}

/// One call's decision for a group.
#[derive(Clone, Copy, Default)]
pub struct GroupState {
    pub decided: bool,
    /// The members hold without being evaluated.
    pub holds: bool,
    current: Option<(usize, u64, u64)>,
}

impl InstanceDictGroup {
    pub fn new(parent: usize, lookup: &KnownLookup) -> InstanceDictGroup {
        InstanceDictGroup {
            parent,
            ty: lookup.ty,
            tag: lookup.tag,
            renames: lookup.renames.clone(),
            dict: AtomicUsize::new(0),
            dict_tag: AtomicU64::new(0),
            renames_tag: AtomicU64::new(0),
        }
    }

    /// Whether a member read through `lookup` from the step `parent` belongs to this group.
    pub fn admits(&self, parent: usize, lookup: &KnownLookup) -> bool {
        self.parent == parent
            && self.ty == lookup.ty
            && self.tag == lookup.tag
            && self.renames.as_ref().map(|r| r.as_ptr())
                == lookup.renames.as_ref().map(|r| r.as_ptr())
    }

    /// The instance dict's address and tag and the renaming table's tag, when `object`
    /// still looks attributes up as when the guard was built.
    fn current(&self, object: &Bound<'_, PyAny>) -> Option<(usize, u64, u64)> {
        let ty = object.get_type();
        if ty.as_ptr() as usize != self.ty {
            return None;
        }
        // SAFETY: a live type object (the object holds it); reading a field with the GIL held.
        let tag = unsafe { (*ty.as_type_ptr()).tp_version_tag };
        if tag != self.tag {
            return None;
        }
        let dict = instance_dict_of(object)?;
        let dict_tag = DictTagMemo::tag_of(dict.as_any())?;
        let renames_tag = match &self.renames {
            Some(renames) => DictTagMemo::tag_of(&renames.bind(object.py()))?,
            None => 0,
        };
        Some((dict.as_ptr() as usize, dict_tag, renames_tag))
    }

    /// Decides, for this call, whether the members can be skipped.
    pub fn decide(&self, object: Option<&Bound<'_, PyAny>>) -> GroupState {
        let current = object.and_then(|o| self.current(o));
        let holds = current.is_some_and(|(dict, dict_tag, renames_tag)| {
            dict != 0
                && self.dict.load(Relaxed) == dict
                && self.dict_tag.load(Relaxed) == dict_tag
                && self.renames_tag.load(Relaxed) == renames_tag
        });
        GroupState {
            decided: true,
            holds,
            current,
        }
    }

    /// Remembers that the members were evaluated and held on the dict as it was when
    /// `state` was decided. (If something changed the dict while the guard ran, its tag is
    /// newer than the one remembered, and the next call evaluates the members again.)
    pub fn record(&self, state: &GroupState) {
        if let (true, false, Some((dict, dict_tag, renames_tag))) =
            (state.decided, state.holds, state.current)
        {
            self.dict.store(dict, Relaxed);
            self.dict_tag.store(dict_tag, Relaxed);
            self.renames_tag.store(renames_tag, Relaxed);
        }
    }
}

/// Whether `value` can never change: numbers, strings, bytes, None, torch's dtype, device,
/// layout and memory-format objects, and tuples of such values (exact types only: a
/// subclass may carry mutable state).
pub fn deeply_immutable(value: &Bound<'_, PyAny>) -> bool {
    deeply_immutable_at(value, 0)
}

fn deeply_immutable_at(value: &Bound<'_, PyAny>, depth: usize) -> bool {
    if value.is_none()
        || value.is_exact_instance_of::<PyBool>()
        || value.is_exact_instance_of::<PyInt>()
        || value.is_exact_instance_of::<PyFloat>()
        || value.is_exact_instance_of::<PyString>()
        || value.is_exact_instance_of::<PyBytes>()
        || value.is_exact_instance_of::<PyComplex>()
    {
        return true;
    }
    if let Ok(tuple) = value.cast_exact::<PyTuple>() {
        return depth < 8
            && tuple
                .iter()
                .all(|item| deeply_immutable_at(&item, depth + 1));
    }
    let ty = value.get_type();
    let module = ty.module().map(|m| m.to_string()).unwrap_or_default();
    let name = ty.name().map(|n| n.to_string()).unwrap_or_default();
    module == "torch"
        && matches!(
            name.as_str(),
            "dtype" | "device" | "layout" | "memory_format"
        )
}
