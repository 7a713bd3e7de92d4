//! Graph nodes: recording one operation (run on fake tensors for its result), wrapping what
//! it returned, and turning trackers into node arguments and fake values.

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::break_reasons::BreakKind;
use super::graph::{Arg, Op};
use super::ops_call::describe;
use super::translator::{kind_name, unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// Records one graph node, running the operation on fake tensors for its result.
    pub fn graph_call(
        &mut self,
        op: Op,
        name: &str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        // `torch.ones(2, requires_grad=True)`, `x.new_zeros(n, requires_grad=True)`: a new
        // leaf that needs gradients. In a graph AOTAutograd makes it an output that needs
        // none (and no gradient reaches it); it is made eagerly after the graph, as
        // TorchDynamo breaks the graph there.
        let leaf_needing_grad = kwargs.iter().any(|(k, v)| {
            k == "requires_grad"
                && matches!(self.kind(*v), VarKind::Const(c) if c.bind(py).is_truthy().unwrap_or(true))
        });
        if leaf_needing_grad {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "{name}(..., requires_grad=True): a tensor that needs gradients made in the \
                     graph (made eagerly after it, as under TorchDynamo)"
                ),
            );
        }
        let change = self.changes_state(&op, name, &args, &kwargs)?;
        // Random numbers drawn from the default generators: a rerun after the graph raised
        // draws them again from the state they were drawn from (`Rerun::restore_random`).
        if change == StateChange::Random {
            self.draws_random = true;
        }
        let changes_state = change == StateChange::Other;
        if self.in_try {
            // An operation inside a `try` block of its own frame: in the graph when the frame
            // can run again eagerly if the graph raises (see `Tracer::rerun_on_error`), which
            // needs a graph that changes nothing a second run would see.
            if !self.rerun_on_error || changes_state || self.state_changing_op.is_some() {
                let why = match (&self.state_changing_op, changes_state) {
                    (_, true) => format!("{name} changes state"),
                    (Some(first), false) => format!("the graph has {first}, which changes state"),
                    (None, false) => "the frame cannot be run again".to_string(),
                };
                return unsupported(
                    BreakKind::TensorOperationInTry,
                    format!("the tensor operation {name} inside a try block ({why})"),
                );
            }
            self.graph_ops_in_own_try = true;
        } else if changes_state && self.graph_ops_in_own_try {
            return unsupported(
                BreakKind::TensorOperationInTry,
                format!(
                    "{name} changes state, and the graph has operations from inside a try block"
                ),
            );
        }
        // Inside a function called from a `try` block: in the graph either way; run again
        // when the graph raises unless it changes state (then the exception leaves the
        // graph past the handler, as under TorchDynamo).
        self.graph_ops_in_try |= self.in_try || self.in_outer_try;
        if changes_state && self.state_changing_op.is_none() {
            self.state_changing_op = Some(name.to_string());
        }
        if self.grad_enabled && !self.no_grad_leaves.is_empty() {
            let leaf = args.iter().chain(kwargs.iter().map(|(_, v)| v)).any(|&a| {
                matches!(self.kind(a), VarKind::Tensor { node, .. } if self.no_grad_leaves.contains(node))
            });
            if leaf {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    format!(
                        "{name} with grad mode on, of a leaf requires_grad_() made in the graph \
                         with grad mode off (its result would need gradients)"
                    ),
                );
            }
        }
        let fake_args = args
            .iter()
            .map(|&a| self.fake_value(a))
            .collect::<CResult<Vec<_>>>()?;
        let fake_kwargs = PyDict::new(py);
        for (k, v) in &kwargs {
            fake_kwargs.set_item(k, self.fake_value(*v)?)?;
        }
        let target: Bound<'py, PyAny> = match &op {
            Op::CallFunction(f) => f.bind(py).clone(),
            Op::CallMethod(m) => pyo3::types::PyString::new(py, m).into_any(),
            Op::Placeholder | Op::GetAttr { .. } => {
                return unsupported(BreakKind::Internal, "internal: not a call")
            }
        };
        let result = match self.h.run_fake.call1((
            &self.fake_mode,
            &target,
            PyTuple::new(py, fake_args)?,
            fake_kwargs,
        )) {
            Ok(r) => r,
            Err(err) => {
                return unsupported(
                    BreakKind::FakeTensorFailure,
                    format!("{name} failed on fake tensors: {err}"),
                )
            }
        };
        if let Some(answer) = self.constant_from_fake(&op, &result, changes_state)? {
            return Ok(answer);
        }
        let graph_args = args
            .iter()
            .map(|&a| self.graph_arg(a))
            .collect::<CResult<Vec<_>>>()?;
        let graph_kwargs = kwargs
            .iter()
            .map(|(k, v)| Ok((k.clone(), self.graph_arg(*v)?)))
            .collect::<CResult<Vec<_>>>()?;
        // An in-place form (`y.add_(1)`) or `out=` returns one of its tensor arguments: the
        // same object, so `z is y` holds and stores through either name are one tensor's.
        let returned_argument = args
            .iter()
            .chain(kwargs.iter().map(|(_, v)| v))
            .copied()
            .find(|&a| matches!(self.kind(a), VarKind::Tensor { fake, .. } if fake.bind(py).is(&result)));
        let node = self.graph.add(
            op,
            name,
            graph_args,
            graph_kwargs,
            OwnedRef::from_bound(&result),
        );
        if changes_state {
            self.refuse_changes_beside_arrays(false)?;
        }
        if let Some(argument) = returned_argument {
            return Ok(argument);
        }
        self.wrap_node_result(node, &result, name)
    }

    /// Whether running operation `name` twice could differ from running it once: an
    /// in-place form (`add_`, `x[i] = v`, `x += y`, `out=`, `inplace=` not known to be
    /// False), running statistics (`batch_norm` in training), global state, or a call of
    /// code outside torch and the operator module (an `autograd.Function`, a function
    /// allowed in the graph) — `Other`; random numbers (`dropout` not known to be in eval,
    /// sampling) drawn from the CPU or CUDA default generators — `Random`, which a rerun can
    /// undo by restoring the generators (drawn from an explicit `generator=`, or on another
    /// device, `Other`). Conservative: `None` must be right; `Other` only costs graph breaks.
    fn changes_state(
        &self,
        op: &Op,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> PyResult<StateChange> {
        match self.changes_other_state(op, name, args, kwargs)? {
            // Which generators it draws from is only asked of operations that draw.
            StateChange::Random => self.random_state_change(args, kwargs),
            other => Ok(other),
        }
    }

    /// `Random` when the random numbers an operation draws come from generators a rerun
    /// restores: the CPU and CUDA default generators (no `generator=` argument, every tensor
    /// argument on one of those devices, and a factory's device among them).
    fn random_state_change(
        &self,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> PyResult<StateChange> {
        let py = self.py;
        let restorable_device = |device: &Bound<'py, PyAny>| -> PyResult<bool> {
            let kind: String = if let Ok(text) = device.extract::<String>() {
                text.split(':').next().unwrap_or_default().to_string()
            } else {
                device.getattr("type")?.extract()?
            };
            Ok(kind == "cpu" || kind == "cuda")
        };
        let mut any_tensor = false;
        for &a in args.iter().chain(kwargs.iter().map(|(_, v)| v)) {
            if let VarKind::Tensor { fake, .. } = self.kind(a) {
                any_tensor = true;
                if !restorable_device(&fake.bind(py).getattr("device")?)? {
                    return Ok(StateChange::Other);
                }
            }
        }
        for (keyword, value) in kwargs {
            match keyword.as_str() {
                "generator" => return Ok(StateChange::Other),
                "device" => match self.kind(*value) {
                    VarKind::Const(d) if d.bind(py).is_none() => {}
                    VarKind::Const(d) | VarKind::Object(d) if restorable_device(&d.bind(py))? => {}
                    _ => return Ok(StateChange::Other),
                },
                _ => {}
            }
        }
        if !any_tensor {
            let default = self.h.torch.call_method0("get_default_device")?;
            if !restorable_device(&default)? {
                return Ok(StateChange::Other);
            }
        }
        Ok(StateChange::Random)
    }

    /// `changes_state`, with every operation that draws random numbers `Random`.
    fn changes_other_state(
        &self,
        op: &Op,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> PyResult<StateChange> {
        let random = StateChange::Random;
        const IN_PLACE_OPERATORS: &[&str] = &[
            "setitem",
            "delitem",
            "iadd",
            "isub",
            "imul",
            "imatmul",
            "itruediv",
            "ifloordiv",
            "imod",
            "ipow",
            "ilshift",
            "irshift",
            "iand",
            "ixor",
            "ior",
            "iconcat",
        ];
        const RANDOM: &[&str] = &[
            "rand",
            "normal",
            "bernoulli",
            "multinomial",
            "poisson",
            "uniform",
            "exponential",
            "cauchy",
            "geometric",
            "gumbel",
            "seed",
            "sample",
        ];
        let py = self.py;
        let base = match op {
            Op::CallMethod(method) => method.as_str(),
            _ => name,
        };
        // (NumPy operations are `torch._dynamo.utils` wrappers named `wrapped_<operation>`.)
        let plain = base
            .strip_prefix("wrapped_")
            .unwrap_or(base)
            .trim_start_matches("__")
            .trim_end_matches("__");
        // `and_`, `or_`, `not_`, `is_`: the operator module's names, not in-place forms.
        let operator_name = matches!(base, "and_" | "or_" | "not_" | "is_");
        if (base.ends_with('_')
            && !base.starts_with('_')
            && !base.ends_with("__")
            && !operator_name)
            || IN_PLACE_OPERATORS.contains(&plain)
        {
            return Ok(StateChange::Other);
        }
        let known_false = |id: VarId| {
            matches!(self.kind(id), VarKind::Const(v)
                if v.bind(py).cast::<pyo3::types::PyBool>().is_ok_and(|b| !b.is_true()))
        };
        for (keyword, value) in kwargs {
            if keyword == "out" || (keyword == "inplace" && !known_false(*value)) {
                return Ok(StateChange::Other);
            }
        }
        // An argument by one of its keywords or its position.
        let argument = |names: &[&str], position: usize| {
            kwargs
                .iter()
                .find(|(k, _)| names.contains(&k.as_str()))
                .map(|(_, v)| *v)
                .or_else(|| args.get(position).copied())
        };
        // Whether the operation runs in training mode (drawing random numbers, updating
        // running statistics): its flag, by keyword or position, unless known to be False;
        // absent, the function's default.
        let in_training = |position: usize, default: bool| {
            argument(&["training", "train"], position).map_or(default, |id| !known_false(id))
        };
        if base.contains("dropout") {
            // F.dropout(input, p, training=True, inplace), torch.dropout(input, p, train); with
            // p = 0 the input is returned as it is, drawing nothing (transformers' configs with
            // dropout off call it so in training).
            let drops_nothing = argument(&["p"], 1).is_some_and(|p| {
                matches!(self.kind(p), VarKind::Const(v) if super::in_place::is_zero(&v.bind(py)))
            });
            return Ok(if in_training(2, true) && !drops_nothing {
                random
            } else {
                StateChange::None
            });
        }
        if base.contains("rrelu") {
            // F.rrelu(input, lower, upper, training=False)
            return Ok(if in_training(3, false) {
                random
            } else {
                StateChange::None
            });
        }
        if base.contains("batch_norm") {
            // F.batch_norm(input, mean, var, weight, bias, training=False, ...) and
            // torch.batch_norm(input, weight, bias, mean, var, training, ...)
            return Ok(if in_training(5, false) {
                StateChange::Other
            } else {
                StateChange::None
            });
        }
        // Global state set by the graph (autocast entered, ...) stays set when it raises;
        // grad mode is put back by the rerun itself (`Rerun::grad_mode`).
        let sets_global_state = ["autocast", "_enter", "_exit", "set_"]
            .iter()
            .any(|s| base.contains(s))
            && base != "_set_grad_enabled";
        if sets_global_state || base.contains("instance_norm") {
            return Ok(StateChange::Other);
        }
        if RANDOM.iter().any(|r| base.contains(r)) && !base.contains("normalize") {
            // `seed` sets the generator rather than drawing from it: not undone by a rerun.
            return Ok(if base.contains("seed") {
                StateChange::Other
            } else {
                random
            });
        }
        if let Op::CallFunction(function) = op {
            let module = function
                .bind(py)
                .getattr("__module__")
                .ok()
                .and_then(|m| m.extract::<String>().ok())
                .unwrap_or_default();
            let known = module == "torch"
                || module.starts_with("torch.")
                || matches!(
                    module.as_str(),
                    "_operator" | "operator" | "math" | "builtins"
                );
            return Ok(if known {
                StateChange::None
            } else {
                StateChange::Other
            });
        }
        Ok(StateChange::None)
    }

    pub(super) fn wrap_node_result(
        &mut self,
        node: super::graph::NodeId,
        result: &Bound<'py, PyAny>,
        name: &str,
    ) -> CResult<VarId> {
        let py = self.py;
        if result.is_instance(&self.h.tensor_type)? {
            return Ok(self.add(
                VarKind::Tensor {
                    node,
                    fake: OwnedRef::from_bound(result),
                },
                None,
            ));
        }
        if result.is_instance(&self.h.symbolic_types)? {
            return self.symbolic_result(node, result);
        }
        if result.is_instance(&self.h.tuple_type)? || result.is_instance(&self.h.list_type)? {
            let getitem = self.h.operator.getattr("getitem")?;
            let mut items = Vec::new();
            for (i, item) in result.try_iter()?.enumerate() {
                let item = item?;
                if item.is_none() {
                    // `(attn_output, None)` of multi_head_attention_forward without weights.
                    items.push(self.constant(&item));
                    continue;
                }
                let symbolic = item.is_instance(&self.h.symbolic_types)?;
                if !item.is_instance(&self.h.tensor_type)? && !symbolic {
                    return unsupported(
                        BreakKind::UnsupportedCall,
                        format!("{name} returned a non-tensor item"),
                    );
                }
                let index = (i as i64).into_pyobject(py)?.into_any();
                let child = self.graph.add(
                    Op::CallFunction(OwnedRef::from_bound(&getitem)),
                    "getitem",
                    vec![Arg::Node(node), Arg::Const(OwnedRef::from_bound(&index))],
                    Vec::new(),
                    OwnedRef::from_bound(&item),
                );
                items.push(if symbolic {
                    self.symbolic_result(child, &item)?
                } else {
                    self.add(
                        VarKind::Tensor {
                            node: child,
                            fake: OwnedRef::from_bound(&item),
                        },
                        None,
                    )
                });
            }
            let kind = if result.is_instance(&self.h.list_type)? {
                VarKind::List(items)
            } else {
                VarKind::Tuple(items)
            };
            let id = self.add(kind, None);
            // Named results (torch.return_types) keep their field names.
            let fields = result
                .get_type()
                .getattr("__match_args__")
                .or_else(|_| result.get_type().getattr("_fields"));
            if let Ok(fields) = fields {
                if let Ok(names) = fields.extract::<Vec<String>>() {
                    self.tuple_fields.insert(id, names);
                    let cls = result.get_type();
                    if !cls.is(&self.h.tuple_type) && !cls.is(&self.h.list_type) {
                        self.tuple_classes
                            .insert(id, OwnedRef::from_bound(cls.as_any()));
                    }
                }
            }
            return Ok(id);
        }
        if self.h.is_constant(result)? {
            // Metadata-only results (sizes, dtypes) are fixed by the tensor guards.
            return Ok(self.constant(result));
        }
        unsupported(
            BreakKind::UnsupportedCall,
            format!("{name} returned {}", describe(result)),
        )
    }

    /// The value to pass to an operation run on fake tensors.
    pub fn fake_value(&self, id: VarId) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        Ok(match self.kind(id) {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::Tensor { fake, .. } | VarKind::Symbolic { fake, .. } => fake.bind(py).clone(),
            VarKind::Tuple(items) => PyTuple::new(
                py,
                items
                    .iter()
                    .map(|&i| self.fake_value(i))
                    .collect::<CResult<Vec<_>>>()?,
            )?
            .into_any(),
            VarKind::List(items) => pyo3::types::PyList::new(
                py,
                items
                    .iter()
                    .map(|&i| self.fake_value(i))
                    .collect::<CResult<Vec<_>>>()?,
            )?
            .into_any(),
            VarKind::Slice(parts) => {
                self.slice_bound_check(parts)?;
                py.import_module("builtins")?
                    .getattr("slice")?
                    .call1(PyTuple::new(
                        py,
                        parts
                            .iter()
                            .map(|&i| self.fake_value(i))
                            .collect::<CResult<Vec<_>>>()?,
                    )?)?
            }
            VarKind::Dict(entries) => {
                let d = PyDict::new(py);
                for (k, v) in entries {
                    if self.is_tensor_key(k) {
                        return unsupported(
                            BreakKind::UnsupportedOperation,
                            "a dict with a tensor key passed to a graph operation",
                        );
                    }
                    d.set_item(k.bind(py), self.fake_value(*v)?)?;
                }
                d.into_any()
            }
            // An existing slice is an object (not a constant) only when its bounds are not
            // constants: tensors, most likely.
            VarKind::Object(v) if v.bind(py).is_instance_of::<pyo3::types::PySlice>() => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "a slice with tensor bounds",
                )
            }
            VarKind::Const(v) | VarKind::Object(v) => {
                self.pin_identity(id);
                v.bind(py).clone()
            }
            other @ (VarKind::DictView { .. }
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
            | VarKind::NdArray(_)) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("{} as an operation argument", kind_name(other)),
                )
            }
        })
    }

    /// The graph argument for a tracker.
    pub fn graph_arg(&self, id: VarId) -> CResult<Arg> {
        Ok(match self.kind(id) {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::Tensor { node, .. } | VarKind::Symbolic { node, .. } => Arg::Node(*node),
            VarKind::Tuple(items) => Arg::Tuple(
                items
                    .iter()
                    .map(|&i| self.graph_arg(i))
                    .collect::<CResult<_>>()?,
            ),
            VarKind::Slice(parts) => Arg::Slice(
                self.slice_bound_check(parts)
                    .map(|()| parts)?
                    .iter()
                    .map(|&i| self.graph_arg(i))
                    .collect::<CResult<_>>()?,
            ),
            VarKind::List(items) => Arg::List(
                items
                    .iter()
                    .map(|&i| self.graph_arg(i))
                    .collect::<CResult<_>>()?,
            ),
            VarKind::Dict(entries) => Arg::Dict(
                entries
                    .iter()
                    .map(|(k, v)| {
                        if self.is_tensor_key(k) {
                            return unsupported(
                                BreakKind::UnsupportedOperation,
                                "a dict with a tensor key passed to a graph operation",
                            );
                        }
                        Ok((k.clone(), self.graph_arg(*v)?))
                    })
                    .collect::<CResult<_>>()?,
            ),
            // A NumPy float (a `float` subclass, so a constant) goes into the graph as the
            // Python float it is: FX would write it as `np.float64(...)`, a name the graph's
            // code does not have.
            VarKind::Const(v) if super::helpers::is_numpy_scalar(&v.bind(self.py))? => {
                Arg::Const(OwnedRef::from_bound(&v.bind(self.py).call_method0("item")?))
            }
            // Other NumPy scalars (immutable; guarded by identity) likewise: torch takes them
            // as the Python numbers they hold.
            VarKind::Object(v) if super::helpers::is_numpy_scalar(&v.bind(self.py))? => {
                self.pin_identity(id);
                Arg::Const(OwnedRef::from_bound(&v.bind(self.py).call_method0("item")?))
            }
            VarKind::Const(v) => Arg::Const(v.clone()),
            VarKind::Object(v) => {
                let value = v.bind(self.py).clone();
                if !self.immutable_object(&value)? {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("{} as a graph argument", describe(&value)),
                    );
                }
                self.pin_identity(id);
                Arg::Const(v.clone())
            }
            other @ (VarKind::DictView { .. }
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
            | VarKind::NdArray(_)) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("{} as a graph argument", kind_name(other)),
                )
            }
        })
    }
}

/// What running one graph operation does beyond computing its result (see
/// `Tracer::changes_state`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StateChange {
    None,
    /// Draws from the CPU or CUDA default random generators.
    Random,
    /// Anything else a second run would see.
    Other,
}
