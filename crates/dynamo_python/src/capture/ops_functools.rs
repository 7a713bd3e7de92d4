//! `functools` in traced code: `partial` objects (made in the trace, or existing ones read
//! through their source), `lru_cache`-wrapped functions and `reduce`.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// A call of `obj` that `functools` explains, or None: `partial(...)` itself, an existing
    /// partial object, an `lru_cache` wrapper, `reduce`.
    pub(super) fn functools_call(
        &mut self,
        callee: VarId,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let functools = self.py.import_module("functools")?;
        let partial = functools.getattr("partial")?;
        if obj.is(&partial) {
            return self.make_partial(args, kwargs).map(Some);
        }
        let of_type = |name: &str| -> PyResult<bool> {
            Ok(functools
                .getattr(name)
                .is_ok_and(|cls| obj.get_type().is(&cls)))
        };
        if of_type("partial")? {
            // An existing partial: what it binds is read through it (and guarded like any
            // other read), then the call is the wrapped function's.
            let func = self.get_attr(callee, "func")?;
            let bound_args = self.get_attr(callee, "args")?;
            let bound_args = self.items_of(bound_args)?;
            let keywords = self.get_attr(callee, "keywords")?;
            let keywords = self.keyword_entries(keywords)?;
            return self
                .call_bound(func, bound_args, keywords, args, kwargs)
                .map(Some);
        }
        if of_type("_lru_cache_wrapper")? {
            // Called with constants, the cached function is called now, as the first eager
            // call would (a later one gets the cached result, with no side effects again):
            // an immutable result is then a constant of the trace.
            if let Some(result) = self.cached_constant(obj, args, kwargs)? {
                return Ok(Some(result));
            }
            // Otherwise (tensors among the arguments, which hash by identity: a miss on
            // every call with new tensors) the wrapped function is traced, as TorchDynamo does.
            let wrapped = self.get_attr(callee, "__wrapped__")?;
            return self
                .call_function(wrapped, args.to_vec(), kwargs.to_vec())
                .map(Some);
        }
        if kwargs.is_empty() {
            return self.functools_reduce(obj, args);
        }
        Ok(None)
    }

    /// `cached(*args, **kwargs)` of an `lru_cache` wrapper evaluated now, when every argument
    /// is a constant or an existing object (None otherwise); a result that is not a
    /// constant breaks.
    fn cached_constant(
        &mut self,
        cached: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let all = args.iter().chain(kwargs.iter().map(|(_, v)| v));
        // Existing objects among the arguments (a logger for `warning_once`) are hashed by
        // the cache as they are: the call depends on which objects they are.
        if !all
            .clone()
            .all(|&a| matches!(self.kind(a), VarKind::Const(_) | VarKind::Object(_)))
        {
            return Ok(None);
        }
        let positional = self.python_args(args)?;
        let keywords = self.python_kwargs(kwargs)?;
        let result = match cached.call(positional, Some(&keywords)) {
            Ok(result) => result,
            Err(err) => {
                return unsupported(
                    BreakKind::ExceptionWhileTracing,
                    format!("an lru_cache function raised {err}"),
                )
            }
        };
        if !self.h.is_constant(&result)? {
            // The cached object itself is what every later call returns; the trace cannot
            // stand for it (and tracing the function now would run its side effects twice).
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "an lru_cache function returning {} (not a constant)",
                    super::ops_call::describe(&result)
                ),
            );
        }
        Ok(Some(self.constant(&result)))
    }

    /// `functools.partial(func, *args, **kwargs)`; a partial of a partial binds into one,
    /// as Python's does.
    fn make_partial(&mut self, args: &[VarId], kwargs: &[(String, VarId)]) -> CResult<VarId> {
        let Some((&func, rest)) = args.split_first() else {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                "functools.partial() without a function",
            );
        };
        if !self.is_callable(func)? {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                "functools.partial() of something not callable",
            );
        }
        let (func, mut bound_args, mut bound_kwargs) = match self.kind(func) {
            VarKind::Partial { func, args, kwargs } => (*func, args.clone(), kwargs.clone()),
            _ => (func, Vec::new(), Vec::new()),
        };
        bound_args.extend_from_slice(rest);
        merge_keywords(&mut bound_kwargs, kwargs);
        Ok(self.add(
            VarKind::Partial {
                func,
                args: bound_args,
                kwargs: bound_kwargs,
            },
            None,
        ))
    }

    /// Calls a partial made in the trace.
    pub(super) fn call_partial(
        &mut self,
        partial: VarId,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let VarKind::Partial {
            func,
            args: bound_args,
            kwargs: bound_kwargs,
        } = self.kind(partial)
        else {
            return unsupported(
                BreakKind::Internal,
                "internal: call_partial on a non-partial",
            );
        };
        let (func, bound_args, bound_kwargs) = (*func, bound_args.clone(), bound_kwargs.clone());
        self.call_bound(func, bound_args, bound_kwargs, &args, &kwargs)
    }

    /// `func(*bound_args, *args, **{**bound_kwargs, **kwargs})`.
    fn call_bound(
        &mut self,
        func: VarId,
        mut bound_args: Vec<VarId>,
        mut bound_kwargs: Vec<(String, VarId)>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        bound_args.extend_from_slice(args);
        merge_keywords(&mut bound_kwargs, kwargs);
        self.call_function(func, bound_args, bound_kwargs)
    }

    /// The entries of a keyword dict (`partial.keywords`) as names and values.
    fn keyword_entries(&mut self, dict: VarId) -> CResult<Vec<(String, VarId)>> {
        let py = self.py;
        match self.kind(dict) {
            VarKind::Dict(entries) => entries
                .iter()
                .map(|(k, v)| Ok((k.bind(py).extract::<String>()?, *v)))
                .collect(),
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
            | VarKind::NdArray(_)) => unsupported(
                BreakKind::UnsupportedOperation,
                format!(
                    "the keywords of a partial held as {}",
                    super::translator::kind_name(other)
                ),
            ),
        }
    }

    /// Whether calling `id` is possible (what `callable(value)` answers), for trackers that
    /// hold no real object, and for those that do.
    pub fn is_callable(&self, id: VarId) -> CResult<bool> {
        let py = self.py;
        Ok(match self.kind(id) {
            VarKind::Function(_)
            | VarKind::Method { .. }
            | VarKind::Partial { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)
            | VarKind::GradModeWrapped { .. } => true,
            VarKind::Instance { cls, .. } => cls.bind(py).hasattr("__call__")?,
            VarKind::Const(v) | VarKind::Object(v) => v.bind(py).is_callable(),
            _ => false,
        })
    }

    /// `functools.reduce(function, iterable[, initial])`: the calls made one by one, left to
    /// right, as Python does (it consumes the iterable at once, so nothing is deferred).
    fn functools_reduce(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let reduce = self.py.import_module("functools")?.getattr("reduce")?;
        if !func.is(&reduce) || !(2..=3).contains(&args.len()) {
            return Ok(None);
        }
        let mut items = self.items_of(args[1])?.into_iter();
        let mut total = match args.get(2) {
            Some(&initial) => initial,
            None => match items.next() {
                Some(first) => first,
                None => {
                    return unsupported(
                        BreakKind::ExceptionWhileTracing,
                        "reduce() of an empty iterable with no initial value",
                    )
                }
            },
        };
        for item in items {
            total = self.call_function(args[0], vec![total, item], Vec::new())?;
        }
        Ok(Some(total))
    }
}

/// `{**into, **more}` on keyword lists: a name given again takes its new value in place.
fn merge_keywords(into: &mut Vec<(String, VarId)>, more: &[(String, VarId)]) {
    for (name, value) in more {
        match into.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = *value,
            None => into.push((name.clone(), *value)),
        }
    }
}
