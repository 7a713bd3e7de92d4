//! Rebuild plans: how the generated code makes each value the frame must produce — its
//! result, the values live at a graph break, the values of replayed side effects — from
//! the graph's outputs, constants and sources.
//!
//! An object made in the trace (a list, dict, set or instance) that several places reach
//! (`return a, a`; a list both in a local and inside an object at a graph break) must be one
//! object there too: the plans are made twice when that happens, and the second time each
//! such object is built once, first, into a temp (`Rebuild::Shared`).

use std::collections::{HashMap, HashSet};

use pyo3::prelude::*;

use crate::imports::ImportModule;

use super::break_reasons::BreakKind;
use super::codegen::{Rebuild, Replay};
use super::graph::{self, Op};
use super::source::Source;
use super::translator::{self, unsupported, CResult, Tracer};
use super::vars::{Cell, TracedFunction, VarId, VarKind};
use super::{guards, ops_with};
use crate::eval_frame::owned::OwnedRef;
use std::rc::Rc;

/// What the plans of one graph share: the graph outputs they read, and the objects made in
/// the trace that more than one place reaches.
#[derive(Default)]
pub struct Rebuilder {
    pub outputs: Vec<graph::NodeId>,
    pub output_index: HashMap<graph::NodeId, usize>,
    /// Objects made in the trace met so far.
    seen: HashSet<VarId>,
    /// Those met twice (first pass).
    repeated: HashSet<VarId>,
    /// Objects built once into a temp (second pass), and their plans in the order they must
    /// be built (an object before those that contain it).
    shared: HashSet<VarId>,
    pub definitions: Vec<(VarId, Rebuild)>,
    defining: HashSet<VarId>,
    /// Containers a rebuilt iterator reads (a copy of them): reaching them elsewhere too is
    /// refused (see the `Iter` arm).
    watched_by_iter: HashSet<VarId>,
    /// Cells of functions made in the trace, rebuilt as new cells (by address).
    cells: HashSet<usize>,
}

/// Whether `id` is an object made in the trace whose identity the generated code must keep.
fn made_in_trace(tracer: &Tracer<'_>, id: VarId) -> bool {
    match tracer.kind(id) {
        VarKind::List(_) | VarKind::Dict(_) => tracer.source(id).is_none(),
        // A tuple of a class whose instances take attributes (a subclass of a named tuple
        // without `__slots__`): an attribute stored at a graph break must be on the one
        // object the resume function gets.
        VarKind::Tuple(_) => {
            tracer.source(id).is_none()
                && tracer.tuple_classes.get(&id).is_some_and(|cls| {
                    cls.bind(tracer.py)
                        .getattr("__dictoffset__")
                        .and_then(|o| o.extract::<isize>())
                        .is_ok_and(|offset| offset != 0)
                })
        }
        VarKind::Instance { .. } | VarKind::Partial { .. } | VarKind::Function(_) => true,
        VarKind::Object(_) => {
            tracer.is_fresh_set(id)
                || (tracer.is_fresh_deque(id) && tracer.source(id).is_none())
                || tracer.is_private(id)
        }
        _ => false,
    }
}

/// How to build `id`, collecting the graph outputs it needs.
pub fn rebuild_plan(tracer: &Tracer<'_>, id: VarId, r: &mut Rebuilder) -> CResult<Rebuild> {
    if let Some(source) = tracer.unread_item_source(id) {
        // A constant item of a container the trace never looked at: loaded from where it
        // is (the generated code rebuilds before it replays any store), so its value is
        // not guarded.
        return Ok(Rebuild::Source(source));
    }
    if made_in_trace(tracer, id) {
        if r.watched_by_iter.contains(&id) {
            return unsupported(
                BreakKind::ValueNotRebuildable,
                "an iterator whose container is also reachable at the graph break",
            );
        }
        if r.shared.contains(&id) {
            if !r.definitions.iter().any(|(d, _)| *d == id) {
                if !r.defining.insert(id) {
                    return unsupported(
                        BreakKind::ValueNotRebuildable,
                        "an object made while tracing that contains itself",
                    );
                }
                let plan = rebuild_inline(tracer, id, r)?;
                r.defining.remove(&id);
                r.definitions.push((id, plan));
            }
            return Ok(Rebuild::Shared(id.0));
        }
        if !r.seen.insert(id) {
            // Reached again: the plans are made again with `id` shared (see `plan_all`).
            r.repeated.insert(id);
            let py = tracer.py;
            return Ok(Rebuild::Const(OwnedRef::from_bound(
                &py.None().into_bound(py),
            )));
        }
    }
    rebuild_inline(tracer, id, r)
}

/// Plans for `roots` and for every side effect to replay, made twice when some object made
/// in the trace is reached from two places (then built once, into a temp).
pub fn plan_all(
    tracer: &mut Tracer<'_>,
    roots: &[VarId],
) -> CResult<(Vec<Rebuild>, Vec<Replay>, Rebuilder)> {
    let mut r = Rebuilder::default();
    let (mut plans, mut replays) = plan_once(tracer, roots, &mut r)?;
    if !r.repeated.is_empty() {
        r = Rebuilder {
            outputs: std::mem::take(&mut r.outputs),
            output_index: std::mem::take(&mut r.output_index),
            shared: std::mem::take(&mut r.repeated),
            ..Rebuilder::default()
        };
        (plans, replays) = plan_once(tracer, roots, &mut r)?;
        if !r.repeated.is_empty() {
            return unsupported(
                BreakKind::Internal,
                "internal: an object made while tracing reached twice after sharing",
            );
        }
    }
    // Which sources compared with `is` are one object (see `is_between_sources`).
    for (source, class, _) in tracer.identity_sources.clone() {
        tracer
            .guards
            .add(source, guards::GuardKind::SameObjectClass(class));
    }
    if !tracer.written_containers.is_empty() || tracer.containers_shared {
        // Which sources are one object must stay as traced (see `SameObjectClass`).
        for (source, class) in tracer.container_sources.clone() {
            tracer
                .guards
                .add(source, guards::GuardKind::SameObjectClass(class));
        }
    }
    Ok((plans, replays, r))
}

/// `collections.deque(items, maxlen)` for a deque the trace made.
fn deque_plan(
    tracer: &Tracer<'_>,
    deque: super::ops_deque::DequeContents,
    r: &mut Rebuilder,
) -> CResult<Rebuild> {
    let maxlen = deque.maxlen.clone();
    Ok(Rebuild::Call {
        func: Box::new(Rebuild::Const(OwnedRef::from_bound(&tracer.h.deque_type))),
        args: vec![deque_items_plan(tracer, deque, r)?, Rebuild::Const(maxlen)],
        kwargs: Vec::new(),
    })
}

/// A new list of the items of a deque the trace made or copied.
fn deque_items_plan(
    tracer: &Tracer<'_>,
    deque: super::ops_deque::DequeContents,
    r: &mut Rebuilder,
) -> CResult<Rebuild> {
    Ok(Rebuild::List(
        deque
            .items
            .into_iter()
            .map(|item| match item {
                super::ops_deque::DequeItem::Tracked(id) => rebuild_plan(tracer, id, r),
                super::ops_deque::DequeItem::Constant(c) => Ok(Rebuild::Const(c)),
            })
            .collect::<CResult<Vec<_>>>()?,
    ))
}

/// A new plain list, dict or set holding what the list, dict or existing set tracker `id`
/// holds now.
fn contents_plan(tracer: &Tracer<'_>, id: VarId, r: &mut Rebuilder) -> CResult<Rebuild> {
    Ok(match tracer.kind(id) {
        VarKind::List(items) => Rebuild::List(
            items
                .iter()
                .map(|&i| rebuild_plan(tracer, i, r))
                .collect::<CResult<_>>()?,
        ),
        VarKind::Dict(entries) => Rebuild::Dict(
            entries
                .iter()
                .map(|(k, v)| {
                    let key = match tracer.key_tensors.get(&(k.as_ptr() as usize)) {
                        Some(&tensor) => rebuild_plan(tracer, tensor, r)?,
                        None => Rebuild::Const(k.clone()),
                    };
                    Ok((key, rebuild_plan(tracer, *v, r)?))
                })
                .collect::<CResult<_>>()?,
        ),
        // An existing set the trace changed: its copy's final elements.
        VarKind::Object(copy) if tracer.is_written_set(id) => {
            tracer.set_elements_rebuild(&copy.bind(tracer.py).clone(), r)?
        }
        // An existing deque: its copy's final items.
        VarKind::Object(_) if tracer.is_fresh_deque(id) => match tracer.fresh_deque_contents(id)? {
            Some(deque) => deque_items_plan(tracer, deque, r)?,
            None => return unsupported(BreakKind::Internal, "internal: the contents of a deque"),
        },
        other @ (VarKind::Tensor { .. }
        | VarKind::Unrealized(_)
        | VarKind::Symbolic { .. }
        | VarKind::Slice(_)
        | VarKind::Const(_)
        | VarKind::Object(_)
        | VarKind::Tuple(_)
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
                BreakKind::Internal,
                format!("internal: the contents of {}", translator::kind_name(other)),
            )
        }
    })
}

fn plan_once(
    tracer: &Tracer<'_>,
    roots: &[VarId],
    r: &mut Rebuilder,
) -> CResult<(Vec<Rebuild>, Vec<Replay>)> {
    let plans = roots
        .iter()
        .map(|&root| rebuild_plan(tracer, root, r))
        .collect::<CResult<Vec<_>>>()?;
    // Side effects on attributes of existing objects: the last store (or delete) of each,
    // replayed so the instance dict ends in eager's key order too. A store to a name the
    // dict holds keeps its place; a name stored after being deleted (or new) goes to the
    // end, in the order those stores came.
    struct AttrFate {
        /// Index (into `mutations`) of the store that decides where the name ends up.
        placed_at: usize,
        /// Whether a delete of a name the object had came before that store.
        deleted_first: bool,
        last: usize,
    }
    let mut fates: Vec<((usize, &str), AttrFate)> = Vec::new();
    for (index, m) in tracer.mutations.iter().enumerate() {
        let key = (m.object.as_ptr() as usize, m.name.as_str());
        let at = match fates.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                fates.push((
                    key,
                    AttrFate {
                        placed_at: index,
                        deleted_first: false,
                        last: index,
                    },
                ));
                fates.len() - 1
            }
        };
        let previous = &tracer.mutations[fates[at].1.last];
        let fate = &mut fates[at].1;
        if m.value.is_some() && previous.value.is_none() && fate.last != index {
            // Stored again after a delete: appended at this point.
            fate.placed_at = index;
        }
        if m.value.is_none() {
            fate.deleted_first = true;
        }
        fate.last = index;
    }
    fates.sort_by_key(|(_, fate)| fate.placed_at);
    let mut replays: Vec<Replay> = Vec::new();
    for (_, fate) in &fates {
        let m = &tracer.mutations[fate.last];
        let delete = Replay::DelAttr {
            source: m.source.clone(),
            name: m.name.clone(),
        };
        match m.value {
            Some(v) => {
                if fate.deleted_first {
                    replays.push(delete);
                }
                replays.push(Replay::SetAttr {
                    source: m.source.clone(),
                    name: m.name.clone(),
                    value: rebuild_plan(tracer, v, r)?,
                });
            }
            None => replays.push(delete),
        }
    }
    // Globals stored: the last value of each.
    let mut stored: HashSet<(usize, String)> = HashSet::new();
    let mut global_replays = Vec::new();
    for (globals, name, value) in tracer.global_stores.iter().rev() {
        if stored.insert((globals.as_ptr() as usize, name.clone())) {
            global_replays.push(Replay::SetGlobal {
                globals: globals.clone(),
                name: name.clone(),
                value: rebuild_plan(tracer, *value, r)?,
            });
        }
    }
    replays.extend(global_replays.into_iter().rev());
    // Free variables of the compiled frame written: the last value of each.
    let mut written: HashSet<u32> = HashSet::new();
    let mut deref_replays = Vec::new();
    for &(slot, value) in tracer.deref_stores.iter().rev() {
        if written.insert(slot) {
            deref_replays.push(Replay::SetDeref {
                slot,
                value: rebuild_plan(tracer, value, r)?,
            });
        }
    }
    replays.extend(deref_replays.into_iter().rev());
    // Existing lists, dicts and sets the trace changed: their final contents.
    for &container in &tracer.written_containers {
        let source = tracer
            .source(container)
            .expect("existing containers have sources");
        let value = contents_plan(tracer, container, r)?;
        replays.push(Replay::Contents { source, value });
    }
    Ok((plans, replays))
}

/// How to build `id` in place (see `rebuild_plan`).
fn rebuild_inline(tracer: &Tracer<'_>, id: VarId, r: &mut Rebuilder) -> CResult<Rebuild> {
    let py = tracer.py;
    if let Some(slice) = super::ops_module_slice::module_slice_plan(tracer, id, r)? {
        return Ok(slice);
    }
    Ok(match tracer.kind(id) {
        // Never used by the trace: loaded from its source, an argument tuple.
        VarKind::Unrealized(_) => Rebuild::Source(tracer.source(id).expect("unrealized inputs have sources")),
        // A frame argument the trace did not replace is loaded from its local, which the
        // generated code never overwrites: the same object, no graph output.
        VarKind::Tensor { node, .. }
            if matches!(tracer.graph.nodes[node.0 as usize].op, Op::Placeholder)
                && matches!(tracer.source(id).as_deref(), Some(Source::Local(_))) =>
        {
            Rebuild::Source(tracer.source(id).expect("checked"))
        }
        VarKind::Tensor { node, .. } | VarKind::Symbolic { node, .. } => {
            let k = *r.output_index.entry(*node).or_insert_with(|| {
                r.outputs.push(*node);
                r.outputs.len() - 1
            });
            Rebuild::Output(k)
        }
        VarKind::Const(v) => Rebuild::Const(v.clone()),
        VarKind::Object(v) => match tracer.source(id) {
            Some(source) => Rebuild::Source(source),
            None => {
                if let Some(set) = tracer.fresh_set_rebuild(id, r)? {
                    return Ok(set);
                }
                if let Some(deque) = tracer.fresh_deque_contents(id)? {
                    return deque_plan(tracer, deque, r);
                }
                // A module made in forward (or a copy) is a new object on every call: the
                // one the trace made may not stand for them all.
                if let Some(recipe) = tracer.private_module_recipe(id)? {
                    return Ok(recipe);
                }
                if tracer.is_private(id) {
                    return unsupported(
                        BreakKind::ValueNotRebuildable,
                        "handing on an object made while tracing (a module made in forward, \
                         a copy)",
                    );
                }
                let obj = v.bind(py);
                // A builtin method of a constant (`"loss {}".format`, `", ".join` on the stack
                // when their argument breaks the graph): looked up again on the constant.
                if let Some((receiver, name)) = constant_bound_method(tracer, &obj)? {
                    return Ok(Rebuild::Attr {
                        base: Box::new(Rebuild::Const(OwnedRef::from_bound(&receiver))),
                        name,
                    });
                }
                // A builtin method read from a tracked object: read again from the
                // receiver this call has (unless the trace stored to that attribute since:
                // its replay would come first).
                if let Some((receiver, name)) = tracer.bound_builtin_receivers.get(&id).filter(|(receiver, name)| {
                    tracer
                        .real_unpinned(*receiver)
                        .is_some_and(|real| tracer.mutated_attr(&real, name).is_none())
                }) {
                    return Ok(Rebuild::Attr {
                        base: Box::new(rebuild_plan(tracer, *receiver, r)?),
                        name: name.clone(),
                    });
                }
                // A method bound while tracing is bound to the object the trace saw, which
                // need not be the one this call has: not a constant.
                let bound = obj
                    .getattr("__self__")
                    .is_ok_and(|s| !s.is_none() && !s.is_instance_of::<pyo3::types::PyModule>());
                let immutable = (obj.is_callable() && !bound)
                    || obj.is_exact_instance_of::<pyo3::types::PyFrozenSet>()
                    || obj.is_instance_of::<pyo3::types::PyModule>()
                    || obj.is_instance_of::<pyo3::types::PyType>();
                if !immutable {
                    return unsupported(
                        BreakKind::ValueNotRebuildable,
                        "returning an object created while tracing",
                    );
                }
                Rebuild::Const(v.clone())
            }
        },
        // A container that existed before the call is returned as itself (the caller may
        // compare it with `is` or change it later); changes the trace made to it are
        // replayed into it (`Replay::Contents`).
        VarKind::Tuple(_) | VarKind::List(_) | VarKind::Dict(_) if tracer.source(id).is_some() => {
            Rebuild::Source(tracer.source(id).expect("checked"))
        }
        VarKind::Tuple(items) => {
            let plain = Rebuild::Tuple(
                items
                    .iter()
                    .map(|&i| rebuild_plan(tracer, i, r))
                    .collect::<CResult<_>>()?,
            );
            match tracer.tuple_classes.get(&id) {
                Some(cls) => Rebuild::Converted {
                    into: OwnedRef::from_bound(&super::ops_build::named_tuple_maker(
                        &cls.bind(py),
                    )?),
                    value: Box::new(plain),
                },
                None => plain,
            }
        }
        VarKind::List(_) => {
            let plain = contents_plan(tracer, id, r)?;
            match tracer.list_classes.get(&id) {
                Some(cls) => Rebuild::Converted {
                    into: cls.clone(),
                    value: Box::new(plain),
                },
                None => plain,
            }
        }
        VarKind::Dict(_) if tracer.instance_dicts.values().any(|&d| d == id) => {
            // A copy would not be the object's own `__dict__`.
            return unsupported(
                BreakKind::ValueNotRebuildable,
                "the __dict__ of an object made while tracing, kept after the graph",
            );
        }
        VarKind::Dict(_) => {
            let plain = contents_plan(tracer, id, r)?;
            if let Some(&factory) = tracer.dict_defaults.get(&id) {
                // `defaultdict(factory, entries)`.
                let cls = tracer.dict_classes[&id].clone();
                let factory = rebuild_plan(tracer, factory, r)?;
                return Ok(Rebuild::Call {
                    func: Box::new(Rebuild::Const(cls)),
                    args: vec![factory, plain],
                    kwargs: Vec::new(),
                });
            }
            match tracer.dict_classes.get(&id) {
                Some(cls) => Rebuild::Converted {
                    into: cls.clone(),
                    value: Box::new(plain),
                },
                None => plain,
            }
        }
        VarKind::Instance {
            cls,
            attrs,
            model_output,
        } => {
            let (cls, attrs, model_output) = (cls.clone(), attrs.clone(), *model_output);
            if model_output {
                let class = cls.bind(py);
                let class = class.cast::<pyo3::types::PyType>().map_err(PyErr::from)?;
                if super::model_output::is_standard(class)? {
                    // Every field, None or not: the state the constructor leaves.
                    let names = attrs.iter().map(|(name, _)| name.as_str());
                    let names = pyo3::types::PyTuple::new(py, names)?;
                    let mut args = vec![
                        Rebuild::Const(cls.clone()),
                        Rebuild::Const(OwnedRef::from_bound(names.as_any())),
                    ];
                    for (_, v) in attrs {
                        args.push(rebuild_plan(tracer, v, r)?);
                    }
                    let helper = py
                        .import_module("dynamo_rs._native")?
                        .getattr("model_output_from_fields")?;
                    let kwargs = match tracer.model_output_attribute_only.get(&id) {
                        Some(names) => {
                            let names = pyo3::types::PyTuple::new(py, names)?;
                            vec![(
                                "attribute_only".to_string(),
                                Rebuild::Const(OwnedRef::from_bound(names.as_any())),
                            )]
                        }
                        None => Vec::new(),
                    };
                    return Ok(Rebuild::Call {
                        func: Box::new(Rebuild::Const(OwnedRef::from_bound(&helper))),
                        args,
                        kwargs,
                    });
                }
                if tracer.model_output_attribute_only.contains_key(&id) {
                    return unsupported(
                        BreakKind::ValueNotRebuildable,
                        "a ModelOutput of a class with its own construction, with a field set \
                         as an attribute only",
                    );
                }
                let fields = tracer
                    .model_output_items(id)
                    .into_iter()
                    .map(|(name, v)| Ok((name, rebuild_plan(tracer, v, r)?)))
                    .collect::<CResult<_>>()?;
                // The constructor runs with the hook off: its frames (`__init__`,
                // `__post_init__`, a custom `__setattr__`) only store the fields the graph
                // computed, and capturing them would find nothing to compile.
                let constructor = Bound::new(
                    py,
                    crate::eval_frame::disable::DisabledFunction::wrap(cls.bind(py).clone()),
                )?;
                Rebuild::Call {
                    func: Box::new(Rebuild::Const(OwnedRef::from_bound(constructor.as_any()))),
                    args: Vec::new(),
                    kwargs: fields,
                }
            } else {
                let attrs = attrs
                    .into_iter()
                    .map(|(name, v)| Ok((name, rebuild_plan(tracer, v, r)?)))
                    .collect::<CResult<_>>()?;
                Rebuild::Instance { cls, attrs }
            }
        }
        VarKind::Function(function) => {
            let made = function_plan(tracer, &function.clone(), r)?;
            super::ops_function_attrs::with_function_attrs(tracer, id, made, &mut |v| {
                rebuild_plan(tracer, v, r)
            })?
        }
        VarKind::Partial { func, args, kwargs } => {
            let (func, args, kwargs) = (*func, args.clone(), kwargs.clone());
            let mut all = vec![rebuild_plan(tracer, func, r)?];
            for arg in args {
                all.push(rebuild_plan(tracer, arg, r)?);
            }
            let kwargs = kwargs
                .into_iter()
                .map(|(name, v)| Ok((name, rebuild_plan(tracer, v, r)?)))
                .collect::<CResult<_>>()?;
            let partial = py.import_module("functools")?.getattr("partial")?;
            Rebuild::Call {
                func: Box::new(Rebuild::Const(OwnedRef::from_bound(&partial))),
                args: all,
                kwargs,
            }
        }
        // The function the trace resolved, bound to the receiver: `receiver.name` could
        // find another (the method was reached through `super()`).
        VarKind::Method {
            receiver,
            func: Some(func),
            ..
        } => Rebuild::BoundMethod {
            func: func.clone(),
            receiver: Box::new(rebuild_plan(tracer, *receiver, r)?),
        },
        // A tensor's or container's own method: `receiver.name`, looked up again (what
        // `LOAD_METHOD` did in the original), unless the receiver's class overrides it in
        // Python (then the trace reached the builtin through `super()`).
        VarKind::Method {
            receiver,
            name,
            func: None,
        } => {
            if let Some(real) = tracer.real(*receiver) {
                let found = real.get_type().getattr(name.as_str());
                if found.is_ok_and(|f| f.is_instance_of::<pyo3::types::PyFunction>()) {
                    return unsupported(
                        BreakKind::SuperCall,
                        format!("super().{name} on the stack at a graph break"),
                    );
                }
            }
            Rebuild::Attr {
                base: Box::new(rebuild_plan(tracer, *receiver, r)?),
                name: name.clone(),
            }
        }
        // An iterator live at a graph break: `ResumeIterator((remaining items...))`. Python's iterator
        // reads its list live; the rebuilt one reads a copy, which is the same only while
        // no one else can change that list: none from a source, and none reachable from
        // the other values rebuilt (`Rebuilder::watched_by_iter`).
        VarKind::Iter {
            items,
            next,
            watched,
            handed_on,
            exhausted: _,
        } => {
            let remaining = items[*next..].to_vec();
            // A container changed since the iterator was made: Python's iterator sees the
            // change, the items taken do not.
            let changed = watched
                .iter()
                .any(|w| tracer.contents_fingerprint(w.container) != w.then);
            let watched: Vec<VarId> = watched.iter().map(|w| w.container).collect();
            if changed
                || *handed_on
                || watched.iter().any(|&c| {
                    tracer.source(c).is_some()
                        || r.seen.contains(&c)
                        || r.shared.contains(&c)
                        || !r.watched_by_iter.insert(c)
                })
            {
                return unsupported(
                    BreakKind::ValueNotRebuildable,
                    "an iterator whose container is also reachable at the graph break",
                );
            }
            let items = remaining
                .into_iter()
                .map(|i| rebuild_plan(tracer, i, r))
                .collect::<CResult<_>>()?;
            // Plain Python (`_polyfills.ResumeIterator`), so that a trace of the rest of the
            // frame reads its items through sources and replays how far it got.
            Rebuild::Converted {
                into: OwnedRef::from_bound(
                    &py.import_module("dynamo_rs._polyfills")?
                        .getattr("ResumeIterator")?,
                ),
                value: Box::new(Rebuild::Tuple(items)),
            }
        }
        VarKind::StateContext(var) => tracer.state_context_rebuild(*var)?,
        // An array the frame was given (arrays are never changed in the trace): itself.
        VarKind::NdArray(_) if tracer.source(id).is_some() => {
            Rebuild::Source(tracer.source(id).expect("checked"))
        }
        VarKind::NdArray(tensor) => {
            let tensor = rebuild_plan(tracer, *tensor, r)?;
            tracer.ndarray_rebuild(tensor)?
        }
        // Only on the stack at a graph break inside the block: the resume function's.
        VarKind::GradModeExit { previous } => Rebuild::Const(OwnedRef::from_bound(
            ops_with::GradModeExit::get(py, *previous)?.as_any(),
        )),
        // A slice with bounds from the graph (tensors), on the stack at the break where a
        // tensor is indexed by it.
        VarKind::Slice(parts) => Rebuild::Call {
            func: Box::new(Rebuild::Const(OwnedRef::from_bound(
                &tracer.h.builtins.getattr("slice")?,
            ))),
            args: parts
                .iter()
                .map(|&p| rebuild_plan(tracer, p, r))
                .collect::<CResult<_>>()?,
            kwargs: Vec::new(),
        },
        // A view of a dict (`d.items()`, `locals().keys()` returned): the view of the dict
        // as rebuilt (the same object wherever else it is reached).
        VarKind::DictView { dict, which } => Rebuild::Call {
            func: Box::new(Rebuild::Attr {
                base: Box::new(rebuild_plan(tracer, *dict, r)?),
                name: which.method().to_string(),
            }),
            args: Vec::new(),
            kwargs: Vec::new(),
        },
        // Kinds the generated code cannot make (listed, so that a new kind must be placed
        // here or given a plan).
        other @ (VarKind::Null
        // A generator's frame, suspended mid-way, is not an object the code can make.
        | VarKind::Generator { .. }
        | VarKind::Lazy(_)
        | VarKind::CellRef(_)
        | VarKind::Super { .. }
        | VarKind::GradModeContext { .. }
        | VarKind::GradModeWrapped { .. }) => {
            return unsupported(
                BreakKind::ValueNotRebuildable,
                format!("returning {}", translator::kind_name(other)),
            )
        }
    })
}

/// `(receiver, name)` when `obj` is a builtin method bound to a constant (a string, a number,
/// a tuple of constants) that the receiver's own attribute `name` gives again.
pub(super) fn constant_bound_method<'py>(
    tracer: &Tracer<'py>,
    obj: &Bound<'py, PyAny>,
) -> CResult<Option<(Bound<'py, PyAny>, String)>> {
    let Some(receiver) = super::helpers::builtin_method_receiver(obj)? else {
        return Ok(None);
    };
    if receiver.is_none()
        || receiver.is_instance_of::<pyo3::types::PyModule>()
        || !tracer.h.is_constant(&receiver)?
    {
        return Ok(None);
    }
    let name: String = obj.getattr("__name__")?.extract()?;
    let again = receiver.getattr(name.as_str());
    if !again.is_ok_and(|m| m.eq(obj).unwrap_or(false)) {
        return Ok(None);
    }
    Ok(Some((receiver, name)))
}

/// A function made by `MAKE_FUNCTION` in the trace, made again by the generated code from
/// its code object, globals, defaults and closure (`_capture.make_function`). A cell the
/// trace made becomes a new cell holding its last value: right when the trace ends by
/// returning (the frames that made the cells are gone, and nothing else can reach them),
/// refused where the compiled frame goes on with the cell (a graph break) and where two
/// functions share one.
fn function_plan(
    tracer: &Tracer<'_>,
    function: &TracedFunction,
    r: &mut Rebuilder,
) -> CResult<Rebuild> {
    let py = tracer.py;
    let cell_type = py.import_module("types")?.getattr("CellType")?;
    let mut cells = Vec::with_capacity(function.closure.len());
    for cell in &function.closure {
        cells.push(match cell {
            Cell::Real(_, Some(source)) => Rebuild::Source(source.clone()),
            Cell::Real(cell, None) => Rebuild::Const(cell.clone()),
            Cell::Traced(contents) => {
                let address = Rc::as_ptr(contents) as usize;
                if let Some(&slot) = tracer.root_free_cells.get(&address) {
                    // A free variable of the compiled frame (`nonlocal out` in a closure it
                    // returns): the function gets the frame's own cell, shared with the scope
                    // that made the frame's closure, as eagerly; the trace's writes to it are
                    // replayed into that cell (`deref_stores`).
                    cells.push(Rebuild::FrameCell { slot, value: None });
                    continue;
                }
                let frame_cell = tracer.root_cells.get(&address).copied();
                if tracer.stop_at.is_some() && frame_cell == Some(None) {
                    return unsupported(
                        BreakKind::ValueNotRebuildable,
                        "a function made in the trace that shares a cell with the frame at a \
                         graph break (a cell of a resume function)",
                    );
                }
                if let (Some(_), Some(Some(slot))) = (tracer.stop_at, frame_cell) {
                    // A function on the stack at a graph break that closes over a cell of the
                    // frame (a comprehension reading the frame's locals, a closure made before
                    // the break): it gets the frame's own cell, holding the traced value; the
                    // resume function is handed the same cell, so what either writes later
                    // the other sees.
                    let value = match *contents.borrow() {
                        Some(v) => Some(Box::new(rebuild_plan(tracer, v, r)?)),
                        None => None,
                    };
                    cells.push(Rebuild::FrameCell { slot, value });
                    continue;
                }
                if !r.cells.insert(address) {
                    return unsupported(
                        BreakKind::ValueNotRebuildable,
                        "two functions made in the trace that share a cell",
                    );
                }
                let value = *contents.borrow();
                let args = match value {
                    Some(v) => vec![rebuild_plan(tracer, v, r)?],
                    None => Vec::new(),
                };
                Rebuild::Call {
                    func: Box::new(Rebuild::Const(OwnedRef::from_bound(&cell_type))),
                    args,
                    kwargs: Vec::new(),
                }
            }
        });
    }
    let none = || Rebuild::Const(OwnedRef::from_bound(&py.None().into_bound(py)));
    let defaults = match function.defaults {
        Some(d) => rebuild_plan(tracer, d, r)?,
        None => none(),
    };
    let kwdefaults = match function.kwdefaults {
        Some(d) => rebuild_plan(tracer, d, r)?,
        None => none(),
    };
    let make = py
        .import_module("dynamo_rs._capture")?
        .getattr("make_function")?;
    Ok(Rebuild::Call {
        func: Box::new(Rebuild::Const(OwnedRef::from_bound(&make))),
        args: vec![
            Rebuild::Const(function.code.clone()),
            Rebuild::Const(function.globals.clone()),
            defaults,
            kwdefaults,
            Rebuild::Tuple(cells),
        ],
        kwargs: Vec::new(),
    })
}
