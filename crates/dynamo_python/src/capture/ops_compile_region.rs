//! `torch.compiler.nested_compile_region(fn)`: a region compiled once and called from the
//! graph as one `torch.ops.higher_order.invoke_subgraph(subgraph_0, 'subgraph_0', *inputs)`
//! node, as under TorchDynamo, instead of its operations inlined.
//!
//! The wrapper the decorator makes calls `invoke_subgraph_placeholder(fn, *args, **kwargs)`,
//! which raises when it is traced; the trace takes that call: `fn` is traced as a subgraph
//! body (see `subgraph`: nothing changed outside it, no random numbers, no tensor it was
//! given changed in place), its inputs are what it reads from before it, and its result is
//! its own tensors' stand-ins (tensors it returns as it got them stay as they are). Calls that
//! trace to the same operations on inputs of the same sizes, strides and dtypes share one
//! subgraph, named as its identifier (the backends cache compiled regions by identifier, so
//! one identifier always stands for one subgraph). As TorchDynamo does before the backend
//! sees the graph, a subgraph called once is inlined again (`_capture.export`).

use std::collections::HashMap;

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::graph::Arg;
use super::subgraph::FunctionBody;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::VarId;
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

const WHAT: &str = "a nested compile region";

impl<'py> Tracer<'py> {
    /// Whether `obj` is `invoke_subgraph_placeholder`, which a compile region's wrapper calls.
    pub(super) fn is_compile_region_call(&self, obj: &Bound<'py, PyAny>) -> bool {
        self.h
            .invoke_subgraph_placeholder
            .as_ref()
            .is_some_and(|placeholder| placeholder.is(obj))
    }

    /// `invoke_subgraph_placeholder(fn, *args, **kwargs)` (see the module docs).
    pub(super) fn compile_region_call(
        &mut self,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        let py = self.py;
        let Some((&function, function_args)) = args.split_first() else {
            return unsupported(
                BreakKind::UnsupportedCall,
                "a compile region without a function",
            );
        };
        let (result, traced) =
            self.trace_function_body(WHAT, function, function_args.to_vec(), kwargs)?;
        let Some(FunctionBody {
            outputs,
            output_nodes,
            lifted,
            module,
        }) = traced
        else {
            // Nothing the region computed reaches its result.
            return Ok(result);
        };
        let fingerprint: String = py
            .import_module("dynamo_rs._capture")?
            .call_method1("region_fingerprint", (&module,))?
            .extract()?;
        let known = self
            .compile_regions
            .iter()
            .find(|(f, _, _)| *f == fingerprint)
            .map(|(_, name, module)| (name.clone(), module.clone()));
        let (get, identifier) = match known {
            // The same computation on inputs of the same kinds: the same subgraph.
            Some((name, module)) => (self.submodule_of(&name, &module.bind(py).clone()), name),
            None => {
                let get = self.submodule("subgraph_0", &module);
                let name = self.graph.nodes[get.0 as usize].name.clone();
                let entry = (fingerprint, name.clone(), OwnedRef::from_bound(&module));
                self.compile_regions.push(entry);
                (get, name)
            }
        };
        let identifier = pyo3::types::PyString::new(py, &identifier).into_any();
        let mut call_args = vec![
            Arg::Node(get),
            Arg::Const(OwnedRef::from_bound(&identifier)),
        ];
        call_args.extend(lifted.iter().map(|&n| Arg::Node(n)));
        let output_fakes = self.node_fakes(&output_nodes)?;
        let items =
            self.operation_outputs("invoke_subgraph", call_args, Vec::new(), &output_fakes)?;
        let replaced: HashMap<VarId, VarId> = outputs.into_iter().zip(items).collect();
        Ok(self.replace_tensors(result, &replaced))
    }
}
