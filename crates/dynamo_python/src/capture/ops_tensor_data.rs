//! `tensor.data = other` — swapping a tensor's storage and metadata for another's without
//! autograd seeing it: weight clipping and re-normalisation written the old way
//! (`self.weight.data = self.weight.data.clamp(-c, c)`), parameter averaging, manual
//! optimiser steps (`p.data = p.data - lr * p.grad`).
//!
//! As under TorchDynamo it is one graph node, `aten.shallow_copy_data_(tensor, other)`, with
//! grad mode off around it: the graph changes the real tensor in place when it runs, so
//! every later use of the tensor in the graph (its placeholder) and every alias of it after
//! the frame sees the new data. Only for a tensor the frame was given (a graph input): one
//! made in the trace has no object to change until the graph has run. The new data must
//! have the tensor's dtype and device, and, for a tensor that requires grad, sizes known to
//! equal its own (AOTAutograd builds the backward graph for the input's metadata). Anything
//! else breaks the graph, leaving the store to run eagerly (where torch raises for a value
//! that is not a tensor).

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::graph::Op;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// `tensor.data = value` (`del tensor.data` when `value` is None).
    pub(super) fn store_tensor_data(&mut self, tensor: VarId, value: Option<VarId>) -> CResult<()> {
        let py = self.py;
        let Some(value) = value else {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                "deleting .data of a tensor",
            );
        };
        if self.tensor_given(tensor).is_none() {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                "setting .data of a tensor made in the trace (only a tensor the frame was given \
                 can be changed by the graph, as under TorchDynamo)",
            );
        }
        let VarKind::Tensor { fake: new_fake, .. } = self.kind(value) else {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                "setting .data to a value that is not a tensor",
            );
        };
        let new_fake = new_fake.bind(py).clone();
        let fake = self.fake_value(tensor)?;
        let same =
            |name: &str| -> PyResult<bool> { new_fake.getattr(name)?.eq(fake.getattr(name)?) };
        if !same("dtype")? || !same("device")? {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                "setting .data to a tensor of another dtype or device",
            );
        }
        if fake.getattr("requires_grad")?.is_truthy()?
            && !(super::ops_tensor_grad::static_sizes(&fake)?
                && super::ops_tensor_grad::static_sizes(&new_fake)?
                && same("shape")?)
        {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                "setting .data of a tensor that requires grad to one whose sizes may differ \
                 (AOTAutograd builds the backward graph for the input's sizes)",
            );
        }
        // The placeholder keeps the metadata the input has when the graph is called (the
        // operation changes the fake tensor itself, as it changes the real one).
        if let VarKind::Tensor { node, .. } = *self.kind(tensor) {
            let snapshot = self
                .h
                .torch
                .getattr("_subclasses")?
                .getattr("fake_impls")?
                .call_method1("fast_detach", (&self.fake_mode, &fake))?;
            let placeholder = &mut self.graph.nodes[node.0 as usize];
            if matches!(placeholder.op, Op::Placeholder) {
                placeholder.fake = OwnedRef::from_bound(&snapshot);
            }
            // So do the shape guard's sizes of the input (dynamic shapes).
            for input in &mut self.dynamic_inputs {
                if input.fake.bind(py).is(&fake) {
                    input.fake = OwnedRef::from_bound(&snapshot);
                }
            }
        }
        let shallow_copy = self
            .h
            .torch
            .getattr("ops")?
            .getattr("aten")?
            .getattr("shallow_copy_data_")?;
        let grad_was_on = self.grad_enabled;
        if grad_was_on {
            self.set_grad_enabled(false)?;
        }
        let stored = self.graph_call(
            Op::CallFunction(OwnedRef::from_bound(&shallow_copy)),
            "shallow_copy_data_",
            vec![tensor, value],
            Vec::new(),
        );
        if grad_was_on {
            self.set_grad_enabled(true)?;
        }
        stored?;
        // FakeTensorMode's dispatch cache can answer the operation without running it (an
        // in-place result is the input, whatever its metadata): the fake is given the new
        // data directly, as the operation gives the real tensor.
        fake.setattr("data", &new_fake)?;
        self.note_effect(Some(tensor));
        Ok(())
    }
}
