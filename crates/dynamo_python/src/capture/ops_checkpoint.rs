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
//! The function is traced as a subgraph body (see `subgraph`: no effect outside it — a
//! recomputation must compute the same thing and change nothing twice): the values it reads
//! from before are the body's inputs, the tensors of its result (a tensor, or tuples and lists
//! of tensors and constants) that it computes are its outputs; a tensor it was given and
//! hands back as it is (T5's position bias) stays what it is, as eagerly.
//! The graph gets a `get_attr` of the body and the operation's call, whose items stand for
//! the result's tensors.
//!
//! Not captured (a graph break at the call, as before): a `context_fn` (selective
//! checkpointing policies), a function whose result holds anything else, random numbers
//! drawn inside unless the backend goes through AOTAutograd (`inductor`, `aot_eager`; not
//! with `preserve_rng_state=False`), and `use_reentrant=True` when no input needs a gradient (eagerly nothing then gets a
//! gradient through the function, which the higher-order operation would not reproduce).
//! With grad mode off nothing is recomputed and the function is simply inlined.

use std::collections::HashMap;

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::graph::Arg;
use super::subgraph::FunctionBody;
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

const WHAT: &str = "a checkpointed function";

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
        let mut preserve_rng_state = true;
        let mut own_values = Vec::new();
        for (keyword, value) in &own {
            if keyword == "context_fn" {
                self.check_default_context_fn(*value)?;
                continue;
            }
            let VarKind::Const(value) = self.kind(*value) else {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    format!("checkpoint() with {keyword}= not a constant"),
                );
            };
            let value = value.bind(py).clone();
            if keyword == "use_reentrant" && !value.is_none() {
                reentrant = value.is_truthy()?;
            }
            if keyword == "preserve_rng_state" {
                preserve_rng_state = value.is_truthy()?;
            }
            own_values.push((keyword.clone(), Arg::Const(OwnedRef::from_bound(&value))));
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
        // Random numbers drawn inside (dropout in a training transformer layer): a backend
        // that runs the graph through AOTAutograd keeps what they drew for backward (its
        // partitioner does not recompute random operations; Inductor draws its own, alike
        // in the recomputation), as TorchDynamo relies on. Run as it is, torch's operation
        // recomputes with other draws (it turns `preserve_rng_state` off): a graph break.
        self.random_in_next_body = preserve_rng_state && self.random_recompute;
        let (result, traced) =
            self.trace_function_body(WHAT, function, function_args.to_vec(), passed)?;
        let Some(FunctionBody {
            outputs,
            output_nodes,
            lifted,
            module,
        }) = traced
        else {
            // Nothing the function computed reaches its result.
            return Ok(result);
        };
        let get = self.submodule("wrap_body_0", &module);
        let mut call_args = vec![Arg::Node(get)];
        call_args.extend(lifted.iter().map(|&n| Arg::Node(n)));
        let output_fakes = self.node_fakes(&output_nodes)?;
        let items = self.operation_outputs(
            "tag_activation_checkpoint",
            call_args,
            own_values,
            &output_fakes,
        )?;
        let replaced: HashMap<VarId, VarId> = outputs.into_iter().zip(items).collect();
        Ok(self.replace_tensors(result, &replaced))
    }

    /// Refuses a `context_fn` other than the default (a selective checkpointing policy).
    fn check_default_context_fn(&self, value: VarId) -> CResult<()> {
        let default = self
            .py
            .import_module("torch.utils.checkpoint")?
            .getattr("noop_context_fn")?;
        if let VarKind::Object(v) = self.kind(value) {
            if v.bind(self.py).is(&default) {
                self.pin_identity(value);
                return Ok(());
            }
        }
        unsupported(
            BreakKind::UnsupportedCall,
            "checkpoint() with a context_fn (selective checkpointing)",
        )
    }
}
