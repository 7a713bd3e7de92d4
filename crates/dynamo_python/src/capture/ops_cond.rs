//! `torch.cond(pred, true_fn, false_fn, operands)` inside traced code.
//!
//! A constant `pred` (a Python bool or number) runs the chosen function, as eagerly. A tensor
//! `pred` keeps both sides in the graph, as TorchDynamo does: each function is traced as a
//! subgraph body (see `subgraph`: nothing changed outside it, no random numbers) over the
//! operands, and the graph calls `torch.ops.higher_order.cond(pred, self.cond_true_0,
//! self.cond_false_0, inputs)` — both subgraphs take the same inputs: the operands, then what
//! either function reads from before. Both results must be tensors (or tuples and lists of
//! tensors) of the same structure and the same sizes, dtypes and devices, each computed by the
//! function (torch.cond refuses the rest eagerly; here they break the graph at the call).

use std::collections::HashMap;

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::graph::{Arg, NodeId};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};

const WHAT: &str = "a branch of torch.cond";

impl<'py> Tracer<'py> {
    /// Whether `obj` is `torch.cond`.
    pub(super) fn is_cond(&self, obj: &Bound<'py, PyAny>) -> bool {
        obj.is(&self.h.cond)
    }

    /// A call of `torch.cond` (see the module docs).
    pub(super) fn cond_call(
        &mut self,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let mut bound: Vec<Option<VarId>> = args.iter().map(|&a| Some(a)).collect();
        bound.resize(4.max(bound.len()), None);
        for (name, value) in &kwargs {
            let Some(position) = ["pred", "true_fn", "false_fn", "operands"]
                .iter()
                .position(|p| p == name)
            else {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    format!("torch.cond() with the keyword {name}"),
                );
            };
            if bound[position].replace(*value).is_some() {
                // Given twice: a TypeError eagerly, raised by the call run as it is.
                return unsupported(
                    BreakKind::UnsupportedCall,
                    format!("torch.cond() given {name} twice"),
                );
            }
        }
        let (Some(pred), Some(true_fn), Some(false_fn), 4) =
            (bound[0], bound[1], bound[2], bound.len())
        else {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.cond() with these arguments",
            );
        };
        let operands = match bound[3].map(|o| self.kind(o)) {
            None => Vec::new(),
            Some(VarKind::Tuple(items) | VarKind::List(items)) => items.clone(),
            Some(_) => {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    "torch.cond() with operands that are not a tuple or list",
                )
            }
        };
        if let VarKind::Const(value) = self.kind(pred) {
            // Known while tracing: the chosen function runs, as eagerly.
            let chosen = if value.bind(py).is_truthy()? {
                true_fn
            } else {
                false_fn
            };
            return self.call_function(chosen, operands, Vec::new());
        }
        let Some(pred_node) = self.tensor_node(pred) else {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.cond() with a predicate that is neither a tensor nor a constant",
            );
        };
        let mut operand_nodes = Vec::new();
        for &operand in &operands {
            match self.tensor_node(operand) {
                Some(node) => operand_nodes.push(node),
                None => {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        "torch.cond() with an operand that is not a tensor",
                    )
                }
            }
        }
        let (true_result, true_body) = self.trace_body(WHAT, |t| {
            t.call_function(true_fn, operands.clone(), Vec::new())
        })?;
        let (false_result, false_body) = self.trace_body(WHAT, |t| {
            t.call_function(false_fn, operands.clone(), Vec::new())
        })?;
        if !self.same_structure(true_result, false_result) {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.cond() whose branches return different structures",
            );
        }
        let (mut true_outputs, mut false_outputs) = (Vec::new(), Vec::new());
        self.body_result_tensors(WHAT, true_result, &mut true_outputs)?;
        self.body_result_tensors(WHAT, false_result, &mut false_outputs)?;
        let true_nodes: Vec<NodeId> = true_outputs
            .iter()
            .filter_map(|&v| self.tensor_node(v))
            .collect();
        let false_nodes: Vec<NodeId> = false_outputs
            .iter()
            .filter_map(|&v| self.tensor_node(v))
            .collect();
        let computed = true_nodes.iter().all(|&n| true_body.contains(n))
            && false_nodes.iter().all(|&n| false_body.contains(n));
        if true_nodes.len() != false_nodes.len() || true_nodes.is_empty() || !computed {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.cond() whose branches do not each compute their own tensors",
            );
        }
        let (true_fakes, false_fakes) = (
            self.node_fakes(&true_nodes)?,
            self.node_fakes(&false_nodes)?,
        );
        if !self
            .h
            .same_tensor_metadata
            .call1((&true_fakes, &false_fakes))?
            .is_truthy()?
        {
            return unsupported(
                BreakKind::UnsupportedCall,
                "torch.cond() whose branches return tensors of different sizes, dtypes or \
                 devices",
            );
        }
        let lifted = self.lifted_inputs(&[&true_body, &false_body], &operand_nodes)?;
        self.check_body_writes(WHAT, &true_body, &lifted)?;
        self.check_body_writes(WHAT, &false_body, &lifted)?;
        let true_module = self.body_module(&true_body, &lifted, &true_nodes)?;
        let false_module = self.body_module(&false_body, &lifted, &false_nodes)?;
        let true_get = self.submodule("cond_true_0", &true_module);
        let false_get = self.submodule("cond_false_0", &false_module);
        let call_args = vec![
            Arg::Node(pred_node),
            Arg::Node(true_get),
            Arg::Node(false_get),
            Arg::Tuple(lifted.iter().map(|&n| Arg::Node(n)).collect()),
        ];
        let items = self.operation_outputs("cond", call_args, Vec::new(), &true_fakes)?;
        let replaced: HashMap<VarId, VarId> = true_outputs.into_iter().zip(items).collect();
        Ok(self.replace_tensors(true_result, &replaced))
    }

    /// Whether two results have the same shape of tuples, lists and tensors.
    fn same_structure(&self, a: VarId, b: VarId) -> bool {
        match (self.kind(a), self.kind(b)) {
            (VarKind::Tensor { .. }, VarKind::Tensor { .. }) => true,
            (VarKind::Tuple(x), VarKind::Tuple(y)) | (VarKind::List(x), VarKind::List(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(&p, &q)| self.same_structure(p, q))
            }
            _ => false,
        }
    }
}
