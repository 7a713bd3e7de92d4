//! Handles to the Python objects the translator uses, looked up once per compiled frame.

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// The dicts `nn.Module.__getattr__` looks a missing attribute up in, in its order; its
/// `__setattr__` treats names and values of these specially.
pub const MODULE_TABLES: [&str; 3] = ["_parameters", "_buffers", "_modules"];

#[derive(Debug)]
pub struct Helpers<'py> {
    pub new_fake_mode: Bound<'py, PyAny>,
    /// `_capture.release_real_tensor_memos`: run on the trace's fake mode when the tracer
    /// goes away.
    pub release_real_tensor_memos: Bound<'py, PyAny>,
    pub to_fake: Bound<'py, PyAny>,
    /// `_shapes.input_fake`: a graph input's fake, symbolic in the dimensions the
    /// dynamic-shape policy picks.
    pub input_fake: Bound<'py, PyAny>,
    /// `_shapes.symbolic_dims`: which sizes and strides of a fake are symbolic.
    pub symbolic_dims: Bound<'py, PyAny>,
    /// (torch.SymInt, torch.SymFloat, torch.SymBool).
    pub symbolic_types: Bound<'py, PyAny>,
    pub run_fake: Bound<'py, PyAny>,
    pub export: Bound<'py, PyAny>,
    /// `_capture.forward_template`: the function whose code the graphs' `forward`s are
    /// made from (`graph_forward`).
    pub forward_template: Bound<'py, PyAny>,
    /// `_polyfills.POLYFILLS`: C functions traced as their Python versions.
    pub polyfills: Bound<'py, PyAny>,
    pub node_ref: Bound<'py, PyAny>,
    pub binary_ops: Bound<'py, PyList>,
    pub compare_ops: Bound<'py, PyList>,
    pub unary_ops: Bound<'py, PyDict>,
    pub is_graph_function: Bound<'py, PyAny>,
    pub tensor_type: Bound<'py, PyAny>,
    /// `numpy.ndarray` (None without NumPy), `torch.autocast`, `torch.jit.ScriptFunction`:
    /// what every wrapped value and every call are compared with.
    pub ndarray_type: Option<Bound<'py, PyAny>>,
    pub autocast_type: Bound<'py, PyAny>,
    /// `dynamo_rs._state_contexts.StateContext` and `torch.nn.attention.sdpa_kernel`: see
    /// `ops_state_context`.
    pub state_context_type: Bound<'py, PyAny>,
    pub sdpa_kernel: Bound<'py, PyAny>,
    /// `torch.utils.checkpoint.checkpoint` (see `ops_checkpoint`).
    pub checkpoint: Bound<'py, PyAny>,
    /// `_capture.shares_storage(tensor, others)`.
    pub shares_storage: Bound<'py, PyAny>,
    /// `torch.cond` and `_capture.same_tensor_metadata` (see `ops_cond`).
    pub cond: Bound<'py, PyAny>,
    pub same_tensor_metadata: Bound<'py, PyAny>,
    /// `torch.ops.higher_order.while_loop` and `.scan`, by name (see `ops_loops`).
    pub loop_operators: Vec<(&'static str, Bound<'py, PyAny>)>,
    /// `invoke_subgraph_placeholder`, which a nested compile region's wrapper calls (see
    /// `ops_compile_region`).
    pub invoke_subgraph_placeholder: Option<Bound<'py, PyAny>>,
    /// The functorch primitives of `torch._functorch.predispatch` (see `ops_functorch`).
    pub functorch_primitives: Vec<(
        &'static str,
        super::ops_functorch::Primitive,
        Bound<'py, PyAny>,
    )>,
    pub script_function_type: Bound<'py, PyAny>,
    pub module_type: Bound<'py, PyAny>,
    pub tuple_type: Bound<'py, PyAny>,
    pub list_type: Bound<'py, PyAny>,
    pub dict_type: Bound<'py, PyAny>,
    pub ordered_dict_type: Bound<'py, PyAny>,
    pub deque_type: Bound<'py, PyAny>,
    pub defaultdict_type: Bound<'py, PyAny>,
    pub partial_type: Bound<'py, PyAny>,
    pub function_type: Bound<'py, PyAny>,
    pub method_type: Bound<'py, PyAny>,
    pub operator: Bound<'py, PyAny>,
    pub builtins: Bound<'py, PyAny>,
    pub torch: Bound<'py, PyAny>,
    /// Types whose values are immutable constants, embedded in graphs and guarded by value.
    pub constant_types: Bound<'py, PyAny>,
    /// Callables evaluated at trace time when their arguments are constants.
    pub foldable: Bound<'py, PyAny>,
    /// `nn.Sequential` and `nn.ModuleList` (and subclasses): iterated through `_modules`.
    pub module_sequences: Bound<'py, PyAny>,
    pub module_dict: Bound<'py, PyAny>,
    /// `(nn.RNN, nn.GRU, nn.LSTM)`: calls of these break the graph at the call unless
    /// `torch._dynamo.config.allow_rnn`, as under TorchDynamo (their forward manages a
    /// cuDNN weight cache through weak references).
    pub recurrent_modules: Bound<'py, PyAny>,
    /// Predicates that are false for everything the translator tracks (`has_torch_function`
    /// on plain tensors and constants, `torch.compiler.is_exporting`).
    pub always_false: Vec<Bound<'py, PyAny>>,
    /// Functions that answer None while we trace (no JIT tracer is active).
    pub always_none: Vec<Bound<'py, PyAny>>,
    /// Functions that report whether code is being compiled: true while tracing.
    pub is_compiling: Vec<Bound<'py, PyAny>>,
    /// Functions of torch that answer from a tensor's metadata as the tensor's method of the
    /// name paired with each does (`torch.numel(x)` is `x.numel()`): no graph node.
    pub tensor_queries: Vec<(Bound<'py, PyAny>, &'static str)>,
    /// `_capture.disallowed_in_graph`: torch operations `torch._dynamo.disallow_in_graph`
    /// took out of graphs.
    pub disallowed_in_graph: Bound<'py, PyAny>,
    /// `torch.is_tensor`: true for any tensor the trace holds, without a node.
    pub is_tensor: Bound<'py, PyAny>,
    /// `torch._assert`: checked while tracing when its condition is known.
    pub torch_assert: Bound<'py, PyAny>,
    /// `torch._dynamo.graph_break`: a graph break where the program calls it.
    pub requested_breaks: Vec<Bound<'py, PyAny>>,
    /// `torch.distributions.distribution._all_true_or_runtime_assert`, the check of a
    /// distribution's argument validation (None if torch no longer has it).
    pub distribution_check: Option<Bound<'py, PyAny>>,
}

impl<'py> Helpers<'py> {
    pub fn load(py: Python<'py>) -> PyResult<Helpers<'py>> {
        let capture = py.import_module("dynamo_rs._capture")?;
        let shapes = py.import_module("dynamo_rs._shapes")?;
        let torch = py.import_module("torch")?;
        let builtins = py.import_module("builtins")?;
        let types = py.import_module("types")?;
        let constant_types = pyo3::types::PyTuple::new(
            py,
            [
                builtins.getattr("type")?.call1((py.None(),))?,
                builtins.getattr("bool")?,
                builtins.getattr("int")?,
                builtins.getattr("float")?,
                builtins.getattr("complex")?,
                builtins.getattr("str")?,
                builtins.getattr("bytes")?,
                builtins
                    .getattr("type")?
                    .call1((builtins.getattr("Ellipsis")?,))?,
                torch.getattr("dtype")?,
                torch.getattr("device")?,
                torch.getattr("Size")?,
                torch.getattr("memory_format")?,
                torch.getattr("layout")?,
                builtins.getattr("slice")?,
                builtins.getattr("range")?,
                // Type annotations used as values (`torch.jit.annotate(List[Tensor], [])`).
                py.import_module("typing")?.getattr("_BaseGenericAlias")?,
                types.getattr("GenericAlias")?,
            ],
        )?
        .into_any();
        let mut is_compiling = vec![torch.getattr("compiler")?.getattr("is_compiling")?];
        // `torch.compiler.is_dynamo_compiling` and `torch._utils.is_compiling`: true under
        // TorchDynamo's trace too.
        for (module, name) in [
            ("torch.compiler", "is_dynamo_compiling"),
            ("torch._utils", "is_compiling"),
        ] {
            if let Ok(f) = py.import_module(module).and_then(|m| m.getattr(name)) {
                is_compiling.push(f);
            }
        }
        if let Ok(dynamo) = py.import_module("torch._dynamo") {
            if let Ok(f) = dynamo.getattr("is_compiling") {
                is_compiling.push(f);
            }
        }
        if let Ok(utils) = py.import_module("torch._dynamo.external_utils") {
            if let Ok(f) = utils.getattr("is_compiling") {
                is_compiling.push(f);
            }
        }
        // nn.MultiheadAttention takes its slow path (plain operations) when this says true,
        // as under TorchDynamo: the fused inference kernel stays out of graphs.
        if let Ok(f) = py
            .import_module("torch.nn.modules.activation")
            .and_then(|m| m.getattr("_is_make_fx_tracing"))
        {
            is_compiling.push(f);
        }
        let nn = torch.getattr("nn")?;
        let module_sequences =
            pyo3::types::PyTuple::new(py, [nn.getattr("Sequential")?, nn.getattr("ModuleList")?])?
                .into_any();
        let recurrent_modules = pyo3::types::PyTuple::new(
            py,
            [nn.getattr("RNN")?, nn.getattr("GRU")?, nn.getattr("LSTM")?],
        )?
        .into_any();
        let overrides = py.import_module("torch.overrides")?;
        let mut always_false = Vec::new();
        for name in [
            "has_torch_function",
            "has_torch_function_unary",
            "has_torch_function_variadic",
        ] {
            always_false.push(overrides.getattr(name)?);
        }
        for name in [
            "_has_torch_function",
            "_has_torch_function_unary",
            "_has_torch_function_variadic",
        ] {
            if let Ok(f) = torch.getattr("_C")?.getattr(name) {
                always_false.push(f);
            }
        }
        if let Ok(f) = torch.getattr("compiler")?.getattr("is_exporting") {
            always_false.push(f);
        }
        // No JIT tracing or scripting is active while we trace.
        for (module, name) in [
            ("torch._C", "_is_tracing"),
            ("torch.jit", "is_tracing"),
            ("torch.jit", "is_scripting"),
            ("torch.jit._trace", "is_tracing"),
            ("torch._jit_internal", "is_scripting"),
        ] {
            if let Ok(f) = py.import_module(module).and_then(|m| m.getattr(name)) {
                always_false.push(f);
            }
        }
        // Nor FX symbolic tracing or ONNX export (TorchDynamo folds these the same way).
        for (module, name) in [
            ("torch.fx._symbolic_trace", "is_fx_tracing"),
            ("torch.fx._symbolic_trace", "is_fx_symbolic_tracing"),
            ("torch.onnx", "is_in_onnx_export"),
        ] {
            if let Ok(f) = py.import_module(module).and_then(|m| m.getattr(name)) {
                always_false.push(f);
            }
        }
        // The JIT tracer's state: none (torchvision's `_is_tracing()` returns it).
        let always_none = torch
            .getattr("_C")?
            .getattr("_get_tracing_state")
            .into_iter()
            .collect();
        let mut tensor_queries = Vec::new();
        for name in ["numel", "is_floating_point", "is_complex", "is_signed"] {
            if let Ok(f) = torch.getattr(name) {
                tensor_queries.push((f, name));
            }
        }
        Ok(Helpers {
            tensor_queries,
            is_tensor: torch.getattr("is_tensor")?,
            disallowed_in_graph: capture.getattr("disallowed_in_graph")?,
            module_sequences,
            module_dict: nn.getattr("ModuleDict")?,
            recurrent_modules,
            always_false,
            always_none,
            new_fake_mode: shapes.getattr("new_fake_mode")?,
            release_real_tensor_memos: capture.getattr("release_real_tensor_memos")?,
            to_fake: capture.getattr("to_fake")?,
            input_fake: shapes.getattr("input_fake")?,
            symbolic_dims: shapes.getattr("symbolic_dims")?,
            symbolic_types: pyo3::types::PyTuple::new(
                py,
                [
                    torch.getattr("SymInt")?,
                    torch.getattr("SymFloat")?,
                    torch.getattr("SymBool")?,
                ],
            )?
            .into_any(),
            run_fake: capture.getattr("run_fake")?,
            export: capture.getattr("export")?,
            forward_template: capture.getattr("forward_template")?,
            polyfills: py
                .import_module("dynamo_rs._polyfills")?
                .getattr("POLYFILLS")?,
            node_ref: capture.getattr("NodeRef")?,
            binary_ops: capture.getattr("BINARY_OPS")?.cast_into()?,
            compare_ops: capture.getattr("COMPARE_OPS")?.cast_into()?,
            unary_ops: capture.getattr("UNARY_OPS")?.cast_into()?,
            is_graph_function: capture.getattr("is_graph_function")?,
            foldable: capture.getattr("FOLDABLE")?,
            tensor_type: torch.getattr("Tensor")?,
            ndarray_type: py
                .import_module("numpy")
                .and_then(|numpy| numpy.getattr("ndarray"))
                .ok(),
            autocast_type: torch
                .getattr("amp")?
                .getattr("autocast_mode")?
                .getattr("autocast")?,
            state_context_type: py
                .import_module("dynamo_rs._state_contexts")?
                .getattr("StateContext")?,
            sdpa_kernel: py
                .import_module("torch.nn.attention")?
                .getattr("sdpa_kernel")?,
            shares_storage: capture.getattr("shares_storage")?,
            cond: torch.getattr("cond")?,
            same_tensor_metadata: capture.getattr("same_tensor_metadata")?,
            invoke_subgraph_placeholder: py
                .import_module("torch._higher_order_ops.invoke_subgraph")
                .and_then(|m| m.getattr("invoke_subgraph_placeholder"))
                .ok(),
            functorch_primitives: {
                // (eager_transforms is imported by torch.func, which a model may not have
                // imported yet.)
                py.import_module("torch._functorch.eager_transforms")?;
                super::ops_functorch::load_primitives(torch.as_any())
            },
            loop_operators: {
                let higher_order = torch.getattr("ops")?.getattr("higher_order")?;
                ["while_loop", "scan"]
                    .into_iter()
                    .filter_map(|name| higher_order.getattr(name).ok().map(|op| (name, op)))
                    .collect()
            },
            checkpoint: py
                .import_module("torch.utils.checkpoint")?
                .getattr("checkpoint")?,
            script_function_type: torch.getattr("jit")?.getattr("ScriptFunction")?,
            module_type: torch.getattr("nn")?.getattr("Module")?,
            tuple_type: builtins.getattr("tuple")?,
            list_type: builtins.getattr("list")?,
            dict_type: builtins.getattr("dict")?,
            ordered_dict_type: py.import_module("collections")?.getattr("OrderedDict")?,
            deque_type: py.import_module("collections")?.getattr("deque")?,
            defaultdict_type: py.import_module("collections")?.getattr("defaultdict")?,
            partial_type: py.import_module("functools")?.getattr("partial")?,
            function_type: types.getattr("FunctionType")?,
            method_type: types.getattr("MethodType")?,
            operator: py.import_module("operator")?.into_any(),
            builtins: builtins.into_any(),
            torch: torch.clone().into_any(),
            constant_types,
            is_compiling,
            torch_assert: torch.getattr("_assert")?,
            requested_breaks: py
                .import_module("torch._dynamo.decorators")
                .and_then(|m| m.getattr("graph_break"))
                .into_iter()
                .collect(),
            distribution_check: py
                .import_module("torch.distributions.distribution")
                .and_then(|m| m.getattr("_all_true_or_runtime_assert"))
                .ok(),
        })
    }

    /// Whether `value` is an immutable constant (tuples of constants included; a slice only
    /// when its bounds are — `slice(t0, t1)` holds tensors that can change).
    pub fn is_constant(&self, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        if let Ok(slice) = value.cast::<pyo3::types::PySlice>() {
            for bound in ["start", "stop", "step"] {
                let bound = slice.getattr(bound)?;
                if !self.is_constant(&bound)? && !is_numpy_integer(&bound)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        if value.is_instance(&self.constant_types)? {
            return Ok(true);
        }
        // NumPy's numbers (`np.int64(8)`, `np.float32(0.5)`, `np.bool_(True)`) are immutable
        // values too: guarded by type and value as TorchDynamo does, not by identity (a new
        // one with the same value each call must not recompile).
        if is_numpy_instance(value, &["integer", "floating", "bool_"])? {
            return Ok(true);
        }
        if value.get_type().is(&self.tuple_type) {
            for item in value.try_iter()? {
                if !self.is_constant(&item?)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        Ok(false)
    }
}

/// Whether `value` is a NumPy scalar of one of these abstract NumPy types (`"integer"`,
/// `"floating"`).
fn is_numpy_instance(value: &Bound<'_, PyAny>, kinds: &[&str]) -> PyResult<bool> {
    let numpy_type = value
        .get_type()
        .getattr("__module__")
        .is_ok_and(|m| m.to_string() == "numpy");
    if !numpy_type {
        return Ok(false);
    }
    let numpy = value.py().import_module("numpy")?;
    for kind in kinds {
        if value.is_instance(&numpy.getattr(*kind)?)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `value` is a NumPy integer scalar (immutable, like an int).
/// The number of argument slots of `code`: positional, keyword-only, `*args`, `**kwargs`
/// (the first localsplus slots, bound when a frame starts).
pub fn argument_slots(code: &Bound<'_, PyAny>) -> PyResult<usize> {
    let flags: u32 = code.getattr("co_flags")?.extract()?;
    Ok(code.getattr("co_argcount")?.extract::<usize>()?
        + code.getattr("co_kwonlyargcount")?.extract::<usize>()?
        + usize::from(flags & 0x04 != 0) // CO_VARARGS
        + usize::from(flags & 0x08 != 0)) // CO_VARKEYWORDS
}

/// The object a builtin method (`"{}".format`, `outs.append`, `t.add`) or a method-wrapper
/// (`od.__setitem__`) is bound to; None for anything else.
pub fn builtin_method_receiver<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let types = obj.py().import_module("types")?;
    let kind = obj.get_type().into_any();
    if !kind.is(&types.getattr("BuiltinMethodType")?)
        && !kind.is(&types.getattr("MethodWrapperType")?)
    {
        return Ok(None);
    }
    Ok(obj.getattr("__self__").ok())
}

pub fn is_numpy_integer(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    is_numpy_instance(value, &["integer"])
}

/// Whether `value` is a NumPy integer or floating-point scalar, which torch takes as the
/// Python number it holds (not `numpy.bool_`: `torch.full(size, numpy.bool_(True))` makes a
/// float tensor, with `True` a bool one).
pub fn is_numpy_scalar(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    is_numpy_instance(value, &["integer", "floating"])
}

/// The first of `dunders` that `ty` defines as a Python function: a protocol whose answer
/// Python code computes from the object's state (which an identity guard does not cover).
pub fn python_dunder<'a>(
    ty: &Bound<'_, pyo3::types::PyType>,
    dunders: &[&'a str],
    function_type: &Bound<'_, PyAny>,
) -> Option<&'a str> {
    dunders.iter().copied().find(|dunder| {
        ty.getattr(*dunder)
            .is_ok_and(|f| f.is_instance(function_type).unwrap_or(false))
    })
}
