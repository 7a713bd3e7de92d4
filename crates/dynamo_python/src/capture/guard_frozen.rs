//! Frozen subtrees of a guard plan: reads from dicts skipped while no dict they go through
//! has changed.
//!
//! A module tree's guard is mostly reads from dicts — `self.__dict__["_modules"]["layer1"]`,
//! `._parameters["weight"]` — and checks answered by the identity of what was read (`is the
//! same object`, `== 1e-05` of an immutable value, `has type Conv2d`, no hooks, no instance
//! attribute hiding `forward`). CPython 3.11 gives a dict a new version tag, unique in the
//! process, on every change, and a type a new version tag on every change to it or its
//! bases. So when the object a subtree hangs from is the same object as at the last pass,
//! and every instance dict and dict the subtree reads through (and the type of every
//! object it reads an instance attribute from) has the tag it had then, every read gives the
//! same object as then and every such check holds again: the subtree costs one pass over a
//! flat list of these *witnesses* instead of a walk with a dict lookup per step. Only the
//! checks that look inside an object — tensors' metadata, aliasing — run again, on the
//! objects remembered.
//!
//! Memory: the objects are remembered by address only. Witnesses are checked in the order
//! they were recorded, parents before children, and each one's address is proven alive by
//! the ones before it: the subtree's root is this call's value; an object read from an
//! instance dict or dict whose witness held is still referenced by that (unchanged) dict, an
//! item of a tuple so vouched for by that tuple. A dict or type freed and another allocated
//! at the same address has another tag (tags are never reused), so address reuse cannot pass
//! for the old one. The root's address alone proves nothing (it may be another object at a
//! freed one's address): every read from the root goes through a tagged witness on it, so
//! items of a root tuple are never remembered.
//!
//! A subtree whose tags change on every call (a module that counts its calls in an
//! attribute) is recorded again a few times in a row, then left to the normal walk for good;
//! one that changes now and then (an attribute set once per epoch) holds in between, which
//! clears the count.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::eval_frame::owned::OwnedRef;

use super::guard_values::{
    class_lookup, is_module_lookup, known_hasattr, module_call_hooks, module_tables, AttrRead,
    DictReadCache, DictTagMemo, KnownLookup,
};

/// How a step reads its value from its parent, where a witness can vouch for the read.
pub enum FrozenRead {
    /// From the parent's instance dict, as the plan's `InstanceAttr` read does while the
    /// parent still looks `name` up as `lookup` says (its type at a version tag; for a
    /// renaming class, the renaming table's answer — witnessed too).
    InstanceDict { lookup: KnownLookup, name: OwnedRef },
    /// An item of the parent, an exact dict or an exact tuple.
    Item { key: OwnedRef },
    /// A global of a frame or an inlined function: from its globals dict, else its builtins
    /// dict (both held by the plan, so always alive).
    Global {
        globals: OwnedRef,
        builtins: OwnedRef,
        name: OwnedRef,
    },
    /// `getattr_static(parent, name)` of a class: found along its MRO, which its version tag
    /// vouches for (any change to a class or its bases gives it a new tag).
    ClassAttr { name: OwnedRef },
    /// A function's `__code__` (witnessed through a weak reference to the code), its
    /// `__globals__` or `__closure__` (fixed for the function's life, so vouched for by the
    /// function being the same object: never read from the root, which may be another
    /// function at a freed one's address), or a module's global from the module's own dict.
    /// Not `__defaults__`/`__kwdefaults__`: replaceable tuples, which a freed one's address
    /// could pass for.
    Attr { read: AttrRead, name: OwnedRef },
}

impl FrozenRead {
    /// Whether the read is only vouched for when its parent is a member (proven the same
    /// object by the witnesses before it), not the root.
    fn needs_vouched_parent(&self) -> bool {
        matches!(
            self,
            FrozenRead::Attr {
                read: AttrRead::FunctionGlobals | AttrRead::FunctionClosure,
                ..
            }
        )
    }
}

/// What a check on a step's value needs witnessed to hold again without running.
pub enum ValueWitness {
    /// Its type (`has type ...`).
    TypeOf,
    /// Its instance dict (`has no instance attribute forward`).
    InstanceDict,
    /// Its instance dict and the four hook tables in it (`has no hooks`).
    ModuleHooks,
    /// Its own contents, a dict with dict's `len` and `in` (`has keys`, `has length`,
    /// `contains`).
    DictContents,
    /// Its lookup of this name, which finds nothing (`has no attribute`): its type (whose
    /// tag covers the whole MRO), its instance dict and, for a module, the tables
    /// `Module.__getattr__` looks in; for a renaming class (`known`), its renaming table.
    LacksAttribute(OwnedRef, Option<KnownLookup>),
}

/// One step as the planner sees it.
pub struct StepShape {
    pub parent: Option<usize>,
    /// None: the step is always read the normal way.
    pub read: Option<FrozenRead>,
    /// None: a check that needs the value each time and is not re-run on a remembered
    /// object (the step is always read and checked the normal way).
    pub witnesses: Option<Vec<ValueWitness>>,
    /// Someone reads the step's value when its subtree is frozen: a tensor or aliasing
    /// check, a graph input, a shape input, a step read the normal way from it.
    pub needed: bool,
    /// What is done with the value when the subtree is frozen (`needed` steps only).
    pub uses: FrozenUses,
}

/// What the walk does with a needed member's remembered value, known when planning so that
/// a frozen walk does not go through the step's checks.
#[derive(Clone, Copy, Default)]
pub struct FrozenUses {
    /// It is checked as a tensor after the walk (with the tensors reached).
    pub tensor: bool,
    /// An aliasing or distinctness check looks at it (the walk goes through its checks).
    pub identity: bool,
}

enum Witness {
    /// The object's type is `ty` at version `ty_tag`, and its instance dict is `dict` at
    /// version `dict_tag`.
    InstanceDict {
        object: usize,
        ty: usize,
        ty_tag: u32,
        dict: usize,
        dict_tag: u64,
    },
    /// The object at `dict` is of type `ty` (a dict or dict subclass) and has version `tag`.
    Dict { dict: usize, ty: usize, tag: u64 },
    /// The object's type is `ty`.
    TypeOf { object: usize, ty: usize },
    /// The class at `ty` has version tag `tag`.
    TypeTag { ty: usize, tag: u32 },
    /// The function at `function` still holds in its `__code__` the code object that
    /// `code` (a weak reference) refers to: the weak reference proves that object is the
    /// one recorded, not another at its address.
    FunctionCode { function: usize, code: OwnedRef },
}

pub struct Snapshot {
    /// The root's address (0 for a tree of constants).
    root: usize,
    witnesses: Vec<Witness>,
    /// The address of each member someone reads (`Tree::needed` order).
    values: Vec<usize>,
}

struct Tree {
    /// The step the subtree hangs from (read the normal way); None for a tree of globals
    /// of one globals dict, which hangs from constants the plan holds.
    root: Option<usize>,
    /// The steps vouched for by the witnesses, parents first.
    members: Vec<usize>,
    /// The members whose values are read when the tree holds, and what is done with them.
    needed: Vec<(usize, FrozenUses)>,
    snapshot: Mutex<Option<Arc<Snapshot>>>,
    records: AtomicU32,
    retired: AtomicBool,
}

/// How many times in a row (without holding in between) a subtree is recorded before it is
/// left to the normal walk.
const RECORD_LIMIT: u32 = 8;

pub struct FrozenTrees {
    /// The tree each step is a member of, and its position among the members.
    member_of: Vec<Option<(u32, u32)>>,
    /// For a member someone reads: its position in its tree's `needed`.
    needed_slot: Vec<Option<u32>>,
    /// For a member: the step after the run of consecutive steps of its tree it is in (a
    /// frozen tree's run is passed over in one jump).
    run_end: Vec<u32>,
    reads: Vec<Option<FrozenRead>>,
    value_witnesses: Vec<Vec<ValueWitness>>,
    parents: Vec<Option<usize>>,
    trees: Vec<Tree>,
}

/// One call's view of a tree: undecided until its first member is reached.
#[derive(Default)]
pub enum TreeState<'py> {
    #[default]
    Undecided,
    /// Frozen: the remembered values of the members someone reads, taken as the tree was
    /// decided — before any later step can run code that changes a dict the witnesses
    /// vouched for and frees what it held.
    Holds(Held<'py>),
    /// Read the normal way (and recorded after a passing check).
    Walked,
}

/// The remembered values of a frozen tree's members that someone reads (`Tree::needed`
/// order), and how many of them the walk has passed.
pub struct Held<'py> {
    values: Vec<Option<Bound<'py, PyAny>>>,
    next: usize,
}

impl FrozenTrees {
    /// Groups the steps into subtrees: a step belongs to one when its read can be vouched
    /// for and every check on it either holds with the same object or runs again on it; its
    /// tree is its parent's, or a new one hanging from its parent.
    pub fn plan(shapes: Vec<StepShape>) -> FrozenTrees {
        let mut member_of: Vec<Option<(u32, u32)>> = vec![None; shapes.len()];
        let mut trees: Vec<Tree> = Vec::new();
        // Trees by root: a step, or a globals dict (its globals' tree).
        let mut tree_of_root: std::collections::HashMap<(usize, bool), u32> = Default::default();
        let mut needed = Vec::with_capacity(shapes.len());
        let mut uses = Vec::with_capacity(shapes.len());
        let mut reads = Vec::with_capacity(shapes.len());
        let mut value_witnesses = Vec::with_capacity(shapes.len());
        let mut parents = Vec::with_capacity(shapes.len());
        for (index, shape) in shapes.into_iter().enumerate() {
            // The tree a vouched-for step joins: its parent's, or one hanging from its parent,
            // or (a global) its globals dict's.
            let root_key = match (&shape.read, &shape.witnesses, shape.parent) {
                (Some(FrozenRead::Global { globals, .. }), Some(_), None) => {
                    Some((globals.as_ptr() as usize, true))
                }
                (Some(FrozenRead::Global { .. }), _, _) | (_, None, _) | (None, _, _) => None,
                (Some(read), Some(_), Some(parent)) => match member_of[parent] {
                    // A field fixed for the function's life says nothing when the function
                    // (the root, read the normal way) may be another one at its address.
                    None if read.needs_vouched_parent() => None,
                    Some((tree, _)) => {
                        let members = &mut trees[tree as usize].members;
                        member_of[index] = Some((tree, members.len() as u32));
                        members.push(index);
                        None
                    }
                    None => Some((parent, false)),
                },
                (Some(_), Some(_), None) => None,
            };
            if let Some((key, globals)) = root_key {
                let tree = *tree_of_root.entry((key, globals)).or_insert_with(|| {
                    trees.push(Tree {
                        root: (!globals).then_some(key),
                        members: Vec::new(),
                        needed: Vec::new(),
                        snapshot: Mutex::new(None),
                        records: AtomicU32::new(0),
                        retired: AtomicBool::new(false),
                    });
                    trees.len() as u32 - 1
                });
                let members = &mut trees[tree as usize].members;
                member_of[index] = Some((tree, members.len() as u32));
                members.push(index);
            }
            needed.push(shape.needed);
            uses.push(shape.uses);
            reads.push(shape.read);
            value_witnesses.push(shape.witnesses.unwrap_or_default());
            parents.push(shape.parent);
        }
        // A member read the normal way needs nothing from a frozen parent; a step read the
        // normal way from a member needs that member's value.
        for index in 0..parents.len() {
            if let Some(parent) = parents[index] {
                if member_of[index].is_none() && member_of[parent].is_some() {
                    needed[parent] = true;
                }
            }
        }
        let mut needed_slot = vec![None; member_of.len()];
        for (index, slot) in needed_slot.iter_mut().enumerate() {
            if let (Some((tree, _)), true) = (member_of[index], needed[index]) {
                let tree = &mut trees[tree as usize];
                *slot = Some(tree.needed.len() as u32);
                tree.needed.push((index, uses[index]));
            }
        }
        let mut run_end = vec![0u32; member_of.len()];
        let mut end = member_of.len();
        for index in (0..member_of.len()).rev() {
            let tree = member_of[index].map(|(tree, _)| tree);
            if tree.is_some() {
                let next = member_of
                    .get(index + 1)
                    .and_then(|m| m.map(|(tree, _)| tree));
                if next != tree {
                    end = index + 1;
                }
                run_end[index] = end as u32;
            }
        }
        FrozenTrees {
            member_of,
            needed_slot,
            run_end,
            reads,
            value_witnesses,
            parents,
            trees,
        }
    }

    /// Each tree's root step (None: a globals dict's), member count and whether a snapshot
    /// is armed (for tests).
    pub fn summary(&self) -> Vec<(Option<usize>, usize, bool)> {
        self.trees
            .iter()
            .map(|tree| {
                let armed = tree.snapshot.lock().map(|s| s.is_some()).unwrap_or(false);
                (tree.root, tree.members.len(), armed)
            })
            .collect()
    }

    pub fn tree_count(&self) -> usize {
        self.trees.len()
    }

    /// The tree `step` is a member of, if any.
    pub fn tree_of(&self, step: usize) -> Option<usize> {
        self.member_of[step].map(|(tree, _)| tree as usize)
    }

    /// The tree's root step; None for a tree of globals (it hangs from constants).
    pub fn root(&self, tree: usize) -> Option<usize> {
        self.trees[tree].root
    }

    /// Whether the tree holds for this call, given its root's value (None: the root step
    /// was not read; ignored for a tree of globals).
    pub fn decide<'py>(
        &self,
        py: Python<'py>,
        tree: usize,
        root: Option<&Bound<'py, PyAny>>,
    ) -> TreeState<'py> {
        let tree = &self.trees[tree];
        let root_address = match (tree.root, root) {
            (None, _) => 0,
            (Some(_), Some(root)) => root.as_ptr() as usize,
            (Some(_), None) => return TreeState::Walked,
        };
        let snapshot = match tree.snapshot.lock() {
            Ok(guard) => guard.clone(),
            Err(_) => None,
        };
        let Some(snapshot) = snapshot else {
            return TreeState::Walked;
        };
        if snapshot.root != root_address {
            return TreeState::Walked;
        }
        // SAFETY: witnesses are checked in order; each address is the root (alive: the
        // caller holds its value) or was proven alive by the witnesses before it (see the
        // module docs). Only fields are read, with the GIL held.
        let holds = snapshot
            .witnesses
            .iter()
            .all(|witness| unsafe { witness_holds(witness) });
        if !holds {
            return TreeState::Walked;
        }
        // Held again: the records so far were changes now settled (an attribute set once
        // per epoch), not a subtree that changes on every call.
        if tree.records.load(Relaxed) != 0 {
            tree.records.store(0, Relaxed);
        }
        let values = snapshot
            .values
            .iter()
            .map(|&address| {
                // SAFETY: the witnesses held just now, so the object at `address` is the one
                // read at the last pass and still referenced by an unchanged dict (alive);
                // the Bound takes a new reference.
                Some(unsafe { Bound::from_borrowed_ptr(py, address as *mut pyo3::ffi::PyObject) })
            })
            .collect();
        TreeState::Holds(Held { values, next: 0 })
    }

    /// The step after the run of consecutive members of `step`'s tree that `step` is in.
    pub fn run_end(&self, step: usize) -> usize {
        self.run_end[step] as usize
    }

    /// The next member of a tree that holds, before step `end`, whose value someone reads,
    /// with its remembered value; members are passed in step order.
    pub fn next_needed<'py>(
        &self,
        tree: usize,
        held: &mut Held<'py>,
        end: usize,
    ) -> Option<(usize, FrozenUses, Option<Bound<'py, PyAny>>)> {
        let (member, uses) = *self.trees[tree].needed.get(held.next)?;
        if member >= end {
            return None;
        }
        let value = held.values.get_mut(held.next).and_then(Option::take);
        held.next += 1;
        Some((member, uses, value))
    }

    /// After a passing check that walked `tree`: remembers what makes its reads and checks
    /// hold again. Each member is read again from its dict and `verify` runs its checks on
    /// what was found (none of them runs user code, so no tag moves in between); nothing is
    /// remembered when a read or a check cannot be vouched for by tags (the tree stays
    /// walked).
    pub fn record(
        &self,
        py: Python<'_>,
        tree: usize,
        values: &[Option<Bound<'_, PyAny>>],
        verify: &dyn Fn(usize, &Bound<'_, PyAny>) -> bool,
    ) {
        let tree_ref = &self.trees[tree];
        if tree_ref.retired.load(Relaxed) {
            return;
        }
        if tree_ref.records.fetch_add(1, Relaxed) >= RECORD_LIMIT {
            tree_ref.retired.store(true, Relaxed);
            if let Ok(mut guard) = tree_ref.snapshot.lock() {
                *guard = None;
            }
            return;
        }
        let snapshot = self.snapshot(py, tree_ref, values, verify);
        if let Ok(mut guard) = tree_ref.snapshot.lock() {
            *guard = snapshot.map(Arc::new);
        }
    }

    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        tree: &Tree,
        values: &[Option<Bound<'_, PyAny>>],
        verify: &dyn Fn(usize, &Bound<'_, PyAny>) -> bool,
    ) -> Option<Snapshot> {
        let root = match tree.root {
            Some(step) => Some(values.get(step)?.as_ref()?),
            None => None,
        };
        let mut witnesses = Vec::new();
        let mut witnessed: std::collections::HashSet<(usize, u8)> = Default::default();
        let mut member_values = Vec::with_capacity(tree.needed.len());
        // Each member as found again (a leaf its group let through was not read this call).
        let mut read: std::collections::HashMap<usize, Bound<'_, PyAny>> = Default::default();
        if let (Some(step), Some(root)) = (tree.root, root) {
            read.insert(step, root.clone());
        }
        for &member in &tree.members {
            let found = match self.reads[member].as_ref()? {
                FrozenRead::Global {
                    globals,
                    builtins,
                    name,
                } => {
                    // Found in the globals dict, or missing there and found in the builtins.
                    let globals = globals.bind(py).clone().cast_into_exact::<PyDict>().ok()?;
                    dict_witness(globals.as_any(), &mut witnesses, &mut witnessed)?;
                    match globals.get_item(name.bind(py)).ok()? {
                        Some(found) => found,
                        None => {
                            // `__builtins__` is the builtins module in `__main__`: its dict.
                            let builtins = builtins.bind(py);
                            let builtins = match builtins.cast::<pyo3::types::PyModule>() {
                                Ok(module) => module.dict(),
                                Err(_) => builtins.clone().cast_into_exact::<PyDict>().ok()?,
                            };
                            dict_witness(builtins.as_any(), &mut witnesses, &mut witnessed)?;
                            builtins.get_item(name.bind(py)).ok()??
                        }
                    }
                }
                other => {
                    let parent = self.parents[member]?;
                    let parent_value = read.get(&parent)?.clone();
                    self.read_from_parent(
                        other,
                        tree,
                        parent,
                        &parent_value,
                        &mut witnesses,
                        &mut witnessed,
                    )?
                }
            };
            if let Some(Some(value)) = values.get(member) {
                if !value.is(&found) {
                    return None; // read another way than from the dict (a fallback)
                }
            }
            if !verify(member, &found) {
                return None;
            }
            for need in &self.value_witnesses[member] {
                value_witness(py, &found, need, &mut witnesses, &mut witnessed)?;
            }
            if self.needed_slot[member].is_some() {
                member_values.push(found.as_ptr() as usize);
            }
            read.insert(member, found);
        }
        Some(Snapshot {
            root: root.map_or(0, |root| root.as_ptr() as usize),
            witnesses,
            values: member_values,
        })
    }

    /// What member read `how` from `parent_value` (the value of step `parent`) finds now,
    /// with the witnesses that vouch for the read; None when nothing can vouch for it.
    fn read_from_parent<'py>(
        &self,
        how: &FrozenRead,
        tree: &Tree,
        parent: usize,
        parent_value: &Bound<'py, PyAny>,
        witnesses: &mut Vec<Witness>,
        witnessed: &mut std::collections::HashSet<(usize, u8)>,
    ) -> Option<Bound<'py, PyAny>> {
        let py = parent_value.py();
        Some(match how {
            FrozenRead::InstanceDict { lookup, name } => {
                // The read the plan makes (type and tag, renaming table) finds the dict.
                let dict = lookup.instance_dict(parent_value, &name.bind(py))?;
                let witnessed_dict = instance_dict_witness(parent_value, witnesses, witnessed)?;
                if !witnessed_dict.is(&dict) {
                    return None;
                }
                if let Some(renames) = &lookup.renames {
                    dict_witness(&renames.bind(py), witnesses, witnessed)?;
                }
                let key = lookup.key.as_ref().unwrap_or(name);
                dict.get_item(key.bind(py)).ok()??
            }
            FrozenRead::Item { key } => {
                if let Ok(tuple) = parent_value.cast_exact::<PyTuple>() {
                    // Immutable: the same tuple holds the same items — but only a tuple
                    // vouched for by the witnesses before it is known to be the same
                    // tuple. The root has no tag: another tuple can be at its address.
                    if Some(parent) == tree.root {
                        return None;
                    }
                    tuple.as_any().get_item(key.bind(py)).ok()?
                } else {
                    let dict = parent_value.cast_exact::<PyDict>().ok()?;
                    dict_witness(dict.as_any(), witnesses, witnessed)?;
                    dict.get_item(key.bind(py)).ok()??
                }
            }
            FrozenRead::ClassAttr { name } => {
                let ty = parent_value.cast::<pyo3::types::PyType>().ok()?;
                let found = class_lookup(ty.as_any(), name.bind(py).cast::<PyString>().ok()?)?;
                // SAFETY: a live type (we hold it); the lookup just gave it a tag if it
                // can have one.
                let tag = unsafe { (*ty.as_type_ptr()).tp_version_tag };
                if tag == 0 {
                    return None;
                }
                if witnessed.insert((ty.as_ptr() as usize, 2)) {
                    witnesses.push(Witness::TypeTag {
                        ty: ty.as_ptr() as usize,
                        tag,
                    });
                }
                found
            }
            FrozenRead::Attr { read, name } => match read {
                AttrRead::ModuleDict => {
                    let module = parent_value.cast_exact::<pyo3::types::PyModule>().ok()?;
                    let dict = module.dict();
                    dict_witness(dict.as_any(), witnesses, witnessed)?;
                    dict.get_item(name.bind(py)).ok()??
                }
                AttrRead::FunctionCode => {
                    let found = AttrRead::FunctionCode.read(
                        parent_value,
                        &name.bind(py),
                        &DictReadCache::default(),
                    )?;
                    // SAFETY: a live object, GIL held; a new reference or NULL (an object
                    // without weak references: nothing is remembered then).
                    let weak = unsafe {
                        pyo3::ffi::PyWeakref_NewRef(found.as_ptr(), std::ptr::null_mut())
                    };
                    if weak.is_null() {
                        let _ = PyErr::take(py);
                        return None;
                    }
                    witnesses.push(Witness::FunctionCode {
                        function: parent_value.as_ptr() as usize,
                        // SAFETY: the new reference just made, handed over.
                        code: unsafe { OwnedRef::from_owned(weak) }?,
                    });
                    found
                }
                AttrRead::FunctionGlobals | AttrRead::FunctionClosure => {
                    // Read-only fields: the same function holds the same objects.
                    read.read(parent_value, &name.bind(py), &DictReadCache::default())?
                }
                AttrRead::Generic | AttrRead::FunctionDefaults | AttrRead::FunctionKwDefaults => {
                    return None
                }
            },
            FrozenRead::Global { .. } => return None,
        })
    }
}

/// Adds what vouches for a check on `found` (`need`) to `witnesses`; None when nothing can
/// (a dict subclass with its own `len`/`in`, an attribute answer that needs code to run).
fn value_witness(
    py: Python<'_>,
    found: &Bound<'_, PyAny>,
    need: &ValueWitness,
    witnesses: &mut Vec<Witness>,
    witnessed: &mut std::collections::HashSet<(usize, u8)>,
) -> Option<()> {
    match need {
        ValueWitness::TypeOf => witnesses.push(Witness::TypeOf {
            object: found.as_ptr() as usize,
            ty: found.get_type().as_ptr() as usize,
        }),
        ValueWitness::InstanceDict => {
            instance_dict_witness(found, witnesses, witnessed)?;
        }
        ValueWitness::ModuleHooks => {
            let dict = instance_dict_witness(found, witnesses, witnessed)?;
            for name in module_call_hooks(py) {
                let table = dict.get_item(name.bind(py)).ok()??;
                dict_witness(&table, witnesses, witnessed)?;
            }
        }
        ValueWitness::DictContents => {
            DictTagMemo::tag_of(found)?;
            // An `OrderedDict` reorders its keys without a new version tag.
            if !found.is_exact_instance_of::<pyo3::types::PyDict>()
                && found.hasattr("move_to_end").unwrap_or(true)
            {
                return None;
            }
            dict_witness(found, witnesses, witnessed)?;
        }
        ValueWitness::LacksAttribute(name, known) => {
            let name = name.bind(py);
            let name = name.cast::<PyString>().ok()?;
            // Only an answer found without running code is vouched for.
            if known_hasattr(found, name, known.as_ref()) != Some(false) {
                return None;
            }
            if let Some(renames) = known.as_ref().and_then(|k| k.renames.as_ref()) {
                dict_witness(&renames.bind(py), witnesses, witnessed)?;
            }
            let dict = instance_dict_witness(found, witnesses, witnessed)?;
            if is_module_lookup(&found.get_type()) {
                for table in module_tables(py) {
                    if let Some(table) = dict.get_item(table.bind(py)).ok()? {
                        dict_witness(&table, witnesses, witnessed)?;
                    }
                }
            }
        }
    }
    Some(())
}
/// Adds a witness of `object`'s type and instance dict (once per object) and returns the
/// dict; None when the object has no instance dict or its type no version tag.
fn instance_dict_witness<'py>(
    object: &Bound<'py, PyAny>,
    witnesses: &mut Vec<Witness>,
    witnessed: &mut std::collections::HashSet<(usize, u8)>,
) -> Option<Bound<'py, PyDict>> {
    let dict = super::guard_values::instance_dict_of(object)?;
    let ty = object.get_type();
    // SAFETY: a live type object (the object holds it); GIL held.
    let ty_tag = unsafe { (*ty.as_type_ptr()).tp_version_tag };
    if ty_tag == 0 {
        return None;
    }
    if witnessed.insert((object.as_ptr() as usize, 0)) {
        witnesses.push(Witness::InstanceDict {
            object: object.as_ptr() as usize,
            ty: ty.as_ptr() as usize,
            ty_tag,
            dict: dict.as_ptr() as usize,
            // SAFETY: a live dict we hold; GIL held.
            dict_tag: unsafe { dict_tag(dict.as_ptr()) },
        });
    }
    Some(dict)
}

/// Adds a witness of the dict (or subclass) `value`'s version tag (once per dict).
fn dict_witness(
    value: &Bound<'_, PyAny>,
    witnesses: &mut Vec<Witness>,
    witnessed: &mut std::collections::HashSet<(usize, u8)>,
) -> Option<()> {
    // SAFETY: a live object; GIL held.
    if unsafe { pyo3::ffi::PyDict_Check(value.as_ptr()) } == 0 {
        return None;
    }
    if witnessed.insert((value.as_ptr() as usize, 1)) {
        witnesses.push(Witness::Dict {
            dict: value.as_ptr() as usize,
            ty: value.get_type().as_ptr() as usize,
            // SAFETY: a live dict (subclass) we hold; GIL held.
            tag: unsafe { dict_tag(value.as_ptr()) },
        });
    }
    Some(())
}

/// # Safety
/// `dict` points to a live dict (or dict subclass); the GIL is held.
unsafe fn dict_tag(dict: *mut pyo3::ffi::PyObject) -> u64 {
    // SAFETY: per the contract, laid out as a PyDictObject.
    unsafe { (*(dict as *mut pyo3::ffi::PyDictObject)).ma_version_tag }
}

extern "C" {
    /// CPython's pointer to an object's instance-dict slot (made from inline values first
    /// when the object keeps them that way), or NULL when its type has none. Exported by
    /// libpython 3.11; pyo3 leaves it out as private.
    fn _PyObject_GetDictPtr(object: *mut pyo3::ffi::PyObject) -> *mut *mut pyo3::ffi::PyObject;
}

/// CPython 3.11's flag for a type whose instances keep their dict before the object header
/// (`Py_TPFLAGS_MANAGED_DICT`): the dict pointer three words before it, the inline values
/// pointer four words before it.
const MANAGED_DICT: std::os::raw::c_ulong = 1 << 4;

/// The instance dict `object` holds now, without making one (NULL when it has none or
/// keeps its attributes as inline values).
///
/// # Safety
/// `object` points to a live object; the GIL is held.
unsafe fn current_instance_dict(object: *mut pyo3::ffi::PyObject) -> *mut pyo3::ffi::PyObject {
    // SAFETY: a live object's type is alive; reading its slots with the GIL held.
    let ty = unsafe { &*pyo3::ffi::Py_TYPE(object) };
    if ty.tp_flags & MANAGED_DICT != 0 {
        // SAFETY: for such types CPython 3.11 lays out the dict pointer three words before
        // the object header, inside the object's allocation.
        return unsafe { *(object as *mut *mut pyo3::ffi::PyObject).sub(3) };
    }
    if ty.tp_dictoffset > 0 {
        // SAFETY: a positive `tp_dictoffset` is the slot's offset inside the object.
        return unsafe {
            *((object as *mut u8).add(ty.tp_dictoffset as usize) as *mut *mut pyo3::ffi::PyObject)
        };
    }
    // SAFETY: a live object, GIL held (negative offsets depend on the object's size).
    let slot = unsafe { _PyObject_GetDictPtr(object) };
    if slot.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the slot pointer CPython just gave for this live object.
    unsafe { *slot }
}

/// # Safety
/// Every address in `witness` must be proven alive by the witnesses checked before it (see
/// the module docs); the GIL is held.
unsafe fn witness_holds(witness: &Witness) -> bool {
    match *witness {
        Witness::InstanceDict {
            object,
            ty,
            ty_tag,
            dict,
            dict_tag: tag,
        } => {
            let object = object as *mut pyo3::ffi::PyObject;
            // SAFETY: `object` is alive (contract); its type is alive while it is.
            let object_type = unsafe { pyo3::ffi::Py_TYPE(object) };
            if object_type as usize != ty {
                return false;
            }
            // SAFETY: as above.
            if unsafe { (*object_type).tp_version_tag } != ty_tag {
                return false;
            }
            // SAFETY: as above.
            let current = unsafe { current_instance_dict(object) };
            // SAFETY: the object's current dict, alive while the object references it.
            current as usize == dict && unsafe { dict_tag(current) } == tag
        }
        Witness::Dict {
            dict,
            ty,
            tag: expected,
        } => {
            let dict = dict as *mut pyo3::ffi::PyObject;
            // SAFETY: the object is alive (contract); a dict (subclass) once its type is
            // the one recorded.
            unsafe { pyo3::ffi::Py_TYPE(dict) as usize == ty && dict_tag(dict) == expected }
        }
        Witness::TypeOf { object, ty } => {
            // SAFETY: the object is alive (contract).
            unsafe { pyo3::ffi::Py_TYPE(object as *mut pyo3::ffi::PyObject) as usize == ty }
        }
        Witness::TypeTag { ty, tag } => {
            // SAFETY: the class is alive (contract); its tag is a field of the type object.
            // A class freed and another made at its address has another tag (never reused).
            unsafe { (*(ty as *mut pyo3::ffi::PyTypeObject)).tp_version_tag == tag }
        }
        Witness::FunctionCode { function, ref code } => {
            let function = function as *mut pyo3::ffi::PyObject;
            // SAFETY: the function is alive (contract) and its fields are read only once it
            // is known to be an exact function; the weak reference is held by the witness.
            unsafe {
                pyo3::ffi::Py_TYPE(function) == std::ptr::addr_of_mut!(pyo3::ffi::PyFunction_Type)
                    && pyo3::ffi::PyFunction_GetCode(function)
                        == pyo3::ffi::PyWeakref_GetObject(code.as_ptr())
            }
        }
    }
}

/// The planner's view of a guard's steps: which reads and checks tags can vouch for, and
/// which values are read when a subtree is frozen (graph inputs, shape inputs, tensors,
/// aliasing checks and their first sources).
pub(super) fn step_shapes(
    py: Python<'_>,
    steps: &[super::guards::Step],
    graph_inputs: &[usize],
    shape_inputs: &[usize],
) -> Vec<StepShape> {
    use super::guards::{Access, Check};
    let mut needed = vec![false; steps.len()];
    for &index in graph_inputs.iter().chain(shape_inputs) {
        if let Some(n) = needed.get_mut(index) {
            *n = true;
        }
    }
    for (index, step) in steps.iter().enumerate() {
        for check in &step.checks {
            match check {
                Check::Alias(first) => {
                    needed[index] = true;
                    needed[*first] = true;
                }
                Check::Tensor | Check::DistinctObject => needed[index] = true,
                _ => {}
            }
        }
    }
    let uses_of = |step: &super::guards::Step| FrozenUses {
        tensor: !step.is_argument && step.checks.iter().any(|c| matches!(c, Check::Tensor)),
        identity: step
            .checks
            .iter()
            .any(|c| matches!(c, Check::Alias(_) | Check::DistinctObject)),
    };
    // The type each step's value is known to have when its checks hold (an identity, a
    // type check, a constant): an attribute read is only vouched for on the kind of object
    // its witness knows how to read (a function's field, a module's dict, a class's MRO).
    let known_type: Vec<Option<usize>> = steps
        .iter()
        .map(|step| {
            let from_checks = step.checks.iter().find_map(|check| match check {
                Check::Id(identity) => identity.get(py).map(|v| v.get_type().as_ptr() as usize),
                Check::Type(ty) => Some(ty.address()),
                _ => None,
            });
            from_checks.or(match &step.access {
                Access::Object(object) => object.get(py).map(|o| o.get_type().as_ptr() as usize),
                _ => None,
            })
        })
        .collect();
    // A class: its type (a metaclass) is `type` or a subclass of it.
    let is_class = |step: Option<usize>| {
        step.and_then(|s| known_type[s]).is_some_and(|ty| {
            // SAFETY: the address of a live type object (a value's type, held by it).
            unsafe {
                pyo3::ffi::PyType_IsSubtype(
                    ty as *mut pyo3::ffi::PyTypeObject,
                    std::ptr::addr_of_mut!(pyo3::ffi::PyType_Type),
                ) != 0
            }
        })
    };
    let has_type = |step: Option<usize>, expected: *mut pyo3::ffi::PyTypeObject| {
        step.and_then(|s| known_type[s]) == Some(expected as usize)
    };
    steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            let read = match &step.access {
                // A property's getter can be replaced (`__code__`) without any tag moving.
                Access::InstanceAttr { name, lookup, .. } if lookup.property.is_none() => {
                    Some(FrozenRead::InstanceDict {
                        lookup: lookup.clone(),
                        name: name.clone(),
                    })
                }
                Access::Item(_, key) => Some(FrozenRead::Item { key: key.clone() }),
                Access::Global {
                    globals,
                    builtins,
                    name,
                } => Some(FrozenRead::Global {
                    globals: globals.clone(),
                    builtins: builtins.clone(),
                    name: name.clone(),
                }),
                Access::ClassAttr(parent, name) if is_class(Some(*parent)) => {
                    Some(FrozenRead::ClassAttr { name: name.clone() })
                }
                Access::Attr(parent, name, read) => {
                    let expected = match read {
                        AttrRead::Generic => std::ptr::null_mut(),
                        AttrRead::ModuleDict => std::ptr::addr_of_mut!(pyo3::ffi::PyModule_Type),
                        AttrRead::FunctionDefaults | AttrRead::FunctionKwDefaults => {
                            std::ptr::null_mut()
                        }
                        _ => std::ptr::addr_of_mut!(pyo3::ffi::PyFunction_Type),
                    };
                    (!expected.is_null() && has_type(Some(*parent), expected)).then(|| {
                        FrozenRead::Attr {
                            read: *read,
                            name: name.clone(),
                        }
                    })
                }
                _ => None,
            };
            let witnesses = step
                .checks
                .iter()
                .map(|check| match check {
                    Check::Id(_) | Check::Tensor | Check::Alias(_) | Check::DistinctObject => {
                        Some(None)
                    }
                    Check::Equals(expected) => {
                        super::guard_groups::deeply_immutable(&expected.bind(py)).then_some(None)
                    }
                    Check::Type(_) => Some(Some(ValueWitness::TypeOf)),
                    Check::ModuleCall(_) => Some(Some(ValueWitness::ModuleHooks)),
                    Check::InstanceDictLacks(..) => Some(Some(ValueWitness::InstanceDict)),
                    Check::Keys(..) | Check::Len(..) | Check::Contains(..) => {
                        Some(Some(ValueWitness::DictContents))
                    }
                    // Absence, answered from the type and dicts.
                    Check::HasAttr(name, false, known) => Some(Some(ValueWitness::LacksAttribute(
                        name.clone(),
                        known.clone(),
                    ))),
                    Check::HasAttr(..) => None,
                })
                .collect::<Option<Vec<Option<ValueWitness>>>>()
                .map(|w| w.into_iter().flatten().collect());
            // A value known now (an identity check's object) whose checks nothing could
            // vouch for keeps its step out of the trees: one such member would keep its
            // whole tree from ever being remembered.
            let witnesses = witnesses.filter(|needs: &Vec<ValueWitness>| {
                let known = step.checks.iter().find_map(|check| match check {
                    Check::Id(identity) => identity.get(py),
                    _ => None,
                });
                known.is_none_or(|value| {
                    let (mut scratch, mut seen) = (Vec::new(), Default::default());
                    needs.iter().all(|need| {
                        value_witness(py, &value, need, &mut scratch, &mut seen).is_some()
                    })
                })
            });
            StepShape {
                parent: step.parent(),
                read,
                witnesses,
                needed: needed[index],
                uses: uses_of(step),
            }
        })
        .collect()
}
