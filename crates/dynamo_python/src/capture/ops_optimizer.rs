//! Optimizer steps of `torch.optim`, traced as TorchDynamo traces them (`torch.compile(
//! opt.step)`, or the `step()` a compiled training loop calls after its `backward()`).
//!
//! Two departures from tracing the optimizer's code as it is written, both TorchDynamo's:
//!
//! - `_init_group(group, params, grads, ...)`, which fills the step's lists and makes each
//!   parameter's state on the first step, runs for real while tracing, on the real group
//!   and fresh lists; the trace takes what it put in the lists as graph inputs read through
//!   their sources (the group's parameters, their `.grad`, their `opt.state[p][key]`). So the
//!   first step's graph is already the graph of every later step (one compile, where
//!   tracing the state's creation would compile again on the second call), and the
//!   per-parameter bookkeeping (a loop over every parameter, dict lookups keyed by
//!   parameters) stays out of the trace. Running it again eagerly, if the trace then fails,
//!   does nothing more: it makes state only for parameters that have none.
//! - Each group's `capturable` flag reads True in the trace (the real dict keeps its value):
//!   the optimizers' non-capturable paths read their step count as a Python number
//!   (`.item()`, a branch on it) where the capturable paths keep it a tensor, so only those
//!   fit in one graph. The results differ from eager by rounding (the step size is computed
//!   in the parameters' dtype rather than in Python floats), as under torch.compile.

use std::rc::Rc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::break_reasons::BreakKind;
use super::guards::GuardKind;
use super::source::{ItemKey, ObjectKey, Source};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// Whether `obj` is a `torch.optim.Optimizer`.
    fn is_optimizer(&self, obj: &Bound<'py, PyAny>) -> PyResult<bool> {
        let optimizer = self.h.torch.getattr("optim")?.getattr("Optimizer")?;
        obj.is_instance(&optimizer)
    }

    /// `opt.param_groups` of an optimizer, read into `groups`: each group's `capturable`
    /// entry reads True in the trace (see the module's comment). Such a group is not to be
    /// changed by the trace: its final contents would be written back with the flag.
    pub(super) fn optimizer_param_groups(&mut self, obj: VarId, groups: VarId) -> CResult<()> {
        let py = self.py;
        let VarKind::Object(opt) = self.kind(obj) else {
            return Ok(());
        };
        let opt = opt.bind(py).clone();
        if !self.is_optimizer(&opt)? {
            return Ok(());
        }
        let VarKind::List(items) = self.kind(groups) else {
            return Ok(());
        };
        let items = items.clone();
        let capturable = pyo3::types::PyString::new(py, "capturable").into_any();
        let yes = self.constant(&pyo3::types::PyBool::new(py, true).to_owned().into_any());
        for group in items {
            let VarKind::Dict(entries) = &mut self.vars[group.0 as usize].kind else {
                continue;
            };
            let Some(entry) = entries
                .iter_mut()
                .find(|(k, _)| k.bind(py).eq(&capturable).unwrap_or(false))
            else {
                continue;
            };
            entry.1 = yes;
            self.capturable_groups.insert(group);
        }
        Ok(())
    }

    /// `opt._init_group(group, [], [], ...)` of a `torch.optim` optimizer: run for real on
    /// the real group and fresh lists, whose contents become the trace's lists (see the
    /// module's comment). None when the call is not one this can do (the method is then
    /// inlined): another receiver or arguments, or changes this trace has not carried out
    /// yet to objects the method reads (see `pending_changes_reach`).
    pub(super) fn optimizer_init_group(
        &mut self,
        function: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let Some(method) = init_group_method(function)? else {
            return Ok(None);
        };
        let Some((&receiver, rest)) = args.split_first() else {
            return Ok(None);
        };
        let (VarKind::Object(opt), Some(opt_source)) = (self.kind(receiver), self.source(receiver))
        else {
            return Ok(None);
        };
        let opt = opt.bind(py).clone();
        if !kwargs.is_empty() || !self.is_optimizer(&opt)? {
            return Ok(None);
        }
        // The group (an existing dict the trace read), then empty lists the trace made.
        let mut group = None;
        let mut lists = Vec::new();
        let mut real_args = vec![opt.clone()];
        for &arg in rest {
            match self.kind(arg) {
                VarKind::Dict(_) if group.is_none() => {
                    let Some(source) = self.source(arg) else {
                        return Ok(None);
                    };
                    let Some(real) = self.existing_container_object(arg) else {
                        return Ok(None);
                    };
                    real_args.push(real.clone());
                    group = Some((arg, source, real));
                }
                VarKind::List(items) if items.is_empty() && self.source(arg).is_none() => {
                    let list = PyList::empty(py);
                    real_args.push(list.clone().into_any());
                    lists.push((arg, list));
                }
                VarKind::Const(value) => real_args.push(value.bind(py).clone()),
                _ => return Ok(None),
            }
        }
        let Some((group, group_source, real_group)) = group else {
            return Ok(None);
        };
        if self.pending_changes_reach(&opt, &real_group)? {
            return Ok(None);
        }
        let result = match method.call1(PyTuple::new(py, &real_args)?) {
            Ok(result) => result,
            Err(err) => {
                return unsupported(
                    BreakKind::ExceptionWhileTracing,
                    format!("the optimizer's _init_group raised {err}"),
                )
            }
        };
        if !self.h.is_constant(&result)? {
            return unsupported(
                BreakKind::UnsupportedCall,
                "the optimizer's _init_group returned something that is not a constant",
            );
        }
        let sources =
            self.init_group_sources(&opt, &opt_source, group, &group_source, &real_group)?;
        for (list, real) in lists {
            let mut items = Vec::with_capacity(real.len());
            for value in real.iter() {
                let source = sources
                    .iter()
                    .find(|(t, _)| t.bind(py).is(&value))
                    .map(|(_, s)| s.clone());
                if value.is_instance(&self.h.tensor_type)? && source.is_none() {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        "the optimizer's _init_group listed a tensor it does not hold",
                    );
                }
                let item = self.wrap(&value, source)?;
                self.kind(item);
                items.push(item);
            }
            self.may_change_container(list, "the optimizer's _init_group")?;
            if let VarKind::List(held) = &mut self.vars[list.0 as usize].kind {
                held.extend(items);
            }
        }
        Ok(Some(self.constant(&result)))
    }

    /// Whether a change this trace has made but not yet carried out (it is replayed after
    /// the graph) is to something `_init_group` reads for `group`: the optimizer's attributes,
    /// the group, the optimizer's `state` or the state of one of the group's parameters, a
    /// parameter's attributes (`p.grad = ...`). The real objects do not have those changes
    /// yet. (The previous group's state written by the step is not one of them.)
    fn pending_changes_reach(
        &self,
        opt: &Bound<'py, PyAny>,
        group: &Bound<'py, PyAny>,
    ) -> PyResult<bool> {
        let py = self.py;
        let state = opt.getattr("state")?;
        let mut read = vec![opt.clone(), group.clone(), state.clone()];
        for param in group.get_item("params")?.try_iter()? {
            let param = param?;
            if let Some(entries) = state.cast::<pyo3::types::PyDict>()?.get_item(&param)? {
                read.push(entries);
            }
            read.push(param);
        }
        let touched = |object: &Bound<'py, PyAny>| read.iter().any(|r| r.is(object));
        if self.mutations.iter().any(|m| touched(&m.object.bind(py))) {
            return Ok(true);
        }
        Ok(self
            .written_containers
            .iter()
            .filter_map(|&id| self.existing_container_object(id))
            .any(|object| touched(&object)))
    }

    /// Guards what `_init_group` read — the group's entries, which tensors its parameters
    /// are, whether each has a gradient, which parameters have state and its keys — and
    /// returns the source of every tensor it can have listed: the parameters, their
    /// gradients and their state.
    fn init_group_sources(
        &mut self,
        opt: &Bound<'py, PyAny>,
        opt_source: &Rc<Source>,
        group: VarId,
        group_source: &Rc<Source>,
        real_group: &Bound<'py, PyAny>,
    ) -> CResult<Vec<(OwnedRef, Rc<Source>)>> {
        if let VarKind::Dict(entries) = self.kind(group) {
            for (_, value) in entries.clone() {
                self.kind(value);
            }
        }
        let state = opt.getattr("state")?;
        let state = state.cast::<PyDict>().map_err(PyErr::from)?;
        let state_source = Rc::new(Source::Attr(opt_source.clone(), "state".into()));
        let params_source = Rc::new(Source::Item(
            group_source.clone(),
            ItemKey::Str("params".into()),
        ));
        let mut sources = Vec::new();
        let params = real_group.get_item("params")?;
        for (j, param) in params.try_iter()?.enumerate() {
            let param = param?;
            let param_source = Rc::new(Source::Item(params_source.clone(), ItemKey::Int(j as i64)));
            self.guards.add(
                param_source.clone(),
                GuardKind::Id(OwnedRef::from_bound(&param)),
            );
            sources.push((OwnedRef::from_bound(&param), param_source.clone()));
            let grad = param.getattr("grad")?;
            let grad_source = Rc::new(Source::Attr(param_source, "grad".into()));
            if grad.is_none() {
                let none = self.wrap(&grad, Some(grad_source))?;
                self.kind(none);
            } else {
                sources.push((OwnedRef::from_bound(&grad), grad_source));
            }
            let has_state = state.contains(&param)?;
            self.guards.add(
                state_source.clone(),
                GuardKind::Contains(OwnedRef::from_bound(&param), has_state),
            );
            let Some(entries) = state.get_item(&param)? else {
                continue;
            };
            let key = ItemKey::Object(ObjectKey {
                value: OwnedRef::from_bound(&param),
                repr: format!("<parameter at {:#x}>", param.as_ptr() as usize),
            });
            let entries_source = Rc::new(Source::Item(state_source.clone(), key));
            let Ok(entries) = entries.cast_into::<PyDict>() else {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "an optimizer state entry that is not a dict",
                );
            };
            self.guards.add(
                entries_source.clone(),
                GuardKind::Keys(OwnedRef::from_bound(entries.keys().to_tuple().as_any())),
            );
            for (name, value) in entries.iter() {
                let Ok(name) = name.extract::<String>() else {
                    continue;
                };
                if value.is_instance(&self.h.tensor_type)? {
                    sources.push((
                        OwnedRef::from_bound(&value),
                        Rc::new(Source::Item(entries_source.clone(), ItemKey::Str(name))),
                    ));
                }
            }
        }
        Ok(sources)
    }
}

/// The `_init_group` of a `torch.optim` optimizer class that `function` is, or that it wraps
/// when it is TorchDynamo's `disable` wrapper of one (TorchDynamo disables them in every
/// process that has run `torch.compile`).
fn init_group_method<'py>(function: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let name = pyo3::intern!(function.py(), "__name__");
    let disabled = super::ops_call::torch_disabled(function);
    if !disabled
        && !function
            .getattr(name)
            .is_ok_and(|n| n.eq("_init_group").unwrap_or(false))
    {
        return Ok(None);
    }
    let function = if disabled {
        match function.getattr("_torchdynamo_orig_callable") {
            Ok(original) => original,
            Err(_) => return Ok(None),
        }
    } else {
        function.clone()
    };
    if !function.is_instance_of::<pyo3::types::PyFunction>() {
        return Ok(None);
    }
    let name: String = function.getattr(name)?.extract()?;
    let module: String = function
        .getattr("__module__")?
        .extract()
        .unwrap_or_default();
    Ok((name == "_init_group" && module.starts_with("torch.optim.")).then_some(function))
}
