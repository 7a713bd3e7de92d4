//! Comparisons of tuples and lists that hold tensors, decided by their known items:
//! `(priority, counter, tensor) < (priority2, counter2, tensor2)` in a heap, `sorted` over
//! such tuples. Python compares two sequences item by item, skipping items that are equal
//! (the same object counts as equal without calling `__eq__`), and lets the first unequal
//! pair, or the lengths, decide. Where that pair and every equality before it are between
//! values the trace knows, the answer is known too; an equality that would need a tensor's
//! `__eq__` (a data-dependent answer) is left to the caller, which refuses it.

use pyo3::prelude::*;

use super::translator::{CResult, Tracer};
use super::vars::{VarId, VarKind};

impl<'py> Tracer<'py> {
    /// `op(a, b)` for two tuples or two lists decided without looking into a tensor, as a
    /// constant tracker; None where it cannot be.
    pub(super) fn compare_sequences(
        &mut self,
        name: &str,
        a: VarId,
        b: VarId,
    ) -> CResult<Option<VarId>> {
        Ok(match self.sequence_order(name, a, b)? {
            Some(answer) => {
                Some(self.constant(&answer.into_pyobject(self.py)?.to_owned().into_any()))
            }
            None => None,
        })
    }

    fn sequence_order(&mut self, name: &str, a: VarId, b: VarId) -> CResult<Option<bool>> {
        let (left, right) = match (self.kind(a), self.kind(b)) {
            (VarKind::Tuple(l), VarKind::Tuple(r)) | (VarKind::List(l), VarKind::List(r)) => {
                (l.clone(), r.clone())
            }
            _ => return Ok(None),
        };
        let equality = matches!(name, "eq" | "ne");
        if equality && left.len() != right.len() {
            return Ok(Some(name == "ne"));
        }
        for (&x, &y) in left.iter().zip(&right) {
            if x == y {
                continue;
            }
            match self.known_equal(x, y)? {
                None => return Ok(None),
                Some(true) => continue,
                Some(false) if equality => return Ok(Some(name == "ne")),
                Some(false) => return self.known_order(name, x, y),
            }
        }
        let (n, m) = (left.len(), right.len());
        Ok(Some(match name {
            "eq" => true,
            "ne" => false,
            "lt" => n < m,
            "le" => n <= m,
            "gt" => n > m,
            "ge" => n >= m,
            _ => return Ok(None),
        }))
    }

    /// Whether two items are equal, where the trace knows both (constants, or sequences of
    /// them compared in turn).
    fn known_equal(&mut self, x: VarId, y: VarId) -> CResult<Option<bool>> {
        match (self.kind(x), self.kind(y)) {
            // The same object is equal without `__eq__` (a NaN to itself), as in Python.
            (VarKind::Const(p), VarKind::Const(q)) => {
                let (p, q) = (p.bind(self.py).clone(), q.bind(self.py).clone());
                Ok(Some(p.is(&q) || p.eq(q)?))
            }
            _ => self.sequence_order("eq", x, y),
        }
    }

    /// `op(x, y)` for the first unequal pair.
    fn known_order(&mut self, name: &str, x: VarId, y: VarId) -> CResult<Option<bool>> {
        match (self.kind(x), self.kind(y)) {
            (VarKind::Const(p), VarKind::Const(q)) => {
                let (p, q) = (p.bind(self.py).clone(), q.bind(self.py).clone());
                let op = match name {
                    "lt" => pyo3::basic::CompareOp::Lt,
                    "le" => pyo3::basic::CompareOp::Le,
                    "gt" => pyo3::basic::CompareOp::Gt,
                    "ge" => pyo3::basic::CompareOp::Ge,
                    _ => return Ok(None),
                };
                // A TypeError (`1 < "a"`) is raised where Python raises it: not here.
                Ok(p.rich_compare(q, op).and_then(|r| r.is_truthy()).ok())
            }
            _ => self.sequence_order(name, x, y),
        }
    }
}
