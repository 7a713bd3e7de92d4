//! Calls: `CALL`, `CALL_FUNCTION_EX`, `MAKE_FUNCTION`, and what a call means for each kind
//! of callee:
//!
//! - a torch function (or `torch.nn.functional`) with tensor arguments: one graph node;
//! - a tensor method: a graph node, or a constant for metadata (`size()`, `dim()`, ...);
//! - a Python function, a method, `nn.Module.__call__`: inlined (translated in a nested
//!   frame), modules only when they have no hooks;
//! - a pure builtin (`len`, `isinstance`, `range`, `math.*`, `operator.*`, ...) on known
//!   values: evaluated at trace time (`builtins.rs`);
//! - anything else: unsupported.
//!
//! Methods of containers are in `ops_containers.rs`, recording graph nodes in `ops_graph.rs`.

use std::rc::Rc;

use super::break_reasons::BreakKind;
use super::ops_containers::dict_fromkeys_class;

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::graph::Op;
use super::guards::GuardKind;
use super::source::Source;
use super::translator::{frame_state, kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{Cell, TracedFunction, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use dynamo_bytecode::binding::{self, ParamValue};

const CO_GENERATOR_LIKE: u32 = 0x20 | 0x80 | 0x100 | 0x200;
const CO_GENERATOR: u32 = 0x20;

/// A model of calls to some library callables: the result, or None when `obj` is not one
/// of them.
type LibraryModel<'py> = fn(
    &mut Tracer<'py>,
    &Bound<'py, PyAny>,
    &[VarId],
    &[(String, VarId)],
) -> CResult<Option<VarId>>;

/// Models of library and builtin calls tried in order by `call_object`, each in the file of
/// its family (`ops_autograd`, `ops_copy`, `builtins`, `ops_objects`, `ops_exceptions`,
/// `ops_build`, `ops_itertools`, `ops_operator_getters`).
fn library_models<'py>() -> [LibraryModel<'py>; 13] {
    [
        Tracer::deque_call,
        Tracer::autograd_function_apply,
        Tracer::autograd_function_instance,
        Tracer::shallow_copy_call,
        Tracer::deepcopy_call,
        Tracer::attribute_builtin,
        Tracer::object_new,
        Tracer::construct_exception,
        Tracer::construct_named_tuple,
        Tracer::construct_tuple_of_class,
        Tracer::construct_module,
        Tracer::lazy_iteration_call,
        Tracer::operator_getter_call,
    ]
}

/// The Python function a `torch.jit.ScriptFunction` was made from (torch keeps it as
/// `_torchdynamo_inline` for TorchDynamo to inline), or None.
fn scripted_original<'py>(
    obj: &Bound<'py, PyAny>,
    script_function: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !obj.is_instance(script_function)? {
        return Ok(None);
    }
    Ok(obj
        .getattr("_torchdynamo_inline")
        .ok()
        .filter(|f| f.is_instance_of::<pyo3::types::PyFunction>()))
}

/// The default values of a function being inlined: a real function's `__defaults__` and
/// `__kwdefaults__` (each possibly None), or the trackers of a function the trace made.
enum Defaults<'py> {
    Real {
        function: Bound<'py, PyAny>,
        source: Option<Rc<Source>>,
        defaults: Bound<'py, PyAny>,
        kwdefaults: Bound<'py, PyAny>,
    },
    Traced {
        defaults: Vec<VarId>,
        kwdefaults: Vec<(String, VarId)>,
    },
}

/// Methods of a `mappingproxy` that only read it.
const MAPPING_PROXY_READS: [&str; 8] = [
    "values",
    "keys",
    "items",
    "get",
    "copy",
    "__getitem__",
    "__contains__",
    "__len__",
];

impl<'py> Tracer<'py> {
    pub(super) fn op_call(&mut self, f: &mut FrameState<'py>, argc: u32) -> CResult<Flow> {
        let kw_names = f.kw_names.take();
        let mut args = self.popn(f, argc as usize)?;
        let callable_or_self = self.pop(f)?;
        let first = self.pop(f)?;
        let callee = if matches!(self.kind(first), VarKind::Null) {
            callable_or_self
        } else {
            args.insert(0, callable_or_self);
            first
        };
        let mut kwargs = Vec::new();
        if let Some(names) = kw_names {
            let n = names.len();
            let values = args.split_off(args.len() - n);
            for (name, value) in names.iter().zip(values) {
                kwargs.push((name.to_string(), value));
            }
        }
        if args.is_empty() && kwargs.is_empty() && self.is_builtin(callee, "super") {
            let result = self.zero_arg_super(f)?;
            f.stack.push(result);
            return Ok(Flow::Continue);
        }
        if args.is_empty() && kwargs.is_empty() {
            for name in ["locals", "vars", "dir"] {
                if self.is_builtin(callee, name) {
                    if let Some(result) = self.frame_reading_builtin(f, name)? {
                        f.stack.push(result);
                        return Ok(Flow::Continue);
                    }
                }
            }
        }
        let result = self.call_function(callee, args, kwargs)?;
        f.stack.push(result);
        Ok(Flow::Continue)
    }

    fn is_builtin(&self, id: VarId, name: &str) -> bool {
        match self.kind(id) {
            VarKind::Object(obj) => self
                .h
                .builtins
                .getattr(name)
                .map(|b| b.is(obj.bind(self.py)))
                .unwrap_or(false),
            _ => false,
        }
    }

    pub(super) fn op_import_name(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let fromlist = self.pop(f)?;
        let level = self.pop(f)?;
        let name = f.names.get_item(i as usize)?.to_string();
        let level: i64 = self.python_value(level)?.extract()?;
        let name = if level == 0 {
            name
        } else {
            // `from .x import y` inside a function: resolved against the package of the
            // frame's module as `__import__` resolves it (`__package__`, else `__spec__`).
            let bootstrap = self.py.import_module("importlib._bootstrap")?;
            let resolved = bootstrap
                .call_method1("_calc___package__", (&f.globals,))
                .and_then(|package| {
                    bootstrap.call_method1("_resolve_name", (name.as_str(), package, level))
                });
            match resolved {
                Ok(absolute) => absolute.to_string(),
                Err(err) => {
                    return unsupported(
                        BreakKind::Import,
                        format!("a relative import of {name}: {err}"),
                    )
                }
            }
        };
        let modules = self.py.import_module("sys")?.getattr("modules")?;
        if !modules.contains(&name)? {
            return unsupported(
                BreakKind::Import,
                format!("importing {name}, which is not loaded yet"),
            );
        }
        let has_fromlist =
            !matches!(self.kind(fromlist), VarKind::Const(v) if v.bind(self.py).is_none());
        let target = if has_fromlist {
            name.clone()
        } else {
            name.split('.').next().unwrap_or(&name).to_string()
        };
        let module = modules.get_item(&target)?;
        // What `import` gives is `sys.modules[name]`: read from there, it is guarded like any
        // other read (a module replaced in `sys.modules` recompiles), and attributes read
        // from it (`from m import x`, `m.x`) have sources.
        let source = Rc::new(Source::Item(
            Rc::new(Source::Object(
                OwnedRef::from_bound(&modules),
                "sys.modules".into(),
            )),
            super::source::ItemKey::Str(target),
        ));
        let id = self.wrap(&module, Some(source))?;
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub(super) fn op_import_from(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let name = f.names.get_item(i as usize)?.to_string();
        let Some(&module) = f.stack.last() else {
            return unsupported(BreakKind::Internal, "IMPORT_FROM on an empty stack");
        };
        let value = self.get_attr(module, &name)?;
        f.stack.push(value);
        Ok(Flow::Continue)
    }

    pub(super) fn op_call_function_ex(
        &mut self,
        f: &mut FrameState<'py>,
        flags: u32,
    ) -> CResult<Flow> {
        let kwargs_var = if flags & 1 == 1 {
            Some(self.pop(f)?)
        } else {
            None
        };
        let args_var = self.pop(f)?;
        let callee = self.pop(f)?;
        let _null = self.pop(f)?;
        let args = self.items_of(args_var)?;
        let mut kwargs = Vec::new();
        if let Some(kw) = kwargs_var {
            match self.kind(kw) {
                VarKind::Dict(entries) => {
                    for (k, v) in entries.clone() {
                        // `f(**{1: x})` raises TypeError: keywords are strings.
                        let Ok(name) = k.bind(self.py).extract::<String>() else {
                            return unsupported(
                                BreakKind::UnsupportedCall,
                                "a ** argument whose keys are not all strings",
                            );
                        };
                        kwargs.push((name, v));
                    }
                }
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
                        format!("**kwargs from {}", kind_name(other)),
                    )
                }
            }
        }
        let result = self.call_function(callee, args, kwargs)?;
        f.stack.push(result);
        Ok(Flow::Continue)
    }

    pub(super) fn op_make_function(
        &mut self,
        f: &mut FrameState<'py>,
        flags: u32,
    ) -> CResult<Flow> {
        let code = self.pop(f)?;
        let closure = if flags & 0x08 != 0 {
            Some(self.pop(f)?)
        } else {
            None
        };
        let annotations = if flags & 0x04 != 0 {
            Some(self.pop(f)?)
        } else {
            None
        };
        let kwdefaults = if flags & 0x02 != 0 {
            Some(self.pop(f)?)
        } else {
            None
        };
        let defaults = if flags & 0x01 != 0 {
            Some(self.pop(f)?)
        } else {
            None
        };
        let Some(code_obj) = self.real(code) else {
            return unsupported(BreakKind::Internal, "MAKE_FUNCTION without a code object");
        };
        let mut cells = Vec::new();
        if let Some(closure) = closure {
            for item in self.items_of(closure)? {
                match self.kind(item) {
                    VarKind::CellRef(cell) => cells.push(cell.clone()),
                    other @ (VarKind::Tensor { .. }
                    | VarKind::Unrealized(_)
                    | VarKind::Symbolic { .. }
                    | VarKind::Slice(_)
                    | VarKind::Const(_)
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
                    | VarKind::Super { .. }
                    | VarKind::Instance { .. }
                    | VarKind::GradModeContext { .. }
                    | VarKind::GradModeWrapped { .. }
                    | VarKind::GradModeExit { .. }
                    | VarKind::StateContext(_)
                    | VarKind::NdArray(_)) => {
                        return unsupported(
                            BreakKind::ValueNotRebuildable,
                            format!("a closure made of {}", kind_name(other)),
                        )
                    }
                }
            }
        }
        let function = TracedFunction {
            code: OwnedRef::from_bound(&code_obj),
            globals: OwnedRef::from_bound(f.globals.as_any()),
            builtins: OwnedRef::from_bound(&f.builtins),
            defaults,
            kwdefaults,
            closure: cells,
        };
        let id = self.add(VarKind::Function(Rc::new(function)), None);
        if let Some(annotations) = annotations {
            // A flat tuple (name, annotation, ...): the function's `__annotations__` dict.
            let items = self.items_of(annotations)?;
            let mut entries = Vec::with_capacity(items.len() / 2);
            for pair in items.chunks(2) {
                let (VarKind::Const(name), Some(&value)) = (self.kind(pair[0]), pair.get(1)) else {
                    return unsupported(BreakKind::Internal, "MAKE_FUNCTION annotations");
                };
                entries.push((name.clone(), value));
            }
            let dict = self.add(VarKind::Dict(entries), None);
            self.store_function_attr(id, "__annotations__", Some(dict))?;
        }
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub fn call_function(
        &mut self,
        callee: VarId,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        if let Some(result) = self.grad_mode_call(callee, &args, &kwargs)? {
            return Ok(result);
        }
        if let Some(result) = self.state_exit_call(callee)? {
            return Ok(result);
        }
        if let Some(result) = self.call_module_slice(callee, &args, &kwargs)? {
            return Ok(result);
        }
        self.refuse_frame_reading_call(callee)?;
        self.refuse_formatting_call(callee, &args, &kwargs)?;
        let py = self.py;
        if let Some(result) = self.iteration_dunder_call(callee, &args, &kwargs)? {
            return Ok(result);
        }
        match self.kind(callee) {
            VarKind::Method {
                receiver,
                name,
                func: None,
            } => {
                let (receiver, name) = (*receiver, name.clone());
                if matches!(self.kind(receiver), VarKind::Tensor { .. }) {
                    self.tensor_method(receiver, &name, args, kwargs)
                } else if matches!(self.kind(receiver), VarKind::NdArray(_)) {
                    self.ndarray_method(receiver, &name, args, kwargs)
                } else {
                    self.container_method(receiver, &name, args, kwargs)
                }
            }
            VarKind::Method {
                receiver,
                func: Some(func),
                ..
            } => {
                let (receiver, func) = (*receiver, func.bind(py).clone());
                let mut all = vec![receiver];
                all.extend(args);
                if func.is_instance(&self.h.function_type)? && !torch_disabled(&func) {
                    return self.call_python(&func, all, kwargs);
                }
                // A method made by another callable's `__get__` (an `lru_cache`d function
                // stored on a class), or a method disabled with `torch.compiler.disable`
                // (which breaks the graph): that callable, with the receiver first.
                let func = self.wrap(&func, None)?;
                self.call_function(func, all, kwargs)
            }
            VarKind::Function(function) => {
                let function = function.clone();
                self.inline_traced(&function, args, kwargs)
            }
            VarKind::Partial { .. } => self.call_partial(callee, args, kwargs),
            VarKind::Const(obj) | VarKind::Object(obj) => {
                let obj = obj.bind(py).clone();
                self.call_object(callee, &obj, args, kwargs)
            }
            // An object made in the trace whose class defines `__call__` in Python.
            VarKind::Instance {
                cls,
                model_output: false,
                ..
            } if cls
                .bind(py)
                .getattr("__call__")
                .is_ok_and(|c| c.is_instance_of::<pyo3::types::PyFunction>()) =>
            {
                let method = self.get_attr(callee, "__call__")?;
                self.call_function(method, args, kwargs)
            }
            // A list or dict of a user class that defines `__call__` in Python.
            VarKind::List(_) | VarKind::Dict(_)
                if self
                    .user_list_class(callee)
                    .or_else(|| self.user_dict_class(callee))
                    .is_some_and(|cls| {
                        cls.getattr("__call__")
                            .is_ok_and(|c| c.is_instance_of::<pyo3::types::PyFunction>())
                    }) =>
            {
                let method = self.get_attr(callee, "__call__")?;
                self.call_function(method, args, kwargs)
            }
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Tuple(_)
            | VarKind::List(_)
            | VarKind::Dict(_)
            | VarKind::DictView { .. }
            | VarKind::Null
            | VarKind::Iter { .. }
            | VarKind::Generator { .. }
            | VarKind::Lazy(_)
            | VarKind::CellRef(_)
            | VarKind::Super { .. }
            | VarKind::Instance { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)) => unsupported(
                BreakKind::UnsupportedCall,
                format!("calling {}", kind_name(other)),
            ),
        }
    }

    /// The name of `obj` if it is a C method of torch's tensor class taken from the class
    /// (`torch.Tensor.add`, `torch.Tensor.__mul__`) and `args` start with a tensor to call it
    /// on.
    fn unbound_tensor_method(
        &self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> PyResult<Option<String>> {
        let Some(&first) = args.first() else {
            return Ok(None);
        };
        if !matches!(self.kind(first), VarKind::Tensor { .. }) {
            return Ok(None);
        }
        let kind = obj.get_type().name()?.to_string();
        if kind != "method_descriptor" && kind != "wrapper_descriptor" {
            return Ok(None);
        }
        let Ok(owner) = obj.getattr("__objclass__") else {
            return Ok(None);
        };
        let tensor_base = self
            .py
            .import_module("torch")?
            .getattr("_C")?
            .getattr("TensorBase")?;
        if !owner.is(&tensor_base) {
            return Ok(None);
        }
        Ok(Some(obj.getattr("__name__")?.extract()?))
    }

    /// `c.__iter__()` and `it.__next__()` on a container, constant or iterator the trace
    /// holds (`range(3).__iter__()`, `[a, b].__iter__()`, `t.__iter__()` of a tuple of
    /// tensors): as `iter(c)` and `next(it)`, which the trace follows (they were evaluated
    /// on the real object, leaving an iterator the trace could not hand on). None for other
    /// calls (a class's own Python `__iter__` is a method with a function, inlined as such).
    fn iteration_dunder_call(
        &mut self,
        callee: VarId,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        if !args.is_empty() || !kwargs.is_empty() {
            return Ok(None);
        }
        let py = self.py;
        let (receiver, name) = match self.kind(callee) {
            VarKind::Method {
                receiver,
                name,
                func: None,
            } => (*receiver, name.clone()),
            // A constant's own method (`range(3).__iter__`), bound while tracing.
            VarKind::Const(method) | VarKind::Object(method) => {
                let method = method.bind(py).clone();
                let Ok(owner) = method.getattr("__self__") else {
                    return Ok(None);
                };
                if !self.h.is_constant(&owner)? {
                    return Ok(None);
                }
                let name = method.getattr("__name__")?.extract::<String>()?;
                (self.constant(&owner), name)
            }
            _ => return Ok(None),
        };
        let builtin = match name.as_str() {
            "__iter__" => "iter",
            "__next__" => "next",
            _ => return Ok(None),
        };
        if !matches!(
            self.kind(receiver),
            VarKind::List(_) | VarKind::Tuple(_) | VarKind::Iter { .. } | VarKind::Const(_)
        ) || (builtin == "next" && !matches!(self.kind(receiver), VarKind::Iter { .. }))
        {
            return Ok(None);
        }
        let function = self.h.builtins.getattr(builtin)?;
        self.iteration_builtin(&function, &[receiver])
    }

    pub(super) fn any_tensor(&self, args: &[VarId], kwargs: &[(String, VarId)]) -> bool {
        args.iter().any(|&a| self.contains_tensor(a))
            || kwargs.iter().any(|(_, v)| self.contains_tensor(*v))
    }

    fn call_object(
        &mut self,
        callee: VarId,
        obj: &Bound<'py, PyAny>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let h = self.h.clone();
        let polyfill = match obj.is_instance_of::<pyo3::types::PyCFunction>()
            || obj.is_instance_of::<pyo3::types::PyType>()
            || obj.is_instance_of::<pyo3::types::PyFunction>()
        {
            true => h.polyfills.get_item(obj).ok(),
            false => None,
        };
        if let Some(polyfill) = polyfill {
            // A C function or class (`itertools.cycle`), or a Python function written in a
            // way the trace cannot follow (`tree_map_`), whose Python version is traced.
            self.pin_identity(callee);
            return self.call_python(&polyfill, args, kwargs);
        }
        if let Some(result) = self.tensor_function_call(obj, &args, &kwargs)? {
            self.pin_identity(callee);
            return Ok(result);
        }
        if args.is_empty()
            && kwargs.is_empty()
            && obj.is_instance_of::<pyo3::types::PyCFunction>()
            && obj.is(&py.import_module("sys")?.getattr("exc_info")?)
        {
            if let Some(info) = self.exc_info()? {
                self.pin_identity(callee);
                return Ok(info);
            }
        }
        if args.is_empty()
            && kwargs.is_empty()
            && obj.is_instance_of::<pyo3::types::PyType>()
            && obj.is(&py.import_module("builtins")?.getattr("object")?)
        {
            // `sentinel = object()`: a new object with no state, compared by identity in
            // the trace. It cannot stand for the next call's: handing it on (returned,
            // stored, live at a graph break) is refused as for any object made here.
            self.pin_identity(callee);
            let sentinel = obj.call0()?;
            return Ok(self.add(VarKind::Object(OwnedRef::from_bound(&sentinel)), None));
        }
        if let Some(result) = self.shape_env_query(obj, &args, &kwargs)? {
            self.pin_identity(callee);
            return Ok(result);
        }
        if let Some(result) = self.numpy_call(obj, &args, &kwargs)? {
            self.pin_identity(callee);
            return Ok(result);
        }
        if let Some(original) = super::ops_nested_compile::compiled_original(obj)? {
            // A function compiled by `dynamo_rs.compile` or `torch.compile` called from traced
            // code: the function it wraps is traced into this graph, the inner compile's
            // backend and options unused, as TorchDynamo treats nested compiles. The wrapper
            // is read through its source: its code says it is still such a wrapper.
            let source = self.source(callee);
            if let Some(s) = &source {
                self.guards.add(
                    Rc::new(Source::Attr(s.clone(), "__code__".into())),
                    super::guards::GuardKind::Id(OwnedRef::from_bound(&obj.getattr("__code__")?)),
                );
            } else {
                self.pin_identity(callee);
            }
            let source =
                source.map(|s| Rc::new(Source::Attr(s, "_torchdynamo_orig_callable".into())));
            return self.call_python_from(&original, source, args, kwargs);
        }
        if let Some(original) = scripted_original(obj, &self.h.script_function_type)? {
            // A `torch.jit.script`ed (or traced) function: the Python function it was made
            // from, inlined as TorchDynamo inlines it (read through its source, guarded).
            let source = self.source(callee);
            if let Some(s) = &source {
                self.guards.add(
                    s.clone(),
                    super::guards::GuardKind::Type(OwnedRef::from_bound(obj.get_type().as_any())),
                );
            }
            let source = source.map(|s| Rc::new(Source::Attr(s, "_torchdynamo_inline".into())));
            return self.call_python_from(&original, source, args, kwargs);
        }
        if let Some(name) = self.unbound_tensor_method(obj, &args)? {
            // `torch.Tensor.add(x, y)`: the method of `x`, as `x.add(y)` (TorchDynamo's
            // graph too).
            self.pin_identity(callee);
            return self.tensor_method(args[0], &name, args[1..].to_vec(), kwargs);
        }
        if let Some(result) = self.optimizer_init_group(obj, &args, &kwargs)? {
            self.pin_identity(callee);
            return Ok(result);
        }
        // Only inlining a user function leaves its identity unread (its code and closure
        // are guarded instead); every other way of calling depends on which object it is.
        let torch_disabled = torch_disabled(obj);
        let user_function = obj.get_type().is(&h.function_type)
            && !torch_disabled
            && !h.is_compiling.iter().any(|f| f.is(obj))
            && !h.always_false.iter().any(|f| f.is(obj))
            && !h.always_none.iter().any(|f| f.is(obj))
            && !h.requested_breaks.iter().any(|f| f.is(obj))
            && !h.foldable.contains(obj).unwrap_or(true)
            && !h.is_graph_function.call1((obj,))?.is_truthy()?;
        // A module call reads what it needs through the module's source (`call_module`); an
        // instance's Python `__call__` is found through its guarded class.
        let python_call = !obj.is_instance_of::<pyo3::types::PyType>()
            && obj
                .get_type()
                .getattr("__call__")
                .is_ok_and(|c| c.is_instance_of::<pyo3::types::PyFunction>());
        // A `functools.partial` is called through its guarded `func`, `args` and `keywords`
        // (`functools_call`): which partial object it is does not matter.
        let partial = obj.get_type().is(&h.partial_type);
        let native_callable = !user_function && !python_call && !obj.is_instance(&h.module_type)?;
        if native_callable && !partial {
            self.pin_identity(callee);
        }
        let args = if !user_function && !python_call {
            self.settle_python_iterables(obj, args)?
        } else {
            args
        };
        if native_callable {
            if let Some(answer) = self.short_circuit_consumer(obj, &args, &kwargs)? {
                return Ok(answer);
            }
            if let Some(made) = self.lazy_iterator_call(obj, &args, &kwargs)? {
                return Ok(made);
            }
            self.settle_generators(obj, &args, &kwargs)?;
        }
        if h.is_compiling.iter().any(|f| f.is(obj)) {
            return Ok(self.constant(&true.into_pyobject(py)?.to_owned().into_any()));
        }
        if h.requested_breaks.iter().any(|f| f.is(obj)) {
            return unsupported(BreakKind::Requested, "torch._dynamo.graph_break()");
        }
        if self.is_checkpoint(obj) {
            return self.checkpoint_call(args, kwargs);
        }
        if self.is_cond(obj) {
            return self.cond_call(args, kwargs);
        }
        if let Some(name) = self.loop_operator(obj) {
            return self.loop_call(name, args, kwargs);
        }
        if self.is_compile_region_call(obj) {
            return self.compile_region_call(args, kwargs);
        }
        if let Some(primitive) = self.functorch_primitive(obj) {
            return self.functorch_call(obj, primitive, args, kwargs);
        }
        if torch_disabled {
            // Run as it is, after the graph: the hook leaves the wrapper's frames and all
            // they call alone (`Mode::Disabled`). A non-recursive disable leaves only the
            // function's own frames alone.
            let recursive = obj
                .getattr("_torchdynamo_disable_recursive")
                .map(|r| r.is_truthy().unwrap_or(true))
                .unwrap_or(true);
            if !recursive {
                if let Ok(code) = obj
                    .getattr("_torchdynamo_orig_callable")
                    .and_then(|f| f.getattr("__code__"))
                {
                    crate::eval_frame::skip_code(py, &code)?;
                }
            }
            return unsupported(
                BreakKind::Requested,
                format!("{} (disabled with torch.compiler.disable)", describe(obj)),
            );
        }
        if h.always_false.iter().any(|f| f.is(obj)) {
            let overridden = args
                .iter()
                .chain(kwargs.iter().map(|(_, v)| v))
                .any(|&a| match self.kind(a) {
                    VarKind::Object(o) => o.bind(py).hasattr("__torch_function__").unwrap_or(true),
                    _ => false,
                });
            if overridden {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "has_torch_function on an object with __torch_function__",
                );
            }
            return Ok(self.constant(&false.into_pyobject(py)?.to_owned().into_any()));
        }
        if h.always_none.iter().any(|f| f.is(obj)) && args.is_empty() && kwargs.is_empty() {
            return Ok(self.constant(&py.None().into_bound(py)));
        }
        if obj.is_instance(&h.module_type)? {
            return self.call_module(callee, obj, args, kwargs);
        }
        let is_operator = obj
            .getattr("__module__")
            .map(|m| m.to_string() == "_operator")
            .unwrap_or(false);
        // `operator.add(a, b)` on symbolic numbers, NumPy arrays, or objects whose class
        // defines the operator in Python (see `ops_user_operators`): as `a + b`.
        if is_operator
            && kwargs.is_empty()
            && args.iter().any(|&a| {
                self.operated_one_by_one(a) || matches!(self.kind(a), VarKind::NdArray(_))
            })
        {
            return self.apply_operator(obj, args);
        }
        if obj.is(&h.torch_assert) && !args.is_empty() && kwargs.is_empty() {
            if matches!(self.kind(args[0]), VarKind::Tensor { .. }) {
                // A tensor condition is checked when the graph runs, as TorchDynamo emits it
                // (`assert` would need the tensor's value while tracing).
                let check = h.torch.getattr("_assert_async")?;
                return self.graph_call(
                    Op::CallFunction(OwnedRef::from_bound(&check)),
                    "_assert_async",
                    args,
                    kwargs,
                );
            }
            // A condition known while tracing (a constant, a guarded size) is checked here,
            // as TorchDynamo does: a true one leaves no node; a false one runs eagerly and
            // raises there.
            if self.truth(args[0])? {
                return Ok(self.constant(&py.None().into_bound(py)));
            }
            return unsupported(BreakKind::UnsupportedOperation, "torch._assert that fails");
        }
        if h.distribution_check.as_ref().is_some_and(|c| c.is(obj))
            && args.len() == 2
            && kwargs.is_empty()
            && matches!(self.kind(args[0]), VarKind::Tensor { .. })
        {
            // A distribution validating its arguments or a sample (`Normal(loc, scale)`,
            // `log_prob(value)`): whether every element is valid is known only when the graph
            // runs, so the check runs there — as torch does it under export — and the trace
            // goes on as for valid data. Invalid data then raises a RuntimeError with torch's
            // message from the graph, where eager raises a ValueError.
            let all_true = h.torch.getattr("_is_all_true")?;
            let valid = self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(&all_true)),
                "_is_all_true",
                vec![args[0]],
                Vec::new(),
            )?;
            let check = h.torch.getattr("_assert_async")?;
            self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(&check)),
                "_assert_async",
                vec![valid, args[1]],
                Vec::new(),
            )?;
            return Ok(self.constant(&true.into_pyobject(py)?.to_owned().into_any()));
        }
        if let Some(checked) = self.symbolic_check(obj, &args, &kwargs)? {
            return Ok(checked);
        }
        if self.any_tensor(&args, &kwargs)
            && (is_operator || h.is_graph_function.call1((obj,))?.is_truthy()?)
        {
            if h.disallowed_in_graph.call1((obj,))?.is_truthy()? {
                return unsupported(
                    BreakKind::Requested,
                    format!(
                        "{} (taken out of graphs by torch._dynamo.disallow_in_graph)",
                        function_name(obj)
                    ),
                );
            }
            return self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(obj)),
                &function_name(obj),
                args,
                kwargs,
            );
        }
        if args.is_empty() {
            if let Some(answer) = self.inference_mode_query(obj)? {
                return Ok(answer);
            }
        }
        // Factory functions (`torch.zeros(3)`, `torch.arange(n)`) make tensors from constants:
        // graph nodes too, unless they are pure queries evaluated below.
        if !h.foldable.contains(obj).unwrap_or(false)
            && h.is_graph_function.call1((obj,))?.is_truthy()?
            && !self.check_known_while_tracing(obj, &args, &kwargs)?
        {
            return self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(obj)),
                &function_name(obj),
                args,
                kwargs,
            );
        }
        if kwargs.is_empty() && args.iter().any(|&a| self.is_symbolic(a)) {
            if let Some(result) = self.symbolic_builtin(obj, &args)? {
                return Ok(result);
            }
        }
        // From here on the call is evaluated while tracing (or inlined, for Python
        // functions): symbolic arguments of anything but an inlined function are specialised.
        let (args, kwargs) = if obj.is_instance(&h.function_type)? {
            (args, kwargs)
        } else {
            self.specialize_args(args, kwargs)?
        };
        if obj.is(&h.builtins.getattr("super")?) && args.is_empty() {
            return unsupported(
                BreakKind::SuperCall,
                "super() outside a method the translator knows",
            );
        }
        if obj.is(&h.builtins.getattr("super")?) && args.len() == 2 && kwargs.is_empty() {
            return self.two_arg_super(args[0], args[1]);
        }
        if let Some(cls) = dict_fromkeys_class(obj, &h.dict_type, &h.ordered_dict_type) {
            let mut args = args.clone();
            match kwargs.as_slice() {
                [] => {}
                [(k, v)] if k == "value" && args.len() == 1 => args.push(*v),
                _ => {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        "fromkeys() with these keywords",
                    )
                }
            }
            if (1..=2).contains(&args.len()) {
                return self.dict_fromkeys(&cls, args);
            }
        }
        if kwargs.is_empty() {
            if let Some(result) = self.iteration_builtin(obj, &args)? {
                return Ok(result);
            }
        }
        if let Some(result) = self.functools_call(callee, obj, &args, &kwargs)? {
            return Ok(result);
        }
        for model in library_models() {
            if let Some(result) = model(self, obj, &args, &kwargs)? {
                return Ok(result);
            }
        }
        if obj.is(&h.builtins.getattr("set")?) && kwargs.is_empty() && args.len() <= 1 {
            return self.construct_set(&args);
        }
        if kwargs.is_empty() {
            if let Some(result) = self.set_method(obj, &args)? {
                return Ok(result);
            }
        }
        if let Some(dict) = self.construct_defaultdict(obj, &args, &kwargs)? {
            return Ok(dict);
        }
        if let Some(dict) = self.construct_dict_subclass(obj, &args, &kwargs)? {
            return Ok(dict);
        }
        if let Some(list) = self.construct_list_subclass(obj, &args, &kwargs)? {
            return Ok(list);
        }
        if obj.is(&h.dict_type) || obj.is(&h.ordered_dict_type) {
            if let Some(dict) = self.construct_dict(obj, &args, &kwargs)? {
                return Ok(dict);
            }
        }
        if h.foldable.contains(obj).unwrap_or(false) {
            return self.call_builtin(obj, args, kwargs);
        }
        if obj.is_instance(&h.function_type)? {
            if obj.is(&h.sdpa_kernel) {
                if let Some(context) = self.state_context(obj, &args, &kwargs)? {
                    return Ok(context);
                }
            }
            let source = self.source(callee);
            return self.call_python_from(obj, source, args, kwargs);
        }
        if let Some(context) = self.grad_mode_context(obj, &args, &kwargs)? {
            return Ok(context);
        }
        if let Some(context) = self.state_context(obj, &args, &kwargs)? {
            return Ok(context);
        }
        if is_model_output_class(py, obj)? {
            return self.construct_model_output(obj, args, kwargs);
        }
        if self.is_plain_class(obj)? {
            return self.construct(obj, args, kwargs);
        }
        if obj.is_instance(&h.method_type)? {
            let source = self
                .source(callee)
                .map(|s| Rc::new(Source::Attr(s, "__self__".into())));
            let receiver = self.wrap(&obj.getattr("__self__")?, source)?;
            let mut all = vec![receiver];
            all.extend(args);
            let func = obj.getattr("__func__")?;
            if func.is_instance(&h.function_type)? {
                return self.call_python(&func, all, kwargs);
            }
            // A method made by another callable's `__get__` (an `lru_cache`d function
            // stored on a class): that callable, with the receiver first.
            let func_source = self
                .source(callee)
                .map(|s| Rc::new(Source::Attr(s, "__func__".into())));
            let func = self.wrap(&func, func_source)?;
            return self.call_function(func, all, kwargs);
        }
        if h.foldable.contains(obj).unwrap_or(false) {
            return self.call_builtin(obj, args, kwargs);
        }
        // An instance of a Python class with a Python `__call__` (torchvision's
        // `LevelMapper`): the call is that method's, looked up as `obj.__call__` so the
        // class lookup is guarded like any method's.
        let call = obj.get_type().getattr("__call__");
        if !obj.is_instance_of::<pyo3::types::PyType>()
            && call.is_ok_and(|c| c.is_instance_of::<pyo3::types::PyFunction>())
        {
            let method = self.get_attr(callee, "__call__")?;
            return self.call_function(method, args, kwargs);
        }
        // Methods of constants (`"x".startswith`, `(1, 2).index`, `"ab".__len__`) are pure.
        let type_name = obj.get_type().name()?;
        if type_name == "builtin_function_or_method" || type_name == "method-wrapper" {
            if let Ok(owner) = obj.getattr("__self__") {
                if h.is_constant(&owner)? {
                    return self.call_builtin(obj, args, kwargs);
                }
                // Reading a read-only view the trace made (`inspect.signature(f).parameters`,
                // made from what the trace guarded): `values()`, `get(name)`, ...
                let name = obj.getattr("__name__")?;
                if self.source(callee).is_none()
                    && owner.get_type().name()? == "mappingproxy"
                    && MAPPING_PROXY_READS.contains(&name.extract::<String>()?.as_str())
                {
                    return self.call_builtin(obj, args, kwargs);
                }
            }
        }
        unsupported(
            BreakKind::UnsupportedCall,
            format!("calling {}", describe(obj)),
        )
    }

    /// Inlines a Python function: binds the arguments as CPython would and translates its
    /// code in a nested frame.
    pub fn call_python(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        self.call_python_from(func, None, args, kwargs)
    }

    /// Inlines a Python function read from `source` (if it has one): its defaults and
    /// closure cells are read through that source, so a new function object with the same
    /// code on a later call is checked for what it holds, not for being the same object.
    pub fn call_python_from(
        &mut self,
        func: &Bound<'py, PyAny>,
        source: Option<Rc<Source>>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        if let Some(result) = self.optimizer_init_group(func, &args, &kwargs)? {
            return Ok(result);
        }
        if let Some(module) = self.module_to_without_change(func, &args, &kwargs)? {
            return Ok(module);
        }
        if let Some(none) = self.stand_in_module_init(func, &args, &kwargs)? {
            return Ok(none);
        }
        let code = func.getattr("__code__")?;
        if let Some(source) = &source {
            // The function's identity (or what it holds) is guarded where it was read; its
            // code can be replaced in place (`fn.__code__ = other.__code__`).
            self.guards.add(
                Rc::new(Source::Attr(source.clone(), "__code__".into())),
                super::guards::GuardKind::Id(OwnedRef::from_bound(&code)),
            );
        }
        let flags: u32 = code.getattr("co_flags")?.extract()?;
        let generator = flags & CO_GENERATOR_LIKE == CO_GENERATOR;
        if flags & CO_GENERATOR_LIKE != 0 && !generator {
            return unsupported(
                BreakKind::Generator,
                format!("calling the coroutine {}", describe(func)),
            );
        }
        let globals = func
            .getattr("__globals__")?
            .cast_into::<PyDict>()
            .map_err(PyErr::from)?;
        let builtins = match globals.get_item("__builtins__")? {
            Some(b) => b,
            None => self.h.builtins.clone(),
        };
        let mut state = frame_state(&code, globals, builtins, false)?;
        let defaults = Defaults::Real {
            function: func.clone(),
            source: source.clone(),
            defaults: func.getattr("__defaults__")?,
            kwdefaults: func.getattr("__kwdefaults__")?,
        };
        self.bind_arguments(&mut state, &code, &args, &kwargs, defaults)?;
        let closure = func.getattr("__closure__")?;
        if !closure.is_none() {
            let first_free = state.slot_names.len() - closure.len()?;
            let closure_source = source
                .as_ref()
                .map(|s| Rc::new(Source::Attr(s.clone(), "__closure__".into())));
            for (i, cell) in closure.try_iter()?.enumerate() {
                let cell_source = closure_source.as_ref().map(|c| {
                    Rc::new(Source::Item(
                        c.clone(),
                        super::source::ItemKey::Int(i as i64),
                    ))
                });
                state.cells.insert(
                    first_free + i,
                    Cell::Real(OwnedRef::from_bound(&cell?), cell_source),
                );
            }
        }
        let _ = py;
        if generator {
            return self.new_generator(state);
        }
        self.enter_depth()?;
        let result = self.run(&mut state);
        self.depth -= 1;
        result
    }

    fn inline_traced(
        &mut self,
        function: &Rc<TracedFunction>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let code = function.code.bind(py).clone();
        let flags: u32 = code.getattr("co_flags")?.extract()?;
        // A generator expression is a generator function too, run as far as it is consumed.
        let generator = flags & CO_GENERATOR_LIKE == CO_GENERATOR;
        if flags & CO_GENERATOR_LIKE != 0 && !generator {
            return unsupported(BreakKind::Generator, "calling a nested coroutine");
        }
        let defaults = match function.defaults {
            Some(d) => self.items_of(d)?,
            None => Vec::new(),
        };
        let kwdefaults = match function.kwdefaults.map(|kw| self.kind(kw)) {
            Some(VarKind::Dict(entries)) => entries
                .iter()
                .map(|(k, v)| Ok((k.bind(py).extract::<String>()?, *v)))
                .collect::<PyResult<Vec<_>>>()?,
            _ => Vec::new(),
        };
        let globals = function
            .globals
            .bind(py)
            .cast::<PyDict>()
            .map_err(PyErr::from)?
            .clone();
        let mut state = frame_state(&code, globals, function.builtins.bind(py).clone(), false)?;
        self.bind_arguments(
            &mut state,
            &code,
            &args,
            &kwargs,
            Defaults::Traced {
                defaults,
                kwdefaults,
            },
        )?;
        let first_free = state.slot_names.len() - function.closure.len();
        for (i, cell) in function.closure.iter().enumerate() {
            state.cells.insert(first_free + i, cell.clone());
        }
        if generator {
            return self.new_generator(state);
        }
        self.enter_depth()?;
        let result = self.run(&mut state);
        self.depth -= 1;
        result
    }

    /// Binds call arguments to the parameters of `code` as CPython would, putting each
    /// parameter's tracker in its local slot.
    fn bind_arguments(
        &mut self,
        state: &mut FrameState<'py>,
        code: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
        defaults: Defaults<'py>,
    ) -> CResult<()> {
        let params = self.parameters(code)?;
        let keywords: Vec<&str> = kwargs.iter().map(|(k, _)| k.as_str()).collect();
        let (ndefaults, kwdefault_names): (usize, Vec<String>) = match &defaults {
            Defaults::Real {
                defaults,
                kwdefaults,
                ..
            } => (
                if defaults.is_none() {
                    0
                } else {
                    defaults.len()?
                },
                if kwdefaults.is_none() {
                    Vec::new()
                } else {
                    kwdefaults
                        .try_iter()?
                        .map(|k| k?.extract::<String>())
                        .collect::<PyResult<_>>()?
                },
            ),
            Defaults::Traced {
                defaults,
                kwdefaults,
            } => (
                defaults.len(),
                kwdefaults.iter().map(|(k, _)| k.clone()).collect(),
            ),
        };
        let kwdefault_refs: Vec<&str> = kwdefault_names.iter().map(String::as_str).collect();
        let func = match &defaults {
            Defaults::Real {
                function, source, ..
            } => Some((function.clone(), source.clone())),
            Defaults::Traced { .. } => None,
        };
        let bound = match binding::bind(&params, args.len(), &keywords, ndefaults, &kwdefault_refs)
        {
            Ok(b) => b,
            Err(message) => {
                let name = code.getattr("co_qualname")?;
                return unsupported(
                    BreakKind::ExceptionWhileTracing,
                    format!("arguments do not fit {name}(): {message}"),
                );
            }
        };
        for (name, value) in params.names.iter().zip(bound) {
            let var = match value {
                ParamValue::Positional(i) => args[i],
                ParamValue::Keyword(k) => kwargs[k].1,
                ParamValue::Default(i) => match &defaults {
                    Defaults::Real { defaults, .. } => {
                        // A default of a real function is state of that function: the tuple
                        // can be replaced (`f.__defaults__ = ...`) and a mutable default
                        // (a list) changed in place, so it is read through a source.
                        // The tuple itself is immutable: guarded by identity, its constant
                        // items need no check of their own.
                        let value = defaults.get_item(i)?;
                        let tuple_source =
                            self.function_attr_source(func.as_ref(), "__defaults__")?;
                        // A function from a source may be a new closure next time, with a
                        // new (equal) tuple: its items are guarded one by one instead.
                        let by_items = matches!(&func, Some((_, Some(_))));
                        if !by_items {
                            self.guards.add(
                                tuple_source.clone(),
                                GuardKind::Id(OwnedRef::from_bound(defaults)),
                            );
                        }
                        if self.h.is_constant(&value)? && !by_items {
                            self.wrap(&value, None)?
                        } else {
                            let source = Rc::new(Source::Item(
                                tuple_source,
                                super::source::ItemKey::Int(i as i64),
                            ));
                            self.wrap(&value, Some(source))?
                        }
                    }
                    Defaults::Traced { defaults, .. } => defaults[i],
                },
                ParamValue::KwDefault => match &defaults {
                    Defaults::Real { kwdefaults, .. } => {
                        let value = kwdefaults.get_item(name)?;
                        let source = Rc::new(Source::Item(
                            self.function_attr_source(func.as_ref(), "__kwdefaults__")?,
                            super::source::ItemKey::Str(name.clone()),
                        ));
                        self.wrap(&value, Some(source))?
                    }
                    Defaults::Traced { kwdefaults, .. } => {
                        kwdefaults.iter().find(|(k, _)| k == name).expect("bound").1
                    }
                },
                ParamValue::VarArgs(indices) => {
                    let items = indices.iter().map(|&i| args[i]).collect();
                    self.add(VarKind::Tuple(items), None)
                }
                ParamValue::VarKeywords(indices) => {
                    let entries = indices
                        .iter()
                        .map(|&k| {
                            let key = pyo3::types::PyString::new(self.py, &kwargs[k].0);
                            (OwnedRef::from_bound(key.as_any()), kwargs[k].1)
                        })
                        .collect();
                    self.add(VarKind::Dict(entries), None)
                }
            };
            let Some(slot) = state.slot_names.iter().position(|n| n == name) else {
                return unsupported(BreakKind::Internal, format!("parameter {name} has no slot"));
            };
            state.locals[slot] = Some(var);
        }
        Ok(())
    }

    /// `function.<attr>` read from the function object itself (held by the guard).
    fn function_attr_source(
        &self,
        function: Option<&(Bound<'py, PyAny>, Option<Rc<Source>>)>,
        attr: &str,
    ) -> CResult<Rc<Source>> {
        let Some((function, source)) = function else {
            return unsupported(
                BreakKind::Internal,
                "internal: defaults of a real function without the function",
            );
        };
        // Through the function's own source when it has one (a new function object with
        // the same code may come next time); otherwise the function held by the guard.
        let base = match source {
            Some(s) => s.clone(),
            None => {
                let what = format!("<function {}>", function_name(function));
                Rc::new(Source::Object(OwnedRef::from_bound(function), what))
            }
        };
        Ok(Rc::new(Source::Attr(base, attr.into())))
    }

    /// The parameter layout of `code`, read once per code object and capture.
    fn parameters(&mut self, code: &Bound<'py, PyAny>) -> CResult<Rc<binding::Parameters>> {
        let key = code.as_ptr() as usize;
        if let Some((_, params)) = self.parameter_cache.get(&key) {
            return Ok(params.clone());
        }
        let argcount: usize = code.getattr("co_argcount")?.extract()?;
        let kwonly: usize = code.getattr("co_kwonlyargcount")?.extract()?;
        let flags: u32 = code.getattr("co_flags")?.extract()?;
        let varargs = flags & 0x04 != 0;
        let varkw = flags & 0x08 != 0;
        let count = argcount + kwonly + usize::from(varargs) + usize::from(varkw);
        let names: Vec<String> = code.getattr("co_varnames")?.extract()?;
        let params = Rc::new(binding::Parameters {
            names: names.into_iter().take(count).collect(),
            argcount,
            posonly: code.getattr("co_posonlyargcount")?.extract()?,
            kwonly,
            varargs,
            varkw,
        });
        // The code object is kept with its entry so its address cannot be reused meanwhile.
        self.parameter_cache
            .insert(key, (OwnedRef::from_bound(code), params.clone()));
        Ok(params)
    }
}

/// Whether `cls` is a transformers `ModelOutput` subclass (only if transformers is loaded).
fn is_model_output_class(py: Python<'_>, cls: &Bound<'_, PyAny>) -> PyResult<bool> {
    let modules = py.import_module("sys")?.getattr("modules")?;
    let Ok(generic) = modules.get_item("transformers.utils.generic") else {
        return Ok(false);
    };
    let Ok(model_output) = generic.getattr("ModelOutput") else {
        return Ok(false);
    };
    Ok(cls.is_instance_of::<pyo3::types::PyType>()
        && !cls.is(&model_output)
        && py
            .import_module("builtins")?
            .getattr("issubclass")?
            .call1((cls, model_output))?
            .is_truthy()?)
}

pub fn function_name(obj: &Bound<'_, PyAny>) -> String {
    obj.getattr("__name__")
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "call".into())
}

pub fn describe(obj: &Bound<'_, PyAny>) -> String {
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    match obj
        .getattr("__qualname__")
        .or_else(|_| obj.getattr("__name__"))
    {
        // A pybind11 function's qualified name is its internal record type's
        // (`pybind11_detail_function_record_v1_..._push_saved_tensors_default_hooks`): its
        // module and name say what it is (`torch._C._autograd._push_saved_tensors_...`).
        Ok(name) if name.to_string().starts_with("pybind11_") => {
            match (obj.getattr("__module__"), obj.getattr("__name__")) {
                (Ok(module), Ok(short)) if !module.is_none() => {
                    format!("{module}.{short} ({type_name})")
                }
                _ => format!("{name} ({type_name})"),
            }
        }
        Ok(name) => format!("{name} ({type_name})"),
        Err(_) => format!("a {type_name} object"),
    }
}

/// `inspect.getattr_static(obj, name)`, or None when there is no such attribute.
pub(super) fn py_getattr_static<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let inspect = obj.py().import_module("inspect")?;
    Ok(inspect.call_method1("getattr_static", (obj, name)).ok())
}

/// Whether `obj` is a function `torch.compiler.disable` / `torch._dynamo.disable` returned
/// (it carries `_torchdynamo_disable = True`): read from the function's own `__dict__`, so
/// the common case (no such attribute) raises nothing.
pub(super) fn torch_disabled(obj: &Bound<'_, PyAny>) -> bool {
    let Ok(function) = obj.cast::<pyo3::types::PyFunction>() else {
        return false;
    };
    function
        .getattr(pyo3::intern!(obj.py(), "__dict__"))
        .ok()
        .and_then(|d| d.cast_into::<pyo3::types::PyDict>().ok())
        .and_then(|d| d.get_item("_torchdynamo_disable").ok().flatten())
        .is_some_and(|v| v.is_truthy().unwrap_or(false))
}
