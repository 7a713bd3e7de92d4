//! `MyFunction.apply(...)` of a `torch.autograd.Function`.
//!
//! When no input needs a gradient no backward can run and `apply` is `forward` run with grad
//! mode off (eager runs it that way, and its outputs carry no history), so forward is inlined
//! into the graph.
//!
//! When one does, the graph calls `MyFunction.apply` itself, so that the user's forward and
//! backward run as eagerly (AOTAutograd traces through both for its backends). First forward
//! is traced as above, to check that it can be: it must change no Python state and no tensor
//! in place (the graph will run it again, once per call); its nodes, unused, are dropped.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// `Function()` for an `autograd.Function` subclass that keeps the base `__init__` (old
    /// code calls `MyFunction().apply(x)`): the instance made for real — it holds nothing
    /// and its `apply` is the class's — as a constant; None for other calls.
    pub(super) fn autograd_function_instance(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        if !args.is_empty() || !kwargs.is_empty() || !obj.is_instance_of::<pyo3::types::PyType>() {
            return Ok(None);
        }
        let function = py
            .import_module("torch.autograd.function")?
            .getattr("Function")?;
        let builtins = py.import_module("builtins")?;
        if obj.is(&function)
            || !builtins
                .getattr("issubclass")?
                .call1((obj, &function))?
                .is_truthy()?
        {
            return Ok(None);
        }
        if !obj.getattr("__init__")?.is(&function.getattr("__init__")?)
            || !obj.getattr("__new__")?.is(&function.getattr("__new__")?)
        {
            return Ok(None);
        }
        self.guard_class(obj, "__init__")?;
        let instance = obj.call0()?;
        Ok(Some(self.add(
            VarKind::Object(OwnedRef::from_bound(&instance)),
            None,
        )))
    }

    /// `obj(*args, **kwargs)` when `obj` is the `apply` of an `autograd.Function` subclass,
    /// or None.
    pub(super) fn autograd_function_apply(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        if obj.get_type().name()? != "builtin_function_or_method"
            || !obj
                .getattr("__name__")
                .is_ok_and(|n| n.to_string() == "apply")
        {
            return Ok(None);
        }
        let Ok(cls) = obj.getattr("__self__") else {
            return Ok(None);
        };
        let module = py.import_module("torch.autograd.function")?;
        let function = module.getattr("Function")?;
        if !cls.is_instance_of::<pyo3::types::PyType>()
            || !py
                .import_module("builtins")?
                .getattr("issubclass")?
                .call1((&cls, &function))?
                .is_truthy()?
        {
            return Ok(None);
        }
        let differentiable = self.grad_enabled
            && args
                .iter()
                .chain(kwargs.iter().map(|(_, v)| v))
                .any(|&a| self.needs_grad(a));
        if differentiable {
            if !kwargs.is_empty() {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    "autograd.Function.apply with keyword arguments",
                );
            }
            let what = format!("{}.forward", super::ops_call::describe(&cls));
            let first = self.graph.nodes.len();
            self.without_effects(&what, |t| t.inline_forward(&cls, args, kwargs))?;
            self.discarded_nodes.push(first..self.graph.nodes.len());
            let apply = py
                .import_module("dynamo_rs._capture")?
                .call_method1("autograd_function_apply", (&cls,))?;
            let name = format!("{}_apply", cls.getattr("__name__")?);
            return Ok(Some(self.graph_call(
                super::graph::Op::CallFunction(OwnedRef::from_bound(&apply)),
                &name,
                args.to_vec(),
                Vec::new(),
            )?));
        }
        Ok(Some(self.inline_forward(&cls, args, kwargs)?))
    }

    /// `cls.forward` (and `setup_context`) inlined with grad mode off, as `apply` runs them
    /// when no input needs a gradient; its output.
    fn inline_forward(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        let py = self.py;
        let module = py.import_module("torch.autograd.function")?;
        let inspect = py.import_module("inspect")?;
        let forward = inspect.call_method1("getattr_static", (cls, "forward"))?;
        let staticmethod = py.import_module("builtins")?.getattr("staticmethod")?;
        if !forward.is_instance(&staticmethod)? {
            return unsupported(
                BreakKind::UnsupportedCall,
                "an autograd.Function whose forward is not a staticmethod",
            );
        }
        let forward = forward.getattr("__func__")?;
        let setup_context = inspect.call_method1("getattr_static", (cls, "setup_context"))?;
        let default_setup = inspect.call_method1(
            "getattr_static",
            (module.getattr("_SingleLevelFunction")?, "setup_context"),
        )?;
        let separate_setup = !setup_context.is(&default_setup);
        // The class's forward and setup_context are what the trace used.
        self.guard_class(cls, "forward")?;
        self.guard_class(cls, "setup_context")?;
        let ctx_class = py
            .import_module("dynamo_rs._capture")?
            .getattr("InferenceFunctionCtx")?;
        let no_grad_inputs = pyo3::types::PyTuple::new(py, args.iter().map(|_| false))?;
        let needs_input_grad = self.constant(no_grad_inputs.as_any());
        let ctx = self.add(
            VarKind::Instance {
                cls: OwnedRef::from_bound(&ctx_class),
                attrs: vec![("needs_input_grad".to_string(), needs_input_grad)],
                model_output: false,
            },
            None,
        );
        let outer_grad_mode = self.grad_enabled;
        if outer_grad_mode {
            self.set_grad_enabled(false)?;
        }
        let output = if separate_setup {
            let output = self.call_python(&forward, args.to_vec(), kwargs.to_vec())?;
            let inputs = self.add(VarKind::Tuple(args.to_vec()), None);
            let setup = setup_context.getattr("__func__")?;
            self.call_python(&setup, vec![ctx, inputs, output], Vec::new())?;
            output
        } else {
            let mut all = vec![ctx];
            all.extend_from_slice(args);
            self.call_python(&forward, all, kwargs.to_vec())?
        };
        if outer_grad_mode {
            self.set_grad_enabled(true)?;
        }
        Ok(output)
    }

    /// Whether a tensor in `id` (or in the containers it holds) requires grad.
    pub(super) fn needs_grad(&self, id: VarId) -> bool {
        match self.kind(id) {
            VarKind::Tensor { fake, .. } => fake
                .bind(self.py)
                .getattr("requires_grad")
                .and_then(|r| r.is_truthy())
                .unwrap_or(true),
            VarKind::Tuple(items) | VarKind::List(items) => {
                items.iter().any(|&i| self.needs_grad(i))
            }
            VarKind::Dict(entries) => entries.iter().any(|(_, v)| self.needs_grad(*v)),
            _ => false,
        }
    }
}
