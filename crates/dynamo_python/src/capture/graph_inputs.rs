//! Graph inputs: the placeholder for each real tensor the trace reaches (one per source;
//! one per object when a tensor is reached through two sources), and for an int argument
//! the dynamic-shape policy makes symbolic. Their fakes come from `_shapes` (static or
//! symbolic in the dimensions the policy picks); each records the guard that keeps it valid.

use std::rc::Rc;

use pyo3::prelude::*;

use crate::imports::ImportModule;

use super::break_reasons::BreakKind;
use super::graph::{NodeId, Op};
use super::guards::GuardKind;
use super::source::Source;
use super::translator::{unsupported, CResult, DynamicInput, GraphInput, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// The placeholder for a real tensor from `source` (one per source). Its fake is
    /// symbolic in the dimensions the dynamic-shape policy picks (see `_shapes`).
    pub(super) fn graph_input(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: Rc<Source>,
    ) -> CResult<VarId> {
        let key = self.guards.sources.intern(&source);
        if let Some(&existing) = self.input_by_source.get(&key) {
            return Ok(existing);
        }
        // The same tensor reached through another source (`mha(x, x, x)`): one placeholder,
        // as in TorchDynamo, so that `query is key` holds in the trace as it does in Python.
        // The guard checks this source is that same object (`Check::Alias`).
        if let Some(input) = self
            .inputs
            .iter()
            .find(|i| i.example.bind(self.py).is(value))
        {
            let node = input.node;
            let existing =
                self.input_by_source.values().copied().find(
                    |&v| matches!(self.kind(v), VarKind::Tensor { node: n, .. } if *n == node),
                );
            if let Some(existing) = existing {
                self.guards.add(
                    source.clone(),
                    GuardKind::Tensor(OwnedRef::from_bound(value)),
                );
                self.input_by_source.insert(key, existing);
                return Ok(existing);
            }
        }
        self.refuse_changes_beside_arrays(matches!(&*source, Source::AsTensor(_)))?;
        let name = source.graph_name();
        let path = source.describe();
        // Tensors a module owns stay static unless marked (TorchDynamo's
        // `force_parameter_static_shapes` and `force_nn_module_property_static_shapes`).
        let module_owned = path.contains("._parameters[") || path.contains("._buffers[");
        let code = match &self.root_code {
            Some(code) => code.bind(self.py).clone(),
            None => self.py.None().into_bound(self.py),
        };
        let made = self.h.input_fake.call1((
            &self.fake_mode,
            value,
            code,
            &path,
            self.dynamic,
            module_owned,
        ));
        let made = match made {
            Ok(made) => made,
            // Torch refuses to describe some tensors' autograd state (a view made under
            // no_grad whose base was then changed in place with grad mode on: reading its
            // `grad_fn` raises): such a tensor is not traced, the frame runs as it is. (A size
            // outside a range given to `mark_dynamic`, and our own errors, are raised.)
            Err(err)
                if err.is_instance_of::<pyo3::exceptions::PyRuntimeError>(self.py)
                    && !err.is_instance_of::<crate::errors::CompileError>(self.py) =>
            {
                return unsupported(
                    BreakKind::FakeTensorFailure,
                    format!("{path} cannot be described as a fake tensor: {err}"),
                );
            }
            Err(err) => return Err(err.into()),
        };
        let (fake, user_marks) = made.extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>()?;
        let node = self.graph.add(
            Op::Placeholder,
            &name,
            Vec::new(),
            Vec::new(),
            OwnedRef::from_bound(&fake),
        );
        let dims = self.h.symbolic_dims.call1((&fake,))?;
        if !dims.is_none() {
            let (sizes, strides): (Vec<bool>, Vec<bool>) = dims.extract()?;
            self.guards.dynamic_dims.insert(key, (sizes, strides));
            self.dynamic_inputs.push(DynamicInput {
                source: source.clone(),
                fake: OwnedRef::from_bound(&fake),
                user_marks: OwnedRef::from_bound(&user_marks),
            });
        }
        self.guards.add(
            source.clone(),
            GuardKind::Tensor(OwnedRef::from_bound(value)),
        );
        let kind = VarKind::Tensor {
            node,
            fake: OwnedRef::from_bound(&fake),
        };
        Ok(self.register_input(key, node, source, value, kind))
    }

    /// Records graph input `node` (its placeholder), loaded from `source` (interned as
    /// `key`), seen as `value`, traced as `kind`; returns its tracker.
    fn register_input(
        &mut self,
        key: u32,
        node: NodeId,
        source: Rc<Source>,
        value: &Bound<'py, PyAny>,
        kind: VarKind,
    ) -> VarId {
        self.inputs.push(GraphInput {
            node,
            source: source.clone(),
            example: OwnedRef::from_bound(value),
        });
        let id = self.add(kind, Some(source));
        self.input_by_source.insert(key, id);
        id
    }

    /// A frame argument that is an int or a float, when the dynamic-shape policy makes it
    /// symbolic (`_shapes.dynamic_int`, `dynamic_float`): a graph input whose fake is a SymInt
    /// or SymFloat, guarded by type here and by the shape guard for its value. None: a
    /// constant as usual. `automatic_only`: symbolic only once seen with another value, even
    /// under `dynamic=True`.
    pub(super) fn int_input(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: Rc<Source>,
        automatic_only: bool,
    ) -> CResult<Option<VarId>> {
        let key = self.guards.sources.intern(&source);
        if let Some(&existing) = self.input_by_source.get(&key) {
            return Ok(Some(existing));
        }
        let Some(code) = &self.root_code else {
            return Ok(None);
        };
        let code = code.bind(self.py).clone();
        let helper = if value.is_exact_instance_of::<pyo3::types::PyFloat>() {
            "dynamic_float"
        } else {
            "dynamic_int"
        };
        let symbolic = self.py.import_module("dynamo_rs._shapes")?.call_method1(
            helper,
            (
                &self.fake_mode,
                value,
                code,
                source.describe(),
                if automatic_only && self.dynamic == Some(true) {
                    None
                } else {
                    self.dynamic
                },
            ),
        )?;
        if symbolic.is_none() {
            return Ok(None);
        }
        let node = self.graph.add(
            Op::Placeholder,
            &source.graph_name(),
            Vec::new(),
            Vec::new(),
            OwnedRef::from_bound(&symbolic),
        );
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(value.get_type().as_any())),
        );
        self.dynamic_inputs.push(DynamicInput {
            source: source.clone(),
            fake: OwnedRef::from_bound(&symbolic),
            user_marks: OwnedRef::from_bound(&self.py.None().into_bound(self.py)),
        });
        let kind = VarKind::Symbolic {
            node,
            fake: OwnedRef::from_bound(&symbolic),
        };
        Ok(Some(self.register_input(key, node, source, value, kind)))
    }
}
