//! `torch.vmap` and `torch.func.grad` (with what is built on them: `jacrev`, `vjp`, `hessian`,
//! `grad_and_value`) inside traced code, as TorchDynamo captures them: the trace follows
//! torch's own Python implementations (`vmap_impl`, `grad_and_value_impl`), whose calls of
//! the functorch primitives are recorded in the graph as they are — `_vmap_increment_nesting
//! (batch_size, randomness)`, `_add_batch_dim(x, in_dim, level)`, `_grad_increment_nesting()`,
//! `_wrap_for_grad(x, level)`, `_autograd_grad(outputs, inputs, create_graph=True)`, ... —
//! and also made for real while tracing: the transform's level is entered around the traced
//! function, whose operations then run on batched or gradient-tracking fake tensors through
//! functorch, as they will when the graph runs (AOTAutograd and Inductor trace through the
//! primitives). Queries of the state these switch (`get_inplace_requires_grad_allowed`) are
//! answered while tracing. The level numbers are constants of the graph: a
//! frame is only compiled outside every functorch transform (`mod.rs`), so they are the same
//! on every call. A trace that stops inside (a graph break in the transformed function) leaves
//! the levels and switches it entered when it ends (`SavedGlobalState::restore`), and the
//! break runs the whole call as it is.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::graph::{Arg, Op};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;
use pyo3::types::PyTuple;

/// How the trace takes a primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    /// Answered while tracing (a query of functorch's state, or of what a fake tensor is:
    /// `is_batchedtensor`), not recorded.
    Query,
    /// Switches functorch's or autograd's state: recorded, made for real, its result (a
    /// level, or None) a constant.
    State,
    /// Computes on tensors: an operation of the graph like any other (its fakes made by
    /// running it on the fakes).
    Tensors,
}

// Where the primitives are found, from `torch`.
const PREDISPATCH: &str = "_functorch.predispatch";
const FUNCTORCH: &str = "_C._functorch";
const AUTOGRAD: &str = "_C._autograd";
const TRANSFORMS: &str = "_functorch.eager_transforms";

/// The primitives: where each is found, its name and how it is taken.
pub(super) const PRIMITIVES: [(&str, &str, Primitive); 29] = {
    use Primitive::{Query, State, Tensors};
    [
        (PREDISPATCH, "lazy_load_decompositions", State),
        (PREDISPATCH, "_vmap_increment_nesting", State),
        (PREDISPATCH, "_vmap_decrement_nesting", State),
        (PREDISPATCH, "_add_batch_dim", Tensors),
        (PREDISPATCH, "_remove_batch_dim", Tensors),
        (PREDISPATCH, "_unwrap_for_grad", Tensors),
        (FUNCTORCH, "_grad_increment_nesting", State),
        (FUNCTORCH, "_grad_decrement_nesting", State),
        (FUNCTORCH, "_wrap_for_grad", Tensors),
        (FUNCTORCH, "set_inplace_requires_grad_allowed", State),
        (FUNCTORCH, "get_inplace_requires_grad_allowed", Query),
        (FUNCTORCH, "is_batchedtensor", Query),
        (FUNCTORCH, "is_gradtrackingtensor", Query),
        (FUNCTORCH, "is_functorch_wrapped_tensor", Query),
        (TRANSFORMS, "_set_tensor_requires_grad", Tensors),
        (TRANSFORMS, "_autograd_grad", Tensors),
        (AUTOGRAD, "_saved_tensors_hooks_disable", State),
        (AUTOGRAD, "_saved_tensors_hooks_enable", State),
        (
            AUTOGRAD,
            "_saved_tensors_hooks_get_disabled_error_message",
            Query,
        ),
        (AUTOGRAD, "_saved_tensors_hooks_is_enabled", Query),
        // Forward mode (`jvp`, `jacfwd`, `hessian`).
        (PREDISPATCH, "_jvp_increment_nesting", State),
        (PREDISPATCH, "_jvp_decrement_nesting", State),
        (PREDISPATCH, "_enter_dual_level", State),
        (PREDISPATCH, "_exit_dual_level", State),
        (PREDISPATCH, "_make_dual", Tensors),
        (PREDISPATCH, "_unpack_dual", Tensors),
        ("_C", "_set_fwd_grad_enabled", State),
        ("_C", "_is_fwd_grad_enabled", Query),
        ("autograd.forward_ad", "_maybe_load_decompositions", State),
    ]
};

/// The primitives found in this torch, with their functions.
pub(super) fn load_primitives<'py>(
    torch: &Bound<'py, PyAny>,
) -> Vec<(&'static str, Primitive, Bound<'py, PyAny>)> {
    PRIMITIVES
        .iter()
        .filter_map(|&(path, name, kind)| {
            let mut object = torch.clone();
            for part in path.split('.').chain([name]) {
                object = object.getattr(part).ok()?;
            }
            Some((name, kind, object))
        })
        .collect()
}

impl<'py> Tracer<'py> {
    /// Which functorch primitive `obj` is, if one.
    pub(super) fn functorch_primitive(
        &self,
        obj: &Bound<'py, PyAny>,
    ) -> Option<(&'static str, Primitive)> {
        self.h
            .functorch_primitives
            .iter()
            .find(|(_, _, f)| f.is(obj))
            .map(|(name, kind, _)| (*name, *kind))
    }

    /// A call of a functorch primitive (see the module docs).
    pub(super) fn functorch_call(
        &mut self,
        obj: &Bound<'py, PyAny>,
        (name, kind): (&'static str, Primitive),
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let op = Op::CallFunction(OwnedRef::from_bound(obj));
        if kind == Primitive::Tensors {
            return self.graph_call(op, name, args, kwargs);
        }
        // Ints, bools and strings known while tracing, or a size of a dynamic dimension (a
        // vmap's batch size: its symbol, as under TorchDynamo).
        let value_of = |this: &Self, arg: VarId| -> CResult<(Bound<'py, PyAny>, Arg)> {
            match this.kind(arg) {
                VarKind::Const(value) => {
                    let value = value.bind(py).clone();
                    let graph_arg = Arg::Const(OwnedRef::from_bound(&value));
                    Ok((value, graph_arg))
                }
                VarKind::Symbolic { node, fake } if kind == Primitive::State => {
                    Ok((fake.bind(py).clone(), Arg::Node(*node)))
                }
                // A query of what a tensor is: asked of its fake (batched under a traced
                // vmap as the real one is when the graph runs).
                VarKind::Tensor { node, fake } if kind == Primitive::Query => {
                    Ok((fake.bind(py).clone(), Arg::Node(*node)))
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
                | VarKind::NdArray(_) => unsupported(
                    BreakKind::UnsupportedCall,
                    format!("{name}() with an argument not known while tracing"),
                ),
            }
        };
        let (mut values, mut graph_args) = (Vec::new(), Vec::new());
        for &arg in &args {
            let (value, graph_arg) = value_of(self, arg)?;
            values.push(value);
            graph_args.push(graph_arg);
        }
        let (keywords, mut graph_kwargs) = (pyo3::types::PyDict::new(py), Vec::new());
        for (key, arg) in &kwargs {
            let (value, graph_arg) = value_of(self, *arg)?;
            keywords.set_item(key, value)?;
            graph_kwargs.push((key.clone(), graph_arg));
        }
        if kind == Primitive::Query {
            let answer = obj.call(PyTuple::new(py, &values)?, Some(&keywords))?;
            if graph_args.iter().any(|a| matches!(a, Arg::Node(_))) {
                // Asked of a tensor: a node of the graph too, as TorchDynamo records it.
                let none = OwnedRef::from_bound(&py.None().into_bound(py));
                self.graph.add(op, name, graph_args, graph_kwargs, none);
            }
            return Ok(self.constant(&answer));
        }
        // Through `_capture.run_state_primitive`, which notes the forward-AD levels entered
        // (`SavedGlobalState::restore` leaves those a stopped trace did not).
        let result = py.import_module("dynamo_rs._capture")?.call_method1(
            "run_state_primitive",
            (name, obj, PyTuple::new(py, &values)?, keywords),
        )?;
        let none = OwnedRef::from_bound(&py.None().into_bound(py));
        self.graph.add(op, name, graph_args, graph_kwargs, none);
        Ok(self.constant(&result))
    }
}
