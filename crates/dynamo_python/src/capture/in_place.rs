//! Whether graph nodes change a tensor in place: what the guard's aliasing checks and the
//! generators' run-ahead depend on.

use pyo3::prelude::*;

use super::graph::{self, Arg};

/// Whether a graph may change a tensor in place (`add_`, `relu_`, `x[i] = v`, `+=` on a
/// tensor, `inplace=True`, `out=`): only then can two inputs that are one tensor give another
/// result than two distinct ones. Conservative: a false positive only costs a check.
pub(super) fn may_mutate_in_place(py: Python<'_>, graph: &graph::Graph) -> bool {
    graph
        .nodes
        .iter()
        .any(|node| node_mutates_in_place(py, node))
}

/// Whether one graph node may change a tensor in place (see `may_mutate_in_place`).
fn node_mutates_in_place(py: Python<'_>, node: &graph::Node) -> bool {
    let name = node.name.trim_end_matches(|c: char| c.is_ascii_digit());
    let in_place_name = (name.ends_with('_') && !name.ends_with("__"))
        || name.starts_with("setitem")
        || ops_arith_in_place(name)
        || numpy_wrapper_in_place(name.trim_end_matches('_'));
    in_place_name || node_has_out_argument(py, node)
}

/// Whether a graph node changes a tensor in place, by what it calls (an `x.add_()` method, a
/// `torch.relu_`, an in-place operator or `setitem`) rather than by its unique name, which
/// can end in `_` for other reasons (`mul_1` stripped of its digits).
pub(crate) fn node_calls_in_place(py: Python<'_>, node: &graph::Node) -> bool {
    let Some(target) = node_target_name(py, node) else {
        return false;
    };
    (target.ends_with('_') && !target.ends_with("__"))
        || target == "setitem"
        || ops_arith_in_place(&target)
        || numpy_wrapper_in_place(&target)
        || node_has_out_argument(py, node)
}

/// Whether a node name or target is one of `torch._dynamo.utils`' NumPy wrappers of an
/// in-place operation (`ops_numpy`): `wrapped_iadd` (`a += b`), `wrapped___setitem__`
/// (`a[i] = v`), `wrapped___imul__` (`a.__imul__(b)`). Trailing underscores are ignored
/// (`node_mutates_in_place` strips the digits of a unique name, leaving one).
fn numpy_wrapper_in_place(name: &str) -> bool {
    let Some(operation) = name.strip_prefix("wrapped_") else {
        return false;
    };
    let operation = operation.trim_matches('_');
    operation == "setitem" || ops_arith_in_place(operation)
}

/// Whether the in-place `node`, one of `nodes[from..]`, may change a tensor that existed
/// before `nodes[from]` was made: the tensor it changes (its first argument, its `out=`)
/// shares storage with an input of the graph (a placeholder, an attribute) or with a node
/// made before `from`. A tensor made after `from` and changed in place (`out.masked_fill_()`
/// inside a function run ahead) is private to that run. True when the target is not known.
pub(crate) fn changes_older_tensor(
    py: Python<'_>,
    nodes: &[graph::Node],
    from: usize,
    node: &graph::Node,
) -> bool {
    let storage = |n: &graph::Node| -> Option<usize> {
        let fake = n.fake.bind(py);
        fake.call_method0("untyped_storage")
            .and_then(|s| s.getattr("_cdata"))
            .and_then(|c| c.extract::<usize>())
            .ok()
    };
    let mut targets = Vec::new();
    match node.args.first() {
        Some(Arg::Node(id)) => targets.push(id.0 as usize),
        Some(_) => return true,
        None => {}
    }
    for (name, value) in &node.kwargs {
        if name != "out" {
            continue;
        }
        match value {
            Arg::Node(id) => targets.push(id.0 as usize),
            Arg::Tuple(items) | Arg::List(items) => {
                for item in items {
                    let Arg::Node(id) = item else {
                        return true;
                    };
                    targets.push(id.0 as usize);
                }
            }
            _ => return true,
        }
    }
    if targets.is_empty() {
        return true;
    }
    let mut target_storages = Vec::with_capacity(targets.len());
    for target in targets {
        match nodes.get(target).and_then(storage) {
            Some(s) => target_storages.push(s),
            None => return true,
        }
    }
    nodes.iter().enumerate().any(|(i, n)| {
        let older = i < from || matches!(n.op, graph::Op::Placeholder | graph::Op::GetAttr { .. });
        older && storage(n).is_some_and(|s| target_storages.contains(&s))
    })
}

/// Whether a node draws from torch's random number generator (`randn`, `dropout`,
/// `bernoulli_`, ...): computing it ahead of when Python would (a generator run to its end)
/// would shift every later random draw. Dropout with a constant `training=False` (third
/// argument) draws nothing.
pub(crate) fn node_draws_random(py: Python<'_>, node: &graph::Node) -> bool {
    if let Some(Arg::Const(flag)) = node_argument(node, "training", 2) {
        let flag = flag.bind(py);
        if flag.is_instance_of::<pyo3::types::PyBool>() && !flag.is_truthy().unwrap_or(true) {
            return false;
        }
    }
    let Some(target) = node_target_name(py, node) else {
        return false;
    };
    if target.contains("dropout") {
        // With p = 0 dropout returns its input and draws nothing.
        if let Some(Arg::Const(p)) = node_argument(node, "p", 1) {
            if is_zero(&p.bind(py)) {
                return false;
            }
        }
    }
    RANDOM_TARGETS.contains(&target.as_str())
}

/// A node's argument given by keyword `name` or at `position`.
fn node_argument<'a>(node: &'a graph::Node, name: &str, position: usize) -> Option<&'a Arg> {
    node.kwargs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .or(node.args.get(position))
}

/// Whether `value` is the number 0 (an int or float, not a bool).
pub(crate) fn is_zero(value: &Bound<'_, PyAny>) -> bool {
    !value.is_instance_of::<pyo3::types::PyBool>()
        && (value.is_exact_instance_of::<pyo3::types::PyFloat>()
            || value.is_exact_instance_of::<pyo3::types::PyInt>())
        && value.extract::<f64>().is_ok_and(|v| v == 0.0)
}

/// The name a node calls: the method's, or the function's `__name__`; None for a placeholder.
fn node_target_name(py: Python<'_>, node: &graph::Node) -> Option<String> {
    match &node.op {
        graph::Op::Placeholder | graph::Op::GetAttr { .. } => None,
        graph::Op::CallMethod(name) => Some(name.clone()),
        graph::Op::CallFunction(f) => Some(
            f.bind(py)
                .getattr("__name__")
                .map(|n| n.to_string())
                .unwrap_or_default(),
        ),
    }
}

/// Names of torch functions and tensor methods that draw random numbers.
const RANDOM_TARGETS: &[&str] = &[
    "rand",
    "rand_like",
    "randn",
    "randn_like",
    "randint",
    "randint_like",
    "randperm",
    "bernoulli",
    "bernoulli_",
    "multinomial",
    "normal",
    "normal_",
    "poisson",
    "uniform_",
    "exponential_",
    "geometric_",
    "log_normal_",
    "cauchy_",
    "random_",
    "dropout",
    "dropout_",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "alpha_dropout",
    "feature_alpha_dropout",
    "rrelu",
    "rrelu_",
    "native_dropout",
];

/// The tensors an in-place node (see `node_calls_in_place`) may write: its `out=` argument,
/// else its first argument (the receiver, the target of `setitem` or `iadd`, the input of
/// `relu(x, inplace=True)`). Arguments that are not nodes are left out.
pub(crate) fn written_nodes(node: &graph::Node) -> Vec<graph::NodeId> {
    let out = node_argument(node, "out", usize::MAX);
    let mut written = Vec::new();
    let mut collect = |arg: &Arg| {
        fn nodes(arg: &Arg, into: &mut Vec<graph::NodeId>) {
            match arg {
                Arg::Node(n) => into.push(*n),
                Arg::Tuple(items) | Arg::List(items) => items.iter().for_each(|a| nodes(a, into)),
                Arg::Slice(_) | Arg::Dict(_) | Arg::Const(_) => {}
            }
        }
        nodes(arg, &mut written)
    };
    match (out, node.args.first()) {
        (Some(out), _) => collect(out),
        (None, Some(first)) => collect(first),
        (None, None) => {}
    }
    written
}

/// `out=` or `inplace=True` among a node's keyword arguments.
fn node_has_out_argument(py: Python<'_>, node: &graph::Node) -> bool {
    node.kwargs.iter().any(|(k, v)| {
        k == "out"
            || (k == "inplace"
                && matches!(v, Arg::Const(c) if c.bind(py).is_truthy().unwrap_or(true)))
    })
}

fn ops_arith_in_place(name: &str) -> bool {
    matches!(
        name,
        "iadd"
            | "isub"
            | "imul"
            | "imatmul"
            | "itruediv"
            | "ifloordiv"
            | "imod"
            | "ipow"
            | "iand"
            | "ior"
            | "ixor"
            | "ilshift"
            | "irshift"
    )
}
