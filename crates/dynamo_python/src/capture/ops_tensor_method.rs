//! Calls of tensor methods (`x.view(...)`, `x.size()`, `x.item()`, ...): graph nodes, or
//! constants for metadata answered by the fake tensor; the methods that act outside what the
//! graph computes break the graph.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::break_reasons::BreakKind;
use super::graph::Op;
use super::translator::{kind_name, unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// Tensor methods whose non-tensor answer a fake tensor gives as the real tensor would: from
/// the metadata the tensor guards fix (dtype, device, sizes, strides, layout), or from the
/// values of a tensor the trace made from constants (`torch.tensor(3).__index__()`; a fake
/// without known values raises for these instead). Any other method answering a constant on a
/// fake answers about the fake itself — its identity (`__hash__`, `is_set_to`), its printed
/// form (`__repr__`, `__format__`), its storage (`storage_offset`, `_use_count`), which the
/// guards do not fix — and breaks the graph so that the real tensor answers.
const ANSWERED_BY_FAKE: &[&str] = &[
    "type",
    "is_conj",
    "is_neg",
    "_is_zerotensor",
    "dense_dim",
    "sparse_dim",
    "dim_order",
    "is_same_size",
    "is_distributed",
    "is_coalesced",
    "_nnz",
    "has_names",
    "get_device",
    "size",
    "stride",
    "dim",
    "ndimension",
    "numel",
    "nelement",
    "element_size",
    "is_contiguous",
    "is_floating_point",
    "is_complex",
    "is_signed",
    "__len__",
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__complex__",
    "__contains__",
    "equal",
    "allclose",
    "is_nonzero",
];

/// Tensor methods that change the tensor's own sizes or strides (torch's `inplace_view`
/// operations and the composite ones made of them).
const INPLACE_VIEWS: &[&str] = &[
    "t_",
    "transpose_",
    "unsqueeze_",
    "squeeze_",
    "swapaxes_",
    "swapdims_",
    "as_strided_",
    "resize_as_",
];

impl<'py> Tracer<'py> {
    /// The answer of an operation whose result on fake tensors is a constant (a dtype, a
    /// size, a flag): that constant, with no graph node, unless the operation also changes
    /// state (then the node stays and the constant is its result, see `wrap_node_result`).
    /// A tensor method answering about the fake itself breaks the graph (`ANSWERED_BY_FAKE`).
    /// None when the result is not such a constant.
    pub(super) fn constant_from_fake(
        &mut self,
        op: &Op,
        result: &Bound<'py, PyAny>,
        changes_state: bool,
    ) -> CResult<Option<VarId>> {
        let not_implemented = self.h.builtins.getattr("NotImplemented")?;
        if result.is_none() || result.is(&not_implemented) || !self.h.is_constant(result)? {
            return Ok(None);
        }
        if let Op::CallMethod(method) = op {
            if !ANSWERED_BY_FAKE.contains(&method.as_str()) {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    format!(
                        "tensor.{method}() answers about the tensor's identity, storage or \
                         printed form, which the fake tensor traced does not share"
                    ),
                );
            }
        }
        if changes_state {
            return Ok(None);
        }
        Ok(Some(self.constant(result)))
    }

    /// A tensor method call.
    pub(super) fn tensor_method(
        &mut self,
        receiver: VarId,
        name: &str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let VarKind::Tensor { fake, .. } = self.kind(receiver) else {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("method {name} of {}", kind_name(self.kind(receiver))),
            );
        };
        let fake = fake.bind(py).clone();
        match name {
            "numpy" => self.tensor_to_numpy(receiver, &args, &kwargs),
            // `x.__iter__()`: as `iter(x)`, an iterator over the rows.
            "__iter__" if args.is_empty() && kwargs.is_empty() => {
                let rows = self.items_of(receiver)?;
                Ok(self.new_iter(rows, &[receiver]))
            }
            // `x.__len__()` is `x.size(0)` (symbolic when that size is; a 0-d tensor raises).
            "__len__"
                if args.is_empty()
                    && kwargs.is_empty()
                    && fake.call_method0("dim")?.extract::<i64>()? > 0 =>
            {
                let zero = self.constant(&0i64.into_pyobject(py)?.into_any());
                self.tensor_method(receiver, "size", vec![zero], Vec::new())
            }
            "size" | "dim" | "ndimension" | "numel" | "nelement" | "stride" | "is_contiguous"
            | "element_size" | "is_floating_point" | "is_complex" | "is_signed" | "__len__"
            | "get_device" => {
                if self.any_tensor(&args, &kwargs) {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!("tensor.{name} with tensor arguments"),
                    );
                }
                if let Some(symbolic) =
                    self.symbolic_tensor_query(receiver, &fake, name, &args, &kwargs)?
                {
                    return Ok(symbolic);
                }
                let (args, kwargs) = self.specialize_args(args, kwargs)?;
                // Every argument counts (`is_contiguous(memory_format=torch.channels_last)`,
                // `size(dim=1)`): the fake tensor answers from the same metadata.
                let py_kwargs = PyDict::new(py);
                for (k, v) in &kwargs {
                    py_kwargs.set_item(k, self.python_value(*v)?)?;
                }
                let value = fake.call_method(name, self.python_args(&args)?, Some(&py_kwargs))?;
                Ok(self.constant(&value))
            }
            // `x.requires_grad_(flag)` asking for what the tensor already is changes nothing
            // (transformers' `enable_input_require_grads` hook on the embeddings' output, which
            // the weights already make need them; `y.detach().requires_grad_(False)`): the
            // tensor itself, as under TorchDynamo.
            "requires_grad_"
                if self.requires_grad_request(&args, &kwargs)
                    == Some(self.needs_grad(receiver)) =>
            {
                Ok(receiver)
            }
            "item"
                if args.is_empty()
                    && kwargs.is_empty()
                    && self.shape_env_allows("allow_scalar_outputs")? =>
            {
                // `capture_scalar_outputs`: the value stays in the graph as an unbacked
                // symbol (as TorchDynamo does); Python needing it later breaks there.
                self.graph_call(
                    Op::CallMethod("item".into()),
                    "item",
                    vec![receiver],
                    kwargs,
                )
            }
            // Methods that act outside what the graph computes — autograd (a backward pass,
            // hooks, gradients kept), storage and memory — or whose answer is an address: the
            // graph breaks there, as under TorchDynamo (a `backward` node failed in every
            // AOTAutograd backend, and ran the pass inside the graph with `eager`).
            "backward"
            | "register_hook"
            | "register_post_accumulate_grad_hook"
            | "retain_grad"
            | "data_ptr"
            | "untyped_storage"
            | "storage"
            | "_typed_storage"
            | "share_memory_"
            | "record_stream"
            | "is_pinned"
            | "pin_memory"
            | "set_"
            | "resize_"
            | "resize_as_"
            | "__setstate__"
            | "__reduce_ex__"
            | "__dlpack__"
            | "__dlpack_device__"
            | "apply_"
            | "map_"
            | "map2_"
            | "is_shared" => unsupported(
                BreakKind::UnsupportedCall,
                format!("tensor.{name}() acts outside the graph"),
            ),
            "requires_grad_"
                if !self.grad_enabled
                    && self.requires_grad_request(&args, &kwargs) == Some(true)
                    && self.tensor_given(receiver).is_none() =>
            {
                self.no_grad_leaf(receiver)
            }
            // A tensor turned into a leaf that needs gradients (`x.detach().requires_grad_()`
            // before `torch.autograd.grad`): autograd state, which a compiled graph's outputs
            // do not carry (AOTAutograd hands back tensors the later `grad` call cannot
            // differentiate with respect to). The graph breaks there, as under TorchDynamo.
            "requires_grad_" => unsupported(
                BreakKind::UnsupportedCall,
                "tensor.requires_grad_() changes autograd state",
            ),
            // Autograd's view tracking and inference-mode state, which the trace's fake tensors
            // do not all carry (views made by the shape rules with grad mode off share storage
            // without the link; fakes are not inference tensors): the graph breaks and the
            // real tensor answers.
            "_is_view" | "is_inference" => unsupported(
                BreakKind::UnsupportedCall,
                format!("tensor.{name}() asks autograd's view or inference-mode state"),
            ),
            // With `capture_dynamic_output_shape_ops`, `nonzero` is a graph operation whose
            // result's size is an unbacked symbol (as TorchDynamo makes it): the last arm.
            "item" | "tolist" | "__bool__" | "__int__" | "__float__" | "nonzero" | "cpu_numpy"
                if name != "nonzero"
                    || !self.shape_env_allows("allow_dynamic_output_shape_ops")? =>
            {
                unsupported(
                    BreakKind::TensorValueNeeded,
                    format!("tensor.{name}() needs the tensor's data"),
                )
            }
            // In-place view operations (`t_`, `unsqueeze_`, `as_strided_`, ...) change the
            // sizes or strides of the tensor itself: on a tensor the frame was given, a
            // change to a graph input's metadata, which Inductor and AOTAutograd do not carry
            // out (they raised on the next use). The graph breaks there, as under TorchDynamo;
            // on a tensor the trace made they are ordinary graph operations.
            _ if INPLACE_VIEWS.contains(&name) && self.tensor_given(receiver).is_some() => {
                unsupported(
                    BreakKind::UnsupportedCall,
                    format!("tensor.{name}() changes the sizes or strides of a frame's input"),
                )
            }
            "addcdiv" | "addcdiv_" | "addcmul" | "addcmul_"
                if args.len() == 2
                    && matches!(kwargs.as_slice(), [(k, v)]
                        if k == "value" && matches!(self.kind(*v), VarKind::Tensor { .. })) =>
            {
                // A tensor `value` (an optimizer's step size once its step count is a
                // tensor): a Scalar argument, which eager reads with `.item()` — data a graph
                // does not have. Written as the same sum with `value` a tensor operand,
                // `x + (t1 / t2) * value`, as TorchDynamo rewrites it.
                let value = kwargs[0].1;
                let combine = if name.starts_with("addcdiv") {
                    "div"
                } else {
                    "mul"
                };
                let combined =
                    self.graph_call(Op::CallMethod(combine.into()), combine, args, Vec::new())?;
                let in_place = if name.ends_with('_') {
                    "addcmul_"
                } else {
                    "addcmul"
                };
                self.graph_call(
                    Op::CallMethod(in_place.into()),
                    in_place,
                    vec![receiver, combined, value],
                    Vec::new(),
                )
            }
            _ => {
                let mut all = vec![receiver];
                all.extend(args);
                self.graph_call(Op::CallMethod(name.to_string()), name, all, kwargs)
            }
        }
    }

    /// A setting of the trace's ShapeEnv (`allow_scalar_outputs`,
    /// `allow_dynamic_output_shape_ops`: torch's `capture_*` configs when the trace began).
    fn shape_env_allows(&self, setting: &str) -> PyResult<bool> {
        self.fake_mode
            .getattr("shape_env")?
            .getattr(setting)?
            .is_truthy()
    }
}

impl Tracer<'_> {
    /// `t.requires_grad_()` on a tensor made in the trace while grad mode is off
    /// (transformers' MRA without its kernel: `torch.zeros_like(q).requires_grad_()` under
    /// `no_grad`): what is computed from it needs no gradient, so the graph can make the leaf
    /// itself — TorchDynamo's nodes, `requires_grad_` between two
    /// `set_inplace_requires_grad_allowed` switches (AOTAutograd traces the graph under
    /// functorch, which refuses it otherwise). The leaf must stay inside the graph and out of
    /// gradient-recording operations: using it with grad mode on again, or handing it out
    /// (returned, stored, live at a break), is refused (see `no_grad_leaves`).
    fn no_grad_leaf(&mut self, tensor: VarId) -> CResult<VarId> {
        let py = self.py;
        let functorch = self.h.torch.getattr("_C")?.getattr("_functorch")?;
        let allowed: bool = functorch
            .call_method0("get_inplace_requires_grad_allowed")?
            .extract()?;
        let switch = functorch.getattr("set_inplace_requires_grad_allowed")?;
        let record_switch = |t: &mut Self, on: bool| -> CResult<()> {
            let arg = super::graph::Arg::Const(OwnedRef::from_bound(
                &pyo3::types::PyBool::new(py, on).to_owned().into_any(),
            ));
            t.graph.add(
                Op::CallFunction(OwnedRef::from_bound(&switch)),
                "set_inplace_requires_grad_allowed",
                vec![arg],
                Vec::new(),
                OwnedRef::from_bound(&py.None().into_bound(py)),
            );
            Ok(())
        };
        record_switch(self, true)?;
        let made = self.graph_call(
            Op::CallMethod("requires_grad_".into()),
            "requires_grad_",
            vec![tensor],
            Vec::new(),
        );
        record_switch(self, allowed)?;
        let made = made?;
        if let VarKind::Tensor { node, .. } = *self.kind(made) {
            self.no_grad_leaves.push(node);
        }
        Ok(made)
    }

    /// The flag of `requires_grad_(flag)` / `requires_grad_(requires_grad=flag)` (True when
    /// not given), when it is a constant bool; None otherwise.
    fn requires_grad_request(&self, args: &[VarId], kwargs: &[(String, VarId)]) -> Option<bool> {
        let flag = match (args, kwargs) {
            ([], []) => return Some(true),
            ([a], []) => *a,
            ([], [(name, v)]) if name == "requires_grad" => *v,
            _ => return None,
        };
        match self.kind(flag) {
            VarKind::Const(v) if v.bind(self.py).is_instance_of::<pyo3::types::PyBool>() => {
                v.bind(self.py).is_truthy().ok()
            }
            _ => None,
        }
    }
}
