//! torch functions called on traced values that are not plain graph operations: metadata
//! queries answered while tracing (`torch.numel(x)`, `torch.is_floating_point(x)`,
//! `torch.is_tensor(x)` leave no node, as `x.numel()` leaves none), and tensors built from
//! Python lists that hold traced values — `torch.tensor([x[0], n, 2.0])` and the legacy
//! constructors (`torch.LongTensor([a[0], a[2]])`, `torch.Tensor([...])`) — recorded as
//! `torch._refs.tensor`, which builds the tensor from the items when the graph runs (what
//! TorchDynamo records for `torch.tensor` too).

use pyo3::prelude::*;

use super::graph::Op;
use super::translator::{CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// The legacy tensor classes and the dtype each makes (`torch.Tensor` makes the default
/// dtype, read when called).
const LEGACY_CONSTRUCTORS: [(&str, &str); 10] = [
    ("FloatTensor", "float32"),
    ("DoubleTensor", "float64"),
    ("HalfTensor", "float16"),
    ("BFloat16Tensor", "bfloat16"),
    ("ByteTensor", "uint8"),
    ("CharTensor", "int8"),
    ("ShortTensor", "int16"),
    ("IntTensor", "int32"),
    ("LongTensor", "int64"),
    ("BoolTensor", "bool"),
];

impl<'py> Tracer<'py> {
    /// `obj(*args, **kwargs)` when `obj` is one of the functions this file models and the
    /// call is one it answers; None otherwise.
    pub(super) fn tensor_function_call(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let h = self.h.clone();
        let tensor_first = kwargs.is_empty()
            && matches!(
                args.first().map(|&a| self.kind(a)),
                Some(VarKind::Tensor { .. })
            );
        if tensor_first {
            if let Some((_, method)) = h.tensor_queries.iter().find(|(f, _)| f.is(obj)) {
                return self
                    .tensor_method(args[0], method, args[1..].to_vec(), Vec::new())
                    .map(Some);
            }
        }
        if obj.is(&h.is_tensor) && args.len() == 1 && kwargs.is_empty() {
            // Anything else the trace holds as a value of its own kind is not a tensor.
            let known = match self.kind(args[0]) {
                VarKind::Tensor { .. } => Some(true),
                VarKind::Const(_)
                | VarKind::Tuple(_)
                | VarKind::List(_)
                | VarKind::Dict(_)
                | VarKind::Instance { .. }
                | VarKind::NdArray(_)
                | VarKind::Symbolic { .. } => Some(false),
                _ => None,
            };
            if let Some(answer) = known {
                return Ok(Some(
                    self.constant(&answer.into_pyobject(py)?.to_owned().into_any()),
                ));
            }
        }
        let torch = h.torch.clone();
        if obj.is(&torch.getattr("tensor")?) {
            let data = match args.first() {
                Some(&d) => Some(d),
                None => kwargs.iter().find(|(k, _)| k == "data").map(|(_, v)| *v),
            };
            let Some(data) = data else { return Ok(None) };
            if !self.holds_traced_numbers(data) {
                return Ok(None);
            }
            let mut args = args.to_vec();
            let mut kwargs = kwargs.to_vec();
            match args.first_mut() {
                Some(first) => *first = self.as_tensor_data(data),
                None => {
                    let converted = self.as_tensor_data(data);
                    for (k, v) in kwargs.iter_mut() {
                        if k == "data" {
                            *v = converted;
                        }
                    }
                }
            }
            return self.refs_tensor(args, kwargs).map(Some);
        }
        let Some(dtype) = legacy_dtype(obj, &torch)? else {
            return Ok(None);
        };
        let [data] = args else { return Ok(None) };
        if !kwargs.is_empty() || !self.holds_traced_numbers(*data) {
            return Ok(None);
        }
        // The legacy constructors take a tensor item as the Python number it holds: one
        // element, and an integer one for an integer or bool dtype (eagerly a float tensor
        // item raises there); anything else is left to run as it is.
        let integer_target = !dtype.getattr("is_floating_point")?.is_truthy()?
            && !dtype.getattr("is_complex")?.is_truthy()?;
        let data = self.as_tensor_data(*data);
        for item in self.flat_items(data) {
            if !matches!(self.kind(item), VarKind::Tensor { .. }) {
                continue;
            }
            let fake = self.fake_value(item)?;
            if fake.call_method0("dim")?.extract::<i64>()? != 0 {
                return Ok(None);
            }
            let item_dtype = fake.getattr("dtype")?;
            if integer_target
                && (item_dtype.getattr("is_floating_point")?.is_truthy()?
                    || item_dtype.getattr("is_complex")?.is_truthy()?)
            {
                return Ok(None);
            }
        }
        let dtype = self.constant(&dtype);
        self.refs_tensor(vec![data], vec![("dtype".to_string(), dtype)])
            .map(Some)
    }

    /// `torch._refs.tensor(*args, **kwargs)` as a graph node.
    fn refs_tensor(&mut self, args: Vec<VarId>, kwargs: Vec<(String, VarId)>) -> CResult<VarId> {
        let refs_tensor = self.py.import_module("torch._refs")?.getattr("tensor")?;
        self.graph_call(
            Op::CallFunction(OwnedRef::from_bound(&refs_tensor)),
            "tensor",
            args,
            kwargs,
        )
    }

    /// Whether a list or tuple (nested) holds a traced tensor, NumPy array or symbolic
    /// number — what makes `torch.tensor(data)` a graph operation rather than a constant.
    fn holds_traced_numbers(&self, id: VarId) -> bool {
        match self.kind(id) {
            VarKind::List(items) | VarKind::Tuple(items) => {
                items.iter().any(|&i| match self.kind(i) {
                    VarKind::Tensor { .. } | VarKind::NdArray(_) | VarKind::Symbolic { .. } => true,
                    _ => self.holds_traced_numbers(i),
                })
            }
            _ => false,
        }
    }

    /// `data` with every NumPy array in it replaced by the tensor it is traced as (lists and
    /// tuples copied where they change).
    fn as_tensor_data(&mut self, id: VarId) -> VarId {
        let items = match self.kind(id) {
            VarKind::NdArray(tensor) => return *tensor,
            VarKind::List(items) | VarKind::Tuple(items) => items.clone(),
            _ => return id,
        };
        let converted: Vec<VarId> = items.iter().map(|&i| self.as_tensor_data(i)).collect();
        if converted == items {
            return id;
        }
        let kind = if matches!(self.kind(id), VarKind::List(_)) {
            VarKind::List(converted)
        } else {
            VarKind::Tuple(converted)
        };
        self.add(kind, None)
    }

    /// The leaves of nested lists and tuples.
    fn flat_items(&self, id: VarId) -> Vec<VarId> {
        match self.kind(id) {
            VarKind::List(items) | VarKind::Tuple(items) => {
                items.iter().flat_map(|&i| self.flat_items(i)).collect()
            }
            _ => vec![id],
        }
    }
}

/// The dtype a legacy tensor class makes, when `obj` is one (`torch.Tensor`: the default
/// dtype now); None otherwise.
fn legacy_dtype<'py>(
    obj: &Bound<'py, PyAny>,
    torch: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !obj.is_instance_of::<pyo3::types::PyType>() {
        return Ok(None);
    }
    if obj.is(&torch.getattr("Tensor")?) {
        return torch.call_method0("get_default_dtype").map(Some);
    }
    for (class, dtype) in LEGACY_CONSTRUCTORS {
        if torch.getattr(class).is_ok_and(|c| c.is(obj)) {
            return torch.getattr(dtype).map(Some);
        }
    }
    Ok(None)
}
