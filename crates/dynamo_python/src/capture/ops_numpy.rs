//! NumPy arrays made from tensors inside traced code (`x.numpy()`, then `np.*` functions,
//! operators, methods and indexing on such arrays), traced through `torch._numpy` as
//! TorchDynamo does.
//!
//! An array is a [`VarKind::NdArray`] over a tensor tracker holding its values: `x.numpy()`
//! is the graph node `x.view_as(x)` (the array shares the tensor's data, as in eager); every
//! operation on arrays is one graph node calling torch's own wrappers
//! (`torch._dynamo.utils.numpy_to_tensor_wrapper(torch._numpy.<fn>)`,
//! `numpy_operator_wrapper(operator.<op>)`, `numpy_method_wrapper(name)`,
//! `numpy_attr_wrapper`), which take and give tensors and compute with NumPy's semantics
//! (dtypes, promotion, broadcasting) on them, so fake tensors propagate through them and
//! every backend sees torch operations. `torch.from_numpy(a)` / `torch.as_tensor(a)` are
//! `torch.as_tensor` of the array's tensor. An array handed back (returned, live at a graph
//! break) is made by the generated code from the graph's output tensor
//! (`to_numpy_helper`: `tensor.numpy(force=True)`) — a new array, not one sharing the
//! input's memory (TorchDynamo's behaviour).
//!
//! In-place operators (`a += 1`) and item assignment (`a[i] = v`) change the array's tensor
//! in place (one node each, as under TorchDynamo), and with it the tensor it shares memory
//! with — not on an array the frame was given (or a view of one): another input may share
//! its memory unseen (TorchDynamo gives a stale read there under AOTAutograd; see
//! `refuse_changes_beside_arrays`). Refused (a graph break): what needs the data (`tolist`,
//! `item`, `bool(...)`, boolean masks), other in-place changes (`out=`, `sort`, `fill`),
//! `np.random`, functions `torch._numpy` does not have, and tensors handed to NumPy
//! functions directly (not through `.numpy()`). Sizes (`shape`, `ndim`, `size`, `len`) are
//! the tensor's own, symbolic ones too. An array given to the frame is an array over the graph input
//! `torch.as_tensor(array)` (`Source::AsTensor`, see `ndarray_input`); handed back, it is
//! that same array.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::break_reasons::BreakKind;
use super::codegen::Rebuild;
use super::graph::Op;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// Methods of arrays that need the data, change the array in place, or leave the graph.
const REFUSED_METHODS: &[&str] = &[
    "tolist",
    "item",
    "itemset",
    "tobytes",
    "tofile",
    "dump",
    "dumps",
    "fill",
    "sort",
    "partition",
    "resize",
    "put",
    "setflags",
    "byteswap",
    "__array__",
    "__setitem__",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "nonzero",
];

/// NumPy functions that write into an array given to them.
const IN_PLACE_FUNCTIONS: &[&str] = &[
    "copyto",
    "place",
    "put",
    "putmask",
    "put_along_axis",
    "fill_diagonal",
];

impl<'py> Tracer<'py> {
    /// `tensor.numpy()` (`force=False`): the array over the tensor's data.
    pub(super) fn tensor_to_numpy(
        &mut self,
        tensor: VarId,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        let py = self.py;
        let forced = kwargs.iter().any(|(k, v)| {
            k == "force"
                && !matches!(self.kind(*v), VarKind::Const(c) if !c.bind(py).is_truthy().unwrap_or(true))
        });
        if !args.is_empty() || forced || kwargs.iter().any(|(k, _)| k != "force") {
            return unsupported(
                BreakKind::TensorValueNeeded,
                "tensor.numpy() with arguments",
            );
        }
        let VarKind::Tensor { fake, .. } = self.kind(tensor) else {
            return unsupported(BreakKind::Internal, "internal: numpy() of a non-tensor");
        };
        let fake = fake.bind(py).clone();
        // Eager raises for these (a tensor that requires grad, one not on the CPU): the
        // graph breaks and the call raises there.
        let on_cpu = fake.getattr("device")?.getattr("type")?.to_string() == "cpu";
        if fake.getattr("requires_grad")?.is_truthy()? || !on_cpu {
            return unsupported(
                BreakKind::TensorValueNeeded,
                "tensor.numpy() of a tensor that requires grad or is not on the CPU",
            );
        }
        let view = self.graph_call(
            Op::CallMethod("view_as".into()),
            "view_as",
            vec![tensor, tensor],
            Vec::new(),
        )?;
        Ok(self.add(VarKind::NdArray(view), None))
    }

    /// A call with a NumPy array among its arguments: a NumPy function through
    /// `torch._numpy`, or `torch.from_numpy`/`torch.as_tensor`. None when no argument is
    /// such an array.
    pub(super) fn numpy_call(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        if !args
            .iter()
            .chain(kwargs.iter().map(|(_, v)| v))
            .any(|&a| self.holds_ndarray(a))
        {
            return self.numpy_array_from_constants(obj, args, kwargs);
        }
        let torch = py.import_module("torch")?;
        // `torch.tensor(array, dtype=)` and `torch.as_tensor(array, dtype=, device=)`: the
        // array's tensor converted (`torch.tensor` always copies).
        let copies = obj.is(&torch.getattr("tensor")?);
        if copies || (obj.is(&torch.getattr("as_tensor")?) && !kwargs.is_empty()) {
            let (Some(&array), true) = (args.first(), args.len() == 1) else {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    "torch.tensor of a NumPy array with other positional arguments",
                );
            };
            if kwargs.iter().any(|(k, _)| k != "dtype" && k != "device") {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    "torch.tensor of a NumPy array with requires_grad= or pin_memory=",
                );
            }
            let Some(tensor) = self.ndarray_tensor(array) else {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    "torch.tensor of a container holding NumPy arrays",
                );
            };
            let result = if kwargs.is_empty() {
                self.tensor_method(tensor, "clone", Vec::new(), Vec::new())?
            } else {
                let mut kwargs = kwargs.to_vec();
                if copies {
                    let copy = self.constant(pyo3::types::PyBool::new(py, true).as_any());
                    kwargs.push(("copy".to_string(), copy));
                }
                self.tensor_method(tensor, "to", Vec::new(), kwargs)?
            };
            return Ok(Some(result));
        }
        let to_tensor = obj.is(&torch.getattr("from_numpy")?)
            || (obj.is(&torch.getattr("as_tensor")?) && kwargs.is_empty());
        if to_tensor {
            let [array] = args else {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    "torch.as_tensor of a NumPy array with other arguments",
                );
            };
            let Some(tensor) = self.ndarray_tensor(*array) else {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    "torch.from_numpy of a container holding NumPy arrays",
                );
            };
            let as_tensor = torch.getattr("as_tensor")?;
            return self
                .graph_call(
                    Op::CallFunction(OwnedRef::from_bound(&as_tensor)),
                    "as_tensor",
                    vec![tensor],
                    Vec::new(),
                )
                .map(Some);
        }
        let module = obj
            .getattr("__module__")
            .map(|m| m.to_string())
            .unwrap_or_default();
        // ufuncs (`np.sin`) have no `__module__` of their own; their class's is numpy's.
        let module = if module.is_empty() || module == "None" {
            obj.get_type().getattr("__module__")?.to_string()
        } else {
            module
        };
        let name = obj
            .getattr("__name__")
            .map(|n| n.to_string())
            .unwrap_or_default();
        if obj.is(&self.h.builtins.getattr("len")?) && args.len() == 1 {
            if let Some(tensor) = self.ndarray_tensor(args[0]) {
                return self
                    .tensor_method(tensor, "__len__", Vec::new(), Vec::new())
                    .map(Some);
            }
        }
        if module.starts_with("torch") {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "calling {} with a NumPy array",
                    super::ops_call::describe(obj)
                ),
            );
        }
        if !module.starts_with("numpy") || name.is_empty() {
            // Anything else (builtins, user functions) takes arrays as values.
            return Ok(None);
        }
        if module.starts_with("numpy.random")
            || kwargs.iter().any(|(k, _)| k == "out")
            || IN_PLACE_FUNCTIONS.contains(&name.as_str())
        {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("numpy.{name} with out=, random numbers or writing into an array"),
            );
        }
        let tnp = py.import_module("torch._numpy")?;
        let namespace = if module.starts_with("numpy.linalg") {
            tnp.getattr("linalg")?
        } else if module.starts_with("numpy.fft") {
            tnp.getattr("fft")?
        } else {
            tnp.into_any()
        };
        let Ok(function) = namespace.getattr(name.as_str()) else {
            return unsupported(
                BreakKind::UnsupportedCall,
                format!("numpy.{name}, which torch._numpy does not have"),
            );
        };
        let wrapper = py
            .import_module("torch._dynamo.utils")?
            .getattr("numpy_to_tensor_wrapper")?
            .call1((function,))?;
        self.numpy_node(&wrapper, &format!("wrapped_{name}"), args, kwargs)
            .map(Some)
    }

    /// `np.array([1, 2, 3], dtype=...)`, `np.zeros(n)`, `np.arange(...)` and NumPy's other
    /// array makers over constants (numbers, lists and tuples of them, dtypes): a new array
    /// on every call, made in the graph through `torch._numpy` as TorchDynamo makes it (a
    /// constant array would be one object shared by every call, which code may change).
    /// None for other calls.
    fn numpy_array_from_constants(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        const MAKERS: [&str; 9] = [
            "array", "asarray", "zeros", "ones", "full", "arange", "linspace", "eye", "identity",
        ];
        let py = self.py;
        let Some(numpy) = self
            .h
            .ndarray_type
            .as_ref()
            .and_then(|_| py.import_module("numpy").ok())
        else {
            return Ok(None);
        };
        let Some(&name) = MAKERS
            .iter()
            .find(|n| numpy.getattr(**n).is_ok_and(|f| f.is(obj)))
        else {
            return Ok(None);
        };
        fn constant_data(t: &Tracer<'_>, id: VarId) -> bool {
            match t.kind(id) {
                VarKind::Const(_) => true,
                VarKind::List(items) | VarKind::Tuple(items) => {
                    items.iter().all(|&i| constant_data(t, i))
                }
                VarKind::Object(v) => is_numpy_dtype_like(&v.bind(t.py).clone()).unwrap_or(false),
                _ => false,
            }
        }
        if !args
            .iter()
            .chain(kwargs.iter().map(|(_, v)| v))
            .all(|&a| constant_data(self, a))
        {
            return Ok(None);
        }
        let function = py.import_module("torch._numpy")?.getattr(name)?;
        let wrapper = py
            .import_module("torch._dynamo.utils")?
            .getattr("numpy_to_tensor_wrapper")?
            .call1((function,))?;
        self.numpy_node(&wrapper, &format!("wrapped_{name}"), args, kwargs)
            .map(Some)
    }

    /// An operator (`a * 2`, `a @ b`, `a > 0`, `-a`, `a[i]`) with a NumPy array operand;
    /// None when there is none.
    pub(super) fn numpy_operator(
        &mut self,
        op: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        // An array operand makes it NumPy's operator; lists or tuples that merely hold
        // arrays are Python's (`[a] + [b]` concatenates, `(a,) * 2` repeats).
        if !args
            .iter()
            .any(|&a| matches!(self.kind_unobserved(a), VarKind::NdArray(_)))
        {
            return Ok(None);
        }
        let py = self.py;
        let name = super::ops_call::function_name(op);
        let in_place = super::ops_arith::IN_PLACE_OPERATORS.contains(&name.as_str());
        if (in_place || name == "setitem") && args.len() >= 2 {
            if let Some(tensor) = self.ndarray_tensor(args[0]) {
                return self.numpy_in_place(op, &name, tensor, args).map(Some);
            }
        }
        if in_place || name == "setitem" || name == "truth" || name == "not_" || name == "index" {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("operator.{name} on a NumPy array (in place, or needing its values)"),
            );
        }
        if name == "getitem" && args.len() == 2 && self.holds_ndarray(args[1]) {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "indexing a NumPy array with an array (its result's size depends on the data)",
            );
        }
        let wrapper = py
            .import_module("torch._dynamo.utils")?
            .getattr("numpy_operator_wrapper")?
            .call1((op,))?;
        self.numpy_node(&wrapper, &format!("wrapped_{name}"), args, &[])
            .map(Some)
    }

    /// `a += b` (any in-place operator) and `a[i] = v` on an array the trace holds: one graph
    /// node changing the array's tensor in place through `torch._numpy`, as TorchDynamo
    /// records them — the tensor the array came from (`x.numpy()`) changes with it, as the
    /// memory they share does eagerly. The operator gives the array itself back.
    fn numpy_in_place(
        &mut self,
        op: &Bound<'py, PyAny>,
        name: &str,
        tensor: VarId,
        args: &[VarId],
    ) -> CResult<VarId> {
        let utils = self.py.import_module("torch._dynamo.utils")?;
        let (wrapper, node_name) = if name == "setitem" {
            let wrapper = utils
                .getattr("numpy_method_wrapper")?
                .call1(("__setitem__",))?;
            (wrapper, "wrapped___setitem__".to_string())
        } else {
            let wrapper = utils.getattr("numpy_operator_wrapper")?.call1((op,))?;
            (wrapper, format!("wrapped_{name}"))
        };
        let result = self.numpy_node(&wrapper, &node_name, args, &[])?;
        if name == "setitem" {
            return Ok(result);
        }
        // NumPy changes the array itself or raises (a result that cannot be cast back);
        // anything else is not what the trace models.
        if self.ndarray_tensor(result) != Some(tensor) {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("operator.{name} on a NumPy array that gave a new array"),
            );
        }
        Ok(args[0])
    }

    /// Whether the trace has a graph input made from a NumPy array the frame was given.
    pub(super) fn has_array_input(&self) -> bool {
        self.inputs
            .iter()
            .any(|i| matches!(&*i.source, super::source::Source::AsTensor(_)))
    }

    /// Refuses a graph that both takes a NumPy array the frame was given and changes one of
    /// its inputs in place. `torch.as_tensor(array)` makes a storage of its own over the
    /// array's memory, which other inputs may share (the tensor the array came from,
    /// `x.numpy()` given beside `x`; two views of one array) with nothing in common that
    /// AOTAutograd's alias analysis sees: a change made through one would be read stale
    /// through the other (TorchDynamo's graph does read it stale). The graph breaks at the
    /// change, or at the array read after it, and that part runs eagerly. `adds_array`: an
    /// array input is being added now.
    pub(super) fn refuse_changes_beside_arrays(&self, adds_array: bool) -> CResult<()> {
        if !(adds_array || self.has_array_input()) {
            return Ok(());
        }
        let nodes = &self.graph.nodes;
        let changes_an_input = nodes.iter().any(|node| {
            super::node_calls_in_place(self.py, node)
                && super::in_place::changes_older_tensor(self.py, nodes, 0, node)
        });
        if changes_an_input {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                "a graph input changed in place in a graph that takes a NumPy array the frame \
                 was given (the array's memory may be another input's, unseen by the backend)",
            );
        }
        Ok(())
    }

    /// `a.name` of an array: shape, dtype, ndim, size (and other values that are not arrays)
    /// known from its fake; arrays (`a.T`, `a.real`) through `numpy_attr_wrapper`; methods
    /// bound for `ndarray_method`.
    pub(super) fn ndarray_attr(&mut self, array: VarId, name: &str) -> CResult<VarId> {
        let py = self.py;
        let Some(tensor) = self.ndarray_tensor(array) else {
            return unsupported(BreakKind::Internal, "internal: not an array");
        };
        let VarKind::Tensor { fake, .. } = self.kind(tensor) else {
            return unsupported(BreakKind::Internal, "internal: an array without a tensor");
        };
        let fake = fake.bind(py).clone();
        // Sizes as the tensor's own (symbolic ones too, after automatic dynamic shapes).
        let size_query = match name {
            "shape" => Some("size"),
            "ndim" => Some("dim"),
            "size" => Some("numel"),
            _ => None,
        };
        if let Some(query) = size_query {
            let answer = self.tensor_method(tensor, query, Vec::new(), Vec::new())?;
            // A NumPy shape is a plain tuple (not a `torch.Size`).
            match self.kind(answer) {
                VarKind::Tuple(items) => {
                    let items = items.clone();
                    return Ok(self.add(VarKind::Tuple(items), None));
                }
                VarKind::Const(size) if size.bind(py).is_instance_of::<PyTuple>() => {
                    let plain =
                        PyTuple::new(py, size.bind(py).try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
                    return Ok(self.constant(plain.as_any()));
                }
                _ => return Ok(answer),
            }
        }
        let wrapped = py
            .import_module("torch._numpy")?
            .getattr("ndarray")?
            .call1((&fake,))?;
        let Ok(value) = wrapped.getattr(name) else {
            if py
                .import_module("numpy")?
                .getattr("ndarray")?
                .hasattr(name)?
            {
                // NumPy has it, torch's model of NumPy does not (`tobytes`, `tofile`):
                // the array is needed as NumPy's own.
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("ndarray.{name}, which torch._numpy does not model"),
                );
            }
            let message = format!("'numpy.ndarray' object has no attribute '{name}'");
            let message = pyo3::types::PyString::new(py, &message).into_any();
            return self.raise_builtin("AttributeError", message);
        };
        if value.is_callable() {
            return Ok(self.method(array, name, None));
        }
        let tnp_array = py.import_module("torch._numpy")?.getattr("ndarray")?;
        if value.is_instance(&tnp_array)? {
            let attr = py
                .import_module("torch._dynamo.utils")?
                .getattr("numpy_attr_wrapper")?;
            let name_var = self.constant(pyo3::types::PyString::new(py, name).as_any());
            return self.numpy_node(&attr, &format!("wrapped_{name}"), &[array, name_var], &[]);
        }
        // A dtype as NumPy's (`a.dtype == np.float32` compares as in eager).
        let numpy = py.import_module("numpy")?;
        let tnp_dtype = py.import_module("torch._numpy")?.getattr("DType")?;
        let value = if value.is_instance(&tnp_dtype)? {
            numpy.call_method1("dtype", (value.getattr("name")?,))?
        } else {
            value
        };
        if !self.h.is_constant(&value)? && !value.is_instance(&numpy.getattr("dtype")?)? {
            let is_int_tuple = value
                .cast::<PyTuple>()
                .is_ok_and(|t| t.iter().all(|i| i.is_instance_of::<pyo3::types::PyInt>()));
            if !is_int_tuple {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("reading .{name} of a NumPy array"),
                );
            }
        }
        // Known from the fake (and guarded with the tensor it came from).
        Ok(self.constant(&value))
    }

    /// `a.name(...)` of an array, through `numpy_method_wrapper(name)`.
    pub(super) fn ndarray_method(
        &mut self,
        array: VarId,
        name: &str,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<VarId> {
        if REFUSED_METHODS.contains(&name) || kwargs.iter().any(|(k, _)| k == "out") {
            return unsupported(
                BreakKind::TensorValueNeeded,
                format!("ndarray.{name}() needs the array's values or changes it in place"),
            );
        }
        let wrapper = self
            .py
            .import_module("torch._dynamo.utils")?
            .getattr("numpy_method_wrapper")?
            .call1((name,))?;
        let mut all = vec![array];
        all.extend(args);
        self.numpy_node(&wrapper, &format!("wrapped_{name}"), &all, &kwargs)
    }

    /// One graph node calling `function` with the arrays among `args` given as their tensors;
    /// the tensors it gives back are arrays.
    fn numpy_node(
        &mut self,
        function: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        let args = args
            .iter()
            .map(|&a| self.arrays_as_tensors(a))
            .collect::<CResult<Vec<_>>>()?;
        let kwargs = kwargs
            .iter()
            .map(|(k, v)| Ok((k.clone(), self.arrays_as_tensors(*v)?)))
            .collect::<CResult<Vec<_>>>()?;
        let result = self.graph_call(
            Op::CallFunction(OwnedRef::from_bound(function)),
            name,
            args,
            kwargs,
        )?;
        self.tensors_as_arrays(result)
    }

    /// `id` with every array in it (through tuples and lists) replaced by its tensor; a
    /// tensor given directly is refused (NumPy would convert it with its own semantics).
    fn arrays_as_tensors(&mut self, id: VarId) -> CResult<VarId> {
        self.arrays_as_tensors_within(id, 2)
    }

    fn arrays_as_tensors_within(&mut self, id: VarId, levels: u32) -> CResult<VarId> {
        let py = self.py;
        match self.kind(id) {
            VarKind::NdArray(tensor) => Ok(*tensor),
            // NumPy's dtypes and scalar types (`astype(np.float64)`, `dtype=np.int32`) by name,
            // which `torch._numpy` takes (it has dtypes of its own).
            VarKind::Const(v) | VarKind::Object(v) if is_numpy_dtype_like(&v.bind(py).clone())? => {
                let name = py
                    .import_module("numpy")?
                    .call_method1("dtype", (v.bind(py),))?
                    .getattr("name")?;
                Ok(self.constant(&name))
            }
            VarKind::Tensor { .. } | VarKind::Unrealized(_) => unsupported(
                BreakKind::UnsupportedCall,
                "a tensor handed to NumPy code (not through tensor.numpy())",
            ),
            VarKind::Tuple(items) | VarKind::List(items) if levels > 0 => {
                let list = matches!(self.kind(id), VarKind::List(_));
                let items = items.clone();
                if !items
                    .iter()
                    .any(|&i| self.holds_ndarray_within(i, levels - 1))
                {
                    return Ok(id);
                }
                let mapped = items
                    .into_iter()
                    .map(|i| self.arrays_as_tensors_within(i, levels - 1))
                    .collect::<CResult<Vec<_>>>()?;
                Ok(self.sequence_like(list, mapped))
            }
            _ => Ok(id),
        }
    }

    /// A wrapper's result: tensors (in tuples and lists too) become arrays.
    fn tensors_as_arrays(&mut self, id: VarId) -> CResult<VarId> {
        match self.kind(id) {
            VarKind::Tensor { .. } => Ok(self.add(VarKind::NdArray(id), None)),
            VarKind::Tuple(items) | VarKind::List(items) => {
                let list = matches!(self.kind(id), VarKind::List(_));
                let items = items.clone();
                let mapped = items
                    .into_iter()
                    .map(|i| self.tensors_as_arrays(i))
                    .collect::<CResult<Vec<_>>>()?;
                Ok(self.sequence_like(list, mapped))
            }
            _ => Ok(id),
        }
    }

    /// A new list (or tuple) of `items`.
    fn sequence_like(&mut self, list: bool, items: Vec<VarId>) -> VarId {
        let kind = if list {
            VarKind::List(items)
        } else {
            VarKind::Tuple(items)
        };
        self.add(kind, None)
    }

    /// The tensor of array `id`, if it is one.
    pub fn ndarray_tensor(&self, id: VarId) -> Option<VarId> {
        match self.kind(id) {
            VarKind::NdArray(tensor) => Some(*tensor),
            _ => None,
        }
    }

    /// Whether `id` is an array, or a tuple or list holding one (directly, or in a tuple or
    /// list it holds: `np.stack([a, b])`, `np.block([[a], [b]])`). Two levels only: a list
    /// may hold itself.
    fn holds_ndarray(&self, id: VarId) -> bool {
        self.holds_ndarray_within(id, 2)
    }

    fn holds_ndarray_within(&self, id: VarId, levels: u32) -> bool {
        match self.kind_unobserved(id) {
            VarKind::NdArray(_) => true,
            VarKind::Tuple(items) | VarKind::List(items) if levels > 0 => items
                .iter()
                .any(|&i| self.holds_ndarray_within(i, levels - 1)),
            _ => false,
        }
    }

    /// A NumPy array the frame is given (at `source`), as TorchDynamo takes one: the array
    /// over a graph input that is `torch.as_tensor(array)` (sharing its memory), guarded by
    /// the array's exact type and that tensor's metadata (dtype, sizes, strides), so a new
    /// array of the same kind reuses the graph. None for arrays torch cannot take (other
    /// dtypes, negative strides) and NumPy subclasses (`np.matrix`, masked arrays).
    pub(super) fn ndarray_input(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &std::rc::Rc<super::source::Source>,
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let Some(ndarray) = self.h.ndarray_type.clone() else {
            return Ok(None);
        };
        if !value.get_type().is(&ndarray) {
            return Ok(None);
        }
        let kind: String = value.getattr("dtype")?.getattr("kind")?.extract()?;
        let itemsize: usize = value.getattr("dtype")?.getattr("itemsize")?.extract()?;
        // bool, signed ints, float and complex; of unsigned ints only uint8 (torch's other
        // unsigned types have few operations).
        if !(matches!(kind.as_str(), "b" | "i" | "f" | "c") || (kind == "u" && itemsize == 1)) {
            return Ok(None);
        }
        let Ok(tensor) = py
            .import_module("torch")?
            .getattr("as_tensor")?
            .call1((value,))
        else {
            return Ok(None);
        };
        self.guards.add(
            source.clone(),
            super::guards::GuardKind::Type(OwnedRef::from_bound(&ndarray)),
        );
        let as_tensor = std::rc::Rc::new(super::source::Source::AsTensor(source.clone()));
        let tensor = self.graph_input(&tensor, as_tensor)?;
        Ok(Some(
            self.add(VarKind::NdArray(tensor), Some(source.clone())),
        ))
    }

    /// Whether `id` is a NumPy array tracker, or a tuple, list or dict holding one.
    pub(super) fn contains_array(&self, id: VarId) -> bool {
        match self.kind_unobserved(id) {
            VarKind::NdArray(_) => true,
            VarKind::Tuple(items) | VarKind::List(items) => {
                items.iter().any(|&i| self.contains_array(i))
            }
            VarKind::Dict(entries) => entries.iter().any(|(_, v)| self.contains_array(*v)),
            VarKind::Iter { items, next, .. } => {
                items[*next..].iter().any(|&i| self.contains_array(i))
            }
            _ => false,
        }
    }

    /// How the generated code makes array `id`: `to_numpy_helper` of its tensor.
    pub(super) fn ndarray_rebuild(&self, tensor: Rebuild) -> CResult<Rebuild> {
        let helper = self
            .py
            .import_module("torch._dynamo.utils")?
            .getattr("to_numpy_helper")?;
        Ok(Rebuild::Call {
            func: Box::new(Rebuild::Const(OwnedRef::from_bound(&helper))),
            args: vec![tensor],
            kwargs: Vec::new(),
        })
    }
}

/// A NumPy dtype, or a NumPy scalar type (`np.float32`).
fn is_numpy_dtype_like(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = value.py();
    let Ok(numpy) = py.import_module("numpy") else {
        return Ok(false);
    };
    if value.is_instance(&numpy.getattr("dtype")?)? {
        return Ok(true);
    }
    let generic = numpy.getattr("generic")?;
    value
        .cast::<pyo3::types::PyType>()
        .map_or(Ok(false), |t| t.is_subclass(&generic))
}
