//! Operators on objects whose class defines them in Python (`__add__`, `__radd__`, `__lt__`,
//! `__neg__`, `__iadd__`, ...): the method is inlined, chosen as Python chooses it.
//!
//! For `a <op> b` Python calls `a.__op__(b)`; if `a`'s class has no such method or it returns
//! `NotImplemented`, `b.__rop__(a)` (the reflected method: `__radd__`, or `__gt__` for `<`) —
//! first, when `b`'s class is a proper subclass of `a`'s that defines it. An in-place `a += b`
//! tries `a.__iadd__(b)` before all that. `a != b` without a `__ne__` of its own is `not
//! (a == b)`. Tensors on the left return `NotImplemented` for objects torch does not know
//! (unless the object has `__torch_function__`, which torch calls instead): the right
//! operand's reflected method then runs. Vector and autograd-like classes written in Python
//! (`Variable(a) * Variable(b)`) are traced through their methods instead of falling back.

use pyo3::prelude::*;

use super::translator::{CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::imports::ImportModule;

/// `operator` function name → (method, reflected method).
const BINARY: [(&str, &str, &str); 13] = [
    ("add", "__add__", "__radd__"),
    ("sub", "__sub__", "__rsub__"),
    ("mul", "__mul__", "__rmul__"),
    ("truediv", "__truediv__", "__rtruediv__"),
    ("floordiv", "__floordiv__", "__rfloordiv__"),
    ("mod", "__mod__", "__rmod__"),
    ("pow", "__pow__", "__rpow__"),
    ("matmul", "__matmul__", "__rmatmul__"),
    ("lshift", "__lshift__", "__rlshift__"),
    ("rshift", "__rshift__", "__rrshift__"),
    ("and_", "__and__", "__rand__"),
    ("or_", "__or__", "__ror__"),
    ("xor", "__xor__", "__rxor__"),
];

/// Comparisons: (name, method, reflected method).
const COMPARE: [(&str, &str, &str); 6] = [
    ("lt", "__lt__", "__gt__"),
    ("le", "__le__", "__ge__"),
    ("gt", "__gt__", "__lt__"),
    ("ge", "__ge__", "__le__"),
    ("eq", "__eq__", "__eq__"),
    ("ne", "__ne__", "__ne__"),
];

const UNARY: [(&str, &str); 3] = [
    ("neg", "__neg__"),
    ("pos", "__pos__"),
    ("invert", "__invert__"),
];

impl<'py> Tracer<'py> {
    /// `name` (an `operator` function's name) applied to `args` when an operand is an object
    /// whose class defines the operator in Python; None otherwise (the caller goes on).
    pub(super) fn user_operator(
        &mut self,
        op: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let maybe_user = |k: &VarKind| {
            matches!(
                k,
                VarKind::Instance { .. } | VarKind::Object(_) | VarKind::Dict(_)
            )
        };
        if !args.iter().any(|&a| maybe_user(self.kind(a)))
            || !args
                .iter()
                .any(|&a| self.user_class(a).is_ok_and(|c| c.is_some()))
        {
            return Ok(None);
        }
        let name = super::ops_call::function_name(op);
        let name = name.as_str();
        if let [value] = args {
            let Some(&(_, method)) = UNARY.iter().find(|(n, _)| *n == name) else {
                return Ok(None);
            };
            if !self.has_python_method(*value, method)? {
                return Ok(None);
            }
            return self.call_dunder(*value, method, None).map(Some);
        }
        let [lhs, rhs] = *args else {
            return Ok(None);
        };
        if let Some(binary) = name.strip_prefix('i') {
            if let Some(&(_, method, _)) = BINARY.iter().find(|(n, _, _)| *n == binary) {
                let inplace = format!("__i{}", &method[2..]);
                if self.has_python_method(lhs, &inplace)? {
                    let result = self.call_dunder(lhs, &inplace, Some(rhs))?;
                    if !self.is_not_implemented(result) {
                        return Ok(Some(result));
                    }
                }
                return self.dispatch_binary(binary, lhs, rhs);
            }
        }
        self.dispatch_binary(name, lhs, rhs)
    }

    /// `a == b` / `a != b` where an operand is an object made in the trace whose class keeps
    /// `object`'s equality, and the other is such an object or a constant: identity, as
    /// Python falls back to it (`MyCls() == None`, `node != other_node`). None otherwise.
    pub(super) fn default_equality(
        &mut self,
        op: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let [lhs, rhs] = *args else {
            return Ok(None);
        };
        let name = super::ops_call::function_name(op);
        if name != "eq" && name != "ne" {
            return Ok(None);
        }
        let object = self.py.import_module("builtins")?.getattr("object")?;
        let default_equality = |t: &Self, id: VarId| -> PyResult<Option<bool>> {
            match t.instance_class(id) {
                Some(cls) => Ok(Some(
                    cls.getattr("__eq__")?.is(&object.getattr("__eq__")?)
                        && cls.getattr("__ne__")?.is(&object.getattr("__ne__")?),
                )),
                None => Ok(None),
            }
        };
        let (left, right) = (default_equality(self, lhs)?, default_equality(self, rhs)?);
        let same = match (left, right) {
            (Some(true), Some(true)) => lhs == rhs,
            (Some(true), None) | (None, Some(true)) => {
                let other = if left.is_some() { rhs } else { lhs };
                if !matches!(self.kind(other), VarKind::Const(_)) {
                    return Ok(None);
                }
                false
            }
            _ => return Ok(None),
        };
        let answer = same == (name == "eq");
        Ok(Some(self.constant(
            &answer.into_pyobject(self.py)?.to_owned().into_any(),
        )))
    }

    /// Whether the trace applies operators to `id` one by one rather than evaluating them
    /// on Python values: a symbolic number (evaluated, it would be specialised) or an object
    /// whose class defines operators in Python (`operator.add(a, b)`, `sum(objects)`).
    pub(super) fn operated_one_by_one(&self, id: VarId) -> bool {
        self.is_symbolic(id) || self.user_class(id).is_ok_and(|c| c.is_some())
    }

    /// Whether `sum(items[, start])` adds such values (see `operated_one_by_one`).
    pub(super) fn sum_operated_one_by_one(&self, args: &[VarId]) -> bool {
        let items = match self.kind(args[0]) {
            VarKind::Tuple(items) | VarKind::List(items) => {
                items.iter().any(|&i| self.operated_one_by_one(i))
            }
            _ => false,
        };
        items
            || args
                .get(1)
                .is_some_and(|&start| self.operated_one_by_one(start))
    }

    /// `lhs <name> rhs` by the operator's method and its reflection, in Python's order; None
    /// for a name that is not a binary operator or comparison.
    fn dispatch_binary(&mut self, name: &str, lhs: VarId, rhs: VarId) -> CResult<Option<VarId>> {
        let Some(&(_, method, reflected)) = BINARY
            .iter()
            .chain(COMPARE.iter())
            .find(|(n, _, _)| *n == name)
        else {
            return Ok(None);
        };
        let left_tensor = matches!(self.kind(lhs), VarKind::Tensor { .. });
        let left = !left_tensor && self.has_python_method(lhs, method)?;
        let right = self.has_python_method(rhs, reflected)?;
        if left_tensor && (!right || self.user_class_has(rhs, "__torch_function__")?) {
            return Ok(None);
        }
        if name == "ne" && !left && !right {
            return self.negated_equality(lhs, rhs);
        }
        if !left && !right {
            return Ok(None);
        }
        let right_first = right && left && self.is_proper_subclass(rhs, lhs)?;
        let mut order = Vec::with_capacity(2);
        if right_first {
            order.push((rhs, reflected, lhs));
        }
        if left {
            order.push((lhs, method, rhs));
        }
        if right && !right_first {
            order.push((rhs, reflected, lhs));
        }
        for (receiver, dunder, other) in order {
            let result = self.call_dunder(receiver, dunder, Some(other))?;
            if !self.is_not_implemented(result) {
                return Ok(Some(result));
            }
        }
        // Both returned NotImplemented: `==`/`!=` fall back to identity, others raise.
        Ok(None)
    }

    /// `a != b` for objects with a Python `__eq__` but no `__ne__`: `not (a == b)`.
    fn negated_equality(&mut self, lhs: VarId, rhs: VarId) -> CResult<Option<VarId>> {
        if !self.has_python_method(lhs, "__eq__")? && !self.has_python_method(rhs, "__eq__")? {
            return Ok(None);
        }
        let Some(equal) = self.dispatch_binary("eq", lhs, rhs)? else {
            return Ok(None);
        };
        let truth = self.truth(equal)?;
        let py = self.py;
        Ok(Some(self.constant(
            &(!truth).into_pyobject(py)?.to_owned().into_any(),
        )))
    }

    fn call_dunder(
        &mut self,
        receiver: VarId,
        method: &str,
        other: Option<VarId>,
    ) -> CResult<VarId> {
        let bound = self.get_attr(receiver, method)?;
        self.call_function(bound, other.into_iter().collect(), Vec::new())
    }

    fn is_not_implemented(&self, id: VarId) -> bool {
        let py = self.py;
        self.real_unpinned(id)
            .is_some_and(|v| v.is(py.NotImplemented()))
    }

    fn user_class_has(&self, id: VarId, name: &str) -> CResult<bool> {
        Ok(self
            .user_class(id)?
            .is_some_and(|cls| cls.hasattr(name).unwrap_or(false)))
    }

    /// Whether `a`'s class is a proper subclass of `b`'s (then `a`'s reflected method goes
    /// first).
    fn is_proper_subclass(&self, a: VarId, b: VarId) -> CResult<bool> {
        let (Some(a), Some(b)) = (self.user_class(a)?, self.user_class(b)?) else {
            return Ok(false);
        };
        if a.is(&b) {
            return Ok(false);
        }
        let (Ok(a), Ok(b)) = (
            a.cast::<pyo3::types::PyType>(),
            b.cast::<pyo3::types::PyType>(),
        ) else {
            return Ok(false);
        };
        Ok(a.is_subclass(b)?)
    }
}
