//! Calls to Python builtins (`len`, `isinstance`, `getattr`, `range`, `enumerate`, `zip`,
//! `math.*`, `operator.*`, ...): the tracker-aware cases first, then pure builtins
//! evaluated at trace time on known values.

use super::break_reasons::BreakKind;
use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::graph::Op;
use super::ops_call::{describe, function_name};
use super::translator::{kind_name, unsupported, CResult, CaptureError, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// Protocols a builtin may run on an object argument; when a class defines one in Python,
/// its answer depends on the object's state (`Position.__index__` returning `self.n`,
/// `sum(bag)` iterating `bag.items` through `Bag.__iter__`), which the object's identity
/// guard does not cover.
const PYTHON_PROTOCOLS: &[&str] = &[
    "__index__",
    "__int__",
    "__float__",
    "__complex__",
    "__abs__",
    "__round__",
    "__trunc__",
    "__floor__",
    "__ceil__",
    "__iter__",
    "__next__",
    "__reversed__",
    "__len__",
    "__getitem__",
    "__contains__",
    "__bool__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__eq__",
    "__ne__",
    "__hash__",
    "__str__",
    "__repr__",
    "__format__",
];

impl<'py> Tracer<'py> {
    /// `setattr(obj, "name", value)` / `delattr(obj, "name")` with a constant name: the
    /// attribute store or delete the statement form would make; None for other calls.
    pub(super) fn attribute_builtin(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let b = &self.h.builtins;
        // `object.__setattr__(obj, ...)` stores whatever the class's own `__setattr__` does
        // (a frozen dataclass's `__init__` uses it); `setattr` goes through the class.
        let object = b.getattr("object")?;
        let (store, arity, through_class) = if b.getattr("setattr")?.is(func) {
            (true, 3, true)
        } else if b.getattr("delattr")?.is(func) {
            (false, 2, true)
        } else if object.getattr("__setattr__")?.is(func) {
            (true, 3, false)
        } else if object.getattr("__delattr__")?.is(func) {
            (false, 2, false)
        } else {
            return Ok(None);
        };
        if args.len() != arity || !kwargs.is_empty() {
            return Ok(None);
        }
        let name = match self.kind(args[1]) {
            VarKind::Const(n) => match n.bind(py).extract::<String>() {
                Ok(name) => name,
                Err(_) => return Ok(None),
            },
            _ => return Ok(None),
        };
        let value = store.then(|| args[2]);
        if through_class {
            self.set_attribute(args[0], &name, value)?;
        } else {
            self.store_attr(args[0], &name, value)?;
        }
        Ok(Some(self.constant(&py.None().into_bound(py))))
    }

    /// Calls a pure builtin at trace time, with the tracker-aware cases first.
    pub(super) fn call_builtin(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let h = self.h.clone();
        let b = &h.builtins;
        let name = function_name(func);
        if b.getattr("__build_class__").is_ok_and(|f| f.is(func)) {
            return unsupported(
                BreakKind::UnsupportedCall,
                "a class statement (its body runs eagerly at the break, making a new class on \
                 every call, as under TorchDynamo)",
            );
        }
        let is = |n: &str| b.getattr(n).map(|x| x.is(func)).unwrap_or(false);
        if is("len") && args.len() == 1 {
            if let VarKind::Instance {
                model_output: true, ..
            } = self.kind(args[0])
            {
                // A ModelOutput made here: its items (the fields that are not None).
                let n = self.model_output_items(args[0]).len();
                return Ok(self.constant(&n.into_pyobject(py)?.into_any()));
            }
            if let Some(cls) = self.instance_class(args[0]) {
                let len_fn = py
                    .import_module("inspect")?
                    .call_method1("getattr_static", (&cls, "__len__"))
                    .ok();
                return match len_fn {
                    Some(f) if f.is_instance(&self.h.function_type)? => {
                        self.call_python(&f, vec![args[0]], Vec::new())
                    }
                    _ => unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("len() of a {} made while tracing", describe(&cls)),
                    ),
                };
            }
        }
        if is("len") && args.len() == 1 {
            let n = match self.kind(args[0]) {
                VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
                VarKind::Tuple(items) | VarKind::List(items) => items.len(),
                VarKind::Dict(entries) => entries.len(),
                VarKind::DictView { dict, .. } => match self.kind(*dict) {
                    VarKind::Dict(entries) => entries.len(),
                    other @ (VarKind::Tensor { .. }
                    | VarKind::Unrealized(_)
                    | VarKind::Symbolic { .. }
                    | VarKind::Slice(_)
                    | VarKind::Const(_)
                    | VarKind::Object(_)
                    | VarKind::Tuple(_)
                    | VarKind::List(_)
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
                            BreakKind::UnsupportedOperation,
                            format!("len() of a view of {}", kind_name(other)),
                        )
                    }
                },
                VarKind::Tensor { fake, .. } => fake.bind(py).len()?,
                VarKind::Const(v) => v.bind(py).len()?,
                VarKind::Object(v) => {
                    // The length of an existing object is its state: guard it (a set's
                    // elements are guarded already, or are the trace's own).
                    let n = v.bind(py).len()?;
                    if let (Some(source), false) =
                        (self.source(args[0]), self.set_elements_known(args[0]))
                    {
                        self.guards.add(source, super::guards::GuardKind::Len(n));
                    }
                    n
                }
                other @ (VarKind::Symbolic { .. }
                | VarKind::Slice(_)
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
                        BreakKind::UnsupportedOperation,
                        format!("len() of {}", kind_name(other)),
                    )
                }
            };
            return Ok(self.constant(&n.into_pyobject(py)?.into_any()));
        }
        if is("callable") && args.len() == 1 && kwargs.is_empty() {
            // Values the trace made answer from their kind (functions, methods and partials
            // are callable, containers, iterators and tensors are not), an instance from its
            // class; real objects are asked below.
            if !matches!(self.kind(args[0]), VarKind::Const(_) | VarKind::Object(_)) {
                let answer = self.is_callable(args[0])?;
                return Ok(self.constant(&answer.into_pyobject(py)?.to_owned().into_any()));
            }
            // An existing object is callable by its type alone (its `tp_call`): its type is
            // guarded, not its identity (transformers' `and_masks` checks `callable()` of
            // mask functions made anew on every call).
            if let (VarKind::Object(value), Some(source)) =
                (self.kind(args[0]), self.source(args[0]))
            {
                let value = value.bind(py).clone();
                self.guards.add(
                    source,
                    super::guards::GuardKind::Type(OwnedRef::from_bound(value.get_type().as_any())),
                );
                let answer = value.is_callable();
                return Ok(self.constant(&answer.into_pyobject(py)?.to_owned().into_any()));
            }
        }
        if is("isinstance") && args.len() == 2 {
            if let Some(inst_cls) = self
                .instance_class(args[0])
                .or_else(|| self.module_slice_class(args[0]))
            {
                let cls = self.python_value(args[1])?;
                let result = b.getattr("issubclass")?.call1((inst_cls, cls))?;
                return Ok(self.constant(&result));
            }
        }
        if is("type") && args.len() == 1 {
            if let Some(inst_cls) = self
                .instance_class(args[0])
                .or_else(|| self.module_slice_class(args[0]))
            {
                return self.wrap(&inst_cls, None);
            }
            if let Some(ty) = self.tensor_class(args[0]) {
                return self.wrap(&ty, None);
            }
            // Containers the trace holds (their items may be tensors): their class is known.
            let container_class = match self.kind(args[0]) {
                VarKind::Tuple(_) => match self.tuple_classes.get(&args[0]) {
                    Some(cls) => Some(cls.bind(py).clone()),
                    None if !self.tuple_fields.contains_key(&args[0]) => Some(h.tuple_type.clone()),
                    None => None,
                },
                VarKind::List(_) => Some(match self.list_classes.get(&args[0]) {
                    Some(cls) => cls.bind(py).clone(),
                    None => h.list_type.clone(),
                }),
                VarKind::NdArray(_) => Some(py.import_module("numpy")?.getattr("ndarray")?),
                VarKind::Generator { .. } => {
                    Some(py.import_module("types")?.getattr("GeneratorType")?)
                }
                VarKind::Dict(_) => Some(match self.dict_classes.get(&args[0]) {
                    Some(cls) => cls.bind(py).clone(),
                    None => h.dict_type.clone(),
                }),
                // A deque or set the trace made (its items may be tensors): the object
                // standing for it has its class.
                VarKind::Object(o)
                    if self.source(args[0]).is_none()
                        && (self.is_fresh_deque(args[0]) || self.is_fresh_set(args[0])) =>
                {
                    Some(o.bind(py).get_type().into_any())
                }
                _ => None,
            };
            if let Some(cls) = container_class {
                return Ok(self.constant(&cls));
            }
            // `type(obj)` of an existing object depends on its type only, not on which object
            // it is: guard the type, leave identity alone.
            if let (VarKind::Object(v), Some(source)) = (self.kind(args[0]), self.source(args[0])) {
                let ty = v.bind(py).get_type();
                self.guards.add(
                    source,
                    super::guards::GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
                );
                return Ok(self.add(
                    VarKind::Object(OwnedRef::from_bound(ty.as_any())),
                    Some(super::ops_objects::class_source(&ty)),
                ));
            }
        }
        if is("isinstance") && args.len() == 2 {
            let own_class = self
                .tuple_classes
                .get(&args[0])
                .or_else(|| self.list_classes.get(&args[0]))
                .cloned();
            if let Some(own) = own_class {
                let cls = self.python_value(args[1])?;
                let result = b.getattr("issubclass")?.call1((own.bind(py), cls))?;
                return Ok(self.constant(&result));
            }
        }
        if is("isinstance")
            && args.len() == 2
            && (matches!(self.kind(args[0]), VarKind::Generator { .. })
                || self.generators_run_ahead.contains(&args[0]))
        {
            // A generator function's generator (or the iterator over what one yielded, run
            // ahead in a trace that stops at a graph break): its class is known.
            let generator_type = py.import_module("types")?.getattr("GeneratorType")?;
            let cls = self.python_value(args[1])?;
            let answer = b.getattr("issubclass")?.call1((&generator_type, &cls))?;
            return Ok(self.constant(&answer));
        }
        if is("isinstance")
            && args.len() == 2
            && matches!(
                self.kind(args[0]),
                VarKind::Iter { .. } | VarKind::Generator { .. } | VarKind::Lazy(_)
            )
        {
            // Which iterator it is (a generator, a list's) is not kept, but no iterator is a
            // tuple, list, tensor, ...: timm's `checkpoint_seq` asks it of `children()`.
            let cls = self.python_value(args[1])?;
            let answer = self
                .h
                .torch
                .py()
                .import_module("dynamo_rs._capture")?
                .call_method1("iterator_isinstance", (cls,))?;
            if !answer.is_none() {
                return Ok(self.constant(&answer));
            }
        }
        if (is("isinstance") || is("issubclass")) && args.len() == 2 {
            let cls = self.python_value(args[1])?;
            let value = match self.kind(args[0]) {
                VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
                VarKind::Tensor { fake, .. } => fake.bind(py).clone(),
                VarKind::Tuple(_) => PyTuple::empty(py).into_any(),
                VarKind::List(_) => pyo3::types::PyList::empty(py).into_any(),
                VarKind::NdArray(_) => py.import_module("numpy")?.call_method1("empty", (0,))?,
                VarKind::Dict(_) => match self.dict_classes.get(&args[0]) {
                    Some(cls) => cls.bind(py).call0()?,
                    None => PyDict::new(py).into_any(),
                },
                VarKind::Const(v) | VarKind::Object(v) => v.bind(py).clone(),
                other @ (VarKind::Symbolic { .. }
                | VarKind::Slice(_)
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
                | VarKind::StateContext(_)) => {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("isinstance() of {}", kind_name(other)),
                    )
                }
            };
            let result = func.call1((value, cls))?;
            return Ok(self.constant(&result));
        }
        if (is("getattr") || is("hasattr")) && (2..=3).contains(&args.len()) {
            if let Some(result) = self.dict_subclass_getattr_builtin(is("hasattr"), &args)? {
                return Ok(result);
            }
            let attr: String = self.python_value(args[1])?.extract()?;
            // A store or `del` earlier in this trace decides the answer for an existing object.
            let stored = match self.kind(args[0]) {
                VarKind::Const(v) | VarKind::Object(v) => {
                    self.mutated_attr(&v.bind(py).clone(), &attr)
                }
                _ => None,
            };
            let found = match self.kind(args[0]) {
                VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
                _ if stored.is_some() => matches!(stored, Some(Some(_))),
                VarKind::Const(v) | VarKind::Object(v) => v.bind(py).hasattr(attr.as_str())?,
                VarKind::Tensor { fake, .. } => fake.bind(py).hasattr(attr.as_str())?,
                VarKind::Instance { cls, attrs, .. } => {
                    attrs.iter().any(|(n, _)| *n == attr) || cls.bind(py).hasattr(attr.as_str())?
                }
                VarKind::Function(_) => self.function_has_attr(args[0], &attr)?,
                // A tuple or list holds no attributes of its own (a named tuple's instance
                // `__dict__` is guarded empty): its class answers.
                VarKind::Tuple(_) | VarKind::List(_)
                    if !self.class_of_sequence(args[0]).hasattr("__getattr__")? =>
                {
                    self.class_of_sequence(args[0]).hasattr(attr.as_str())?
                }
                VarKind::Symbolic { .. }
                | VarKind::Slice(_)
                | VarKind::Tuple(_)
                | VarKind::List(_)
                | VarKind::Dict(_)
                | VarKind::DictView { .. }
                | VarKind::Null
                | VarKind::Method { .. }
                | VarKind::Iter { .. }
                | VarKind::Generator { .. }
                | VarKind::Lazy(_)
                | VarKind::Partial { .. }
                | VarKind::CellRef(_)
                | VarKind::Super { .. }
                | VarKind::GradModeContext { .. }
                | VarKind::GradModeWrapped { .. }
                | VarKind::GradModeExit { .. }
                | VarKind::StateContext(_)
                | VarKind::NdArray(_) => {
                    return unsupported(BreakKind::UnsupportedOperation, "getattr() on a container")
                }
            };
            // Whether an attribute is there is state of the object: when it is, reading it
            // (below, or here for hasattr) guards it through its source; when it is not,
            // only the object's identity says it stays missing.
            if stored.is_none() && matches!(self.kind(args[0]), VarKind::Object(_)) {
                if found {
                    if is("hasattr")
                        && self.source(args[0]).is_some()
                        && self.get_attr(args[0], &attr).is_err()
                    {
                        self.pin_identity(args[0]);
                    }
                } else {
                    match self.source(args[0]) {
                        Some(source) => self.guards.add(
                            source,
                            super::guards::GuardKind::HasAttr(attr.clone(), false),
                        ),
                        None => self.pin_identity(args[0]),
                    }
                }
            }
            if is("hasattr") {
                return Ok(self.constant(&found.into_pyobject(py)?.to_owned().into_any()));
            }
            return match (found, args.get(2)) {
                (true, _) => self.get_attr(args[0], &attr),
                (false, Some(&default)) => Ok(default),
                (false, None) => {
                    // Missing as guarded above: AttributeError on every call, worded as
                    // Python words it.
                    let message = self.missing_attribute_message(args[0], &attr)?;
                    self.raise_builtin(
                        "AttributeError",
                        pyo3::types::PyString::new(py, &message).into_any(),
                    )
                }
            };
        }
        if (is("tuple") || is("list"))
            && args.len() == 1
            && kwargs.is_empty()
            && !matches!(self.kind(args[0]), VarKind::Const(_))
        {
            let items = self.items_of(args[0])?;
            let kind = if is("tuple") {
                VarKind::Tuple(items)
            } else {
                VarKind::List(items)
            };
            return Ok(self.add(kind, None));
        }
        if is("id") && args.len() == 1 && kwargs.is_empty() {
            // `id(module)` (a cache key, a registry lookup): the object's identity, guarded.
            if let VarKind::Object(v) = self.kind(args[0]) {
                let address = v.bind(py).as_ptr() as usize;
                self.pin_identity(args[0]);
                return Ok(self.constant(&address.into_pyobject(py)?.into_any()));
            }
        }
        let tracker_aware = [
            "len",
            "isinstance",
            "issubclass",
            "getattr",
            "hasattr",
            "tuple",
            "list",
            "enumerate",
            "zip",
        ];
        if tracker_aware.iter().any(|n| is(n))
            && kwargs
                .iter()
                .any(|(k, _)| !((is("enumerate") && k == "start") || (is("zip") && k == "strict")))
        {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("keyword arguments to {name}()"),
            );
        }
        if is("enumerate") && !args.is_empty() {
            let start_var = args
                .get(1)
                .copied()
                .or_else(|| kwargs.iter().find(|(k, _)| k == "start").map(|(_, v)| *v));
            let start: i64 = match start_var {
                Some(s) => self.python_value(s)?.extract()?,
                None => 0,
            };
            let items = self.items_of(args[0])?;
            let mut pairs = Vec::new();
            for (i, item) in items.into_iter().enumerate() {
                let index = self.constant(&(start + i as i64).into_pyobject(py)?.into_any());
                pairs.push(self.add(VarKind::Tuple(vec![index, item]), None));
            }
            let made = self.new_iter(pairs, &args[..1]);
            self.hand_on_iterators(&args[..1]);
            return Ok(made);
        }
        if is("zip") {
            let strict = match kwargs.first() {
                Some((_, v)) => self.python_value(*v)?.is_truthy()?,
                None => false,
            };
            // Iterators are advanced round by round, as Python's zip does: one that outlives
            // the zip keeps the items it did not take (`zip(range(n), it)` takes n from
            // `it`; an iterator before the shortest argument loses one more), so the code
            // may go on with it (`heapq.nsmallest`).
            if !strict
                && args
                    .iter()
                    .any(|&a| matches!(self.kind(a), VarKind::Iter { .. }))
            {
                let mut lists = Vec::with_capacity(args.len());
                for &a in &args {
                    lists.push(match self.kind(a) {
                        VarKind::Iter { .. } => None,
                        _ => Some(self.items_of(a)?),
                    });
                }
                let mut tuples = Vec::new();
                'rounds: for round in 0.. {
                    let mut items = Vec::with_capacity(args.len());
                    for (&a, list) in args.iter().zip(&lists) {
                        let item = match list {
                            Some(list) => list.get(round).copied(),
                            None => self.iter_advance(a)?,
                        };
                        match item {
                            Some(item) => items.push(item),
                            None => break 'rounds,
                        }
                    }
                    tuples.push(self.add(VarKind::Tuple(items), None));
                }
                return Ok(self.new_iter(tuples, &args));
            }
            let lists = args
                .iter()
                .map(|&a| self.items_of(a))
                .collect::<CResult<Vec<_>>>()?;
            let n = lists.iter().map(Vec::len).min().unwrap_or(0);
            if strict && lists.iter().any(|l| l.len() != n) {
                // Lengths are fixed by the guards: this raises on every call.
                let message = "zip() arguments have different lengths";
                return self.raise_builtin(
                    "ValueError",
                    pyo3::types::PyString::new(py, message).into_any(),
                );
            }
            let mut tuples = Vec::new();
            for i in 0..n {
                let items = lists.iter().map(|l| l[i]).collect();
                tuples.push(self.add(VarKind::Tuple(items), None));
            }
            let made = self.new_iter(tuples, &args);
            self.hand_on_iterators(&args);
            return Ok(made);
        }
        // `sum(items, start=x)`: the keyword is the second argument.
        let (args, kwargs) = match kwargs.as_slice() {
            [(k, start)] if is("sum") && k == "start" && args.len() == 1 => {
                (vec![args[0], *start], Vec::new())
            }
            _ => (args, kwargs),
        };
        if is("sum")
            && (1..=2).contains(&args.len())
            && kwargs.is_empty()
            && (self.any_tensor(&args, &kwargs)
                || args.iter().any(|&a| self.contains_array(a))
                || self.sum_operated_one_by_one(&args))
        {
            // `sum(items, start)` adds left to right, starting from `start` (0), as Python does.
            let items = self.items_of(args[0])?;
            let add = self.h.operator.getattr("add")?;
            let mut total = match args.get(1) {
                Some(&start) => start,
                None => self.constant(&0i64.into_pyobject(py)?.into_any()),
            };
            for item in items {
                total = self.apply_operator(&add, vec![total, item])?;
            }
            return Ok(total);
        }
        if (is("max") || is("min")) && !kwargs.is_empty() && !self.all_constant(&args, &kwargs) {
            return self.min_max_by_key(is("max"), &args, &kwargs);
        }
        if (is("max") || is("min")) && kwargs.is_empty() && self.any_tensor(&args, &kwargs) {
            if let Some(best) = self.min_max_of_scalars(is("max"), &args)? {
                return Ok(best);
            }
        }
        // `abs(t)` and `pow(t, e)` call the tensor's `__abs__`/`__pow__`: graph nodes with the
        // builtin as target, as TorchDynamo records them.
        if ((is("abs") && args.len() == 1) || (is("pow") && args.len() == 2))
            && kwargs.is_empty()
            && self.any_tensor(&args, &kwargs)
        {
            return self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(func)),
                &name,
                args,
                Vec::new(),
            );
        }
        if self.any_tensor(&args, &kwargs) {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("{name}() with tensor arguments"),
            );
        }
        // A real iterator (a generator handed to the frame, one a call made while tracing)
        // would be advanced by the call now, while tracing, and not when the compiled code
        // runs: only calls that do not advance it are evaluated.
        let leaves_iterators = [
            "isinstance",
            "issubclass",
            "type",
            "id",
            "callable",
            "hasattr",
        ]
        .iter()
        .any(|n| is(n));
        if !leaves_iterators {
            for &arg in args.iter().chain(kwargs.iter().map(|(_, v)| v)) {
                if let VarKind::Object(obj) = self.kind(arg) {
                    let obj_type = obj.bind(py).get_type();
                    if obj_type.hasattr("__next__")? {
                        return unsupported(
                            BreakKind::UnsupportedOperation,
                            format!("{name}() of an iterator that exists outside the trace"),
                        );
                    }
                    // `sum(items)`, `sorted(items)` of a list (dict, set) subclass given to
                    // the frame read its items, which its identity guard does not cover.
                    let mutable_container = [
                        &self.h.list_type,
                        &self.h.dict_type,
                        &py.get_type::<pyo3::types::PySet>().into_any(),
                        &py.get_type::<pyo3::types::PyByteArray>().into_any(),
                    ]
                    .into_iter()
                    .any(|t| obj.bind(py).is_instance(t).unwrap_or(true));
                    let outside = self.source(arg).is_some();
                    if mutable_container
                        && outside
                        && !obj.bind(py).is_instance(&self.h.module_type)?
                    {
                        return unsupported(
                            BreakKind::UnsupportedOperation,
                            format!(
                                "{name}() of a {} object that exists outside the trace",
                                obj_type.name()?
                            ),
                        );
                    }
                    // `range(obj)`, `int(obj)`, `sum(obj)`: a protocol written in Python reads
                    // the object's state, which its identity guard does not cover. (Modules'
                    // containers and classes are guarded by their structure, or fixed.)
                    // (`vars` reads the instance dict and runs none of them.)
                    let exempt = is("vars")
                        || obj.bind(py).is_instance(&self.h.module_type)?
                        || obj.bind(py).is_instance_of::<pyo3::types::PyType>();
                    let found = if exempt {
                        None
                    } else {
                        super::helpers::python_dunder(
                            &obj_type,
                            PYTHON_PROTOCOLS,
                            &self.h.function_type,
                        )
                    };
                    if let Some(dunder) = found {
                        return unsupported(
                            BreakKind::UnsupportedOperation,
                            format!(
                                "{name}() of a {} object, whose {dunder} is Python code",
                                obj_type.name()?
                            ),
                        );
                    }
                }
            }
        }
        // An iterator the trace holds stands for the items it has left (a list): only a
        // builtin that iterates its argument sees no difference. `type(it)`, `len(it)`,
        // `str(it)`, `reversed(it)` would see the list.
        let iterates = [
            "list",
            "tuple",
            "set",
            "frozenset",
            "sorted",
            "sum",
            "min",
            "max",
            "any",
            "all",
            "dict",
            "enumerate",
            "zip",
            "map",
            "filter",
        ]
        .iter()
        .any(|n| is(n))
            || joins_an_iterable(func)?;
        let holds_iterator = args.iter().chain(kwargs.iter().map(|(_, v)| v)).any(|&a| {
            matches!(
                self.kind(a),
                VarKind::Iter { .. } | VarKind::Generator { .. } | VarKind::Lazy(_)
            )
        });
        if !iterates && holds_iterator {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("{name}() of an iterator made while tracing"),
            );
        }
        // Everything else is evaluated on the real values.
        let a = self.python_args(&args)?;
        let k = PyDict::new(py);
        for (name, v) in &kwargs {
            k.set_item(name, self.python_value(*v)?)?;
        }
        let result = match func.call(a, Some(&k)) {
            Ok(r) => r,
            Err(err) => {
                let detail = format!("{name}() raised {err} while tracing");
                if self.all_plain_values(&args, &kwargs) {
                    return self.raised(err, detail);
                }
                return unsupported(BreakKind::ExceptionWhileTracing, detail);
            }
        };
        if result.is_instance(&self.h.tensor_type)? {
            return unsupported(
                BreakKind::ValueNotRebuildable,
                format!("{name}() made a tensor outside the graph"),
            );
        }
        self.wrap(&result, None).or_else(|e| match e {
            CaptureError::Unsupported(_) => {
                Ok(self.add(VarKind::Object(OwnedRef::from_bound(&result)), None))
            }
            other => Err(other),
        })
    }

    /// `max(a, b, ...)` / `min(...)` (or over one list/tuple) where the items are one-element
    /// tensors and numbers, in the graph instead of a break on `bool(b > a)`, as TorchDynamo
    /// does. Python keeps the first item and replaces it by each later one that compares
    /// greater (`max`) or less (`min`); each step here is that choice as a graph operation:
    /// `clamp(best, min=item)` when the kept item is a tensor and the new one a number (the
    /// same value for every input, NaN and ties included: clamp keeps `best` on a tie and
    /// propagates its NaN, as the comparison does), otherwise `where(item > best, item,
    /// best)`. Values and gradients are eager's; the one difference is that the result is a
    /// tensor even when eager would return the number. None (break as before) for
    /// multi-element tensors (eager raises on their truth), tensors of different shapes or
    /// dtypes (the choice would change the result's shape or dtype), symbolic sizes and
    /// anything but numbers beside the tensors.
    fn min_max_of_scalars(&mut self, is_max: bool, args: &[VarId]) -> CResult<Option<VarId>> {
        let py = self.py;
        let items = match args {
            [one] => match self.kind(*one) {
                VarKind::List(_) | VarKind::Tuple(_) => self.items_of(*one)?,
                _ => return Ok(None),
            },
            _ => args.to_vec(),
        };
        if items.len() < 2 {
            return Ok(None);
        }
        // (shape, dtype) shared by every tensor item.
        let mut layout: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = None;
        for &item in &items {
            match self.kind(item) {
                VarKind::Tensor { fake, .. } => {
                    let fake = fake.bind(py).clone();
                    let shape = fake.getattr("shape")?;
                    let mut numel = 1i64;
                    for dim in shape.try_iter()? {
                        let dim = dim?;
                        if !dim.is_exact_instance_of::<pyo3::types::PyInt>() {
                            return Ok(None);
                        }
                        numel *= dim.extract::<i64>()?;
                    }
                    if numel != 1 {
                        return Ok(None);
                    }
                    let dtype = fake.getattr("dtype")?;
                    match &layout {
                        Some((s, d)) if !(s.eq(&shape)? && d.is(&dtype)) => return Ok(None),
                        _ => layout = Some((shape, dtype)),
                    }
                }
                VarKind::Const(n) => {
                    let n = n.bind(py);
                    let number = n.is_instance_of::<pyo3::types::PyInt>()
                        || n.is_instance_of::<pyo3::types::PyFloat>();
                    if !number {
                        return Ok(None);
                    }
                }
                _ => return Ok(None),
            }
        }
        let is_tensor = |t: &Self, id: VarId| matches!(t.kind(id), VarKind::Tensor { .. });
        let torch = self.h.torch.clone();
        let better = self.h.operator.getattr(if is_max { "gt" } else { "lt" })?;
        let mut best = items[0];
        for &item in &items[1..] {
            best = if is_tensor(self, best) && !is_tensor(self, item) {
                let bound = if is_max { "min" } else { "max" };
                let clamp = torch.getattr("clamp")?;
                self.graph_call(
                    Op::CallFunction(OwnedRef::from_bound(&clamp)),
                    "clamp",
                    vec![best],
                    vec![(bound.to_string(), item)],
                )?
            } else if !is_tensor(self, best) && !is_tensor(self, item) {
                let replaces = self.apply_operator(&better, vec![item, best])?;
                let keep_new = self.python_value(replaces)?.is_truthy()?;
                if keep_new {
                    item
                } else {
                    best
                }
            } else {
                let replaces = self.apply_operator(&better, vec![item, best])?;
                let choose = torch.getattr("where")?;
                self.graph_call(
                    Op::CallFunction(OwnedRef::from_bound(&choose)),
                    "where",
                    vec![replaces, item, best],
                    Vec::new(),
                )?
            };
        }
        Ok(Some(best))
    }
}

/// Whether `func` is `str.join` or `bytes.join` bound to a separator: it iterates its
/// argument once, so an iterator the trace holds (a generator expression, `map(str, ...)`)
/// may be given as the items it has left.
pub(super) fn joins_an_iterable(func: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !func.is_instance_of::<pyo3::types::PyCFunction>() {
        return Ok(false);
    }
    let Ok(receiver) = func.getattr("__self__") else {
        return Ok(false);
    };
    Ok(func.getattr("__name__")?.extract::<String>()? == "join"
        && (receiver.is_exact_instance_of::<pyo3::types::PyString>()
            || receiver.is_exact_instance_of::<pyo3::types::PyBytes>()))
}
