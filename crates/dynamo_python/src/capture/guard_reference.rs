//! The reference evaluation of a guard, for `dynamo_rs.config.guard_check_mode = "debug"`.
//!
//! [`NativeGuard`](super::guards::NativeGuard) runs a compiled plan: sources shared between
//! checks are resolved once, attributes may be read straight from an instance dict while a
//! type's version tag holds, dict items through a version-keyed cache, type checks implied by
//! identity checks are dropped, tensors are checked in one batch by torch's C++ checker and
//! aliasing by a split rule. Every one of those is an optimisation that could be wrong. This
//! evaluator knows none of them: it resolves every recorded (source, check) on its own, from
//! the frame, with plain `getattr`/`[]`/MRO walks, compares tensor metadata field by field and
//! every pair of tensors for aliasing. In debug mode both run on every check and any
//! disagreement raises `dynamo_rs.InternalCheckFailed`.

use super::guard_values::DynamicDims;
use super::shape_guard::{ShapePlan, TensorProperty, Value};
use std::rc::Rc;

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::guards::GuardKind;
use super::source::Source;
use crate::eval_frame::owned::OwnedRef;

/// One step from the previous value (or the frame) to the next.
enum Hop {
    Local(String),
    Global {
        globals: OwnedRef,
        builtins: OwnedRef,
        name: String,
    },
    Cell(OwnedRef),
    Object(OwnedRef),
    Attr(String),
    ClassAttr(String),
    Item(OwnedRef),
    DictItem(OwnedRef),
    AsTensor,
}

/// What a tensor looked like when the guard was built.
struct TensorFacts {
    type_ptr: usize,
    dtype: String,
    device: String,
    /// None where the size or stride is symbolic (checked by the shape plan).
    shape: Vec<Option<i64>>,
    stride: Vec<Option<i64>>,
    requires_grad: bool,
    dispatch_keys: String,
    /// Index of the first tensor that was the same object (itself if none).
    alias_of: usize,
    /// Whether the source is a frame argument itself (not reached through another value).
    is_argument: bool,
}

enum Expect {
    Equals(OwnedRef),
    Id(super::guard_values::Identity),
    Type(usize),
    Len(usize),
    Keys(OwnedRef),
    Contains(OwnedRef, bool),
    HasAttr(String, bool),
    InstanceDictLacks(String),
    ModuleCall,
    Tensor(usize),
    /// The value's object class (`GuardKind::SameObjectClass`), compared pair by pair.
    ObjectClass(usize),
}

impl std::fmt::Debug for ReferenceGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReferenceGuard({} checks)", self.checks.len())
    }
}

pub struct ReferenceGuard {
    checks: Vec<(Vec<Hop>, Expect, String)>,
    tensors: Vec<TensorFacts>,
    mutates_in_place: bool,
    grad_mode: Option<bool>,
    /// The symbolic-shape plan, with the path of each tensor it reads.
    shape: Option<(Vec<Vec<Hop>>, ShapePlan)>,
}

/// Whether `now` agrees with `was` everywhere `was` is not open (None).
fn matches_open(now: &[Option<i64>], was: &[Option<i64>]) -> bool {
    now.len() == was.len() && now.iter().zip(was).all(|(n, w)| w.is_none() || n == w)
}

fn path_of(py: Python<'_>, source: &Source, out: &mut Vec<Hop>) -> PyResult<()> {
    match source {
        Source::Local(name) => out.push(Hop::Local(name.clone())),
        Source::Global {
            globals,
            builtins,
            name,
            ..
        } => out.push(Hop::Global {
            globals: globals.clone(),
            builtins: builtins.clone(),
            name: name.clone(),
        }),
        Source::Cell(cell) => out.push(Hop::Cell(cell.clone())),
        Source::Object(object, _) => out.push(Hop::Object(object.clone())),
        Source::Attr(parent, name) => {
            path_of(py, parent, out)?;
            out.push(Hop::Attr(name.clone()));
        }
        Source::ClassAttr(parent, name) => {
            path_of(py, parent, out)?;
            out.push(Hop::ClassAttr(name.clone()));
        }
        Source::Item(parent, key) => {
            path_of(py, parent, out)?;
            out.push(Hop::Item(OwnedRef::from_bound(&key.to_python(py)?)));
        }
        Source::DictItem(parent, key) => {
            path_of(py, parent, out)?;
            out.push(Hop::DictItem(OwnedRef::from_bound(&key.to_python(py)?)));
        }
        Source::AsTensor(parent) => {
            path_of(py, parent, out)?;
            out.push(Hop::AsTensor);
        }
    }
    Ok(())
}

/// The slow way of `calls_like_torch`: the functions `type(module)` calls through are the
/// ones defined in torch's `module.py` under their own names, and the instance has no
/// `_call_impl` and no `_compiled_call_impl` but None.
fn torch_call_machinery(py: Python<'_>, module: &Bound<'_, PyAny>) -> PyResult<bool> {
    let file = py
        .import_module("torch.nn.modules.module")?
        .getattr("__file__")?;
    let ty = module.get_type();
    for (attribute, name) in [
        ("__call__", "_wrapped_call_impl"),
        ("_wrapped_call_impl", "_wrapped_call_impl"),
        ("_call_impl", "_call_impl"),
    ] {
        let Ok(code) = ty.getattr(attribute).and_then(|f| f.getattr("__code__")) else {
            return Ok(false);
        };
        if !code.getattr("co_filename")?.eq(&file)? || code.getattr("co_name")?.ne(name)? {
            return Ok(false);
        }
    }
    let own = module.getattr("__dict__")?;
    if own.contains("_call_impl")? {
        return Ok(false);
    }
    Ok(module.getattr("_compiled_call_impl")?.is_none())
}

/// The keys `tensor` dispatches on in this thread's state, as the guard compares them: its
/// own keys with the thread's local include and exclude sets applied (the JIT tracer, an
/// exclusion guard change them) and the Python keys left out (no torch-dispatch mode is
/// active when a guard passes: it checks the mode stack).
fn dispatch_keys(py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<String> {
    let c = py.import_module("torch")?.getattr("_C")?;
    let keys = c.getattr("_dispatch_keys")?.call1((tensor,))?;
    let included = c.getattr("_dispatch_tls_local_include_set")?.call0()?;
    let excluded = c.getattr("_dispatch_tls_local_exclude_set")?.call0()?;
    let mut keys = keys.bitor(included)?.sub(excluded)?;
    let key = c.getattr("DispatchKey")?;
    for python_key in ["Python", "PythonTLSSnapshot", "PythonDispatcher"] {
        keys = keys.call_method1("remove", (key.getattr(python_key)?,))?;
    }
    Ok(keys.str()?.to_string())
}

fn facts(py: Python<'_>, t: &Bound<'_, PyAny>) -> PyResult<TensorFacts> {
    Ok(TensorFacts {
        type_ptr: t.get_type().as_ptr() as usize,
        dtype: t.getattr("dtype")?.str()?.to_string(),
        device: t.getattr("device")?.str()?.to_string(),
        shape: t
            .getattr("shape")?
            .extract::<Vec<i64>>()?
            .into_iter()
            .map(Some)
            .collect(),
        stride: t
            .call_method0("stride")?
            .extract::<Vec<i64>>()?
            .into_iter()
            .map(Some)
            .collect(),
        requires_grad: t.getattr("requires_grad")?.extract()?,
        dispatch_keys: dispatch_keys(py, t)?,
        alias_of: 0,
        is_argument: false,
    })
}

impl ReferenceGuard {
    pub fn build(
        py: Python<'_>,
        guards: &[(Rc<Source>, &GuardKind, Option<DynamicDims>)],
        mutates_in_place: bool,
        grad_mode: Option<bool>,
        shape: Option<(Vec<Rc<Source>>, ShapePlan)>,
    ) -> PyResult<ReferenceGuard> {
        let mut checks = Vec::with_capacity(guards.len());
        let mut tensors: Vec<TensorFacts> = Vec::new();
        let mut examples: Vec<usize> = Vec::new();
        for (source, kind, dynamic) in guards {
            let mut path = Vec::new();
            path_of(py, source, &mut path)?;
            let expect = match kind {
                GuardKind::Equals(v) => Expect::Equals(v.clone()),
                GuardKind::Id(v) => Expect::Id(super::guard_values::Identity::new(&v.bind(py))),
                GuardKind::Type(t) => Expect::Type(t.as_ptr() as usize),
                GuardKind::Len(n) => Expect::Len(*n),
                GuardKind::Keys(k) => Expect::Keys(k.clone()),
                GuardKind::Contains(key, expected) => Expect::Contains(key.clone(), *expected),
                GuardKind::HasAttr(name, expected) => Expect::HasAttr(name.clone(), *expected),
                GuardKind::InstanceDictLacks(name) => Expect::InstanceDictLacks(name.clone()),
                GuardKind::ModuleCall => Expect::ModuleCall,
                GuardKind::SameObjectClass(class) => Expect::ObjectClass(*class),
                GuardKind::Tensor(example) => {
                    let example = example.bind(py);
                    let mut fact = facts(py, &example)?;
                    if let Some((sizes, strides)) = dynamic {
                        for (value, open) in fact.shape.iter_mut().zip(sizes) {
                            if *open {
                                *value = None;
                            }
                        }
                        for (value, open) in fact.stride.iter_mut().zip(strides) {
                            if *open {
                                *value = None;
                            }
                        }
                    }
                    let address = example.as_ptr() as usize;
                    fact.alias_of = examples
                        .iter()
                        .position(|&a| a == address)
                        .unwrap_or(tensors.len());
                    if let Some(first) = tensors.get(fact.alias_of) {
                        // The same tensor reached again (an argument and the name a resume
                        // function gives it): its dimensions are as open as where it was
                        // first met, whose source the trace recorded them under.
                        fact.shape = first.shape.clone();
                        fact.stride = first.stride.clone();
                    }
                    fact.is_argument = matches!(source.as_ref(), Source::Local(_));
                    examples.push(address);
                    tensors.push(fact);
                    Expect::Tensor(tensors.len() - 1)
                }
            };
            checks.push((path, expect, source.describe()));
        }
        let shape = match shape {
            Some((sources, plan)) => {
                let mut paths = Vec::with_capacity(sources.len());
                for source in sources {
                    let mut path = Vec::new();
                    path_of(py, &source, &mut path)?;
                    paths.push(path);
                }
                Some((paths, plan))
            }
            None => None,
        };
        Ok(ReferenceGuard {
            checks,
            tensors,
            mutates_in_place,
            grad_mode,
            shape,
        })
    }

    fn resolve<'py>(
        py: Python<'py>,
        path: &[Hop],
        locals: &dyn Fn(&str) -> Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut value: Option<Bound<'py, PyAny>> = None;
        for hop in path {
            value = match (hop, value) {
                (Hop::Local(name), _) => locals(name),
                (
                    Hop::Global {
                        globals,
                        builtins,
                        name,
                    },
                    _,
                ) => match globals.bind(py).cast::<PyDict>()?.get_item(name)? {
                    Some(v) => Some(v),
                    None => {
                        let builtins = builtins.bind(py);
                        match builtins.cast::<PyDict>() {
                            Ok(d) => d.get_item(name)?,
                            Err(_) => builtins.getattr(name.as_str()).ok(),
                        }
                    }
                },
                (Hop::Cell(cell), _) => cell.bind(py).getattr("cell_contents").ok(),
                (Hop::Object(object), _) => Some(object.bind(py).clone()),
                (Hop::Attr(name), Some(base)) => base.getattr(name.as_str()).ok(),
                (Hop::ClassAttr(name), Some(base)) => {
                    // The raw entry of the first class along the MRO whose __dict__ has it.
                    let mut found = None;
                    if let Ok(mro) = base.getattr("__mro__") {
                        for klass in mro.try_iter()? {
                            let dict = klass?.getattr("__dict__")?;
                            if dict.contains(name.as_str())? {
                                found = Some(dict.get_item(name.as_str())?);
                                break;
                            }
                        }
                    }
                    found
                }
                (Hop::Item(key), Some(base)) => match base.cast_exact::<PyDict>() {
                    Ok(dict) => dict.get_item(key.bind(py))?,
                    Err(_) => base.get_item(key.bind(py)).ok(),
                },
                // Through `dict.__getitem__` itself, as the source says.
                (Hop::DictItem(key), Some(base)) => py
                    .get_type::<PyDict>()
                    .getattr("__getitem__")?
                    .call1((base, key.bind(py)))
                    .ok(),
                (Hop::AsTensor, Some(base)) => py
                    .import_module("torch")?
                    .getattr("as_tensor")?
                    .call1((base,))
                    .ok(),
                (_, None) => None,
            };
        }
        Ok(value)
    }

    /// The first check that does not hold, in words, or None.
    pub fn first_failure<'py>(
        &self,
        py: Python<'py>,
        locals: &dyn Fn(&str) -> Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<String>> {
        let mut tensor_values: Vec<Option<Bound<'py, PyAny>>> = vec![None; self.tensors.len()];
        let mut classed: Vec<(usize, Bound<'py, PyAny>, &str)> = Vec::new();
        for (path, expect, what) in &self.checks {
            let Some(value) = Self::resolve(py, path, locals)? else {
                return Ok(Some(format!("{what}: missing")));
            };
            let ok = match expect {
                Expect::Equals(expected) => {
                    super::guards::equal_constant(&value, &expected.bind(py)).unwrap_or(false)
                }
                Expect::Id(expected) => expected.matches(&value),
                Expect::Type(address) => value.get_type().as_ptr() as usize == *address,
                Expect::Len(n) => value.len().ok() == Some(*n),
                Expect::Keys(expected) => match value.cast::<PyDict>() {
                    Ok(d) => super::guard_values::keys_in_order(d)
                        .and_then(|keys| keys.eq(expected.bind(py)))
                        .unwrap_or(false),
                    Err(_) => false,
                },
                Expect::Contains(key, expected) => {
                    value.contains(key.bind(py)).ok() == Some(*expected)
                }
                // Read the slow way: `vars(value)` (no instance dict: nothing to hide).
                Expect::InstanceDictLacks(name) => match value.getattr("__dict__") {
                    Ok(dict) if !value.is_instance_of::<pyo3::types::PyType>() => {
                        !dict.contains(name.as_str()).unwrap_or(true)
                    }
                    _ => true,
                },
                // The slow way: each hook dict read by name, its length asked.
                Expect::ModuleCall => {
                    let own_forward = value
                        .getattr("__dict__")
                        .map(|d| d.contains("forward").unwrap_or(true))
                        .unwrap_or(true);
                    !own_forward
                        && super::guard_values::MODULE_CALL_HOOKS.iter().all(|hooks| {
                            value
                                .getattr(*hooks)
                                .is_ok_and(|h| h.len().is_ok_and(|n| n == 0))
                        })
                        && torch_call_machinery(py, &value).unwrap_or(false)
                }
                Expect::HasAttr(name, expected) => {
                    value.hasattr(PyString::new(py, name)).unwrap_or(false) == *expected
                }
                Expect::Tensor(i) => {
                    let fact = &self.tensors[*i];
                    let now = if value.hasattr("dtype")? && value.hasattr("stride")? {
                        facts(py, &value).ok()
                    } else {
                        None
                    };
                    let Some(now) = now else {
                        return Ok(Some(format!("{what}: not a tensor")));
                    };
                    let differs = [
                        ("type", now.type_ptr == fact.type_ptr),
                        ("dtype", now.dtype == fact.dtype),
                        ("device", now.device == fact.device),
                        ("size", matches_open(&now.shape, &fact.shape)),
                        ("stride", matches_open(&now.stride, &fact.stride)),
                        ("requires_grad", now.requires_grad == fact.requires_grad),
                        ("dispatch keys", now.dispatch_keys == fact.dispatch_keys),
                    ];
                    if let Some((property, _)) = differs.iter().find(|(_, same)| !same) {
                        return Ok(Some(format!("{what}: tensor {property} differs")));
                    }
                    tensor_values[*i] = Some(value.clone());
                    true
                }
                Expect::ObjectClass(class) => {
                    classed.push((*class, value.clone(), what.as_str()));
                    true
                }
            };
            if !ok {
                return Ok(Some(format!("{what}: check failed")));
            }
        }
        // Containers, pair by pair: one object then, one object now; distinct then, now.
        for (i, (class_a, a, what_a)) in classed.iter().enumerate() {
            for (class_b, b, what_b) in &classed[i + 1..] {
                if (class_a == class_b) != a.is(b) {
                    return Ok(Some(format!(
                        "{what_a} and {what_b}: object sharing changed"
                    )));
                }
            }
        }
        // Aliasing, pair by pair: tensors that were one object must still be; distinct ones
        // must stay distinct, except two reached through other values when the graph changes
        // nothing in place (then sharing cannot change the result).
        for (i, a) in self.tensors.iter().enumerate() {
            for (j, b) in self.tensors.iter().enumerate().skip(i + 1) {
                let (Some(x), Some(y)) = (&tensor_values[i], &tensor_values[j]) else {
                    continue;
                };
                let were_same = a.alias_of == b.alias_of;
                let are_same = x.is(y);
                let matters = were_same || a.is_argument || b.is_argument || self.mutates_in_place;
                if matters && were_same != are_same {
                    return Ok(Some(format!("tensors {i} and {j}: aliasing changed")));
                }
            }
        }
        if let Some((paths, plan)) = &self.shape {
            // Each value read on its own, by indexing `shape` and calling `stride(dim)`.
            let mut reads = Vec::with_capacity(plan.reads.len());
            for &(input, property, dim) in &plan.reads {
                let Some(tensor) = Self::resolve(py, &paths[input], locals)? else {
                    return Ok(Some("a tensor with symbolic sizes: missing".into()));
                };
                let value = match property {
                    TensorProperty::Size => {
                        Value::Int(tensor.getattr("shape")?.get_item(dim)?.extract()?)
                    }
                    TensorProperty::Stride => {
                        Value::Int(tensor.call_method1("stride", (dim,))?.extract()?)
                    }
                    TensorProperty::Value => super::shape_guard::number_value(&tensor)?,
                };
                reads.push(value);
            }
            if let Some(what) = plan.first_failure(&reads) {
                return Ok(Some(format!("shape guard {what} does not hold")));
            }
        }
        if let Some(mode) = self.grad_mode {
            let now: bool = py
                .import_module("torch")?
                .call_method0("is_grad_enabled")?
                .extract()?;
            if now != mode {
                return Ok(Some("grad mode changed".into()));
            }
        }
        Ok(None)
    }
}
