//! `torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=..., **kwargs)` inside
//! traced code: activation checkpointing (as transformers' `gradient_checkpointing_enable()`
//! applies it to every layer).
//!
//! Eagerly, `checkpoint` runs `function` without keeping its intermediate values and runs it
//! again during backward. `checkpoint` itself is disabled for TorchDynamo, and calling it was a
//! graph break on either side of every checkpointed layer; TorchDynamo captures it instead as
//! the higher-order operation `torch.ops.higher_order.tag_activation_checkpoint(body, *inputs)`
//! whose `body` is a GraphModule of the function's operations — which every backend handles:
//! run as it is it checkpoints `body`; AOTAutograd traces through it and marks its operations
//! to be recomputed in backward, which the partitioner honours. So do we:
//!
//! The function is traced inline, as any call, with no effect allowed outside it (no stores to
//! older objects, no tensor changed in place, no random numbers — a recomputation must
//! compute the same thing), then its nodes are moved out of the graph (`discarded_nodes`)
//! into the body: every value they read from before (tensors, sizes, graph inputs first read
//! inside) becomes an input of the body, in first-use order, and the tensors of the
//! function's result (a tensor, or tuples and lists of tensors and constants) its outputs.
//! The graph gets a `get_attr` of the body and the operation's call, whose items stand for
//! the result's tensors.
//!
//! Not captured (a graph break at the call, as before): a `context_fn` (selective
//! checkpointing policies), a function whose result holds anything else, nested checkpoints,
//! and `use_reentrant=True` when no input needs a gradient (eagerly nothing then gets a
//! gradient through the function, which the higher-order operation would not reproduce).
//! With grad mode off nothing is recomputed and the function is simply inlined.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::break_reasons::BreakKind;
use super::graph::{Arg, Node, NodeId, Op};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// `checkpoint`'s own keyword arguments; the others are the function's.
const CHECKPOINT_KEYWORDS: &[&str] = &[
    "use_reentrant",
    "preserve_rng_state",
    "context_fn",
    "determinism_check",
    "debug",
    "early_stop",
    "respect_saved_tensors_hooks",
];

impl<'py> Tracer<'py> {
    /// Whether `obj` is `torch.utils.checkpoint.checkpoint`.
    pub(super) fn is_checkpoint(&self, obj: &Bound<'py, PyAny>) -> bool {
        obj.is(&self.h.checkpoint)
    }

    /// A call of `torch.utils.checkpoint.checkpoint` (see the module docs).
    pub(super) fn checkpoint_call(
        &mut self,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let Some((&function, function_args)) = args.split_first() else {
            return unsupported(
                BreakKind::UnsupportedCall,
                "checkpoint() without a function",
            );
        };
        let (own, passed): (Vec<_>, Vec<_>) = kwargs
            .into_iter()
            .partition(|(k, _)| CHECKPOINT_KEYWORDS.contains(&k.as_str()));
        let mut reentrant = true;
        let mut own_values = Vec::new();
        for (keyword, value) in &own {
            let value = match self.kind(*value) {
                VarKind::Const(v) => v.bind(py).clone(),
                VarKind::Object(v) if keyword == "context_fn" => {
                    let default = py
                        .import_module("torch.utils.checkpoint")?
                        .getattr("noop_context_fn")?;
                    if !v.bind(py).is(&default) {
                        return unsupported(
                            BreakKind::UnsupportedCall,
                            "checkpoint() with a context_fn (selective checkpointing)",
                        );
                    }
                    self.pin_identity(*value);
                    continue;
                }
                VarKind::Tensor { .. }
                | VarKind::Symbolic { .. }
                | VarKind::Slice(_)
                | VarKind::Unrealized(_)
                | VarKind::Object(_)
                | VarKind::Tuple(_)
                | VarKind::List(_)
                | VarKind::Dict(_)
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
                | VarKind::NdArray(_) => {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!("checkpoint() with {keyword}= not a constant"),
                    )
                }
            };
            if keyword == "use_reentrant" && !value.is_none() {
                reentrant = value.is_truthy()?;
            }
            own_values.push((keyword.clone(), value));
        }
        if !self.grad_enabled {
            // Nothing to recompute: eagerly the function just runs.
            return self.call_function(function, function_args.to_vec(), passed);
        }
        if reentrant && !passed.is_empty() {
            return unsupported(
                BreakKind::UnsupportedCall,
                "checkpoint(use_reentrant=True) with keyword arguments for the function (an \
                 error eagerly)",
            );
        }
        if reentrant && !function_args.iter().any(|&a| self.needs_grad(a)) {
            return unsupported(
                BreakKind::UnsupportedCall,
                "checkpoint(use_reentrant=True) where no input needs a gradient",
            );
        }
        let first = self.graph.nodes.len();
        let nested_before = self.discarded_nodes.len();
        let result = self.without_effects("a checkpointed function", |t| {
            t.call_function(function, function_args.to_vec(), passed)
        })?;
        if self.discarded_nodes.len() != nested_before {
            return unsupported(
                BreakKind::UnsupportedCall,
                "a checkpointed function with a checkpoint or autograd.Function inside",
            );
        }
        let end = self.graph.nodes.len();
        let mut outputs = Vec::new();
        self.checkpoint_outputs(result, &mut outputs)?;
        if outputs.is_empty() {
            // Nothing computed reaches the result.
            self.discarded_nodes.push(first..end);
            return Ok(result);
        }
        let in_body = |graph: &super::graph::Graph, n: NodeId| -> bool {
            n.0 as usize >= first && !matches!(graph.nodes[n.0 as usize].op, Op::Placeholder)
        };
        let output_nodes = outputs
            .iter()
            .map(|&v| match self.kind(v) {
                VarKind::Tensor { node, .. } => *node,
                _ => unreachable!("outputs are tensors"),
            })
            .collect::<Vec<_>>();
        if output_nodes.iter().any(|&n| !in_body(&self.graph, n)) {
            return unsupported(
                BreakKind::UnsupportedCall,
                "a checkpointed function returning a tensor it was given",
            );
        }
        self.discarded_nodes.push(first..end);

        // The body: its inputs (values from before, in first-use order), then its operations.
        let mut lifted: Vec<NodeId> = Vec::new();
        let mut body_index: HashMap<u32, NodeId> = HashMap::new();
        for i in first..end {
            let node = &self.graph.nodes[i];
            if matches!(node.op, Op::Placeholder) {
                continue;
            }
            let mut reads = Vec::new();
            node.args.iter().for_each(|a| node_reads(a, &mut reads));
            node.kwargs
                .iter()
                .for_each(|(_, a)| node_reads(a, &mut reads));
            for n in reads {
                if !in_body(&self.graph, n) && !lifted.contains(&n) {
                    lifted.push(n);
                }
            }
        }
        let none = OwnedRef::from_bound(&py.None().into_bound(py));
        let mut body: Vec<Node> = Vec::new();
        for &n in &lifted {
            let outer = &self.graph.nodes[n.0 as usize];
            body_index.insert(n.0, NodeId(body.len() as u32));
            body.push(Node {
                op: Op::Placeholder,
                name: outer.name.clone(),
                args: Vec::new(),
                kwargs: Vec::new(),
                fake: outer.fake.clone(),
            });
        }
        for i in first..end {
            let node = &self.graph.nodes[i];
            if matches!(node.op, Op::Placeholder) {
                continue;
            }
            let remap = |a: &Arg| remap_arg(a, &body_index);
            let copied = Node {
                op: node.op.clone(),
                name: node.name.clone(),
                args: node.args.iter().map(remap).collect(),
                kwargs: node
                    .kwargs
                    .iter()
                    .map(|(k, a)| (k.clone(), remap(a)))
                    .collect(),
                fake: node.fake.clone(),
            };
            body_index.insert(i as u32, NodeId(body.len() as u32));
            body.push(copied);
        }
        let body_outputs: Vec<NodeId> = output_nodes.iter().map(|n| body_index[&n.0]).collect();
        let (nodes, outs, fakes) = super::graph_for_python(py, &self.h, &body, &body_outputs)?;
        let module = py
            .import_module("dynamo_rs._capture")?
            .call_method1("export_subgraph", (nodes, outs, fakes))?;

        // The graph: `self.wrap_body_<n>`, then the operation's call.
        let get = self
            .graph
            .add(Op::Placeholder, "wrap_body_0", Vec::new(), Vec::new(), none);
        let attribute = self.graph.nodes[get.0 as usize].name.clone();
        self.graph.nodes[get.0 as usize].op = Op::GetAttr {
            name: attribute,
            module: OwnedRef::from_bound(&module),
        };
        let operation = py
            .import_module("torch")?
            .getattr("ops")?
            .getattr("higher_order")?
            .getattr("tag_activation_checkpoint")?;
        let mut call_args = vec![Arg::Node(get)];
        call_args.extend(lifted.iter().map(|&n| Arg::Node(n)));
        let call_kwargs = own_values
            .into_iter()
            .map(|(k, v)| (k, Arg::Const(OwnedRef::from_bound(&v))))
            .collect();
        let output_fakes = PyTuple::new(
            py,
            output_nodes
                .iter()
                .map(|n| self.graph.nodes[n.0 as usize].fake.bind(py).clone()),
        )?;
        let node = self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&operation)),
            "tag_activation_checkpoint",
            call_args,
            call_kwargs,
            OwnedRef::from_bound(output_fakes.as_any()),
        );
        let items =
            self.wrap_node_result(node, output_fakes.as_any(), "tag_activation_checkpoint")?;
        let items = if let VarKind::Tuple(items) = self.kind(items) {
            items.clone()
        } else {
            return unsupported(BreakKind::Internal, "internal: checkpoint outputs");
        };
        let replaced: HashMap<VarId, VarId> = outputs.into_iter().zip(items).collect();
        Ok(self.replace_checkpoint_outputs(result, &replaced))
    }

    /// The tensors in a checkpointed function's result, in order (a tensor, or tuples and
    /// lists of tensors and constants); anything else is refused.
    fn checkpoint_outputs(&self, id: VarId, out: &mut Vec<VarId>) -> CResult<()> {
        match self.kind(id) {
            VarKind::Tensor { .. } => {
                if !out.contains(&id) {
                    out.push(id);
                }
                Ok(())
            }
            VarKind::Const(_) => Ok(()),
            VarKind::Tuple(items) | VarKind::List(items) => {
                for &item in items {
                    self.checkpoint_outputs(item, out)?;
                }
                Ok(())
            }
            other @ (VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Unrealized(_)
            | VarKind::Object(_)
            | VarKind::Dict(_)
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
                BreakKind::UnsupportedCall,
                format!(
                    "a checkpointed function returning {}",
                    super::translator::kind_name(other)
                ),
            ),
        }
    }

    /// `id` with each tensor of `replaced` swapped for its stand-in (new tuples and lists).
    fn replace_checkpoint_outputs(&mut self, id: VarId, replaced: &HashMap<VarId, VarId>) -> VarId {
        if let Some(&new) = replaced.get(&id) {
            return new;
        }
        match self.kind(id) {
            VarKind::Tuple(items) => {
                let items = items.clone();
                let new = items
                    .iter()
                    .map(|&i| self.replace_checkpoint_outputs(i, replaced))
                    .collect();
                let made = self.add(VarKind::Tuple(new), None);
                if let Some(fields) = self.tuple_fields.get(&id).cloned() {
                    self.tuple_fields.insert(made, fields);
                }
                if let Some(class) = self.tuple_classes.get(&id).cloned() {
                    self.tuple_classes.insert(made, class);
                }
                made
            }
            VarKind::List(items) => {
                let items = items.clone();
                let new = items
                    .iter()
                    .map(|&i| self.replace_checkpoint_outputs(i, replaced))
                    .collect();
                self.add(VarKind::List(new), None)
            }
            _ => id,
        }
    }
}

/// The nodes an argument reads.
fn node_reads(arg: &Arg, out: &mut Vec<NodeId>) {
    match arg {
        Arg::Node(n) => out.push(*n),
        Arg::Tuple(items) | Arg::List(items) | Arg::Slice(items) => {
            items.iter().for_each(|a| node_reads(a, out))
        }
        Arg::Dict(entries) => entries.iter().for_each(|(_, a)| node_reads(a, out)),
        Arg::Const(_) => {}
    }
}

/// `arg` with its nodes renumbered into the body.
fn remap_arg(arg: &Arg, index: &HashMap<u32, NodeId>) -> Arg {
    let items = |items: &[Arg]| items.iter().map(|a| remap_arg(a, index)).collect();
    match arg {
        Arg::Node(n) => Arg::Node(index[&n.0]),
        Arg::Tuple(items_) => Arg::Tuple(items(items_)),
        Arg::List(items_) => Arg::List(items(items_)),
        Arg::Slice(items_) => Arg::Slice(items(items_)),
        Arg::Dict(entries) => Arg::Dict(
            entries
                .iter()
                .map(|(k, a)| (k.clone(), remap_arg(a, index)))
                .collect(),
        ),
        Arg::Const(c) => Arg::Const(c.clone()),
    }
}
