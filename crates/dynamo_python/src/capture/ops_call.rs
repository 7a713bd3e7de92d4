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

use super::break_reasons::BreakKind;
use std::rc::Rc;

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::graph::{Arg, Op};
use super::guards::GuardKind;
use super::source::Source;
use super::translator::{frame_state, kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{Cell, DictViewKind, TracedFunction, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use dynamo_bytecode::binding::{self, ParamValue};

const CO_GENERATOR_LIKE: u32 = 0x20 | 0x80 | 0x100 | 0x200;

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

    /// `super()` in a method: the class from the `__class__` cell, the receiver from the
    /// first argument.
    fn zero_arg_super(&mut self, f: &FrameState<'py>) -> CResult<VarId> {
        let Some(slot) = f.slot_names.iter().position(|n| n == "__class__") else {
            return unsupported(BreakKind::SuperCall, "super() without a __class__ cell");
        };
        let cls = match f.cells.get(&slot) {
            Some(Cell::Real(cell, _)) => cell.bind(self.py).getattr("cell_contents")?,
            _ => match f
                .locals
                .get(slot)
                .copied()
                .flatten()
                .and_then(|v| self.real(v))
            {
                Some(cls) => cls,
                None => {
                    return unsupported(
                        BreakKind::SuperCall,
                        "super() whose class cell the translator does not know",
                    )
                }
            },
        };
        let Some(receiver) = f.locals.first().copied().flatten() else {
            return unsupported(BreakKind::SuperCall, "super() without a first argument");
        };
        Ok(self.add(
            VarKind::Super {
                cls: OwnedRef::from_bound(&cls),
                receiver,
            },
            None,
        ))
    }

    pub(super) fn op_import_name(&mut self, f: &mut FrameState<'py>, i: u32) -> CResult<Flow> {
        let fromlist = self.pop(f)?;
        let level = self.pop(f)?;
        let name = f.names.get_item(i as usize)?.to_string();
        let level: i64 = self.python_value(level)?.extract()?;
        if level != 0 {
            return unsupported(BreakKind::Import, format!("a relative import of {name}"));
        }
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
                        kwargs.push((k.bind(self.py).to_string(), v));
                    }
                }
                other => {
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
        if flags & 0x04 != 0 {
            self.pop(f)?; // annotations do not affect behaviour
        }
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
                    other => {
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
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    pub fn call_function(
        &mut self,
        callee: VarId,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        if let Some(result) = self.grad_mode_call(callee)? {
            return Ok(result);
        }
        let py = self.py;
        match self.kind(callee) {
            VarKind::Method {
                receiver,
                name,
                func: None,
            } => {
                let (receiver, name) = (*receiver, name.clone());
                if matches!(self.kind(receiver), VarKind::Tensor { .. }) {
                    self.tensor_method(receiver, &name, args, kwargs)
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
                self.call_python(&func, all, kwargs)
            }
            VarKind::Function(function) => {
                let function = function.clone();
                self.inline_traced(&function, args, kwargs)
            }
            VarKind::Const(obj) | VarKind::Object(obj) => {
                let obj = obj.bind(py).clone();
                self.call_object(callee, &obj, args, kwargs)
            }
            other => unsupported(
                BreakKind::UnsupportedCall,
                format!("calling {}", kind_name(other)),
            ),
        }
    }

    /// `dict.fromkeys(keys[, value])` over constant keys: a traced dict whose entries all
    /// hold the one `value` (the same object, as in Python).
    fn dict_fromkeys(&mut self, args: Vec<VarId>) -> CResult<VarId> {
        let py = self.py;
        let keys = self.items_of(args[0])?;
        let value = match args.get(1) {
            Some(&v) => v,
            None => self.constant(&py.None().into_bound(py)),
        };
        let seen = PyDict::new(py);
        let mut entries = Vec::with_capacity(keys.len());
        for key in keys {
            let VarKind::Const(k) = self.kind(key) else {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!(
                        "dict.fromkeys() with a key that is {}",
                        kind_name(self.kind(key))
                    ),
                );
            };
            let k = k.clone();
            if !self.h.is_constant(&k.bind(py).clone())? {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "dict.fromkeys() with a key that is not a constant",
                );
            }
            // A key given twice keeps its first place (and the one value).
            if seen.contains(k.bind(py))? {
                continue;
            }
            seen.set_item(k.bind(py), py.None())?;
            entries.push((k, value));
        }
        Ok(self.add(VarKind::Dict(entries), None))
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
        // Only inlining a user function leaves its identity unread (its code and closure
        // are guarded instead); every other way of calling depends on which object it is.
        let user_function = obj.get_type().is(&h.function_type)
            && !h.is_compiling.iter().any(|f| f.is(obj))
            && !h.always_false.iter().any(|f| f.is(obj))
            && !h.foldable.contains(obj).unwrap_or(true)
            && !h.is_graph_function.call1((obj,))?.is_truthy()?;
        // A module call reads what it needs through the module's source (`call_module`).
        if !user_function && !obj.is_instance(&h.module_type)? {
            self.pin_identity(callee);
        }
        if h.is_compiling.iter().any(|f| f.is(obj)) {
            return Ok(self.constant(&true.into_pyobject(py)?.to_owned().into_any()));
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
        if obj.is_instance(&h.module_type)? {
            return self.call_module(callee, obj, args, kwargs);
        }
        let is_operator = obj
            .getattr("__module__")
            .map(|m| m.to_string() == "_operator")
            .unwrap_or(false);
        if self.any_tensor(&args, &kwargs)
            && (is_operator || h.is_graph_function.call1((obj,))?.is_truthy()?)
        {
            return self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(obj)),
                &function_name(obj),
                args,
                kwargs,
            );
        }
        // Factory functions (`torch.zeros(3)`, `torch.arange(n)`) make tensors from constants:
        // graph nodes too, unless they are pure queries evaluated below.
        if !h.foldable.contains(obj).unwrap_or(false)
            && h.is_graph_function.call1((obj,))?.is_truthy()?
        {
            return self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(obj)),
                &function_name(obj),
                args,
                kwargs,
            );
        }
        if obj.is(&h.builtins.getattr("super")?) && args.is_empty() {
            return unsupported(
                BreakKind::SuperCall,
                "super() outside a method the translator knows",
            );
        }
        if is_dict_fromkeys(obj, &h.dict_type) && kwargs.is_empty() && (1..=2).contains(&args.len())
        {
            return self.dict_fromkeys(args);
        }
        if h.foldable.contains(obj).unwrap_or(false) {
            return self.call_builtin(obj, args, kwargs);
        }
        if obj.is_instance(&h.function_type)? {
            let source = self.source(callee);
            return self.call_python_from(obj, source, args, kwargs);
        }
        if let Some(context) = self.grad_mode_context(obj, &args)? {
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
            return self.call_python(&obj.getattr("__func__")?, all, kwargs);
        }
        if is_dict_fromkeys(obj, &h.dict_type) && kwargs.is_empty() && (1..=2).contains(&args.len())
        {
            return self.dict_fromkeys(args);
        }
        if h.foldable.contains(obj).unwrap_or(false) {
            return self.call_builtin(obj, args, kwargs);
        }
        // Methods of constants (`"x".startswith`, `(1, 2).index`) are pure.
        if obj.get_type().name()? == "builtin_function_or_method" {
            if let Ok(owner) = obj.getattr("__self__") {
                if h.is_constant(&owner)? {
                    return self.call_builtin(obj, args, kwargs);
                }
            }
        }
        unsupported(
            BreakKind::UnsupportedCall,
            format!("calling {}", describe(obj)),
        )
    }

    /// `module(*args)`: inline `forward` when no hooks could run.
    fn call_module(
        &mut self,
        module_var: VarId,
        module: &Bound<'py, PyAny>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        for hooks in [
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
        ] {
            if module.getattr(hooks)?.len()? != 0 {
                return unsupported(
                    BreakKind::Hooks,
                    format!("a call of {} with {hooks}", describe(module)),
                );
            }
        }
        let globals = self.py.import_module("torch.nn.modules.module")?;
        for hooks in [
            "_global_forward_hooks",
            "_global_forward_pre_hooks",
            "_global_backward_hooks",
            "_global_backward_pre_hooks",
            "_global_forward_hooks_always_called",
        ] {
            if globals.getattr(hooks)?.len()? != 0 {
                return unsupported(
                    BreakKind::Hooks,
                    format!("a module call with global {hooks} registered"),
                );
            }
        }
        // Hooks added later must recompile: the hook dicts stay empty.
        if let Some(source) = self.source(module_var) {
            for hooks in [
                "_forward_hooks",
                "_forward_pre_hooks",
                "_backward_hooks",
                "_backward_pre_hooks",
            ] {
                self.guards.add(
                    Rc::new(Source::Attr(source.clone(), hooks.into())),
                    GuardKind::Len(0),
                );
            }
        }
        let module_globals = globals.getattr("__dict__")?;
        for hooks in [
            "_global_forward_hooks",
            "_global_forward_pre_hooks",
            "_global_backward_hooks",
            "_global_backward_pre_hooks",
            "_global_forward_hooks_always_called",
        ] {
            let source = Rc::new(Source::Global {
                globals: OwnedRef::from_bound(&module_globals),
                builtins: OwnedRef::from_bound(&self.h.builtins),
                name: hooks.into(),
                root: false,
            });
            self.guards.add(source, GuardKind::Len(0));
        }
        self.guard_class(module.get_type().as_any(), "forward")?;
        let forward = module.get_type().getattr("forward")?;
        if !forward.is_instance(&self.h.function_type)? {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "{} whose forward is not a Python function",
                    describe(module)
                ),
            );
        }
        let mut all = vec![module_var];
        all.extend(args);
        self.call_python(&forward, all, kwargs)
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
        let code = func.getattr("__code__")?;
        let flags: u32 = code.getattr("co_flags")?.extract()?;
        if flags & CO_GENERATOR_LIKE != 0 {
            return unsupported(
                BreakKind::Generator,
                format!("calling the generator or coroutine {}", describe(func)),
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
        let is_genexpr = flags & 0x20 != 0 && code.getattr("co_name")?.to_string() == "<genexpr>";
        if flags & CO_GENERATOR_LIKE != 0 && !is_genexpr {
            return unsupported(BreakKind::Generator, "calling a nested generator function");
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
        if is_genexpr {
            // Consumed right away by its caller (`all(...)`, `sum(...)`, a loop): run it to
            // the end and hand back the items.
            state.yields = Some(Vec::new());
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

    /// A tensor method call.
    fn tensor_method(
        &mut self,
        receiver: VarId,
        name: &str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let VarKind::Tensor { fake, .. } = self.kind(receiver) else {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("method {name} of {}", kind_name(self.kind(receiver))),
            );
        };
        let fake = fake.bind(py).clone();
        match name {
            "size" | "dim" | "ndimension" | "numel" | "nelement" | "stride" | "is_contiguous"
            | "element_size" | "is_floating_point" | "is_complex" | "__len__" => {
                if self.any_tensor(&args, &kwargs) {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!("tensor.{name} with tensor arguments"),
                    );
                }
                // Every argument counts (`is_contiguous(memory_format=torch.channels_last)`,
                // `size(dim=1)`): the fake tensor answers from the same metadata.
                let py_kwargs = PyDict::new(py);
                for (k, v) in &kwargs {
                    py_kwargs.set_item(k, self.python_value(*v)?)?;
                }
                let value = fake.call_method(name, self.python_args(&args)?, Some(&py_kwargs))?;
                Ok(self.constant(&value))
            }
            "item" | "tolist" | "numpy" | "__bool__" | "__int__" | "__float__" | "nonzero"
            | "cpu_numpy" => unsupported(
                BreakKind::TensorValueNeeded,
                format!("tensor.{name}() needs the tensor's data"),
            ),
            _ => {
                let mut all = vec![receiver];
                all.extend(args);
                self.graph_call(Op::CallMethod(name.to_string()), name, all, kwargs)
            }
        }
    }

    /// Methods of containers built or read by the trace. Mutating methods are allowed on
    /// containers the trace built (no source); mutating the frame's own would be a side
    /// effect to replay, which is not supported yet.
    fn container_method(
        &mut self,
        receiver: VarId,
        name: &str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        if !kwargs.is_empty() {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("keyword arguments to {name}()"),
            );
        }
        let owned = self.source(receiver).is_none();
        let none = || py.None().into_bound(py);
        let environ = py.import_module("os")?.getattr("environ")?;
        if matches!(self.kind(receiver), VarKind::Object(o) if o.bind(py).is(&environ)) {
            return self.environ_lookup(receiver, &environ, name, &args);
        }
        match (self.kind(receiver), name) {
            (VarKind::Dict(entries), "get" | "pop" | "__getitem__") => {
                let key = self.python_value(args[0])?;
                let position = entries
                    .iter()
                    .position(|(k, _)| k.bind(py).eq(&key).unwrap_or(false));
                let found = position.map(|i| entries[i].1);
                if let (true, Some(at)) = (name == "pop", position) {
                    if !owned {
                        return unsupported(
                            BreakKind::UnreplayableSideEffect,
                            "dict.pop on a dict from the frame's inputs",
                        );
                    }
                    if let VarKind::Dict(entries) = &mut self.vars[receiver.0 as usize].kind {
                        entries.remove(at);
                    }
                }
                match (found, args.get(1)) {
                    (Some(v), _) => Ok(v),
                    (None, Some(&default)) => Ok(default),
                    (None, None) if name == "get" => Ok(self.constant(&none())),
                    (None, None) => unsupported(
                        BreakKind::ExceptionWhileTracing,
                        format!("missing key {key} in {name}()"),
                    ),
                }
            }
            (VarKind::Dict(_), "keys" | "values" | "items") => {
                let which = match name {
                    "keys" => DictViewKind::Keys,
                    "values" => DictViewKind::Values,
                    _ => DictViewKind::Items,
                };
                Ok(self.add(
                    VarKind::DictView {
                        dict: receiver,
                        which,
                    },
                    None,
                ))
            }
            (VarKind::Dict(entries), "copy") => {
                let entries = entries.clone();
                Ok(self.add(VarKind::Dict(entries), None))
            }
            (VarKind::Dict(_), "update" | "setdefault") if owned => {
                if name == "update" {
                    let VarKind::Dict(new) = self.kind(args[0]) else {
                        return unsupported(
                            BreakKind::UnsupportedOperation,
                            "dict.update from something that is not a dict",
                        );
                    };
                    let new = new.clone();
                    if let VarKind::Dict(entries) = &mut self.vars[receiver.0 as usize].kind {
                        for (k, v) in new {
                            match entries
                                .iter_mut()
                                .find(|(old, _)| old.bind(py).eq(k.bind(py)).unwrap_or(false))
                            {
                                Some(slot) => slot.1 = v,
                                None => entries.push((k, v)),
                            }
                        }
                    }
                    return Ok(self.constant(&none()));
                }
                let key = self.python_value(args[0])?;
                let default = match args.get(1) {
                    Some(&d) => d,
                    None => self.constant(&none()),
                };
                if let VarKind::Dict(entries) = &mut self.vars[receiver.0 as usize].kind {
                    if let Some((_, v)) = entries
                        .iter()
                        .find(|(k, _)| k.bind(py).eq(&key).unwrap_or(false))
                    {
                        return Ok(*v);
                    }
                    entries.push((OwnedRef::from_bound(&key), default));
                }
                Ok(default)
            }
            (VarKind::List(_), "append" | "extend" | "insert" | "pop" | "clear" | "reverse")
                if owned =>
            {
                let new_items = if name == "extend" {
                    Some(self.items_of(args[0])?)
                } else {
                    None
                };
                let index = match (name, args.first()) {
                    ("insert" | "pop", Some(&i)) => Some(self.python_value(i)?.extract::<i64>()?),
                    _ => None,
                };
                let VarKind::List(items) = &mut self.vars[receiver.0 as usize].kind else {
                    unreachable!()
                };
                let normalize = |i: i64, len: usize| -> usize {
                    if i < 0 {
                        (len as i64 + i).max(0) as usize
                    } else {
                        (i as usize).min(len)
                    }
                };
                let mut popped = None;
                match name {
                    "append" => items.push(args[0]),
                    "extend" => items.extend(new_items.expect("extend items")),
                    "insert" => {
                        let at = normalize(index.unwrap_or(0), items.len());
                        items.insert(at, args[1]);
                    }
                    "pop" => {
                        if items.is_empty() {
                            return unsupported(
                                BreakKind::ExceptionWhileTracing,
                                "pop from an empty list while tracing",
                            );
                        }
                        let at = index.map_or(items.len() - 1, |i| {
                            normalize(i, items.len()).min(items.len() - 1)
                        });
                        popped = Some(items.remove(at));
                    }
                    "clear" => items.clear(),
                    _ => items.reverse(),
                }
                Ok(match popped {
                    Some(v) => v,
                    None => self.constant(&none()),
                })
            }
            (VarKind::List(items) | VarKind::Tuple(items), "index" | "count" | "copy") => {
                if name == "copy" {
                    let items = items.clone();
                    return Ok(self.add(VarKind::List(items), None));
                }
                if self.contains_tensor(receiver) {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("{name}() on a sequence of tensors"),
                    );
                }
                let seq = self.python_value(receiver)?;
                let result = seq.call_method1(name, self.python_args(&args)?)?;
                Ok(self.constant(&result))
            }
            (
                VarKind::Instance {
                    model_output: true, ..
                },
                "to_tuple" | "values" | "keys" | "items" | "get",
            ) => {
                let items = self.model_output_items(receiver);
                let string = |this: &mut Self, k: &str| {
                    this.constant(&pyo3::types::PyString::new(py, k).into_any())
                };
                match name {
                    "to_tuple" | "values" => {
                        let values = items.into_iter().map(|(_, v)| v).collect();
                        Ok(self.add(VarKind::Tuple(values), None))
                    }
                    "keys" => {
                        let keys = items.iter().map(|(k, _)| string(self, k)).collect();
                        Ok(self.add(VarKind::Tuple(keys), None))
                    }
                    "items" => {
                        let mut pairs = Vec::new();
                        for (k, v) in items {
                            let k = string(self, &k);
                            pairs.push(self.add(VarKind::Tuple(vec![k, v]), None));
                        }
                        Ok(self.add(VarKind::Tuple(pairs), None))
                    }
                    _ => {
                        let key: String = self.python_value(args[0])?.extract()?;
                        match (items.iter().find(|(k, _)| *k == key), args.get(1)) {
                            (Some((_, v)), _) => Ok(*v),
                            (None, Some(&default)) => Ok(default),
                            (None, None) => Ok(self.constant(&none())),
                        }
                    }
                }
            }
            (
                VarKind::Object(dict),
                "get" | "__getitem__" | "__contains__" | "keys" | "items" | "values",
            ) => {
                let dict = dict.bind(py).clone();
                self.dict_object_lookup(receiver, &dict, name, &args)
            }
            (other, _) => unsupported(
                BreakKind::UnsupportedCall,
                format!("the method {name}() of {}", kind_name(other)),
            ),
        }
    }

    /// `os.environ.get(k)`, `os.environ[k]`, `k in os.environ`: the answer is guarded (the
    /// variable's value, or its absence), so setting the variable later recompiles.
    fn environ_lookup(
        &mut self,
        receiver: VarId,
        environ: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
    ) -> CResult<VarId> {
        let py = self.py;
        let Some(source) = self.source(receiver) else {
            return unsupported(
                BreakKind::Environment,
                "os.environ reached without a source",
            );
        };
        if !matches!(name, "get" | "__getitem__" | "__contains__") || args.is_empty() {
            return unsupported(BreakKind::Environment, format!("os.environ.{name}()"));
        }
        let key = self.python_value(args[0])?;
        if !key.is_exact_instance_of::<pyo3::types::PyString>() {
            return unsupported(
                BreakKind::Environment,
                "os.environ looked up with a key that is not a str",
            );
        }
        let present = environ.contains(&key)?;
        if name == "__contains__" || !present {
            self.guards.add(
                source.clone(),
                GuardKind::Contains(OwnedRef::from_bound(&key), present),
            );
        }
        match (name, present) {
            ("__contains__", _) => {
                Ok(self.constant(&present.into_pyobject(py)?.to_owned().into_any()))
            }
            (_, true) => {
                let value = environ.get_item(&key)?;
                let item_source = Rc::new(Source::Item(source, super::source::ItemKey::of(&key)));
                self.wrap(&value, Some(item_source))
            }
            ("get", false) => match args.get(1) {
                Some(&default) => Ok(default),
                None => Ok(self.constant(&py.None().into_bound(py))),
            },
            _ => unsupported(
                BreakKind::Environment,
                format!("os.environ[{key}]: the variable is not set"),
            ),
        }
    }

    /// Read-only lookups on a real dict object: its keys are guarded, and each value read
    /// comes through an item source, so a later change to the dict recompiles.
    fn dict_object_lookup(
        &mut self,
        receiver: VarId,
        dict: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
    ) -> CResult<VarId> {
        let py = self.py;
        let Some(source) = self.source(receiver) else {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!("{name}() on a dict that is not an input of the frame"),
            );
        };
        let keys = PyTuple::new(py, dict.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
        if !keys
            .iter()
            .all(|k| k.is_instance_of::<pyo3::types::PyString>())
        {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("{name}() on a dict with keys that are not strings"),
            );
        }
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(dict.get_type().as_any())),
        );
        self.guards.add(
            source.clone(),
            GuardKind::Keys(OwnedRef::from_bound(keys.as_any())),
        );
        let item = |this: &mut Self, key: &Bound<'py, PyAny>| -> CResult<VarId> {
            let value = dict.get_item(key)?;
            let item_source = Rc::new(Source::Item(
                source.clone(),
                super::source::ItemKey::of(key),
            ));
            this.wrap(&value, Some(item_source))
        };
        match name {
            "keys" => {
                let items = keys.iter().map(|k| self.constant(&k)).collect();
                Ok(self.add(VarKind::Tuple(items), None))
            }
            "values" | "items" => {
                let mut out = Vec::new();
                for key in keys.iter() {
                    let value = item(self, &key)?;
                    out.push(if name == "values" {
                        value
                    } else {
                        let k = self.constant(&key);
                        self.add(VarKind::Tuple(vec![k, value]), None)
                    });
                }
                Ok(self.add(VarKind::Tuple(out), None))
            }
            _ => {
                let Some(&key_var) = args.first() else {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("{name}() without a key"),
                    );
                };
                let key = self.python_value(key_var)?;
                let present = keys.contains(&key)?;
                match (name, present) {
                    ("__contains__", _) => {
                        Ok(self.constant(&present.into_pyobject(py)?.to_owned().into_any()))
                    }
                    (_, true) => item(self, &key),
                    ("get", false) => match args.get(1) {
                        Some(&default) => Ok(default),
                        None => Ok(self.constant(&py.None().into_bound(py))),
                    },
                    _ => unsupported(
                        BreakKind::ExceptionWhileTracing,
                        format!("missing key {key} while tracing"),
                    ),
                }
            }
        }
    }

    /// Records one graph node, running the operation on fake tensors for its result.
    pub fn graph_call(
        &mut self,
        op: Op,
        name: &str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        if self.in_try {
            return unsupported(
                BreakKind::TensorOperationInTry,
                format!("the tensor operation {name} inside a try block or with statement"),
            );
        }
        let fake_args = args
            .iter()
            .map(|&a| self.fake_value(a))
            .collect::<CResult<Vec<_>>>()?;
        let fake_kwargs = PyDict::new(py);
        for (k, v) in &kwargs {
            fake_kwargs.set_item(k, self.fake_value(*v)?)?;
        }
        let target: Bound<'py, PyAny> = match &op {
            Op::CallFunction(f) => f.bind(py).clone(),
            Op::CallMethod(m) => pyo3::types::PyString::new(py, m).into_any(),
            Op::Placeholder => {
                return unsupported(BreakKind::Internal, "internal: placeholder as a call")
            }
        };
        let result = match self.h.run_fake.call1((
            &self.fake_mode,
            &target,
            PyTuple::new(py, fake_args)?,
            fake_kwargs,
        )) {
            Ok(r) => r,
            Err(err) => {
                return unsupported(
                    BreakKind::FakeTensorFailure,
                    format!("{name} failed on fake tensors: {err}"),
                )
            }
        };
        let graph_args = args
            .iter()
            .map(|&a| self.graph_arg(a))
            .collect::<CResult<Vec<_>>>()?;
        let graph_kwargs = kwargs
            .iter()
            .map(|(k, v)| Ok((k.clone(), self.graph_arg(*v)?)))
            .collect::<CResult<Vec<_>>>()?;
        let node = self.graph.add(
            op,
            name,
            graph_args,
            graph_kwargs,
            OwnedRef::from_bound(&result),
        );
        self.wrap_node_result(node, &result, name)
    }

    fn wrap_node_result(
        &mut self,
        node: super::graph::NodeId,
        result: &Bound<'py, PyAny>,
        name: &str,
    ) -> CResult<VarId> {
        let py = self.py;
        if result.is_instance(&self.h.tensor_type)? {
            return Ok(self.add(
                VarKind::Tensor {
                    node,
                    fake: OwnedRef::from_bound(result),
                },
                None,
            ));
        }
        if result.is_instance(&self.h.tuple_type)? || result.is_instance(&self.h.list_type)? {
            let getitem = self.h.operator.getattr("getitem")?;
            let mut items = Vec::new();
            for (i, item) in result.try_iter()?.enumerate() {
                let item = item?;
                if !item.is_instance(&self.h.tensor_type)? {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!("{name} returned a non-tensor item"),
                    );
                }
                let index = (i as i64).into_pyobject(py)?.into_any();
                let child = self.graph.add(
                    Op::CallFunction(OwnedRef::from_bound(&getitem)),
                    "getitem",
                    vec![Arg::Node(node), Arg::Const(OwnedRef::from_bound(&index))],
                    Vec::new(),
                    OwnedRef::from_bound(&item),
                );
                items.push(self.add(
                    VarKind::Tensor {
                        node: child,
                        fake: OwnedRef::from_bound(&item),
                    },
                    None,
                ));
            }
            let kind = if result.is_instance(&self.h.list_type)? {
                VarKind::List(items)
            } else {
                VarKind::Tuple(items)
            };
            let id = self.add(kind, None);
            // Named results (torch.return_types) keep their field names.
            let fields = result
                .get_type()
                .getattr("__match_args__")
                .or_else(|_| result.get_type().getattr("_fields"));
            if let Ok(fields) = fields {
                if let Ok(names) = fields.extract::<Vec<String>>() {
                    self.tuple_fields.insert(id, names);
                }
            }
            return Ok(id);
        }
        if self.h.is_constant(result)? {
            // Metadata-only results (sizes, dtypes) are fixed by the tensor guards.
            return Ok(self.constant(result));
        }
        unsupported(
            BreakKind::UnsupportedCall,
            format!("{name} returned {}", describe(result)),
        )
    }

    /// The value to pass to an operation run on fake tensors.
    pub fn fake_value(&self, id: VarId) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        Ok(match self.kind(id) {
            VarKind::Tensor { fake, .. } => fake.bind(py).clone(),
            VarKind::Tuple(items) => PyTuple::new(
                py,
                items
                    .iter()
                    .map(|&i| self.fake_value(i))
                    .collect::<CResult<Vec<_>>>()?,
            )?
            .into_any(),
            VarKind::List(items) => pyo3::types::PyList::new(
                py,
                items
                    .iter()
                    .map(|&i| self.fake_value(i))
                    .collect::<CResult<Vec<_>>>()?,
            )?
            .into_any(),
            VarKind::Dict(entries) => {
                let d = PyDict::new(py);
                for (k, v) in entries {
                    d.set_item(k.bind(py), self.fake_value(*v)?)?;
                }
                d.into_any()
            }
            VarKind::Const(v) | VarKind::Object(v) => {
                self.pin_identity(id);
                v.bind(py).clone()
            }
            other => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("{} as an operation argument", kind_name(other)),
                )
            }
        })
    }

    /// The graph argument for a tracker.
    pub fn graph_arg(&self, id: VarId) -> CResult<Arg> {
        Ok(match self.kind(id) {
            VarKind::Tensor { node, .. } => Arg::Node(*node),
            VarKind::Tuple(items) => Arg::Tuple(
                items
                    .iter()
                    .map(|&i| self.graph_arg(i))
                    .collect::<CResult<_>>()?,
            ),
            VarKind::List(items) => Arg::List(
                items
                    .iter()
                    .map(|&i| self.graph_arg(i))
                    .collect::<CResult<_>>()?,
            ),
            VarKind::Dict(entries) => Arg::Dict(
                entries
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), self.graph_arg(*v)?)))
                    .collect::<CResult<_>>()?,
            ),
            VarKind::Const(v) => Arg::Const(v.clone()),
            VarKind::Object(v) => {
                let value = v.bind(self.py).clone();
                if !self.immutable_object(&value)? {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("{} as a graph argument", describe(&value)),
                    );
                }
                self.pin_identity(id);
                Arg::Const(v.clone())
            }
            other => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("{} as a graph argument", kind_name(other)),
                )
            }
        })
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
        Ok(name) => format!("{name} ({type_name})"),
        Err(_) => format!("a {type_name} object"),
    }
}

/// Whether `obj` is `dict.fromkeys` bound to `dict` itself (a subclass's would make an
/// instance of the subclass).
fn is_dict_fromkeys(obj: &Bound<'_, PyAny>, dict_type: &Bound<'_, PyAny>) -> bool {
    obj.getattr("__self__")
        .is_ok_and(|owner| owner.is(dict_type))
        && obj
            .getattr("__name__")
            .is_ok_and(|n| n.to_string() == "fromkeys")
}
