//! torch's `torch._check*` functions (`_check`, `_check_with`, `_check_index`,
//! `_check_is_size`, ...) in traced code: on a condition known while tracing their Python
//! source is traced (a true condition leaves nothing, a false one raises torch's error,
//! which the code may catch); on a symbolic condition one `torch._check` node checks it when
//! the graph runs, as TorchDynamo records it.

use pyo3::prelude::*;

use super::graph::Op;
use super::translator::{CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// The name of `callee` when it is one of torch's `torch._check*` functions (`_check`,
    /// `_check_with`, `_check_index`, `_check_is_size`, ...).
    fn torch_check_name(&self, callee: &Bound<'py, PyAny>) -> PyResult<Option<String>> {
        if !callee.is_instance(&self.h.function_type)?
            || callee.getattr("__module__")?.to_string() != "torch"
        {
            return Ok(None);
        }
        let name = callee.getattr("__name__")?.to_string();
        Ok(name.starts_with("_check").then_some(name))
    }

    /// Whether `callee` is a `torch._check*` function called on a condition known while
    /// tracing: its Python source is traced — a true condition leaves nothing, a false one
    /// raises the error torch raises, which the traced code may catch — as TorchDynamo does.
    pub(super) fn check_known_while_tracing(
        &self,
        callee: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> PyResult<bool> {
        Ok(self.torch_check_name(callee)?.is_some()
            && !args
                .iter()
                .chain(kwargs.iter().map(|(_, v)| v))
                .any(|&a| self.is_symbolic(a)))
    }

    /// `torch._check(cond[, message])` and its kin (`_check_with`, `_check_index`,
    /// `_check_value`, ...) on a symbolic condition (a size of a dynamic dimension): a
    /// `torch._check(cond[, message])` node checked when the graph runs, as TorchDynamo
    /// records it (every kind then raises `RuntimeError`). A message given as a function
    /// (`lambda: "too small"`) cannot be a graph argument: the node has torch's default
    /// message. None for other calls.
    pub(super) fn symbolic_check(
        &mut self,
        callee: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let Some(name) = self.torch_check_name(callee)? else {
            return Ok(None);
        };
        if !matches!(
            name.as_str(),
            "_check"
                | "_check_with"
                | "_check_index"
                | "_check_value"
                | "_check_type"
                | "_check_not_implemented"
        ) {
            return Ok(None);
        }
        let positional = if name == "_check_with" {
            &args[1.min(args.len())..]
        } else {
            args
        };
        let keyword = |key: &str| kwargs.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
        let Some(cond) = positional.first().copied().or_else(|| keyword("cond")) else {
            return Ok(None);
        };
        if !self.is_symbolic(cond) {
            return Ok(None);
        }
        let message = positional.get(1).copied().or_else(|| keyword("message"));
        let mut node_args = vec![cond];
        if let Some(message) = message {
            if let VarKind::Const(text) = self.kind(message) {
                if text.bind(self.py).is_instance_of::<pyo3::types::PyString>() {
                    node_args.push(message);
                }
            }
        }
        let check = self.h.torch.getattr("_check")?;
        self.graph_call(
            Op::CallFunction(OwnedRef::from_bound(&check)),
            "_check",
            node_args,
            Vec::new(),
        )
        .map(Some)
    }
}
