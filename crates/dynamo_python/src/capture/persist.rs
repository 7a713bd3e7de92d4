//! The bridge between a trace's guards and the persistent capture cache
//! (`dynamo_rs/_persist.py`): a guard set described as plain Python tuples holding the
//! objects the trace saw, and the same description — with the objects a later process found
//! in their place — turned back into a [`NativeGuard`].
//!
//! The encoding into a file (which objects are portable, how they are named, what must be
//! re-checked when an entry is bound to a new frame) is Python's; here only the shapes of
//! sources and guard kinds are known.
//!
//! The converter's side is here too: whether its entries persist, loading an entry for a
//! frame before tracing it, and saving the entry a trace built.

use std::rc::Rc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::guards::{GuardKind, GuardSet, NativeGuard};
use super::source::{ItemKey, Source};
use super::translator::Tracer;
use super::{CompiledGraph, Converter, Frame};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// `set` as a dict: `sources` (one tuple per interned source, parents first: `("local",
/// None, name)`, `("global", None, name, globals, builtins, root)`, `("cell", None, cell)`,
/// `("object", None, object, label)`, `("attr" | "classattr", parent, name)`, `("item",
/// parent, key)`), `guards` (`(source, kind, value...)`), `grad_mode`, `global_state`,
/// `mutates_in_place`, `examples` (the source ids whose objects the plan inspects) and
/// `symbolic` (whether any size is symbolic: such guards are not described further).
pub fn describe<'py>(py: Python<'py>, set: &GuardSet) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    let sources = PyList::empty(py);
    for (source, parent) in set.sources.nodes() {
        let parent = parent.map(|p| p as usize);
        let item = match source.as_ref() {
            Source::Local(name) => ("local", parent, name).into_pyobject(py)?.into_any(),
            Source::Global {
                globals,
                builtins,
                name,
                root,
            } => (
                "global",
                parent,
                name,
                globals.bind(py),
                builtins.bind(py),
                *root,
            )
                .into_pyobject(py)?
                .into_any(),
            Source::Cell(cell) => ("cell", parent, cell.bind(py))
                .into_pyobject(py)?
                .into_any(),
            Source::Object(object, label) => ("object", parent, object.bind(py), label)
                .into_pyobject(py)?
                .into_any(),
            Source::Attr(_, name) => ("attr", parent, name).into_pyobject(py)?.into_any(),
            Source::ClassAttr(_, name) => ("classattr", parent, name).into_pyobject(py)?.into_any(),
            Source::Item(_, key) => ("item", parent, key.to_python(py)?)
                .into_pyobject(py)?
                .into_any(),
            // Not written (`_persist` refuses kinds it does not know).
            Source::DictItem(_, key) => ("dictitem", parent, key.to_python(py)?)
                .into_pyobject(py)?
                .into_any(),
            Source::AsTensor(_) => ("astensor", parent).into_pyobject(py)?.into_any(),
        };
        sources.append(item)?;
    }
    let guards = PyList::empty(py);
    for (id, kind) in &set.guards {
        let item = match kind {
            GuardKind::Tensor(v) => (id, "tensor", v.bind(py)).into_pyobject(py)?.into_any(),
            GuardKind::Equals(v) => (id, "equals", v.bind(py)).into_pyobject(py)?.into_any(),
            GuardKind::Id(v) => (id, "id", v.bind(py)).into_pyobject(py)?.into_any(),
            GuardKind::Type(v) => (id, "type", v.bind(py)).into_pyobject(py)?.into_any(),
            GuardKind::Len(n) => (id, "len", n).into_pyobject(py)?.into_any(),
            GuardKind::Keys(v) => (id, "keys", v.bind(py)).into_pyobject(py)?.into_any(),
            GuardKind::Contains(key, expected) => (id, "contains", key.bind(py), expected)
                .into_pyobject(py)?
                .into_any(),
            GuardKind::HasAttr(name, expected) => (id, "hasattr", name, expected)
                .into_pyobject(py)?
                .into_any(),
            GuardKind::ModuleCall => (id, "module_call", 0).into_pyobject(py)?.into_any(),
            GuardKind::InstanceDictLacks(name) => (id, "instance_dict_lacks", name)
                .into_pyobject(py)?
                .into_any(),
            GuardKind::SameObjectClass(class) => (id, "same_object_class", class)
                .into_pyobject(py)?
                .into_any(),
        };
        guards.append(item)?;
    }
    let mut examples: Vec<u32> = set.examples.keys().copied().collect();
    examples.sort_unstable();
    out.set_item("sources", sources)?;
    out.set_item("guards", guards)?;
    out.set_item("grad_mode", set.grad_mode)?;
    out.set_item(
        "global_state",
        set.global_state.as_ref().map(|g| g.bind(py).clone()),
    )?;
    out.set_item("mutates_in_place", set.mutates_in_place)?;
    out.set_item("examples", examples)?;
    out.set_item(
        "symbolic",
        set.shape.is_some() || !set.dynamic_dims.is_empty(),
    )?;
    Ok(out)
}

fn invalid(what: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("persisted guard description: {what}"))
}

/// A guard set from a description shaped as [`describe`] makes it, holding live objects;
/// `examples` maps source ids to the objects found there now.
fn guard_set_from(description: &Bound<'_, PyDict>) -> PyResult<GuardSet> {
    let item = |name: &str| -> PyResult<Bound<'_, PyAny>> {
        description
            .get_item(name)?
            .ok_or_else(|| invalid(format!("no {name}")))
    };
    let mut set = GuardSet::default();
    let mut made: Vec<Rc<Source>> = Vec::new();
    for entry in item("sources")?.try_iter()? {
        let entry = entry?.cast_into::<PyTuple>().map_err(PyErr::from)?;
        let kind: String = entry.get_item(0)?.extract()?;
        let parent = || -> PyResult<Rc<Source>> {
            let index: usize = entry.get_item(1)?.extract()?;
            made.get(index)
                .cloned()
                .ok_or_else(|| invalid("a source before its parent"))
        };
        let source = match kind.as_str() {
            "local" => Source::Local(entry.get_item(2)?.extract()?),
            "global" => Source::Global {
                name: entry.get_item(2)?.extract()?,
                globals: OwnedRef::from_bound(&entry.get_item(3)?),
                builtins: OwnedRef::from_bound(&entry.get_item(4)?),
                root: entry.get_item(5)?.extract()?,
            },
            "cell" => Source::Cell(OwnedRef::from_bound(&entry.get_item(2)?)),
            "object" => Source::Object(
                OwnedRef::from_bound(&entry.get_item(2)?),
                entry.get_item(3)?.extract()?,
            ),
            "attr" => Source::Attr(parent()?, entry.get_item(2)?.extract()?),
            "classattr" => Source::ClassAttr(parent()?, entry.get_item(2)?.extract()?),
            "item" => Source::Item(parent()?, ItemKey::of(&entry.get_item(2)?)),
            other => return Err(invalid(format!("unknown source kind {other:?}"))),
        };
        let source = Rc::new(source);
        let id = set.sources.intern(&source);
        if id as usize != made.len() {
            return Err(invalid("two sources are the same"));
        }
        made.push(source);
    }
    for entry in item("guards")?.try_iter()? {
        let entry = entry?.cast_into::<PyTuple>().map_err(PyErr::from)?;
        let id: usize = entry.get_item(0)?.extract()?;
        let source = made
            .get(id)
            .cloned()
            .ok_or_else(|| invalid("a guard on an unknown source"))?;
        let kind: String = entry.get_item(1)?.extract()?;
        let value = || -> PyResult<OwnedRef> { Ok(OwnedRef::from_bound(&entry.get_item(2)?)) };
        let kind = match kind.as_str() {
            "tensor" => GuardKind::Tensor(value()?),
            "equals" => GuardKind::Equals(value()?),
            "id" => GuardKind::Id(value()?),
            "type" => GuardKind::Type(value()?),
            "len" => GuardKind::Len(entry.get_item(2)?.extract()?),
            "keys" => GuardKind::Keys(value()?),
            "contains" => GuardKind::Contains(value()?, entry.get_item(3)?.extract()?),
            "hasattr" => {
                GuardKind::HasAttr(entry.get_item(2)?.extract()?, entry.get_item(3)?.extract()?)
            }
            "same_object_class" => GuardKind::SameObjectClass(entry.get_item(2)?.extract()?),
            "instance_dict_lacks" => GuardKind::InstanceDictLacks(entry.get_item(2)?.extract()?),
            "module_call" => GuardKind::ModuleCall,
            other => return Err(invalid(format!("unknown guard kind {other:?}"))),
        };
        set.add(source, kind);
    }
    set.grad_mode = item("grad_mode")?.extract()?;
    let state = item("global_state")?;
    set.global_state = (!state.is_none()).then(|| OwnedRef::from_bound(&state));
    set.mutates_in_place = item("mutates_in_place")?.extract()?;
    let examples = item("examples")?;
    let examples = examples.cast::<PyDict>().map_err(PyErr::from)?;
    for (id, object) in examples.iter() {
        let id: usize = id.extract()?;
        let source = made
            .get(id)
            .ok_or_else(|| invalid("an example of an unknown source"))?;
        set.example(source, &object);
    }
    Ok(set)
}

/// The guard of an entry read back from the persistent capture cache: `description` as
/// [`describe`] made it, with the objects found in this process (`examples` a dict from
/// source id to the object there now); `layout_names` the code's localsplus names,
/// `graph_inputs` the source ids of the graph's inputs, `owner` the converter. The compiled
/// graph the entry's code calls is given later (`NativeGuard.set_graph_token`), once the
/// guard has passed on the frame and the backend has compiled the graph.
#[pyfunction]
#[pyo3(signature = (description, layout_names, graph_inputs, owner))]
pub fn restore_guard(
    py: Python<'_>,
    description: &Bound<'_, PyDict>,
    layout_names: Vec<String>,
    graph_inputs: Vec<usize>,
    owner: &Bound<'_, PyAny>,
) -> PyResult<NativeGuard> {
    let set = guard_set_from(description)?;
    if let Some(&bad) = graph_inputs
        .iter()
        .find(|&&i| i >= set.sources.nodes().len())
    {
        return Err(invalid(format!("graph input {bad} is not a source")));
    }
    NativeGuard::build(
        py,
        &set,
        &layout_names,
        graph_inputs,
        None,
        Some(OwnedRef::from_bound(owner)),
    )
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(restore_guard, m)?)?;
    Ok(())
}

impl Converter {
    /// Whether this converter's entries go to the persistent capture cache
    /// (`dynamo_rs.config.capture_cache`, and a backend named by a string).
    pub(super) fn persists(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.cache_key.is_some()
            && py
                .import_module("dynamo_rs.config")?
                .getattr("capture_cache")?
                .is_truthy()?)
    }

    /// An entry for `frame` read back from the persistent capture cache, bound to this
    /// frame's objects and compiled by the backend; None when there is none that holds.
    pub(super) fn load_persisted(
        &self,
        py: Python<'_>,
        frame: &Bound<'_, PyAny>,
        converter: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Py<PyAny>>> {
        if !self.persists(py)? {
            return Ok(None);
        }
        let start = std::time::Instant::now();
        let loaded = py
            .import_module("dynamo_rs._persist")?
            .call_method1("load", (frame, converter))?;
        if loaded.is_none() {
            self.lap("persistent cache", start);
            return Ok(None);
        }
        let (guard, code, backend_seconds): (Py<PyAny>, Py<PyAny>, f64) = loaded.extract()?;
        let total = start.elapsed().as_secs_f64();
        let mut stats = self.stats();
        *stats.phases.entry("persistent cache").or_insert(0.0) += total - backend_seconds;
        *stats.phases.entry("backend").or_insert(0.0) += backend_seconds;
        stats.loaded += 1;
        stats.graphs += 1;
        Ok(Some((guard, code).into_pyobject(py)?.into_any().unbind()))
    }

    /// Writes the entry just built for `frame` to the persistent capture cache: its guards
    /// as the trace recorded them, the graph (`record`), where the graph's inputs come from,
    /// and the code that calls it. `_persist.save` decides whether it can be written at all
    /// (every object it refers to must be found again by name in a later process).
    pub(super) fn save_persisted<'py>(
        &self,
        py: Python<'py>,
        tracer: &mut Tracer<'py>,
        frame: &Frame<'_, 'py>,
        record: &Py<PyAny>,
        graph: &CompiledGraph<'py>,
        new_code: &Bound<'py, PyAny>,
    ) -> PyResult<()> {
        let description = describe(py, &tracer.guards)?;
        // Where each graph input comes from, readable: what automatic dynamic shapes record
        // sizes under (`_shapes.dynamic_dims`), which a bound entry records too.
        let paths: Vec<String> = graph.inputs.iter().map(|s| s.describe()).collect();
        description.set_item("input_paths", paths)?;
        let inputs: Vec<u32> = graph
            .inputs
            .iter()
            .map(|s| tracer.guards.sources.intern(s))
            .collect();
        py.import_module("dynamo_rs._persist")?.call_method1(
            "save",
            (
                frame.code,
                frame.converter,
                description,
                inputs,
                record.bind(py),
                new_code,
                graph.compiled.as_ref(),
                frame.state.slot_names.clone(),
            ),
        )?;
        Ok(())
    }
}
