//! Subgraphs: the bodies of higher-order operations (`tag_activation_checkpoint`, `cond`),
//! traced inline and then moved out of the graph into GraphModules of their own.
//!
//! A body is traced as any call (`trace_body`), with no effect allowed outside it — no stores
//! to objects older than it, no random numbers (unless its operation draws them again alike:
//! `random_in_next_body`), in-place changes only to tensors it made (the operation may run it
//! again, or not at all). Its nodes are then dropped from the graph
//! (`discarded_nodes`): the graph inputs first read inside stay, and so do the nodes of traces
//! made only to check something (an `autograd.Function`'s forward, a nested body), which their
//! own operation stands for. `lifted_inputs` lists what bodies read from before them (tensors,
//! sizes, graph inputs): the subgraphs' placeholders, in first-use order, and the operation's
//! arguments. `body_module` makes a body's GraphModule, `submodule` the graph's `get_attr`
//! node for it, and `operation_outputs` the trackers for the operation's results.

use std::collections::HashMap;
use std::ops::Range;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::break_reasons::BreakKind;
use super::graph::{Arg, Node, NodeId, Op};
use super::translator::{kind_name, unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// A traced body: the operations that belong to it.
#[derive(Debug)]
pub struct Body {
    /// Indices of its operations, ascending.
    pub ops: Vec<usize>,
    /// Ranges of traces made only to check something inside it.
    nested: Vec<Range<usize>>,
}

impl Body {
    pub fn contains(&self, n: NodeId) -> bool {
        self.ops.binary_search(&(n.0 as usize)).is_ok()
    }
}

/// A function traced as the body of an operation (`Tracer::trace_function_body`).
pub(super) struct FunctionBody<'py> {
    /// The tensors of its result it computed, and their nodes.
    pub outputs: Vec<VarId>,
    pub output_nodes: Vec<NodeId>,
    /// What it read from before it: the subgraph's inputs.
    pub lifted: Vec<NodeId>,
    pub module: Bound<'py, PyAny>,
}

impl<'py> Tracer<'py> {
    /// Traces `trace` as the body of an operation named `what` (for messages), refusing
    /// effects outside it; returns its result and its span. Its nodes are discarded from
    /// the graph (they go into a subgraph, or nowhere).
    pub(super) fn trace_body(
        &mut self,
        what: &str,
        trace: impl FnOnce(&mut Self) -> CResult<VarId>,
    ) -> CResult<(VarId, Body)> {
        let py = self.py;
        // Asked for this body only: a body traced inside it decides for itself.
        let random_ok = std::mem::take(&mut self.random_in_next_body);
        let first = self.graph.nodes.len();
        let nested_before = self.discarded_nodes.len();
        let (result, changed_python) = self.counting_effects(trace)?;
        if changed_python {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("{what} that changes Python state outside it"),
            );
        }
        let end = self.graph.nodes.len();
        let nested = self.discarded_nodes[nested_before..].to_vec();
        let ops: Vec<usize> = (first..end)
            .filter(|&i| {
                !matches!(self.graph.nodes[i].op, Op::Placeholder)
                    && !nested.iter().any(|r| r.contains(&i))
            })
            .collect();
        let body = Body { ops, nested };
        if !random_ok
            && body
                .ops
                .iter()
                .any(|&i| super::node_draws_random(py, &self.graph.nodes[i]))
        {
            // Run not at all (cond), or again, the draws would differ from eager's.
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("{what} that draws random numbers"),
            );
        }
        self.discarded_nodes.push(first..end);
        Ok((result, body))
    }

    /// `function(*args, **kwargs)` traced as a body (`trace_body`) whose own tensors in its
    /// result are the outputs of a subgraph reading what it read from before (tensors it
    /// returns as it got them stay as they are): its result, and unless nothing it computed
    /// reaches the result, the subgraph.
    pub(super) fn trace_function_body(
        &mut self,
        what: &str,
        function: VarId,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<(VarId, Option<FunctionBody<'py>>)> {
        let (result, body) = self.trace_body(what, |t| t.call_function(function, args, kwargs))?;
        let mut outputs = Vec::new();
        self.body_result_tensors(what, result, &mut outputs)?;
        outputs.retain(|&v| self.tensor_node(v).is_some_and(|n| body.contains(n)));
        if outputs.is_empty() {
            return Ok((result, None));
        }
        let output_nodes: Vec<NodeId> = outputs
            .iter()
            .filter_map(|&v| self.tensor_node(v))
            .collect();
        let lifted = self.lifted_inputs(&[&body], &[])?;
        self.check_body_writes(what, &body, &lifted)?;
        let module = self.body_module(&body, &lifted, &output_nodes)?;
        let traced = FunctionBody {
            outputs,
            output_nodes,
            lifted,
            module,
        };
        Ok((result, Some(traced)))
    }

    /// What `bodies` read from before them, in first-use order after `first_inputs`.
    pub(super) fn lifted_inputs(
        &self,
        bodies: &[&Body],
        first_inputs: &[NodeId],
    ) -> CResult<Vec<NodeId>> {
        let mut lifted: Vec<NodeId> = first_inputs.to_vec();
        for body in bodies {
            for &i in &body.ops {
                let node = &self.graph.nodes[i];
                let mut reads = Vec::new();
                node.args.iter().for_each(|a| node_reads(a, &mut reads));
                node.kwargs
                    .iter()
                    .for_each(|(_, a)| node_reads(a, &mut reads));
                for n in reads {
                    let index = n.0 as usize;
                    if body.nested.iter().any(|r| r.contains(&index))
                        && !matches!(self.graph.nodes[index].op, Op::Placeholder)
                    {
                        return unsupported(
                            BreakKind::Internal,
                            "internal: a subgraph reading a discarded node",
                        );
                    }
                    if !body.contains(n) && !lifted.contains(&n) {
                        lifted.push(n);
                    }
                }
            }
        }
        Ok(lifted)
    }

    /// Refuses a body that changes one of `lifted` in place (a view of one included).
    pub(super) fn check_body_writes(
        &self,
        what: &str,
        body: &Body,
        lifted: &[NodeId],
    ) -> CResult<()> {
        let py = self.py;
        let lifted_fakes = pyo3::types::PyList::new(
            py,
            lifted
                .iter()
                .map(|n| self.graph.nodes[n.0 as usize].fake.bind(py).clone()),
        )?;
        for &i in &body.ops {
            let node = &self.graph.nodes[i];
            if !super::node_calls_in_place(py, node) {
                continue;
            }
            for written in super::in_place::written_nodes(node) {
                let fake = self.graph.nodes[written.0 as usize].fake.bind(py).clone();
                if !body.contains(written)
                    || self
                        .h
                        .shares_storage
                        .call1((&fake, &lifted_fakes))?
                        .is_truthy()?
                {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!("{what} changing a tensor it was given in place"),
                    );
                }
            }
        }
        Ok(())
    }

    /// The tensors in a body's result (a tensor, or tuples and lists of tensors and
    /// constants), in order, each once; anything else is refused.
    pub(super) fn body_result_tensors(
        &self,
        what: &str,
        id: VarId,
        out: &mut Vec<VarId>,
    ) -> CResult<()> {
        let kind = self.kind(id);
        if let VarKind::Tuple(items) | VarKind::List(items) = kind {
            for &item in items {
                self.body_result_tensors(what, item, out)?;
            }
            return Ok(());
        }
        if matches!(kind, VarKind::Tensor { .. }) {
            if !out.contains(&id) {
                out.push(id);
            }
            return Ok(());
        }
        if matches!(kind, VarKind::Const(_)) {
            return Ok(());
        }
        unsupported(
            BreakKind::UnsupportedCall,
            format!("{what} returning {}", kind_name(kind)),
        )
    }

    /// The graph node of a tensor tracker.
    pub(super) fn tensor_node(&self, id: VarId) -> Option<NodeId> {
        match self.kind(id) {
            VarKind::Tensor { node, .. } => Some(*node),
            _ => None,
        }
    }

    /// The GraphModule of `body`: placeholders for `lifted`, its operations, returning the
    /// tuple of `outputs`.
    pub(super) fn body_module(
        &self,
        body: &Body,
        lifted: &[NodeId],
        outputs: &[NodeId],
    ) -> CResult<Bound<'py, PyAny>> {
        self.body_module_returning(body, lifted, outputs, false)
    }

    /// `body_module` returning its one output as it is (a `while_loop` condition).
    pub(super) fn body_module_of_one(
        &self,
        body: &Body,
        lifted: &[NodeId],
        output: NodeId,
    ) -> CResult<Bound<'py, PyAny>> {
        self.body_module_returning(body, lifted, &[output], true)
    }

    fn body_module_returning(
        &self,
        body: &Body,
        lifted: &[NodeId],
        outputs: &[NodeId],
        bare: bool,
    ) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        let mut index: HashMap<u32, NodeId> = HashMap::new();
        let mut nodes: Vec<Node> = Vec::new();
        for &n in lifted {
            let outer = &self.graph.nodes[n.0 as usize];
            index.insert(n.0, NodeId(nodes.len() as u32));
            nodes.push(Node {
                op: Op::Placeholder,
                name: outer.name.clone(),
                args: Vec::new(),
                kwargs: Vec::new(),
                fake: outer.fake.clone(),
            });
        }
        for &i in &body.ops {
            let node = &self.graph.nodes[i];
            let remap = |a: &Arg| remap_arg(a, &index);
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
            index.insert(i as u32, NodeId(nodes.len() as u32));
            nodes.push(copied);
        }
        let outputs: Vec<NodeId> = outputs.iter().map(|n| index[&n.0]).collect();
        let (nodes, outs, fakes) = super::graph_for_python(py, &self.h, &nodes, &outputs)?;
        Ok(py
            .import_module("dynamo_rs._capture")?
            .call_method1("export_subgraph", (nodes, outs, fakes, bare))?)
    }

    /// A `get_attr` node for `module`, registered on the exported GraphModule under a name
    /// made from `base` (`wrap_body_0`, `cond_true_0`, ...).
    pub(super) fn submodule(&mut self, base: &str, module: &Bound<'py, PyAny>) -> NodeId {
        let none = OwnedRef::from_bound(&self.py.None().into_bound(self.py));
        let node = self
            .graph
            .add(Op::Placeholder, base, Vec::new(), Vec::new(), none);
        let name = self.graph.nodes[node.0 as usize].name.clone();
        self.graph.nodes[node.0 as usize].op = Op::GetAttr {
            name,
            module: OwnedRef::from_bound(module),
        };
        node
    }

    /// A `get_attr` node for the submodule already registered as `attribute`.
    pub(super) fn submodule_of(&mut self, attribute: &str, module: &Bound<'py, PyAny>) -> NodeId {
        let node = self.submodule(attribute, module);
        if let Op::GetAttr { name, .. } = &mut self.graph.nodes[node.0 as usize].op {
            *name = attribute.to_owned();
        }
        node
    }

    /// The fake values of `nodes`, as a tuple.
    pub(super) fn node_fakes(&self, nodes: &[NodeId]) -> PyResult<Bound<'py, PyTuple>> {
        let py = self.py;
        PyTuple::new(
            py,
            nodes
                .iter()
                .map(|n| self.graph.nodes[n.0 as usize].fake.bind(py).clone()),
        )
    }

    /// Records the call of `torch.ops.higher_order.<name>` returning the tuple of
    /// `output_fakes`; the trackers of its items.
    pub(super) fn operation_outputs(
        &mut self,
        name: &str,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
        output_fakes: &Bound<'py, PyTuple>,
    ) -> CResult<Vec<VarId>> {
        let operation = self
            .h
            .torch
            .getattr("ops")?
            .getattr("higher_order")?
            .getattr(name)?;
        let node = self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&operation)),
            name,
            args,
            kwargs,
            OwnedRef::from_bound(output_fakes.as_any()),
        );
        let items = self.wrap_node_result(node, output_fakes.as_any(), name)?;
        if let VarKind::Tuple(items) = self.kind(items) {
            Ok(items.clone())
        } else {
            unsupported(BreakKind::Internal, "internal: an operation's outputs")
        }
    }

    /// `id` with each tensor of `replaced` swapped for its stand-in (new tuples and lists;
    /// a named tuple stays one).
    pub(super) fn replace_tensors(&mut self, id: VarId, replaced: &HashMap<VarId, VarId>) -> VarId {
        if let Some(&new) = replaced.get(&id) {
            return new;
        }
        let (items, is_tuple) = match self.kind(id) {
            VarKind::Tuple(items) => (items.clone(), true),
            VarKind::List(items) => (items.clone(), false),
            _ => return id,
        };
        let new = items
            .iter()
            .map(|&i| self.replace_tensors(i, replaced))
            .collect();
        if !is_tuple {
            return self.add(VarKind::List(new), None);
        }
        let made = self.add(VarKind::Tuple(new), None);
        if let Some(fields) = self.tuple_fields.get(&id).cloned() {
            self.tuple_fields.insert(made, fields);
        }
        if let Some(class) = self.tuple_classes.get(&id).cloned() {
            self.tuple_classes.insert(made, class);
        }
        made
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

/// `arg` with its nodes renumbered into a subgraph.
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
