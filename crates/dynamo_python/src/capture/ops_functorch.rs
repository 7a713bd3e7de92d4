//! `torch.vmap` (`torch.func.vmap`) inside traced code, as TorchDynamo captures it: the trace
//! follows torch's own Python implementation (`vmap_impl`), whose calls of the functorch
//! primitives in `torch._functorch.predispatch` are recorded in the graph as they are —
//! `lazy_load_decompositions()`, `_vmap_increment_nesting(batch_size, randomness)`,
//! `_add_batch_dim(x, in_dim, level)`, `_remove_batch_dim(x, level, batch_size, out_dim)`,
//! `_vmap_decrement_nesting()` — and also made for real while tracing: the vmap level is
//! entered around the traced function, whose operations then run on batched fake tensors
//! through functorch's batching rules, as they will when the graph runs (AOTAutograd and
//! Inductor trace through the primitives). The level numbers are constants of the graph: a
//! frame is only compiled outside every functorch transform (`mod.rs`), so they are the same
//! on every call. A trace that stops inside (a graph break in the vmapped function) leaves the
//! levels it entered when it ends (`SavedGlobalState::restore`), and the break runs the whole
//! vmap call as it is.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::graph::{Arg, Op};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// The functorch primitives, by their name in `torch._functorch.predispatch`.
pub(super) const PRIMITIVES: [&str; 5] = [
    "lazy_load_decompositions",
    "_vmap_increment_nesting",
    "_vmap_decrement_nesting",
    "_add_batch_dim",
    "_remove_batch_dim",
];

impl<'py> Tracer<'py> {
    /// Which functorch primitive `obj` is, if one.
    pub(super) fn functorch_primitive(&self, obj: &Bound<'py, PyAny>) -> Option<&'static str> {
        self.h
            .functorch_primitives
            .iter()
            .find(|(_, f)| f.is(obj))
            .map(|(name, _)| *name)
    }

    /// A call of a functorch primitive (see the module docs).
    pub(super) fn functorch_call(
        &mut self,
        name: &'static str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        if !kwargs.is_empty() {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("{name}() with keyword arguments"),
            );
        }
        let function = self
            .h
            .functorch_primitives
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| f.clone())
            .expect("a primitive");
        // Every argument but the tensor of `_add_batch_dim`/`_remove_batch_dim` is an int or
        // a string known while tracing, or a size of a dynamic dimension.
        let mut values = Vec::new();
        let mut graph_args = Vec::new();
        for (i, &arg) in args.iter().enumerate() {
            if i == 0 && name.ends_with("_batch_dim") {
                let VarKind::Tensor { node, fake } = self.kind(arg) else {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!("{name}() of something that is not a tensor"),
                    );
                };
                values.push(fake.bind(py).clone());
                graph_args.push(Arg::Node(*node));
                continue;
            }
            match self.kind(arg) {
                VarKind::Const(value) => {
                    let value = value.bind(py).clone();
                    graph_args.push(Arg::Const(OwnedRef::from_bound(&value)));
                    values.push(value);
                }
                // A batch size from a dynamic dimension: its symbol (as under TorchDynamo).
                VarKind::Symbolic { node, fake } => {
                    values.push(fake.bind(py).clone());
                    graph_args.push(Arg::Node(*node));
                }
                _ => {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!("{name}() with an argument not known while tracing"),
                    )
                }
            }
        }
        // Made for real (torch's own function): on the fake tensor for the batch-dimension
        // primitives (a batched fake, or the plain fake under it), on torch's functorch
        // state for the others.
        let result = function.call1(pyo3::types::PyTuple::new(py, &values)?)?;
        let op = Op::CallFunction(OwnedRef::from_bound(&function));
        if name.ends_with("_batch_dim") {
            let node = self.graph.add(
                op,
                name,
                graph_args,
                Vec::new(),
                OwnedRef::from_bound(&result),
            );
            return self.wrap_node_result(node, &result, name);
        }
        let none = OwnedRef::from_bound(&py.None().into_bound(py));
        self.graph.add(op, name, graph_args, Vec::new(), none);
        // The level `_vmap_increment_nesting` entered (a constant of the graph), or None.
        Ok(self.constant(&result))
    }
}
