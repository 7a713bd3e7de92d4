//! Guards: the checks that must hold on a later call for the compiled code to be reused.
//!
//! The translator records one guard per (source, kind). [`NativeGuard`] compiles them into a
//! flat plan in which every distinct source is resolved once per check, parents before
//! children (a guard tree, flattened), and evaluates it in Rust: identity and type checks are
//! pointer compares, constants compare by value, lengths by `len`. All tensors are checked
//! in one call of torch's C++ `TensorGuards` (dtype, device, shape, stride, requires_grad,
//! dispatch keys). Grad mode is checked last.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::guard_frozen::{FrozenTrees, TreeState};
use super::guard_groups::{deeply_immutable, GroupState, InstanceDictGroup};
use super::guard_values::{
    class_lookup, instance_dict_item, instance_dict_of, keys_in_order, known_hasattr, AttrRead,
    DictReadCache, DictTagMemo, Identity, KnownLookup, ModuleCallMemo, TensorGroup,
};
use super::source::{PathPart, Source};
pub use super::source_table::SourceTable;
use crate::eval_frame::cache::{FrameGuard, FrameLayout, FrameView};
use crate::eval_frame::owned::OwnedRef;

#[derive(Debug)]
pub enum GuardKind {
    Tensor(OwnedRef),
    Equals(OwnedRef),
    Id(OwnedRef),
    Type(OwnedRef),
    Len(usize),
    /// The keys of a dict, in order (a tuple).
    Keys(OwnedRef),
    /// `key in value` gives this answer (membership in a set, in `os.environ`).
    Contains(OwnedRef, bool),
    /// `hasattr(value, name)` gives this answer.
    HasAttr(String, bool),
    /// `name` is not in the value's own `__dict__` (an instance attribute of that name
    /// would hide the class's method the trace inlined).
    InstanceDictLacks(String),
    /// An `nn.Module` the trace called: none of the hooks `Module.__call__` runs
    /// (`_forward_hooks`, `_forward_pre_hooks`, `_backward_hooks`, `_backward_pre_hooks`)
    /// and no `forward` of its own in its instance dict, as when traced.
    ModuleCall,
    /// A list or dict the trace changed (or one reached alongside such a one): which of
    /// these sources hold the same object must stay as it was. Sources with the same class
    /// number were one object when traced; different numbers were distinct objects. (An
    /// `append` through one name must show through every other name for the same list,
    /// and through none of the others.)
    SameObjectClass(usize),
}

/// The guards a trace recorded: one per (source, kind), sources interned in a table.
#[derive(Debug, Default)]
pub struct GuardSet {
    pub guards: Vec<(u32, GuardKind)>,
    seen: HashSet<(u32, u64)>,
    pub sources: SourceTable,
    pub grad_mode: Option<bool>,
    /// torch's `GlobalStateGuard`, made before tracing: grad mode, autocast, deterministic
    /// algorithms, default dtype, torch-function enablement, ... as the trace saw them.
    pub global_state: Option<OwnedRef>,
    /// Whether the graph may change a tensor in place (see `NativeGuard::check_distinct`).
    pub mutates_in_place: bool,
    /// The object seen at a source that is guarded by type rather than identity, by source
    /// id: what the plan inspects to read its attributes the fast way.
    pub examples: HashMap<u32, OwnedRef>,
    /// Tensors with symbolic sizes or strides, by source id: which (the tensor check leaves
    /// those to `shape_plan`).
    pub dynamic_dims: HashMap<u32, (Vec<bool>, Vec<bool>)>,
    /// The symbolic-shape checks (see `shape_guard`), built after the backend ran.
    pub shape: Option<super::shape_guard::ShapeGuard>,
}

impl GuardSet {
    pub fn add(&mut self, source: Rc<Source>, kind: GuardKind) {
        let tag = match &kind {
            GuardKind::Tensor(_) => 0,
            GuardKind::Equals(_) => 1,
            GuardKind::Id(_) => 2,
            GuardKind::Type(_) => 3,
            GuardKind::Len(_) => 4,
            GuardKind::Keys(_) => 5,
            // One per key: the tag holds the key's address (the key is kept by the guard;
            // names are interned strings, so one name is one key).
            GuardKind::Contains(key, _) => 7 + ((key.as_ptr() as usize as u64) << 8),
            GuardKind::HasAttr(name, _) => {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                name.hash(&mut hasher);
                8 + (hasher.finish() << 8)
            }
            GuardKind::SameObjectClass(_) => 9,
            GuardKind::ModuleCall => 11,
            GuardKind::InstanceDictLacks(name) => {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                name.hash(&mut hasher);
                10 + (hasher.finish() << 8)
            }
        };
        let id = self.sources.intern(&source);
        if self.seen.insert((id, tag)) {
            self.guards.push((id, kind));
        }
    }

    /// Records `value` as what `source` held when traced (see `examples`).
    pub fn example(&mut self, source: &Rc<Source>, value: &Bound<'_, PyAny>) {
        let id = self.sources.intern(source);
        self.examples
            .entry(id)
            .or_insert_with(|| OwnedRef::from_bound(value));
    }

    pub fn len(&self) -> usize {
        self.guards.len() + usize::from(self.grad_mode.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How one step of the plan reaches its value.
pub(super) enum Access {
    Local(usize),
    Global {
        globals: OwnedRef,
        builtins: OwnedRef,
        name: OwnedRef,
    },
    Cell(OwnedRef),
    /// An object known by identity (a class whose attributes are read), held weakly: once
    /// it is gone its reads find nothing, and the checks on them fail.
    Object(Identity),
    /// `getattr(parent, name)`, read without the attribute machinery where `AttrRead`
    /// knows the answer for the parent's type.
    Attr(usize, OwnedRef, AttrRead),
    /// A name found along the MRO of the class that is the parent's value (see
    /// [`class_lookup`]).
    ClassAttr(usize, OwnedRef),
    /// An attribute that lived in the instance `__dict__` of an object of type `ty` with no
    /// data descriptor of that name and the default `__getattribute__` (checked when the
    /// guard was built): read straight from the instance dict while `ty` is the parent's
    /// type and its version tag is `tag` (any change to the type gets a new tag), otherwise
    /// through `getattr`.
    InstanceAttr {
        parent: usize,
        name: OwnedRef,
        lookup: KnownLookup,
    },
    Item(usize, OwnedRef),
    /// `dict.__getitem__(parent, key)` (`Source::DictItem`): the dict's own table.
    DictItem(usize, OwnedRef),
    /// `torch.as_tensor(parent)` (`Source::AsTensor`), the function held; only for a
    /// parent whose type is checked to be `numpy.ndarray`.
    AsTensor(usize, OwnedRef),
}

pub(super) enum Check {
    /// The same object as the value of another step (a tensor reached from two sources,
    /// like tied weights); torch's tensor checker refuses a tensor given twice.
    Alias(usize),
    Keys(OwnedRef, DictTagMemo),
    Id(Identity),
    /// The exact type, held weakly (a class defined in a function, and what its methods'
    /// closures hold, is not kept alive by the guard).
    Type(Identity),
    Equals(OwnedRef),
    Len(usize, DictTagMemo),
    Contains(OwnedRef, bool, DictTagMemo),
    /// `hasattr` gives this answer; with the object's lookup as traced when it is one the
    /// guard can answer without running its `__getattribute__` (see `KnownLookup`).
    HasAttr(OwnedRef, bool, Option<KnownLookup>),
    /// The name is not in the value's instance dict; remembered by that dict's version tag.
    InstanceDictLacks(OwnedRef, DictTagMemo),
    ModuleCall(ModuleCallMemo),
    Tensor,
    /// The first source of its object class (`GuardKind::SameObjectClass`): distinct from
    /// every other first source, checked after the walk.
    DistinctObject,
}

pub(super) struct Step {
    pub(super) access: Access,
    pub(super) checks: Vec<Check>,
    /// The last component of the source's path, rendered into descriptions on demand.
    label: PathPart,
    /// For item and instance-attribute reads: what the dict held at the last read.
    read_cache: DictReadCache,
    /// A tensor in the `arguments` group (checked before the walk), not `reached`.
    pub(super) is_argument: bool,
    /// The instance-dict group this leaf read belongs to (see `guard_groups`).
    group: Option<usize>,
}

impl Step {
    /// The step whose value this one reads from, if any.
    pub(super) fn parent(&self) -> Option<usize> {
        match &self.access {
            Access::Attr(parent, _, _)
            | Access::ClassAttr(parent, _)
            | Access::Item(parent, _)
            | Access::DictItem(parent, _)
            | Access::AsTensor(parent, _)
            | Access::InstanceAttr { parent, .. } => Some(*parent),
            _ => None,
        }
    }
}

/// How an argument tensor is read before the walk: a local, or an item of a local tuple, list
/// or dict (`*args`, `**kwargs`, a pair passed in) whose type the guard checks anyway — when
/// the local has another type the guard fails there too.
enum ArgumentRead {
    Local(usize),
    Item {
        local: usize,
        container: OwnedRef,
        key: OwnedRef,
    },
}

/// The compiled guard of one cache entry.
#[pyclass(module = "dynamo_rs._native")]
pub struct NativeGuard {
    steps: Vec<Step>,
    /// Tensors that are the frame's own arguments, checked before anything else: a call with
    /// other shapes (another cache entry's) fails there without walking the sources.
    arguments: TensorGroup,
    /// How each of `arguments` is read, in its order.
    argument_reads: Vec<ArgumentRead>,
    /// Every other tensor (parameters, buffers, ...), checked after the walk.
    reached: TensorGroup,
    grad_mode: Option<bool>,
    global_state: Option<OwnedRef>,
    /// `global_state.check`, looked up once.
    global_state_check: Option<OwnedRef>,
    /// Localsplus names, for `first_failure`.
    local_names: Vec<String>,
    /// The graph inputs' steps, in graph-input order, and the compiled graph they are for:
    /// a passing check hands the values it read to the code about to run (see
    /// [`take_graph_inputs`]), which then need not load them again from their sources.
    graph_inputs: Vec<usize>,
    graph_token: Option<OwnedRef>,
    /// The converter (`dynamo_rs.compile`'s callback) that compiled this entry: the entry
    /// only runs under it or under one with the same backend.
    owner: Option<OwnedRef>,
    /// The same checks for the slow reference evaluation, made when the guard is built in
    /// `guard_check_mode = "debug"` (building it reads every tensor's metadata again).
    reference: Option<super::guard_reference::ReferenceGuard>,
    /// Checks on symbolic sizes (dynamic shapes), after everything else.
    shape: Option<super::shape_guard::ShapeGuard>,
    /// Leaf reads checked together by their object's instance dict (see `guard_groups`).
    groups: Vec<InstanceDictGroup>,
    /// Subtrees skipped while the dicts they read through are unchanged (see
    /// `guard_frozen`).
    frozen: FrozenTrees,
}

impl NativeGuard {
    /// Whether some object this guard checks by identity (a class, a module, a function) has
    /// been collected: the check can never pass again (a new object at the same address is
    /// told apart by the weak reference), so the entry is dead weight in its code's cache.
    pub fn checks_a_dead_object(&self) -> bool {
        self.steps.iter().any(|step| {
            matches!(&step.access, Access::Object(id) if id.is_dead())
                || step
                    .checks
                    .iter()
                    .any(|check| matches!(check, Check::Type(id) | Check::Id(id) if id.is_dead()))
        })
    }
}

/// Whether every check also runs the reference evaluation (`guard_check_mode = "debug"`).
pub static DEBUG_CHECKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    /// Graph inputs read by the last passing guard on this thread, with the address of the
    /// compiled graph they belong to.
    /// The graph is held (not just its address), so the address cannot be reused by another
    /// graph while the slot is filled.
    static PASSED_INPUTS: std::cell::RefCell<Option<(OwnedRef, Py<PyTuple>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Called by generated code right before it calls its graph: the graph inputs the guard
/// just read, if the guard that let this code run was for `token` (the compiled graph);
/// otherwise (the first call, right after compiling, runs without a guard check) None, and
/// the code loads the inputs from their sources.
#[pyfunction]
pub fn take_graph_inputs(token: &Bound<'_, PyAny>) -> Option<Py<PyTuple>> {
    PASSED_INPUTS.with(|cell| match cell.borrow_mut().take() {
        Some((graph, inputs)) if graph.as_ptr() == token.as_ptr() => Some(inputs),
        _ => None,
    })
}

impl std::fmt::Debug for NativeGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NativeGuard({} steps)", self.steps.len())
    }
}

impl NativeGuard {
    /// The readable path of step `index`'s source (`L["self"]._modules["fc"]`).
    fn path(&self, index: usize) -> String {
        let step = &self.steps[index];
        let parent = match step.parent() {
            Some(p) => self.path(p),
            None => String::new(),
        };
        step.label.render(&parent)
    }

    /// One check, readable: its source's path and what it requires.
    fn describe_check(&self, py: Python<'_>, index: usize, check: &Check) -> String {
        let repr = |v: &OwnedRef| v.bind(py).repr().map(|r| r.to_string()).unwrap_or_default();
        let what = match check {
            Check::Tensor => "tensor matches (dtype, device, shape, stride, requires_grad)".into(),
            Check::Alias(first) => format!("is the same object as {}", self.path(*first)),
            Check::DistinctObject => "is not the same object as another container".into(),
            Check::Equals(v) => format!("== {}", repr(v)),
            Check::Id(v) => format!("is the same object ({})", v.type_name),
            Check::Type(t) => format!(
                "has type {}",
                t.get(py)
                    .and_then(|t| t.getattr("__name__").ok())
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "<a class no longer alive>".into())
            ),
            Check::Len(n, _) => format!("has length {n}"),
            Check::Keys(k, _) => format!("has keys {}", repr(k)),
            Check::Contains(key, true, _) => format!("contains {}", repr(key)),
            Check::Contains(key, false, _) => format!("does not contain {}", repr(key)),
            Check::HasAttr(name, true, _) => format!("has an attribute {}", repr(name)),
            Check::HasAttr(name, false, _) => format!("has no attribute {}", repr(name)),
            Check::ModuleCall(_) => {
                "has no hooks, no forward of its own and torch's call machinery (as when traced)"
                    .into()
            }
            Check::InstanceDictLacks(name, _) => {
                format!(
                    "has no instance attribute {} (it would hide the class's)",
                    repr(name)
                )
            }
        };
        format!("{} {what}", self.path(index))
    }

    /// The guard of `set`; `graph_inputs` are the interned sources of the graph inputs, in
    /// order, and `graph_token` the compiled graph the generated code calls.
    pub fn build(
        py: Python<'_>,
        set: &GuardSet,
        layout_names: &[String],
        graph_inputs: Vec<usize>,
        graph_token: Option<OwnedRef>,
        owner: Option<OwnedRef>,
    ) -> PyResult<NativeGuard> {
        // One step per interned source, in table order (parents first).
        let mut steps: Vec<Step> = Vec::with_capacity(set.sources.nodes().len());
        for (source, parent) in set.sources.nodes() {
            let access = match source.as_ref() {
                Source::Local(name) => match layout_names.iter().position(|n| n == name) {
                    Some(i) => Access::Local(i),
                    None => {
                        return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                            "no local named {name}"
                        )))
                    }
                },
                Source::Global {
                    globals,
                    builtins,
                    name,
                    ..
                } => Access::Global {
                    globals: globals.clone(),
                    builtins: builtins.clone(),
                    name: OwnedRef::from_bound(PyString::intern(py, name).as_any()),
                },
                Source::Cell(cell) => Access::Cell(cell.clone()),
                Source::Object(object, _) => Access::Object(Identity::new(&object.bind(py))),
                Source::Attr(_, attr) => Access::Attr(
                    parent.expect("attributes have a parent") as usize,
                    OwnedRef::from_bound(PyString::intern(py, attr).as_any()),
                    AttrRead::for_name(py, attr),
                ),
                Source::ClassAttr(_, attr) => Access::ClassAttr(
                    parent.expect("class lookups have a parent") as usize,
                    OwnedRef::from_bound(PyString::intern(py, attr).as_any()),
                ),
                Source::Item(_, key) => {
                    let py_key = key.to_python(py)?;
                    Access::Item(
                        parent.expect("items have a parent") as usize,
                        OwnedRef::from_bound(&py_key),
                    )
                }
                Source::DictItem(_, key) => {
                    let py_key = key.to_python(py)?;
                    Access::DictItem(
                        parent.expect("items have a parent") as usize,
                        OwnedRef::from_bound(&py_key),
                    )
                }
                Source::AsTensor(_) => Access::AsTensor(
                    parent.expect("conversions have a parent") as usize,
                    OwnedRef::from_bound(&py.import_module("torch")?.getattr("as_tensor")?),
                ),
            };
            steps.push(Step {
                access,
                checks: Vec::new(),
                label: source.part(),
                read_cache: DictReadCache::default(),
                is_argument: false,
                group: None,
            });
        }
        let mut tensor_examples = Vec::new();
        let mut first_step_of_tensor: HashMap<usize, usize> = HashMap::new();
        let mut first_step_of_class: HashMap<usize, usize> = HashMap::new();
        for (id, kind) in &set.guards {
            let step = *id as usize;
            let check = match kind {
                GuardKind::Tensor(example) => {
                    match first_step_of_tensor.get(&(example.as_ptr() as usize)) {
                        Some(&first) => Check::Alias(first),
                        None => {
                            first_step_of_tensor.insert(example.as_ptr() as usize, step);
                            let dynamic = set.dynamic_dims.get(id).cloned();
                            tensor_examples.push((step, example.clone(), dynamic));
                            Check::Tensor
                        }
                    }
                }
                GuardKind::Equals(v) => Check::Equals(v.clone()),
                GuardKind::Id(v) => Check::Id(Identity::new(&v.bind(py))),
                GuardKind::Type(t) => Check::Type(Identity::new(&t.bind(py))),
                GuardKind::Len(n) => Check::Len(*n, DictTagMemo::default()),
                GuardKind::Keys(k) => Check::Keys(k.clone(), DictTagMemo::default()),
                GuardKind::Contains(key, expected) => {
                    Check::Contains(key.clone(), *expected, DictTagMemo::default())
                }
                GuardKind::HasAttr(name, expected) => Check::HasAttr(
                    OwnedRef::from_bound(PyString::intern(py, name).as_any()),
                    *expected,
                    None,
                ),
                GuardKind::ModuleCall => Check::ModuleCall(ModuleCallMemo::default()),
                GuardKind::InstanceDictLacks(name) => Check::InstanceDictLacks(
                    OwnedRef::from_bound(PyString::intern(py, name).as_any()),
                    DictTagMemo::default(),
                ),
                GuardKind::SameObjectClass(class) => match first_step_of_class.get(class) {
                    Some(&first) => Check::Alias(first),
                    None => {
                        first_step_of_class.insert(*class, step);
                        Check::DistinctObject
                    }
                },
            };
            steps[step].checks.push(check);
        }
        let mut argument_examples = Vec::new();
        let mut argument_reads = Vec::new();
        let mut reached_examples = Vec::new();
        for example in tensor_examples {
            match argument_read(py, &steps, example.0) {
                Some(read) => {
                    steps[example.0].is_argument = true;
                    argument_reads.push(read);
                    argument_examples.push(example);
                }
                None => reached_examples.push(example),
            }
        }
        // Attributes of objects known by identity (modules, mostly) that live in the
        // instance dict are read from it directly (see `Access::InstanceAttr`).
        let plain = py
            .import_module("dynamo_rs._capture")?
            .getattr("plain_instance_attribute")?;
        for index in 0..steps.len() {
            let Access::Attr(parent, name, _) = &steps[index].access else {
                continue;
            };
            let parent = *parent;
            // The parent's object: known by identity, or (guarded by type) as traced; the
            // fast path re-checks the type and its version tag on every read either way.
            let Some(object) = traced_object(py, &steps[parent].checks, set, parent) else {
                continue;
            };
            let name = name.clone();
            let answer = plain.call1((&object, name.bind(py)))?;
            if answer.is_none() {
                continue;
            }
            let (key, renames, getter): (Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>) =
                answer.extract()?;
            let optional = |v: &Bound<'_, PyAny>| (!v.is_none()).then(|| OwnedRef::from_bound(v));
            let getter = match optional(&getter) {
                Some(function) => Some((
                    OwnedRef::from_bound(&function.bind(py).getattr("__code__")?),
                    function,
                )),
                None => None,
            };
            let ty = object.get_type();
            // SAFETY: `ty` is a live type object (we hold a reference); reading a field of
            // its PyTypeObject while holding the GIL.
            let tag = unsafe { (*ty.as_type_ptr()).tp_version_tag };
            if tag == 0 {
                continue; // no valid tag (`plain_instance_attribute` looks it up to assign one)
            }
            // Read under another key without a property: `attribute_map` renames the name.
            let renamed = getter.is_none() && !key.eq(name.bind(py))?;
            steps[index].access = Access::InstanceAttr {
                parent,
                name: name.clone(),
                lookup: KnownLookup {
                    ty: ty.as_ptr() as usize,
                    tag,
                    renames: optional(&renames),
                    property: getter,
                    key: Some(OwnedRef::from_bound(&key)),
                    renamed,
                },
            };
        }
        // `hasattr` on an object whose `__getattribute__` only renames (a transformers
        // configuration): answered from its class and instance dict, as for plain objects.
        let renamed = py
            .import_module("dynamo_rs._capture")?
            .getattr("renamed_attributes")?;
        for (index, step) in steps.iter_mut().enumerate() {
            if !step.checks.iter().any(|c| matches!(c, Check::HasAttr(..))) {
                continue;
            }
            let Some(object) = traced_object(py, &step.checks, set, index) else {
                continue;
            };
            let ty = object.get_type();
            let renames = renamed.call1((&ty,))?;
            // SAFETY: as above.
            let tag = unsafe { (*ty.as_type_ptr()).tp_version_tag };
            if !renames.is_instance_of::<PyDict>() || tag == 0 {
                continue;
            }
            for check in &mut step.checks {
                if let Check::HasAttr(_, _, known) = check {
                    *known = Some(KnownLookup {
                        ty: ty.as_ptr() as usize,
                        tag,
                        renames: Some(OwnedRef::from_bound(&renames)),
                        property: None,
                        key: None,
                        renamed: false,
                    });
                }
            }
        }
        // The same object has the same type: a type check beside an identity check on the
        // same value adds nothing.
        for step in &mut steps {
            if step.checks.iter().any(|c| matches!(c, Check::Id(_))) {
                step.checks.retain(|c| !matches!(c, Check::Type(_)));
            }
        }
        let groups = plan_instance_dict_groups(py, &mut steps, &graph_inputs, set.shape.as_ref());
        let shape_inputs: Vec<usize> = set
            .shape
            .as_ref()
            .map(|shape| shape.inputs.iter().map(|&id| id as usize).collect())
            .unwrap_or_default();
        let frozen = FrozenTrees::plan(super::guard_frozen::step_shapes(
            py,
            &steps,
            &graph_inputs,
            &shape_inputs,
        ));
        Ok(NativeGuard {
            steps,
            arguments: TensorGroup::new(py, argument_examples)?,
            argument_reads,
            reached: TensorGroup::new(py, reached_examples)?,
            grad_mode: set.grad_mode,
            global_state: set.global_state.clone(),
            global_state_check: match &set.global_state {
                Some(state) => Some(OwnedRef::from_bound(&state.bind(py).getattr("check")?)),
                None => None,
            },
            local_names: layout_names.to_vec(),
            graph_inputs,
            graph_token,
            owner,
            shape: set.shape.clone(),
            groups,
            frozen,
            reference: if DEBUG_CHECKS.load(Relaxed) {
                Some(super::guard_reference::ReferenceGuard::build(
                    py,
                    &set.guards
                        .iter()
                        .map(|(id, kind)| {
                            (
                                set.sources.nodes()[*id as usize].0.clone(),
                                kind,
                                set.dynamic_dims.get(id).cloned(),
                            )
                        })
                        .collect::<Vec<_>>(),
                    set.mutates_in_place,
                    set.grad_mode,
                    set.shape.as_ref().map(|shape| {
                        (
                            shape
                                .inputs
                                .iter()
                                .map(|&id| set.sources.nodes()[id as usize].0.clone())
                                .collect(),
                            shape.plan.clone(),
                        )
                    }),
                )?)
            } else {
                None
            },
        })
    }

    /// Whether the callback installed on this thread may run this entry (see `owner`).
    fn backend_matches(&self, py: Python<'_>) -> PyResult<bool> {
        let Some(owner) = &self.owner else {
            return Ok(true);
        };
        let current = crate::eval_frame::hook::current_callback();
        if current == owner.as_ptr() {
            return Ok(true);
        }
        if current.is_null() {
            return Ok(false);
        }
        // SAFETY: the thread's callback is alive while installed (the hook owns a reference)
        // and the GIL is held.
        let current = unsafe { Bound::from_borrowed_ptr(py, current) };
        let owner = owner.bind(py).cast::<super::Converter>()?.clone();
        Ok(owner.get().same_backend(py, &current))
    }

    fn evaluate(&self, py: Python<'_>, view: &FrameView<'_>) -> PyResult<bool> {
        let fast = self.evaluate_fast(py, view)?;
        if DEBUG_CHECKS.load(Relaxed) && self.reference.is_some() {
            let names = &self.local_names;
            let by_name = |name: &str| {
                names
                    .iter()
                    .position(|n| n == name)
                    .and_then(|i| frame_local(py, view, i))
            };
            let reference = self.reference_failure(py, &by_name, true);
            if reference.is_none() != fast {
                let locals = |i: usize| frame_local(py, view, i);
                let fast_says = self
                    .first_failing(py, &locals, None)
                    .unwrap_or_else(|e| Some(format!("raised {e}")));
                return Err(crate::errors::InternalCheckFailed::new_err(format!(
                    "internal error: the guard and its reference evaluation disagree: the guard \
                     says {}, the reference says {}",
                    fast_says.map_or("it holds".into(), |f| format!("it fails ({f})")),
                    reference.map_or("it holds".into(), |f| format!("it fails ({f})")),
                )));
            }
        }
        Ok(fast)
    }

    /// The reference evaluation's first failure (see `guard_reference`), with the checks
    /// that are not about sources (backend, global state, torch-function modes).
    fn reference_failure<'py>(
        &self,
        py: Python<'py>,
        locals: &dyn Fn(&str) -> Option<Bound<'py, PyAny>>,
        check_backend: bool,
    ) -> Option<String> {
        let rest = || -> PyResult<Option<String>> {
            if check_backend && !self.backend_matches(py)? {
                return Ok(Some("another backend".into()));
            }
            let Some(reference) = &self.reference else {
                return Ok(Some(
                    "no reference evaluation: built outside debug mode".into(),
                ));
            };
            if let Some(failure) = reference.first_failure(py, locals)? {
                return Ok(Some(failure));
            }
            if let Some(state) = &self.global_state {
                if !state.bind(py).call_method0("check")?.is_truthy()? {
                    return Ok(Some("global state changed".into()));
                }
            }
            let torch_c = py.import_module("torch")?.getattr("_C")?;
            let modes: usize = torch_c
                .call_method0("_len_torch_function_stack")?
                .extract()?;
            if modes != 0 {
                return Ok(Some("a torch-function mode is active".into()));
            }
            let modes: usize = torch_c
                .call_method0("_len_torch_dispatch_stack")?
                .extract()?;
            Ok((modes != 0).then(|| "a torch-dispatch mode is active".into()))
        };
        rest().unwrap_or_else(|e| Some(format!("raised {e}")))
    }

    fn evaluate_fast(&self, py: Python<'_>, view: &FrameView<'_>) -> PyResult<bool> {
        let locals = |i: usize| frame_local(py, view, i);
        if !self.backend_matches(py)? {
            return Ok(false);
        }
        let mut values = Vec::new();
        // A check that raises (an attribute whose getter fails, a value of another type than
        // the check expects) does not hold: the frame is compiled again, never failed.
        match self.first_failing(py, &locals, Some(&mut values)) {
            Ok(None) => {}
            Ok(Some(_)) => return Ok(false),
            Err(_) => return Ok(false),
        }
        if let Some(token) = &self.graph_token {
            let present = self
                .graph_inputs
                .iter()
                .all(|&step| values.get(step).is_some_and(Option::is_some));
            if present {
                // Straight from the walk's values into the tuple (no vector in between).
                let inputs = PyTuple::new(
                    py,
                    self.graph_inputs
                        .iter()
                        .map(|&step| values[step].clone().expect("checked present")),
                )?
                .unbind();
                let token = token.clone();
                PASSED_INPUTS.with(|cell| *cell.borrow_mut() = Some((token, inputs)));
            }
        }
        Ok(true)
    }

    /// Checks `tensors` against `group` (see `tensor_check`); on failure names the first
    /// tensor whose metadata differs from its example.
    fn check_tensors(
        &self,
        group: &TensorGroup,
        tensors: &[Bound<'_, PyAny>],
        describe: bool,
    ) -> PyResult<Option<String>> {
        if group.passes(tensors) {
            return Ok(None);
        }
        if !describe {
            // The hook only needs to know.
            return Ok(Some(String::new()));
        }
        for (tensor, example) in tensors.iter().zip(&group.examples) {
            if let Some(difference) = example.difference(&self.path(example.step), tensor)? {
                return Ok(Some(difference));
            }
        }
        // The group also fails on a tensor passed twice (two sources now one object).
        for (i, (tensor, example)) in tensors.iter().zip(&group.examples).enumerate() {
            let repeat = tensors[i + 1..]
                .iter()
                .zip(&group.examples[i + 1..])
                .find(|(other, _)| other.is(tensor));
            if let Some((_, other)) = repeat {
                return Ok(Some(format!(
                    "{} and {} are now the same tensor (they were distinct)",
                    self.path(example.step),
                    self.path(other.step)
                )));
            }
        }
        Ok(Some(format!(
            "a tensor's dispatch keys changed ({} tensors checked, {} expected)",
            tensors.len(),
            group.examples.len()
        )))
    }

    /// Tensors that were distinct objects when compiled must still be: the graph has one
    /// input for each, and an in-place operation on one would not show through the other.
    /// (Tensors that were the same object are `Check::Alias`.) The frame's own tensor
    /// arguments are compared with every other tensor on every call (a few against many);
    /// tensors reached through other sources (parameters, buffers) with each other only when
    /// the graph changes a tensor in place — without that, two of them becoming one object
    /// cannot change the result.
    fn check_distinct(
        &self,
        arguments: &[Bound<'_, PyAny>],
        reached: &[Bound<'_, PyAny>],
    ) -> Option<String> {
        let address = |t: &Bound<'_, PyAny>| t.as_ptr() as usize;
        let steps = || {
            self.arguments
                .examples
                .iter()
                .map(|example| example.step)
                .zip(arguments)
                .chain(
                    self.reached
                        .examples
                        .iter()
                        .map(|example| example.step)
                        .zip(reached),
                )
        };
        let describe = |shared: usize| {
            let both: Vec<usize> = steps()
                .filter(|(_, t)| address(t) == shared)
                .map(|(step, _)| step)
                .collect();
            match both.as_slice() {
                [a, b, ..] => format!(
                    "{} and {} are now the same tensor (they were distinct)",
                    self.path(*a),
                    self.path(*b)
                ),
                _ => "two tensors that were distinct are now the same object".into(),
            }
        };
        for (i, argument) in arguments.iter().enumerate() {
            let a = address(argument);
            let clash = arguments[i + 1..]
                .iter()
                .chain(reached)
                .any(|other| address(other) == a);
            if clash {
                return Some(describe(a));
            }
        }
        // Two reached tensors that became one object: the group's check (`check_tensors`)
        // already refuses a repeated tensor among those it checks, whether or not the graph
        // changes one in place.
        None
    }

    /// The description of the first check that fails (`None`: all pass), reading locals through
    /// `locals`. When all pass, `keep` receives the value of every step. With `keep` (the
    /// hook's own check) a failure is reported without a description, which only
    /// `first_failure` needs.
    fn first_failing<'py>(
        &self,
        py: Python<'py>,
        locals: &dyn Fn(usize) -> Option<Bound<'py, PyAny>>,
        keep: Option<&mut Vec<Option<Bound<'py, PyAny>>>>,
    ) -> PyResult<Option<String>> {
        let describe = keep.is_none();
        // One slot per step; a step nobody reads, or not read on this call, stays None.
        let mut values: Vec<Option<Bound<'_, PyAny>>> = Vec::new();
        values.resize_with(self.steps.len(), || None);
        let mut tensors: Vec<Bound<'_, PyAny>> = Vec::with_capacity(self.reached.examples.len());
        let mut aliases: Vec<(usize, usize, Bound<'_, PyAny>, &Check)> = Vec::new();
        let mut distinct: Vec<(usize, Bound<'_, PyAny>)> = Vec::new();
        // The frame's own tensor arguments first.
        let mut arguments = Vec::with_capacity(self.arguments.examples.len());
        if !self.arguments.examples.is_empty() {
            for (example, read) in self.arguments.examples.iter().zip(&self.argument_reads) {
                let value = match read {
                    ArgumentRead::Local(i) => locals(*i),
                    ArgumentRead::Item {
                        local,
                        container,
                        key,
                    } => match locals(*local) {
                        // Exact tuples, lists and dicts read items without running user code.
                        Some(base) if base.get_type().as_ptr() == container.as_ptr() => {
                            base.get_item(key.bind(py)).ok()
                        }
                        _ => None,
                    },
                };
                match value {
                    Some(value) => arguments.push(value),
                    None => return Ok(Some(format!("{}: missing", self.path(example.step)))),
                }
            }
            if let Some(failure) = self.check_tensors(&self.arguments, &arguments, describe)? {
                return Ok(Some(failure));
            }
        }
        let mut group_states = vec![GroupState::default(); self.groups.len()];
        let mut tree_states: Vec<TreeState<'_>> = (0..self.frozen.tree_count())
            .map(|_| TreeState::Undecided)
            .collect();
        // Steps before this one were passed over with a frozen tree's run.
        let mut skip_to = 0;
        for (index, step) in self.steps.iter().enumerate() {
            if index < skip_to {
                continue;
            }
            if let Some(tree) = self.frozen.tree_of(index) {
                if matches!(tree_states[tree], TreeState::Undecided) {
                    let root = self.frozen.root(tree).and_then(|r| values[r].as_ref());
                    tree_states[tree] = self.frozen.decide(py, tree, root);
                }
                if let TreeState::Holds(held) = &mut tree_states[tree] {
                    // Frozen (see `guard_frozen`): the whole run of the tree's steps starting
                    // here is passed over; of the members someone reads, the value read at
                    // the last pass, and only the checks that look inside it.
                    skip_to = self.frozen.run_end(index);
                    while let Some((member, uses, value)) =
                        self.frozen.next_needed(tree, held, skip_to)
                    {
                        let Some(value) = value else { continue };
                        if uses.tensor {
                            tensors.push(value.clone());
                        }
                        if uses.identity {
                            for check in &self.steps[member].checks {
                                match check {
                                    Check::Alias(first) => {
                                        aliases.push((*first, member, value.clone(), check))
                                    }
                                    Check::DistinctObject => distinct.push((member, value.clone())),
                                    _ => {}
                                }
                            }
                        }
                        values[member] = Some(value);
                    }
                    continue;
                }
            }
            if let Some(group) = step.group {
                let state = &mut group_states[group];
                if !state.decided {
                    let group = &self.groups[group];
                    *state = group.decide(values[group.parent].as_ref());
                }
                if state.holds {
                    // A leaf: nothing reads its value.
                    continue;
                }
            }
            let value = match &step.access {
                Access::Local(i) => locals(*i),
                Access::Global {
                    globals,
                    builtins,
                    name,
                } => {
                    let globals = globals.bind(py);
                    let found = match globals.cast_exact::<PyDict>() {
                        Ok(exact) => step.read_cache.get(exact, &name.bind(py))?,
                        Err(_) => globals
                            .cast::<PyDict>()
                            .map_err(PyErr::from)?
                            .get_item(name.bind(py))?,
                    };
                    match found {
                        Some(v) => Some(v),
                        None => {
                            let builtins = builtins.bind(py);
                            match builtins.cast::<PyDict>() {
                                Ok(d) => d.get_item(name.bind(py))?,
                                Err(_) => builtins.getattr(name.bind(py).cast::<PyString>()?).ok(),
                            }
                        }
                    }
                }
                Access::Cell(cell) => cell.bind(py).getattr("cell_contents").ok(),
                Access::Object(object) => object.get(py),
                Access::Attr(parent, name, read) => match &values[*parent] {
                    Some(base) => match read.read(base, &name.bind(py), &step.read_cache) {
                        Some(value) => Some(value),
                        None => base.getattr(name.bind(py).cast::<PyString>()?).ok(),
                    },
                    None => None,
                },
                Access::ClassAttr(parent, name) => match &values[*parent] {
                    Some(base) => class_lookup(base, name.bind(py).cast::<PyString>()?),
                    None => None,
                },
                Access::InstanceAttr {
                    parent,
                    name,
                    lookup,
                } => match &values[*parent] {
                    Some(base) => match instance_dict_item(base, lookup, name, &step.read_cache) {
                        Some(value) => Some(value),
                        None => base.getattr(name.bind(py).cast::<PyString>()?).ok(),
                    },
                    None => None,
                },
                Access::Item(parent, key) => match &values[*parent] {
                    Some(base) => match base.cast_exact::<PyDict>() {
                        Ok(dict) => step.read_cache.get(dict, &key.bind(py)).ok().flatten(),
                        Err(_) => base.get_item(key.bind(py)).ok(),
                    },
                    None => None,
                },
                // `PyDict_GetItem`: the table itself, whatever the class overrides.
                Access::DictItem(parent, key) => match &values[*parent] {
                    Some(base) => match base.cast::<PyDict>() {
                        Ok(dict) => dict.get_item(key.bind(py)).ok().flatten(),
                        Err(_) => None,
                    },
                    None => None,
                },
                // An array torch cannot take (negative strides, an object dtype) is no
                // tensor: the tensor check fails on the missing value.
                Access::AsTensor(parent, as_tensor) => match &values[*parent] {
                    Some(base) => as_tensor.bind(py).call1((base,)).ok(),
                    None => None,
                },
            };
            let Some(value) = value else {
                if step.checks.is_empty() {
                    continue;
                }
                return Ok(Some(format!("{}: missing", self.path(index))));
            };
            for check in &step.checks {
                let ok = match check {
                    Check::Tensor => {
                        if !step.is_argument {
                            tensors.push(value.clone()); // checked after the walk
                        }
                        true
                    }
                    Check::Alias(first) => {
                        // Checked once every step has its value.
                        aliases.push((*first, index, value.clone(), check));
                        true
                    }
                    Check::DistinctObject => {
                        distinct.push((index, value.clone()));
                        true
                    }
                    other => plain_check(py, other, &value)?,
                };
                if !ok {
                    return Ok(Some(if describe {
                        self.describe_check(py, index, check)
                    } else {
                        String::new()
                    }));
                }
            }
            values[index] = Some(value);
        }
        for (first, index, value, check) in aliases {
            let same = values
                .get(first)
                .and_then(|v| v.as_ref())
                .is_some_and(|v| v.is(&value));
            if !same {
                return Ok(Some(format!(
                    "{} (no longer the case)",
                    self.describe_check(py, index, check)
                )));
            }
        }
        if distinct.len() > 1 {
            let mut addresses: Vec<(usize, usize)> = distinct
                .iter()
                .map(|(step, v)| (v.as_ptr() as usize, *step))
                .collect();
            addresses.sort_unstable();
            if let Some(pair) = addresses.windows(2).find(|w| w[0].0 == w[1].0) {
                return Ok(Some(format!(
                    "{} and {} are now the same object (they were distinct)",
                    self.path(pair[0].1),
                    self.path(pair[1].1)
                )));
            }
        }
        if let Some(failure) = self.check_tensors(&self.reached, &tensors, describe)? {
            return Ok(Some(failure));
        }
        if let Some(failure) = self.check_distinct(&arguments, &tensors) {
            return Ok(Some(failure));
        }
        if let Some(shape) = &self.shape {
            let inputs: Option<Vec<Bound<'_, PyAny>>> = shape
                .inputs
                .iter()
                .map(|&id| values.get(id as usize).cloned().flatten())
                .collect();
            let Some(inputs) = inputs else {
                return Ok(Some("a tensor with symbolic sizes is missing".into()));
            };
            let reads = shape.read(&inputs)?;
            if let Some(what) = shape.plan.first_failure(&reads) {
                return Ok(Some(format!("shape guard {what} does not hold")));
            }
        }
        if let Some(check) = &self.global_state_check {
            if !check.bind(py).call0()?.is_truthy()? {
                let state = self
                    .global_state
                    .as_ref()
                    .expect("a check has its state")
                    .bind(py);
                let what = state.call_method0("reason")?;
                return Ok(Some(format!(
                    "global torch state changed since compiling: {}",
                    what.str()?.to_string().trim()
                )));
            }
        }
        // Frames are only compiled with no torch-function mode active (the trace folds
        // `has_torch_function` to False), and none with a torch-dispatch mode (the trace folds
        // the stack's length to 0, as `MultiheadAttention`'s fast-path check reads it).
        if crate::torch_state::torch_function_stack_len() != 0 {
            return Ok(Some("a torch-function mode is active".into()));
        }
        if crate::torch_state::torch_dispatch_stack_len() != 0 {
            return Ok(Some("a torch-dispatch mode is active".into()));
        }
        for (group, state) in self.groups.iter().zip(&group_states) {
            group.record(state);
        }
        for (tree, state) in tree_states.iter().enumerate() {
            if matches!(state, TreeState::Walked) {
                let verify = |member: usize, value: &Bound<'_, PyAny>| {
                    self.steps[member]
                        .checks
                        .iter()
                        .all(|check| plain_check(py, check, value).unwrap_or(false))
                };
                self.frozen.record(py, tree, &values, &verify);
            }
        }
        if let Some(keep) = keep {
            *keep = values;
        }
        Ok(None)
    }
}

#[pymethods]
impl NativeGuard {
    /// The frozen subtrees (see `guard_frozen`): each root's path, its member count and
    /// whether it is armed (it would be skipped on a call that changed nothing).
    fn frozen_trees(&self) -> Vec<(String, usize, bool)> {
        self.frozen
            .summary()
            .into_iter()
            .map(|(root, members, armed)| {
                let root = root.map_or_else(|| "<globals>".to_string(), |r| self.path(r));
                (root, members, armed)
            })
            .collect()
    }

    /// Human-readable list of the checks, by source (parents first), grad mode last.
    fn describe(&self, py: Python<'_>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (index, step) in self.steps.iter().enumerate() {
            for check in &step.checks {
                out.push(self.describe_check(py, index, check));
            }
        }
        if let Some(mode) = self.grad_mode {
            out.push(format!("torch.is_grad_enabled() == {mode}"));
        }
        if let Some(shape) = &self.shape {
            out.extend(
                shape
                    .plan
                    .checks
                    .iter()
                    .map(|(_, what)| format!("shape: {what}")),
            );
        }
        if self.global_state.is_some() {
            out.push("global torch state (autocast, deterministic algorithms, default dtype, torch function) as when compiled".into());
        }
        out.push("no torch-function mode active".into());
        out
    }

    /// Sets the compiled graph the entry's code calls (see `persist::restore_guard`).
    fn set_graph_token(&mut self, token: &Bound<'_, PyAny>) {
        self.graph_token = Some(OwnedRef::from_bound(token));
    }

    fn __len__(&self) -> usize {
        self.steps.iter().map(|s| s.checks.len()).sum::<usize>()
            + usize::from(self.grad_mode.is_some())
    }

    /// Why this entry would not be used for a frame with these locals (its `f_locals`): the
    /// first failing check, or None if all pass.
    fn first_failure(
        &self,
        py: Python<'_>,
        f_locals: &Bound<'_, PyDict>,
    ) -> PyResult<Option<String>> {
        let names = &self.local_names;
        let locals = |i: usize| -> Option<Bound<'_, PyAny>> {
            names
                .get(i)
                .and_then(|n| f_locals.get_item(n).ok().flatten())
        };
        self.first_failing(py, &locals, None)
    }

    /// What the reference evaluation (see `guard_reference`) says for these locals: the
    /// first failing check, or None if all hold. Like `first_failure`, it leaves out the
    /// backend (which depends on the callback installed on the calling thread).
    fn reference_first_failure(
        &self,
        py: Python<'_>,
        f_locals: &Bound<'_, PyDict>,
    ) -> Option<String> {
        let by_name = |name: &str| f_locals.get_item(name).ok().flatten();
        self.reference_failure(py, &by_name, false)
    }
}

/// Lets the frame hook run a `NativeGuard` without going through Python.
#[derive(Debug)]
pub struct NativeGuardRef(pub OwnedRef);

impl FrameGuard for NativeGuardRef {
    fn check(&self, py: Python<'_>, frame: &FrameView<'_>) -> PyResult<bool> {
        let guard = self.0.bind(py);
        let guard = guard.cast::<NativeGuard>().map_err(PyErr::from)?;
        guard.borrow().evaluate(py, frame)
    }

    fn as_python(&self, py: Python<'_>) -> Py<PyAny> {
        self.0.bind(py).clone().unbind()
    }

    fn is_dead(&self, py: Python<'_>) -> bool {
        self.0
            .bind(py)
            .cast::<NativeGuard>()
            .is_ok_and(|g| g.borrow().checks_a_dead_object())
    }

    fn failure(&self, py: Python<'_>, frame: &FrameView<'_>) -> Option<String> {
        let guard = self.0.bind(py).cast::<NativeGuard>().ok()?.borrow();
        let locals = |i: usize| frame_local(py, frame, i);
        guard.first_failing(py, &locals, None).ok().flatten()
    }
}

/// Local `index` of a live, not yet started frame.
fn frame_local<'py>(
    py: Python<'py>,
    view: &FrameView<'_>,
    index: usize,
) -> Option<Bound<'py, PyAny>> {
    // SAFETY: the index was looked up in this code's layout; the frame is live.
    let ptr = unsafe { view.value(index) };
    // SAFETY: a live object owned by the frame (or null).
    (!ptr.is_null()).then(|| unsafe { Bound::from_borrowed_ptr(py, ptr) })
}

/// The localsplus names of a frame layout, for resolving `Source::Local`.
pub fn layout_names(py: Python<'_>, layout: &FrameLayout) -> Vec<String> {
    layout
        .names
        .iter()
        .map(|n| n.bind(py).to_string())
        .collect()
}

/// The outcome of a dict check just evaluated on `value`, remembered in `memo` if it passed.
/// The object a step had when traced: known by identity, or (guarded by type) as recorded in
/// the guard set's examples.
fn traced_object<'py>(
    py: Python<'py>,
    checks: &[Check],
    set: &GuardSet,
    index: usize,
) -> Option<Bound<'py, PyAny>> {
    checks
        .iter()
        .find_map(|c| match c {
            Check::Id(o) => o.get(py),
            _ => None,
        })
        .or_else(|| {
            set.examples
                .get(&(index as u32))
                .map(|o| o.bind(py).clone())
        })
}

fn dict_check(memo: &DictTagMemo, value: &Bound<'_, PyAny>, passed: bool) -> bool {
    if passed {
        memo.passed(value);
    }
    passed
}

/// How the tensor at `step` can be read before the walk, if it is an argument: a local, or an
/// item (int or str key) of a local whose exact type — tuple, list or dict — the guard checks.
fn argument_read(py: Python<'_>, steps: &[Step], step: usize) -> Option<ArgumentRead> {
    match &steps[step].access {
        Access::Local(i) => Some(ArgumentRead::Local(*i)),
        Access::Item(parent, key) => {
            let Access::Local(local) = steps[*parent].access else {
                return None;
            };
            let container = steps[*parent].checks.iter().find_map(|c| match c {
                Check::Type(t) => t.get(py),
                _ => None,
            })?;
            let ty = &container;
            let key_bound = key.bind(py);
            let fits =
                if ty.is(py.get_type::<PyTuple>()) || ty.is(py.get_type::<pyo3::types::PyList>()) {
                    key_bound.is_exact_instance_of::<pyo3::types::PyInt>()
                } else if ty.is(py.get_type::<PyDict>()) {
                    key_bound.is_exact_instance_of::<PyString>()
                } else {
                    false
                };
            fits.then(|| ArgumentRead::Item {
                local,
                container: OwnedRef::from_bound(&container),
                key: key.clone(),
            })
        }
        _ => None,
    }
}

/// Groups the leaf reads of instance-dict attributes whose checks the value's identity
/// answers (see `guard_groups`) by the object they are read from, and marks each member
/// step with its group. A step is a leaf when no other step reads through it, it is no graph
/// input, no symbolic-size input and no alias's first source.
/// A check answered by the value alone (identity, type, equality, a dict's contents, the
/// lookups of `hasattr`, a module's hooks); the checks that collect their value for later
/// (tensors, aliasing) are the walk's own and pass here.
/// Whether `value` is the constant `expected` an equality guard holds: the same object (an
/// attribute that was not reassigned), or of the same type and `==` — a float NaN counting
/// as equal to NaN, which `==` never is (a guard on `float("nan")` would fail on every call).
pub fn equal_constant(value: &Bound<'_, PyAny>, expected: &Bound<'_, PyAny>) -> PyResult<bool> {
    if value.is(expected) {
        return Ok(true);
    }
    if !value.get_type().is(expected.get_type()) {
        return Ok(false);
    }
    if value.eq(expected)? {
        return Ok(true);
    }
    let nan = |v: &Bound<'_, PyAny>| {
        v.cast::<pyo3::types::PyFloat>()
            .is_ok_and(|f| f.value().is_nan())
    };
    Ok(nan(value) && nan(expected))
}

fn plain_check(py: Python<'_>, check: &Check, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(match check {
        Check::Id(expected) => expected.matches(value),
        Check::Type(expected) => expected.matches(value.get_type().as_any()),
        Check::Equals(expected) => equal_constant(value, &expected.bind(py))?,
        Check::Len(n, memo) => {
            memo.holds(value) || dict_check(memo, value, value.len().ok() == Some(*n))
        }
        Check::HasAttr(name, expected, known) => {
            let name = name.bind(py).cast::<PyString>()?.clone();
            let has = match known_hasattr(value, &name, known.as_ref()) {
                Some(has) => has,
                None => value.hasattr(name).unwrap_or(false),
            };
            has == *expected
        }
        Check::Contains(key, expected, memo) => {
            memo.holds(value)
                || dict_check(
                    memo,
                    value,
                    value.contains(key.bind(py)).ok() == Some(*expected),
                )
        }
        Check::ModuleCall(memo) => memo.check(value)?,
        Check::InstanceDictLacks(name, memo) => match instance_dict_of(value) {
            Some(dict) => {
                memo.holds(&dict) || dict_check(memo, &dict, !dict.contains(name.bind(py))?)
            }
            // No instance dict (now): nothing can hide the class's entry.
            None => true,
        },
        Check::Keys(expected, memo) => match value.cast::<PyDict>() {
            // An `OrderedDict` reorders (`move_to_end`) without changing the dict's version
            // tag: only a plain dict's unchanged version says its keys' order is.
            Ok(d) if d.is_exact_instance_of::<PyDict>() && memo.holds(value) => true,
            Ok(d) => {
                let same = keys_in_order(d)?.eq(expected.bind(py))?;
                dict_check(memo, value, same)
            }
            Err(_) => false,
        },
        Check::Tensor | Check::Alias(_) | Check::DistinctObject => true,
    })
}

fn plan_instance_dict_groups(
    py: Python<'_>,
    steps: &mut [Step],
    graph_inputs: &[usize],
    shape: Option<&super::shape_guard::ShapeGuard>,
) -> Vec<InstanceDictGroup> {
    let mut needed: HashSet<usize> = graph_inputs.iter().copied().collect();
    if let Some(shape) = shape {
        needed.extend(shape.inputs.iter().map(|&id| id as usize));
    }
    for step in steps.iter() {
        needed.extend(step.parent());
        for check in &step.checks {
            if let Check::Alias(first) = check {
                needed.insert(*first);
            }
        }
    }
    let mut groups: Vec<InstanceDictGroup> = Vec::new();
    for (index, step) in steps.iter_mut().enumerate() {
        let Access::InstanceAttr { parent, lookup, .. } = &step.access else {
            continue;
        };
        if needed.contains(&index) || lookup.property.is_some() || step.checks.is_empty() {
            continue;
        }
        let answered_by_identity = step.checks.iter().all(|check| match check {
            Check::Id(_) => true,
            Check::Equals(expected) => deeply_immutable(&expected.bind(py)),
            _ => false,
        });
        if !answered_by_identity {
            continue;
        }
        let group = match groups.iter().position(|g| g.admits(*parent, lookup)) {
            Some(group) => group,
            None => {
                groups.push(InstanceDictGroup::new(*parent, lookup));
                groups.len() - 1
            }
        };
        step.group = Some(group);
    }
    groups
}
