//! Calls of `nn.Module`s: `forward` inlined when no hooks could run, torch's
//! `Module._call_impl` traced when forward hooks are registered, the call machinery guarded,
//! recurrent modules run at a graph break unless `allow_rnn`.

use std::rc::Rc;

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::guards::GuardKind;
use super::ops_call::{describe, py_getattr_static};
use super::source::Source;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::VarId;
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// torch's tables of hooks run around every module call (`register_module_forward_hook`
/// and the like): any entry breaks the graph at a module call; their emptiness is guarded.
const GLOBAL_MODULE_HOOKS: [&str; 5] = [
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_forward_hooks_always_called",
];

impl<'py> Tracer<'py> {
    /// `module(*args)`: inline `forward` when no hooks could run.
    pub(super) fn call_module(
        &mut self,
        module_var: VarId,
        module: &Bound<'py, PyAny>,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        if module.is_instance(&self.h.recurrent_modules)? && !self.rnn_allowed()? {
            // TorchDynamo's choice, kept so graphs split where its do: the module runs
            // eagerly and the graph breaks at its call.
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "a call of {} (RNN, GRU and LSTM modules run eagerly; set \
                     torch._dynamo.config.allow_rnn = True to trace them)",
                    describe(module)
                ),
            );
        }
        if let Some(inner) = self.compiled_module_original(module_var, module)? {
            return self.call_function(inner, args, kwargs);
        }
        if !crate::eval_frame::module_call::calls_like_torch(module) {
            // A class or instance with call machinery of its own (its `__call__`, its
            // `_call_impl`, a `_compiled_call_impl`), or torch's patched: the call is traced
            // as CPython makes it, through `type(module).__call__` (its lookup guarded).
            let call = self.get_attr(module_var, "__call__")?;
            return self.call_function(call, args, kwargs);
        }
        self.initialize_lazy_module(module, &args, &kwargs)?;
        if let Some(result) =
            self.call_module_with_forward_hooks(module_var, module, &args, &kwargs)?
        {
            return Ok(result);
        }
        for hooks in super::guard_values::MODULE_CALL_HOOKS {
            if self.len_in_trace(&module.getattr(hooks)?)? != 0 {
                return unsupported(
                    BreakKind::Hooks,
                    format!("a call of {} with {hooks}", describe(module)),
                );
            }
        }
        let globals = self.py.import_module("torch.nn.modules.module")?;
        for hooks in GLOBAL_MODULE_HOOKS {
            if self.len_in_trace(&globals.getattr(hooks)?)? != 0 {
                return unsupported(
                    BreakKind::Hooks,
                    format!("a module call with global {hooks} registered"),
                );
            }
        }
        // Hooks added later, or a `forward` set on the instance, must recompile.
        if let Some(source) = self.source(module_var) {
            // A hook table the trace read (and may have changed) is guarded by its keys as it
            // was on entry; the one guard of the whole call machinery would ask for none.
            let mut tracked_tables = Vec::new();
            for hooks in super::guard_values::MODULE_CALL_HOOKS {
                let table = module.getattr(hooks)?;
                if self
                    .container_by_object
                    .contains_key(&(table.as_ptr() as usize))
                {
                    tracked_tables.push(hooks);
                }
            }
            let own_forward = Self::in_instance_dict(module, "forward");
            if own_forward || !tracked_tables.is_empty() {
                self.guard_call_machinery(module_var, module)?;
                if !own_forward {
                    self.guard_not_in_instance_dict(module, Some(source.clone()), "forward")?;
                }
                // Its own `forward` is read (and guarded) below; the hooks one by one.
                for hooks in super::guard_values::MODULE_CALL_HOOKS {
                    if tracked_tables.contains(&hooks) {
                        continue;
                    }
                    self.guards.add(
                        Rc::new(Source::Attr(source.clone(), hooks.into())),
                        GuardKind::Len(0),
                    );
                }
            } else {
                self.guards.add(source, GuardKind::ModuleCall);
            }
        }
        let module_globals = globals.getattr("__dict__")?;
        for hooks in GLOBAL_MODULE_HOOKS {
            let source = Rc::new(Source::Global {
                globals: OwnedRef::from_bound(&module_globals),
                builtins: OwnedRef::from_bound(&self.h.builtins),
                name: hooks.into(),
                root: false,
            });
            self.guards.add(source, GuardKind::Len(0));
        }
        if Self::in_instance_dict(module, "forward") {
            // `self.forward = self.forward_slicing` in `__init__` (timm's FasterNet): the
            // instance attribute is what `Module.__call__` calls.
            let forward = self.get_attr(module_var, "forward")?;
            return self.call_function(forward, args, kwargs);
        }
        self.guard_class(module.get_type().as_any(), "forward")?;
        let forward = module.get_type().getattr("forward")?;
        if super::ops_call::torch_disabled(&forward) {
            // `@torch.compiler.disable` on `forward`: called as the disabled function it is
            // (the graph breaks; a non-recursive disable leaves what it calls compiled).
            let forward = self.get_attr(module_var, "forward")?;
            return self.call_function(forward, args, kwargs);
        }
        if !forward.is_instance(&self.h.function_type)? {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "{} whose forward is not a Python function",
                    describe(module)
                ),
            );
        }
        // A `@staticmethod` forward takes no module.
        let is_static = py_getattr_static(module.get_type().as_any(), "forward")?
            .is_some_and(|f| f.get_type().name().is_ok_and(|n| n == "staticmethod"));
        let mut all = if is_static {
            Vec::new()
        } else {
            vec![module_var]
        };
        all.extend(args);
        self.call_python(&forward, all, kwargs)
    }

    /// A lazy module (`nn.LazyLinear`, ...) called before it has parameters: they are made
    /// now, from the shapes of the arguments, as its first call would make them (the
    /// initialisation draws random numbers once, before the graph runs, as eagerly before
    /// `forward`); it is then traced as the module it became, whose parameters are guarded
    /// as any module's.
    fn initialize_lazy_module(
        &mut self,
        module: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<()> {
        let py = self.py;
        if !module.hasattr("has_uninitialized_params")? {
            return Ok(());
        }
        let fake_args = args
            .iter()
            .map(|&a| self.fake_value(a))
            .collect::<CResult<Vec<_>>>()?;
        let fake_kwargs = pyo3::types::PyDict::new(py);
        for (name, value) in kwargs {
            fake_kwargs.set_item(name, self.fake_value(*value)?)?;
        }
        let lazy_class = module.get_type();
        let made = py
            .import_module("dynamo_rs._capture")?
            .getattr("initialize_lazy_module")?
            .call1((
                module,
                pyo3::types::PyTuple::new(py, fake_args)?,
                fake_kwargs,
            ))?
            .is_truthy()?;
        if made {
            // The module's class changed (`LazyLinear` became `Linear`): type guards taken
            // before, when its container was iterated, must expect the class it has now —
            // any other module of the lazy class still lazy then recompiles, as it should.
            let now = OwnedRef::from_bound(module.get_type().as_any());
            for (_, kind) in self.guards.guards.iter_mut() {
                if matches!(kind, GuardKind::Type(cls) if cls.bind(py).is(&lazy_class)) {
                    *kind = GuardKind::Type(now.clone());
                }
            }
        }
        Ok(())
    }

    /// A module with forward hooks or forward pre-hooks (and no backward hooks): torch's own
    /// `Module._call_impl` is inlined, so the hooks run in the trace as in eager (pre-hooks
    /// replacing the arguments, hooks replacing the result, `with_kwargs` and
    /// `always_called` ones), reading the hook tables through the module's source — which
    /// guards their contents. Backward hooks need autograd's `BackwardHook` wrapping and
    /// break the graph (the caller's checks). None when the module has no forward hooks.
    fn call_module_with_forward_hooks(
        &mut self,
        module_var: VarId,
        module: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let non_empty =
            |name: &str| -> PyResult<bool> { Ok(self.len_in_trace(&module.getattr(name)?)? != 0) };
        if !(non_empty("_forward_hooks")? || non_empty("_forward_pre_hooks")?)
            || non_empty("_backward_hooks")?
            || non_empty("_backward_pre_hooks")?
        {
            return Ok(None);
        }
        self.guard_call_machinery(module_var, module)?;
        if let Some(source) = self.source(module_var) {
            for hooks in ["_backward_hooks", "_backward_pre_hooks"] {
                self.guards.add(
                    Rc::new(Source::Attr(source.clone(), hooks.into())),
                    GuardKind::Len(0),
                );
            }
        }
        let call_impl = self.h.module_type.getattr("_call_impl")?;
        let mut all = vec![module_var];
        all.extend_from_slice(args);
        self.call_python(&call_impl, all, kwargs.to_vec()).map(Some)
    }

    /// For a module call modelled as torch's call machinery but not checked by
    /// `GuardKind::ModuleCall` (it has hooks, or a `forward` of its own): the class lookups
    /// of that machinery, and no instance attribute overriding it.
    fn guard_call_machinery(
        &mut self,
        module_var: VarId,
        module: &Bound<'py, PyAny>,
    ) -> CResult<()> {
        let ty = module.get_type();
        for name in [
            "__call__",
            "_wrapped_call_impl",
            "_call_impl",
            "_compiled_call_impl",
        ] {
            self.guard_class(ty.as_any(), name)?;
        }
        let source = self.source(module_var);
        for name in ["_call_impl", "_compiled_call_impl"] {
            if Self::in_instance_dict(module, name) {
                // `_compiled_call_impl = None` on the instance: read, and guarded, as it is.
                self.get_attr(module_var, name)?;
            } else {
                self.guard_not_in_instance_dict(module, source.clone(), name)?;
            }
        }
        Ok(())
    }

    /// `torch._dynamo.config.allow_rnn`, read when a recurrent module is called.
    fn rnn_allowed(&self) -> CResult<bool> {
        let config = self.py.import_module("torch._dynamo.config")?;
        Ok(config.getattr("allow_rnn")?.is_truthy()?)
    }
}
