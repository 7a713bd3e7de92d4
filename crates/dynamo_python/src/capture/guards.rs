//! Guards: the checks that must hold on a later call for the compiled code to be reused.
//!
//! The translator records one guard per (source, kind). [`NativeGuard`] compiles them into a
//! flat plan in which every distinct source is resolved once per check, parents before
//! children (a guard tree, flattened), and evaluates it in Rust: identity and type checks are
//! pointer compares, constants compare by value, lengths by `len`. All tensors are checked
//! in one call of torch's C++ `TensorGuards` (dtype, device, shape, stride, requires_grad,
//! dispatch keys). Grad mode is checked last.

use std::collections::HashMap;
use std::rc::Rc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::source::{ItemKey, Source};
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
}

#[derive(Debug, Default)]
pub struct GuardSet {
    pub guards: Vec<(Rc<Source>, GuardKind)>,
    seen: HashMap<(String, u8), ()>,
    pub grad_mode: Option<bool>,
}

impl GuardSet {
    pub fn add(&mut self, source: Rc<Source>, kind: GuardKind) {
        let tag = match kind {
            GuardKind::Tensor(_) => 0,
            GuardKind::Equals(_) => 1,
            GuardKind::Id(_) => 2,
            GuardKind::Type(_) => 3,
            GuardKind::Len(_) => 4,
            GuardKind::Keys(_) => 5,
        };
        let key = (source_key(&source), tag);
        if self.seen.insert(key, ()).is_none() {
            self.guards.push((source, kind));
        }
    }

    pub fn len(&self) -> usize {
        self.guards.len() + usize::from(self.grad_mode.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A stable text key for a source (embedded objects by address).
fn source_key(source: &Source) -> String {
    match source {
        Source::Local(name) => format!("L[{name}]"),
        Source::Global { globals, name, .. } => format!("G{:p}[{name}]", globals.as_ptr()),
        Source::Cell(cell) => format!("C{:p}", cell.as_ptr()),
        Source::Attr(base, attr) => format!("{}.{attr}", source_key(base)),
        Source::Item(base, ItemKey::Int(i)) => format!("{}[{i}]", source_key(base)),
        Source::Item(base, ItemKey::Str(k)) => format!("{}[{k:?}]", source_key(base)),
    }
}

/// How one step of the plan reaches its value.
enum Access {
    Local(usize),
    Global {
        globals: OwnedRef,
        builtins: OwnedRef,
        name: OwnedRef,
    },
    Cell(OwnedRef),
    Attr(usize, OwnedRef),
    Item(usize, OwnedRef),
}

enum Check {
    /// The same object as the value of another step (a tensor reached from two sources,
    /// like tied weights); torch's tensor checker refuses a tensor given twice.
    Alias(usize),
    Keys(OwnedRef),
    Id(OwnedRef),
    Type(OwnedRef),
    Equals(OwnedRef),
    Len(usize),
    Tensor,
}

struct Step {
    access: Access,
    checks: Vec<Check>,
    /// The source, readable, and one description per check.
    what: String,
    whats: Vec<String>,
}

/// The compiled guard of one cache entry.
#[pyclass(module = "dynamo_rs._native")]
pub struct NativeGuard {
    steps: Vec<Step>,
    /// Example tensors and their sizes/strides, for torch's C++ tensor checker.
    tensor_spec: Option<(OwnedRef, OwnedRef)>,
    /// That checker, made at the first check.
    tensor_guards: std::sync::OnceLock<OwnedRef>,
    grad_mode: Option<bool>,
    is_grad_enabled: OwnedRef,
    /// Guard descriptions, for `describe()`.
    descriptions: Vec<String>,
    /// Localsplus names, for `first_failure`.
    local_names: Vec<String>,
    /// Source and example of each checked tensor, in check order, for `first_failure`.
    tensor_examples: Vec<(String, OwnedRef)>,
}

impl std::fmt::Debug for NativeGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NativeGuard({} steps)", self.steps.len())
    }
}

impl NativeGuard {
    pub fn build(py: Python<'_>, set: &GuardSet, layout_names: &[String]) -> PyResult<NativeGuard> {
        let mut steps: Vec<Step> = Vec::new();
        let mut index_of: HashMap<String, usize> = HashMap::new();
        let mut tensors: Vec<Bound<'_, PyAny>> = Vec::new();
        let mut descriptions = Vec::new();
        let mut tensor_examples = Vec::new();
        let mut first_step_of_tensor: HashMap<usize, usize> = HashMap::new();
        for (source, kind) in &set.guards {
            let step = intern_source(py, source, layout_names, &mut steps, &mut index_of)?;
            let check = match kind {
                GuardKind::Tensor(example) => {
                    match first_step_of_tensor.get(&(example.as_ptr() as usize)) {
                        Some(&first) => Check::Alias(first),
                        None => {
                            first_step_of_tensor.insert(example.as_ptr() as usize, step);
                            tensors.push(example.bind(py).clone());
                            tensor_examples.push((source.describe(), example.clone()));
                            Check::Tensor
                        }
                    }
                }
                GuardKind::Equals(v) => Check::Equals(v.clone()),
                GuardKind::Id(v) => Check::Id(v.clone()),
                GuardKind::Type(t) => Check::Type(t.clone()),
                GuardKind::Len(n) => Check::Len(*n),
                GuardKind::Keys(k) => Check::Keys(k.clone()),
            };
            let description = format!("{} {}", source.describe(), describe_kind(py, kind));
            descriptions.push(description.clone());
            steps[step].checks.push(check);
            steps[step].whats.push(description);
        }
        // torch's TensorGuards records the thread's dispatch state when it is made, so it is made
        // at the first check, in the caller's state, not here inside the compile callback.
        let tensor_spec = if tensors.is_empty() {
            None
        } else {
            let sizes: Vec<Vec<i64>> = tensors
                .iter()
                .map(|t| t.getattr("shape")?.extract())
                .collect::<PyResult<_>>()?;
            let strides: Vec<Vec<i64>> = tensors
                .iter()
                .map(|t| t.call_method0("stride")?.extract())
                .collect::<PyResult<_>>()?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("dynamic_dims_sizes", sizes)?;
            kwargs.set_item("dynamic_dims_strides", strides)?;
            Some((
                OwnedRef::from_bound(PyTuple::new(py, &tensors)?.as_any()),
                OwnedRef::from_bound(kwargs.as_any()),
            ))
        };
        if let Some(mode) = set.grad_mode {
            descriptions.push(format!("torch.is_grad_enabled() == {mode}"));
        }
        Ok(NativeGuard {
            steps,
            tensor_spec,
            tensor_guards: std::sync::OnceLock::new(),
            grad_mode: set.grad_mode,
            is_grad_enabled: OwnedRef::from_bound(&py.import("torch")?.getattr("is_grad_enabled")?),
            descriptions,
            local_names: layout_names.to_vec(),
            tensor_examples,
        })
    }

    fn evaluate(&self, py: Python<'_>, view: &FrameView<'_>) -> PyResult<bool> {
        let locals = |i: usize| -> Option<Bound<'_, PyAny>> {
            // SAFETY: the index was looked up in this code's layout; the frame is live.
            let ptr = unsafe { view.value(i) };
            // SAFETY: a live object owned by the frame (or null).
            (!ptr.is_null()).then(|| unsafe { Bound::from_borrowed_ptr(py, ptr) })
        };
        Ok(self.first_failing(py, &locals)?.is_none())
    }

    /// The description of the first check that fails (`None`: all pass), reading locals through
    /// `locals`.
    fn first_failing<'py>(
        &self,
        py: Python<'py>,
        locals: &dyn Fn(usize) -> Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<String>> {
        let mut values: Vec<Option<Bound<'_, PyAny>>> = Vec::with_capacity(self.steps.len());
        let mut tensors: Vec<Bound<'_, PyAny>> = Vec::new();
        let mut aliases: Vec<(usize, Bound<'_, PyAny>, &String)> = Vec::new();
        for step in &self.steps {
            let value = match &step.access {
                Access::Local(i) => locals(*i),
                Access::Global {
                    globals,
                    builtins,
                    name,
                } => {
                    let globals = globals
                        .bind(py)
                        .cast::<PyDict>()
                        .map_err(PyErr::from)?
                        .clone();
                    match globals.get_item(name.bind(py))? {
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
                Access::Attr(parent, name) => match &values[*parent] {
                    Some(base) => base.getattr(name.bind(py).cast::<PyString>()?).ok(),
                    None => None,
                },
                Access::Item(parent, key) => match &values[*parent] {
                    Some(base) => base.get_item(key.bind(py)).ok(),
                    None => None,
                },
            };
            let Some(value) = value else {
                if step.checks.is_empty() {
                    values.push(None);
                    continue;
                }
                return Ok(Some(format!("{}: missing", step.what)));
            };
            for (check, what) in step.checks.iter().zip(&step.whats) {
                let ok = match check {
                    Check::Id(expected) => value.as_ptr() == expected.as_ptr(),
                    Check::Type(expected) => value.get_type().as_ptr() == expected.as_ptr(),
                    Check::Equals(expected) => {
                        let expected = expected.bind(py);
                        value.get_type().is(expected.get_type()) && value.eq(expected)?
                    }
                    Check::Len(n) => value.len().ok() == Some(*n),
                    Check::Keys(expected) => match value.cast::<PyDict>() {
                        Ok(d) => PyTuple::new(py, d.keys())?.eq(expected.bind(py))?,
                        Err(_) => false,
                    },
                    Check::Tensor => {
                        tensors.push(value.clone());
                        true
                    }
                    Check::Alias(first) => {
                        // Checked once every step has its value.
                        aliases.push((*first, value.clone(), what));
                        true
                    }
                };
                if !ok {
                    return Ok(Some(what.clone()));
                }
            }
            values.push(Some(value));
        }
        for (first, value, what) in aliases {
            let same = values
                .get(first)
                .and_then(|v| v.as_ref())
                .is_some_and(|v| v.is(&value));
            if !same {
                return Ok(Some(format!(
                    "{what} (no longer the same tensor as its alias)"
                )));
            }
        }
        if let Some((examples, kwargs)) = &self.tensor_spec {
            let tensor_guards = match self.tensor_guards.get() {
                Some(g) => g,
                None => {
                    let cls = py
                        .import("torch._C._dynamo.guards")?
                        .getattr("TensorGuards")?;
                    let made = cls.call(
                        examples.bind(py).cast::<PyTuple>()?,
                        Some(kwargs.bind(py).cast::<PyDict>()?),
                    )?;
                    let _ = self.tensor_guards.set(OwnedRef::from_bound(&made));
                    self.tensor_guards.get().expect("just set")
                }
            };
            let args = PyTuple::new(py, &tensors)?;
            if !tensor_guards
                .bind(py)
                .call_method1("check", args)?
                .is_truthy()?
            {
                // Name the first tensor whose metadata differs from its example.
                for (tensor, (what, example)) in tensors.iter().zip(&self.tensor_examples) {
                    let example = example.bind(py);
                    for property in ["dtype", "device", "shape", "requires_grad"] {
                        if !tensor.getattr(property)?.eq(example.getattr(property)?)? {
                            return Ok(Some(format!(
                                "{what}.{property} is {}, was {}",
                                tensor.getattr(property)?,
                                example.getattr(property)?
                            )));
                        }
                    }
                    if !tensor
                        .call_method0("stride")?
                        .eq(example.call_method0("stride")?)?
                    {
                        return Ok(Some(format!("{what} has a different stride")));
                    }
                    let single = PyDict::new(py);
                    single.set_item(
                        "dynamic_dims_sizes",
                        vec![example.getattr("shape")?.extract::<Vec<i64>>()?],
                    )?;
                    single.set_item(
                        "dynamic_dims_strides",
                        vec![example.call_method0("stride")?.extract::<Vec<i64>>()?],
                    )?;
                    let cls = py
                        .import("torch._C._dynamo.guards")?
                        .getattr("TensorGuards")?;
                    let one = cls.call((example.clone(),), Some(&single))?;
                    if !one.call_method1("check", (tensor,))?.is_truthy()? {
                        return Ok(Some(format!(
                            "{what}: type {} (was {}), or dispatch keys changed",
                            tensor.get_type().name()?,
                            example.get_type().name()?
                        )));
                    }
                }
                return Ok(Some(format!(
                    "a tensor's dtype, device, shape, stride, requires_grad or dispatch keys changed ({} tensors checked, {} expected)",
                    tensors.len(),
                    self.tensor_examples.len()
                )));
            }
        }
        if let Some(mode) = self.grad_mode {
            if self.is_grad_enabled.bind(py).call0()?.is_truthy()? != mode {
                return Ok(Some(format!("torch.is_grad_enabled() is no longer {mode}")));
            }
        }
        Ok(None)
    }
}

fn describe_kind(py: Python<'_>, kind: &GuardKind) -> String {
    match kind {
        GuardKind::Tensor(_) => {
            "tensor matches (dtype, device, shape, stride, requires_grad)".into()
        }
        GuardKind::Equals(v) => format!(
            "== {}",
            v.bind(py).repr().map(|r| r.to_string()).unwrap_or_default()
        ),
        GuardKind::Id(v) => format!(
            "is the same object ({})",
            v.bind(py)
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ),
        GuardKind::Type(t) => format!(
            "has type {}",
            t.bind(py)
                .getattr("__name__")
                .map(|n| n.to_string())
                .unwrap_or_default()
        ),
        GuardKind::Len(n) => format!("has length {n}"),
        GuardKind::Keys(k) => format!(
            "has keys {}",
            k.bind(py).repr().map(|r| r.to_string()).unwrap_or_default()
        ),
    }
}

/// The plan step that produces `source`'s value, adding it (and its parents) if new.
fn intern_source(
    py: Python<'_>,
    source: &Source,
    layout_names: &[String],
    steps: &mut Vec<Step>,
    index_of: &mut HashMap<String, usize>,
) -> PyResult<usize> {
    let key = source_key(source);
    if let Some(&i) = index_of.get(&key) {
        return Ok(i);
    }
    let access = match source {
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
        Source::Attr(base, attr) => {
            let parent = intern_source(py, base, layout_names, steps, index_of)?;
            Access::Attr(
                parent,
                OwnedRef::from_bound(PyString::intern(py, attr).as_any()),
            )
        }
        Source::Item(base, key) => {
            let parent = intern_source(py, base, layout_names, steps, index_of)?;
            let key = match key {
                ItemKey::Int(i) => i.into_pyobject(py)?.into_any(),
                ItemKey::Str(s) => PyString::new(py, s).into_any(),
            };
            Access::Item(parent, OwnedRef::from_bound(&key))
        }
    };
    steps.push(Step {
        access,
        checks: Vec::new(),
        what: source.describe(),
        whats: Vec::new(),
    });
    index_of.insert(key, steps.len() - 1);
    Ok(steps.len() - 1)
}

#[pymethods]
impl NativeGuard {
    /// Human-readable list of the checks.
    fn describe(&self) -> Vec<String> {
        self.descriptions.clone()
    }

    fn __len__(&self) -> usize {
        self.descriptions.len()
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
        self.first_failing(py, &locals)
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
}

/// The localsplus names of a frame layout, for resolving `Source::Local`.
pub fn layout_names(py: Python<'_>, layout: &FrameLayout) -> Vec<String> {
    layout
        .names
        .iter()
        .map(|n| n.bind(py).to_string())
        .collect()
}
