//! `nn.Module`s made in `forward` (`nn.Softmax(dim=-1)(x)`, transformers' `ACT2FN[name]`,
//! which makes a `GELUActivation()` on every lookup).
//!
//! The module is made while tracing, for real, and is a *private* object (see `ops_copy`):
//! only the trace reaches it, its `forward` is inlined like any module's, and it may not
//! leave the trace. That is sound only when making it has no effect but the new module, and
//! when what it holds follows from what the trace guards:
//!
//! - `torch.nn`'s own modules (and subclasses keeping an `__init__` of torch's) are known to
//!   only store their arguments;
//! - for any other class, `__init__` is first traced on a stand-in (a traced instance of the
//!   class, whose `nn.Module.__init__` is taken as known and whose attribute stores are
//!   recorded): the trace refuses the construction if `__init__` changed anything older than
//!   the stand-in, computed a tensor or drew random numbers (`Tracer::without_effects`), and
//!   guards everything `__init__` read. The real construction then runs the same code on the
//!   same guarded values.
//!
//! Either way the arguments are constants (tuples of them), and the module made must hold no
//! parameters or buffers (their values would be baked into the trace) and, for classes
//! outside `torch.nn`, only constants, functions and private submodules in its `__dict__`:
//! the private module's attributes are read without guards.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// `cls(*args, **kwargs)` for an `nn.Module` class, made as the module docs describe;
    /// None for other calls.
    pub(super) fn construct_module(
        &mut self,
        cls: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let Ok(ty) = cls.cast::<PyType>() else {
            return Ok(None);
        };
        if !ty.is_subclass(&self.h.module_type)?
            || !args
                .iter()
                .chain(kwargs.iter().map(|(_, v)| v))
                .all(|&a| self.is_constant_tuple_tree(a))
        {
            return Ok(None);
        }
        // Torch's own modules, and subclasses that keep an `__init__` of torch's (whose only
        // effect is on the new module).
        let init = ty.getattr("__init__")?;
        let init_module = init
            .getattr("__module__")
            .map(|m| m.to_string())
            .unwrap_or_default();
        let module_name = ty.getattr("__module__")?.to_string();
        let torch_init = module_name.starts_with("torch.nn.modules.")
            || init_module.starts_with("torch.nn.modules.");
        if !torch_init {
            if !self.standard_module_class(ty)? || !init.is_instance(&self.h.function_type)? {
                return Ok(None);
            }
            self.guard_class(cls, "__init__")?;
            let what = format!("{}.__init__", ty.name()?);
            self.without_effects(&what, |t| {
                let nodes = t.graph.nodes.len();
                let stand_in = t.add(
                    VarKind::Instance {
                        cls: OwnedRef::from_bound(cls),
                        attrs: Vec::new(),
                        model_output: false,
                    },
                    None,
                );
                let mut all = vec![stand_in];
                all.extend_from_slice(args);
                // The module is then made for real: what its `__init__` reads is guarded
                // even where the trace only moves it (`self.scale = CONFIG["scale"]`).
                let observing = std::mem::replace(&mut t.observe_every_value, true);
                let called = t.call_python(&init, all, kwargs.to_vec());
                t.observe_every_value = observing;
                called?;
                if t.graph.nodes.len() != nodes {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!(
                            "making a {} in forward (its __init__ computes tensors)",
                            ty.name()?
                        ),
                    );
                }
                Ok(())
            })?;
        }
        let positional = self.python_args(args)?;
        let keywords = self.python_kwargs(kwargs)?;
        let recipe = (
            OwnedRef::from_bound(cls),
            OwnedRef::from_bound(positional.as_any()),
            OwnedRef::from_bound(keywords.as_any()),
        );
        // A module with parameters initialises them from the random generator: the trial
        // must leave it as it was (the module is then made again, for real, after a break).
        let torch = py.import_module("torch")?;
        let rng = torch.call_method0("get_rng_state")?;
        let made = cls.call(positional.clone(), Some(&keywords.copy()?));
        torch.call_method1("set_rng_state", (rng,))?;
        let module = match made {
            Ok(module) => module,
            Err(err) => {
                let detail = format!("{}() raised {err}", ty.name()?);
                return self.raised(err, detail);
            }
        };
        let stateless = module
            .call_method0("parameters")?
            .try_iter()?
            .next()
            .is_none()
            && module.call_method0("buffers")?.try_iter()?.next().is_none();
        if !stateless {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "making a {} (a module with parameters) in forward",
                    ty.name()?
                ),
            );
        }
        for sub in module.call_method0("modules")?.try_iter()? {
            let sub = sub?;
            if !torch_init && !self.holds_only_fixed_values(&sub)? {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    format!(
                        "making a {} in forward (it keeps objects other than constants, \
                         functions and modules)",
                        ty.name()?
                    ),
                );
            }
            if !sub.is(&module) {
                let sub = OwnedRef::from_bound(&sub);
                self.private_objects.insert(sub.as_ptr() as usize, sub);
            }
        }
        self.private_recipes
            .insert(module.as_ptr() as usize, recipe);
        Ok(Some(self.private_object(&module)))
    }

    /// How to make the module made in `forward` that `id` is again, from its recipe: the
    /// class called (with the frame hook off: its frames store constants only) with the
    /// same constant arguments. None for other trackers, and for modules changed since.
    pub fn private_module_recipe(&self, id: VarId) -> CResult<Option<super::codegen::Rebuild>> {
        use super::codegen::Rebuild;
        let py = self.py;
        let VarKind::Object(module) = self.kind(id) else {
            return Ok(None);
        };
        let Some((cls, positional, keywords)) =
            self.private_recipes.get(&(module.as_ptr() as usize))
        else {
            return Ok(None);
        };
        let constructor = Bound::new(
            py,
            crate::eval_frame::disable::DisabledFunction::wrap(cls.bind(py).clone()),
        )?;
        let args = positional
            .bind(py)
            .try_iter()?
            .map(|a| Ok(Rebuild::Const(OwnedRef::from_bound(&a?))))
            .collect::<CResult<_>>()?;
        let kwargs = keywords
            .bind(py)
            .cast::<PyDict>()
            .map_err(PyErr::from)?
            .iter()
            .map(|(k, v)| (k.to_string(), Rebuild::Const(OwnedRef::from_bound(&v))))
            .collect();
        Ok(Some(Rebuild::Call {
            func: Box::new(Rebuild::Const(OwnedRef::from_bound(constructor.as_any()))),
            args,
            kwargs,
        }))
    }

    /// `nn.Module.__init__(stand_in)` (through `super().__init__()`) on the stand-in of a
    /// construction being traced: what it sets is the module's own bookkeeping, of which
    /// only `training` is read back as an attribute. None for other calls.
    pub(super) fn stand_in_module_init(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        if args.len() != 1 || !kwargs.is_empty() || !self.is_module_stand_in(args[0])? {
            return Ok(None);
        }
        if !func.is(&self.h.module_type.getattr("__init__")?) {
            return Ok(None);
        }
        let training = self.constant(pyo3::types::PyBool::new(py, true).as_any());
        self.store_attr(args[0], "training", Some(training))?;
        Ok(Some(self.constant(&py.None().into_bound(py))))
    }

    /// Whether `id` is the stand-in of a module construction being traced (the only traced
    /// instances of module classes).
    pub(super) fn is_module_stand_in(&self, id: VarId) -> PyResult<bool> {
        match self.kind(id) {
            VarKind::Instance { cls, .. } => cls
                .bind(self.py)
                .cast::<PyType>()
                .map_or(Ok(false), |ty| ty.is_subclass(&self.h.module_type)),
            _ => Ok(false),
        }
    }

    /// A module class whose instances are made, and whose attributes are stored and read,
    /// as `nn.Module`'s: no metaclass, `__new__`, `__setattr__`, `__getattr__` or
    /// `__getattribute__` of its own, and no global registration hooks (which `__setattr__`
    /// would call).
    fn standard_module_class(&self, ty: &Bound<'py, PyType>) -> PyResult<bool> {
        let py = self.py;
        let module = &self.h.module_type;
        if !ty.get_type().is(py.get_type::<PyType>()) {
            return Ok(false);
        }
        for slot in [
            "__new__",
            "__setattr__",
            "__getattr__",
            "__getattribute__",
            "__delattr__",
        ] {
            if !ty.getattr(slot)?.is(&module.getattr(slot)?) {
                return Ok(false);
            }
        }
        let hooks = py.import_module("torch.nn.modules.module")?;
        for table in [
            "_global_module_registration_hooks",
            "_global_parameter_registration_hooks",
            "_global_buffer_registration_hooks",
        ] {
            if hooks.getattr(table)?.len()? != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether every attribute of `module` outside `nn.Module`'s own bookkeeping is a
    /// constant, a tuple of constants, a builtin or torch function, or a method of the module's own
    /// class (guarded there, code included): what reading it without a guard cannot get
    /// wrong. A Python function or a class kept as an attribute could be changed later
    /// (`fn.__code__ = ...`, a class attribute) where no guard would see it.
    fn holds_only_fixed_values(&mut self, module: &Bound<'py, PyAny>) -> CResult<bool> {
        let py = self.py;
        let dict = module
            .getattr("__dict__")?
            .cast_into::<PyDict>()
            .map_err(PyErr::from)?;
        let fresh = self.h.module_type.call0()?.getattr("__dict__")?;
        let types = py.import_module("types")?;
        let builtin_function = types.getattr("BuiltinFunctionType")?;
        let method_type = types.getattr("MethodType")?;
        let cls = module.get_type().into_any();
        for (key, value) in dict.iter() {
            if fresh.contains(&key)? {
                continue;
            }
            // torch's own functions (`F.relu`) are not changed by user code.
            let torch_function = value.is_instance(&self.h.function_type)?
                && value
                    .getattr("__module__")
                    .is_ok_and(|m| m.to_string().starts_with("torch."));
            if self.is_constant_tuple_value(&value)?
                || value.is_instance(&builtin_function)?
                || torch_function
            {
                continue;
            }
            // `self.act = self._python_gelu`: the class's own function, bound to the module.
            let own_method = value.is_instance(&method_type)?
                && value.getattr("__self__")?.is(module)
                && value
                    .getattr("__func__")?
                    .is_instance(&self.h.function_type)?;
            if own_method {
                let func = value.getattr("__func__")?;
                let name = func.getattr("__name__")?.to_string();
                let key = pyo3::types::PyString::intern(py, &name);
                let found = super::guard_values::class_lookup(&cls, &key);
                if found.is_some_and(|f| f.is(&func)) {
                    self.guard_class(&cls, &name)?;
                    continue;
                }
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// Whether `value` is a constant or a tuple of them (nested).
    fn is_constant_tuple_value(&self, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        if let Ok(items) = value.cast::<pyo3::types::PyTuple>() {
            for item in items.iter() {
                if !self.is_constant_tuple_value(&item)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        self.h.is_constant(value)
    }
}
