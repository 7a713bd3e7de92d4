//! `tensor.grad` — read and written by gradient clipping, gradient logging, manual
//! optimiser steps (`p -= lr * p.grad`) and `zero_grad` written by hand (`p.grad = None`).
//!
//! Nothing inside a graph runs a backward pass (`tensor.backward()` breaks the graph), so a
//! tensor's gradient cannot change while the graph runs except by the frame's own stores:
//! - a tensor the frame was given has the gradient it had when the frame was called: read
//!   through the source `<tensor>.grad` (a graph input, or `None`, guarded as any value read
//!   from a source is);
//! - a tensor the trace made (a computed tensor, a view, `x.detach()`, `x.data`) has none;
//! - `p.grad = v` and `del p.grad` on a tensor the frame was given are replayed after the
//!   graph, and read back by the trace until then.

use std::rc::Rc;

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::source::Source;
use super::translator::{unsupported, CResult, Mutation, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// The real tensor and the source of a tensor tracker that is a graph input.
    pub(super) fn tensor_given(&self, tensor: VarId) -> Option<(Bound<'py, PyAny>, Rc<Source>)> {
        let VarKind::Tensor { node, .. } = *self.kind(tensor) else {
            return None;
        };
        self.inputs
            .iter()
            .find(|input| input.node == node)
            .map(|input| (input.example.bind(self.py).clone(), input.source.clone()))
    }

    /// `tensor.grad`.
    pub(super) fn tensor_grad(&mut self, tensor: VarId) -> CResult<VarId> {
        let none = self.py.None().into_bound(self.py);
        let Some((real, source)) = self.tensor_given(tensor) else {
            return Ok(self.constant(&none));
        };
        match self.mutated_attr(&real, "grad") {
            Some(Some(stored)) => return Ok(stored),
            Some(None) => return Ok(self.constant(&none)),
            None => {}
        }
        let grad = real.getattr("grad")?;
        self.wrap(&grad, Some(Rc::new(Source::Attr(source, "grad".into()))))
    }

    /// `tensor.grad = value` (`del tensor.grad` when `value` is None).
    pub(super) fn store_tensor_grad(&mut self, tensor: VarId, value: Option<VarId>) -> CResult<()> {
        let py = self.py;
        let Some((real, source)) = self.tensor_given(tensor) else {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                "setting .grad of a tensor made in the trace",
            );
        };
        let value = match value {
            // `del p.grad` leaves None, as storing None does.
            None => self.constant(&py.None().into_bound(py)),
            Some(v) => v,
        };
        let is_none = matches!(self.kind(value), VarKind::Const(v) if v.bind(py).is_none());
        let grad_fake = match self.kind(value) {
            VarKind::Tensor { fake, .. } => Some(fake.bind(py).clone()),
            _ => None,
        };
        if let Some(grad_fake) = grad_fake {
            // Torch refuses a gradient of another size, dtype or device (eagerly, at the
            // store): such a store is left to run eagerly, where it raises.
            let fake = self.fake_value(tensor)?;
            let same =
                |name: &str| -> PyResult<bool> { grad_fake.getattr(name)?.eq(fake.getattr(name)?) };
            let sizes_known = static_sizes(&grad_fake)? && static_sizes(&fake)?;
            if !(sizes_known && same("shape")? && same("dtype")? && same("device")?) {
                return unsupported(
                    BreakKind::UnreplayableSideEffect,
                    "setting .grad to a tensor whose size, dtype or device may differ",
                );
            }
        } else if !is_none {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                "setting .grad to a value that is neither None nor a tensor",
            );
        }
        self.note_effect(Some(tensor));
        self.mutations.push(Mutation {
            source,
            object: OwnedRef::from_bound(&real),
            name: "grad".to_string(),
            value: Some(value),
        });
        Ok(())
    }
}

/// Whether every size of the fake tensor is a plain int (comparing symbolic sizes would
/// guard them).
pub(super) fn static_sizes(fake: &Bound<'_, PyAny>) -> PyResult<bool> {
    for size in fake.getattr("shape")?.try_iter()? {
        if !size?.is_exact_instance_of::<pyo3::types::PyInt>() {
            return Ok(false);
        }
    }
    Ok(true)
}
