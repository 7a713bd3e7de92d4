//! The loop operators `torch.ops.higher_order.while_loop` and `torch.ops.higher_order.scan`,
//! as `torch._higher_order_ops.while_loop` and `scan` call them once their inputs are
//! flattened (the trace inlines those wrappers, which take the compiling branch).
//!
//! As under TorchDynamo each function becomes a subgraph (see `subgraph`) and the graph calls
//! the operator once: `while_loop(cond_fn_0, body_fn_0, carried, additional)`,
//! `scan(scan_combine_fn_0, init, xs, additional)`. The functions are traced over stand-ins
//! for what changes from one step to the next (the carried values, the slices of `xs`):
//! nodes of their own, dropped from the graph afterwards, so that a function that also reads
//! the initial tensor through a closure reads that tensor, not the step's value. What the
//! functions read from before them is appended to the operator's additional inputs. Only
//! tensors are carried (torch also carries ints, as unbacked sizes); results must be tensors
//! the functions compute, with the metadata torch requires; nothing may need gradients
//! (torch's loops do not differentiate). Anything else breaks the graph at the call, which
//! then runs as it does eagerly.

use std::collections::HashMap;

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::graph::{Arg, NodeId, Op};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// Which loop operator `obj` is, if one.
    pub(super) fn loop_operator(&self, obj: &Bound<'py, PyAny>) -> Option<&'static str> {
        self.h
            .loop_operators
            .iter()
            .find(|(_, op)| op.is(obj))
            .map(|(name, _)| *name)
    }

    /// A call of a loop operator (see the module docs).
    pub(super) fn loop_call(
        &mut self,
        name: &str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        if !kwargs.is_empty() || args.len() != 4 {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("torch.ops.higher_order.{name}() with these arguments"),
            );
        }
        // while_loop(cond_fn, body_fn, carried, additional); scan(fn, init, xs, additional)
        let groups: &[VarId] = if name == "while_loop" {
            &args[2..]
        } else {
            &args[1..]
        };
        let groups = groups
            .iter()
            .map(|&group| self.loop_tensors(name, group))
            .collect::<CResult<Vec<_>>>()?;
        let (first, additional) = (&groups[0], &groups[groups.len() - 1]);
        if self.grad_enabled && groups.iter().flatten().any(|&v| self.needs_grad(v)) {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("torch.{name}() of tensors that need gradients"),
            );
        }
        if name == "while_loop" {
            self.while_loop(args[0], args[1], first, additional)
        } else {
            self.scan(args[0], first, &groups[1], &groups[2])
        }
    }

    /// The tensors of a tuple or list argument of a loop operator.
    fn loop_tensors(&self, name: &str, group: VarId) -> CResult<Vec<VarId>> {
        let items = match self.kind(group) {
            VarKind::Tuple(items) | VarKind::List(items) => items.clone(),
            _ => Vec::new(),
        };
        if items.iter().any(|&v| self.tensor_node(v).is_none()) {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("torch.{name}() carrying something that is not a tensor"),
            );
        }
        Ok(items)
    }

    /// Stand-ins made by `make` for each of `values`, in a span dropped from the graph.
    fn stand_ins(
        &mut self,
        values: &[VarId],
        make: impl Fn(&mut Self, VarId) -> CResult<VarId>,
    ) -> CResult<Vec<VarId>> {
        let first = self.graph.nodes.len();
        let made = values
            .iter()
            .map(|&v| make(self, v))
            .collect::<CResult<Vec<_>>>()?;
        self.discarded_nodes.push(first..self.graph.nodes.len());
        Ok(made)
    }

    /// `torch.ops.aten.<overload>(args)` recorded as an operation of the trace.
    fn aten_call(&mut self, overload: &str, args: Vec<VarId>) -> CResult<VarId> {
        let (name, variant) = overload.split_once('.').unwrap_or((overload, "default"));
        let op = self
            .h
            .torch
            .getattr("ops")?
            .getattr("aten")?
            .getattr(name)?
            .getattr(variant)?;
        self.graph_call(
            Op::CallFunction(OwnedRef::from_bound(&op)),
            name,
            args,
            Vec::new(),
        )
    }

    /// The nodes of the tensors a loop function returned, each computed by the function.
    fn computed_outputs(
        &self,
        what: &str,
        result: VarId,
        body: &super::subgraph::Body,
    ) -> CResult<(Vec<VarId>, Vec<NodeId>)> {
        let mut outputs = Vec::new();
        self.body_result_tensors(what, result, &mut outputs)?;
        let nodes: Vec<NodeId> = outputs
            .iter()
            .filter_map(|&v| self.tensor_node(v))
            .filter(|&n| body.contains(n))
            .collect();
        if nodes.len() != outputs.len() {
            // torch refuses results that alias an input; a constant would be one too.
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("{what} returning a tensor it did not compute"),
            );
        }
        Ok((outputs, nodes))
    }

    fn while_loop(
        &mut self,
        cond_fn: VarId,
        body_fn: VarId,
        carried: &[VarId],
        additional: &[VarId],
    ) -> CResult<VarId> {
        const COND: &str = "the condition of torch.while_loop";
        const BODY: &str = "the body of torch.while_loop";
        let py = self.py;
        if carried.is_empty() {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.while_loop() carrying nothing",
            );
        }
        let steps = self.stand_ins(carried, |t, v| t.aten_call("alias", vec![v]))?;
        let inputs: Vec<VarId> = steps.iter().chain(additional).copied().collect();
        let (condition, cond_body) = self.trace_body(COND, |t| {
            t.call_function(cond_fn, inputs.clone(), Vec::new())
        })?;
        let (result, body_body) = self.trace_body(BODY, |t| {
            t.call_function(body_fn, inputs.clone(), Vec::new())
        })?;
        let (_, condition_nodes) = self.computed_outputs(COND, condition, &cond_body)?;
        let is_scalar_bool = matches!(self.kind(condition), VarKind::Tensor { .. })
            && self
                .capture_helper("is_scalar_bool")?
                .call1((self.node_fakes(&condition_nodes)?,))?
                .is_truthy()?;
        if !is_scalar_bool {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.while_loop() whose condition is not a boolean tensor of one element",
            );
        }
        let (outputs, output_nodes) = self.computed_outputs(BODY, result, &body_body)?;
        let carried_nodes: Vec<NodeId> = carried
            .iter()
            .filter_map(|&v| self.tensor_node(v))
            .collect();
        let output_fakes = self.node_fakes(&output_nodes)?;
        if output_nodes.len() != carried_nodes.len()
            || !self
                .h
                .same_tensor_metadata
                .call1((self.node_fakes(&carried_nodes)?, &output_fakes))?
                .is_truthy()?
        {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.while_loop() whose body does not return tensors like those it carries",
            );
        }
        let step_nodes: Vec<NodeId> = steps.iter().filter_map(|&v| self.tensor_node(v)).collect();
        let additional_nodes: Vec<NodeId> = additional
            .iter()
            .filter_map(|&v| self.tensor_node(v))
            .collect();
        let first: Vec<NodeId> = step_nodes
            .iter()
            .chain(&additional_nodes)
            .copied()
            .collect();
        let lifted = self.lifted_inputs(&[&cond_body, &body_body], &first)?;
        let mut passed: Vec<NodeId> = carried_nodes.clone();
        passed.extend(&lifted[step_nodes.len()..]);
        if (1..passed.len()).any(|i| passed[..i].contains(&passed[i])) {
            // One tensor given to the functions twice (carried twice, or carried and read
            // through a closure): AOTAutograd refuses the operator's aliased inputs, as it
            // does TorchDynamo's graph; eagerly torch copes.
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.while_loop() given one tensor twice (carried twice, or carried and read \
                 by a function)",
            );
        }
        self.check_body_writes(COND, &cond_body, &lifted)?;
        self.check_body_writes(BODY, &body_body, &lifted)?;
        let cond_module = self.body_module_of_one(&cond_body, &lifted, condition_nodes[0])?;
        let body_module = self.body_module(&body_body, &lifted, &output_nodes)?;
        let cond_get = self.submodule("cond_fn_0", &cond_module);
        let body_get = self.submodule("body_fn_0", &body_module);
        let nodes = |ns: &[NodeId]| Arg::Tuple(ns.iter().map(|&n| Arg::Node(n)).collect());
        let call_args = vec![
            Arg::Node(cond_get),
            Arg::Node(body_get),
            nodes(&carried_nodes),
            nodes(&lifted[step_nodes.len()..]),
        ];
        let items = self.operation_outputs("while_loop", call_args, Vec::new(), &output_fakes)?;
        let replaced: HashMap<VarId, VarId> = outputs.into_iter().zip(items).collect();
        let _ = py;
        Ok(self.replace_tensors(result, &replaced))
    }

    fn scan(
        &mut self,
        combine_fn: VarId,
        init: &[VarId],
        xs: &[VarId],
        additional: &[VarId],
    ) -> CResult<VarId> {
        const WHAT: &str = "the function of torch.scan";
        let py = self.py;
        if init.is_empty() || xs.is_empty() {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.scan() without init or xs",
            );
        }
        let xs_nodes: Vec<NodeId> = xs.iter().filter_map(|&v| self.tensor_node(v)).collect();
        let length = self
            .capture_helper("scan_length")?
            .call1((self.node_fakes(&xs_nodes)?,))?;
        if length.is_none() {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.scan() over tensors of different or unknown lengths, or of none",
            );
        }
        let zero = self.constant(&0i64.into_pyobject(py)?.into_any());
        let carries = self.stand_ins(init, |t, v| t.aten_call("alias", vec![v]))?;
        let slices = self.stand_ins(xs, |t, v| t.aten_call("select.int", vec![v, zero, zero]))?;
        let inputs: Vec<VarId> = carries
            .iter()
            .chain(&slices)
            .chain(additional)
            .copied()
            .collect();
        let (result, body) = self.trace_body(WHAT, |t| {
            t.call_function(combine_fn, inputs.clone(), Vec::new())
        })?;
        // The function returns (next carry, step outputs), each structured as the caller
        // made it: their tensors, in order, each computed by the function and none twice.
        let parts = match self.kind(result) {
            VarKind::Tuple(items) | VarKind::List(items) if items.len() == 2 => items.clone(),
            _ => Vec::new(),
        };
        let (mut carry_leaves, mut step_leaves) = (Vec::new(), Vec::new());
        if parts.is_empty()
            || !self.tensor_leaves(parts[0], &mut carry_leaves)
            || !self.tensor_leaves(parts[1], &mut step_leaves)
            || carry_leaves.len() != init.len()
        {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.scan() whose function does not return a carry like its init and tensors",
            );
        }
        let (outputs, output_nodes) = self.computed_outputs(WHAT, result, &body)?;
        if outputs.len() != carry_leaves.len() + step_leaves.len() {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.scan() whose function returns one tensor twice",
            );
        }
        let init_nodes: Vec<NodeId> = init.iter().filter_map(|&v| self.tensor_node(v)).collect();
        let (carry_nodes, step_output_nodes) = output_nodes.split_at(init.len());
        if !self
            .h
            .same_tensor_metadata
            .call1((self.node_fakes(&init_nodes)?, self.node_fakes(carry_nodes)?))?
            .is_truthy()?
        {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.scan() whose function returns a carry unlike its init",
            );
        }
        let result_fakes = self.capture_helper("scan_result_fakes")?.call1((
            self.node_fakes(carry_nodes)?,
            self.node_fakes(step_output_nodes)?,
            &length,
        ))?;
        let result_fakes = result_fakes
            .cast_into::<pyo3::types::PyTuple>()
            .map_err(PyErr::from)?;
        let node_ids = |vs: &[VarId]| -> Vec<NodeId> {
            vs.iter().filter_map(|&v| self.tensor_node(v)).collect()
        };
        let (carry_ids, slice_ids, additional_ids) =
            (node_ids(&carries), node_ids(&slices), node_ids(additional));
        let first: Vec<NodeId> = carry_ids
            .iter()
            .chain(&slice_ids)
            .chain(&additional_ids)
            .copied()
            .collect();
        let lifted = self.lifted_inputs(&[&body], &first)?;
        self.check_body_writes(WHAT, &body, &lifted)?;
        let module = self.body_module(&body, &lifted, &output_nodes)?;
        let get = self.submodule("scan_combine_fn_0", &module);
        let nodes = |ns: &[NodeId]| Arg::List(ns.iter().map(|&n| Arg::Node(n)).collect());
        let call_args = vec![
            Arg::Node(get),
            nodes(&init_nodes),
            nodes(&xs_nodes),
            nodes(&lifted[carry_ids.len() + slice_ids.len()..]),
        ];
        let items = self.operation_outputs("scan", call_args, Vec::new(), &result_fakes)?;
        // The operator returns the final carries and the stacked outputs as one flat
        // sequence; the caller gets them in the structure its function returned them.
        let replaced: HashMap<VarId, VarId> = outputs.into_iter().zip(items).collect();
        Ok(self.replace_tensors(result, &replaced))
    }

    /// Collects the tensors of `id` (a tensor, or tuples and lists of them), in order,
    /// repeats included; false if something else is there.
    fn tensor_leaves(&self, id: VarId, out: &mut Vec<VarId>) -> bool {
        match self.kind(id) {
            VarKind::Tensor { .. } => {
                out.push(id);
                true
            }
            VarKind::Tuple(items) | VarKind::List(items) => items
                .clone()
                .into_iter()
                .all(|i| self.tensor_leaves(i, out)),
            _ => false,
        }
    }

    /// A function of `dynamo_rs._capture`.
    fn capture_helper(&self, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.py.import_module("dynamo_rs._capture")?.getattr(name)
    }
}
