//! Symbolic ints, floats and bools (`VarKind::Symbolic`): sizes of inputs with dynamic
//! dimensions and what the code computes from them. They stay symbolic — graph nodes whose
//! fake values are torch `SymInt`s — through arithmetic, comparisons and as arguments of
//! graph operations (`x.view(n, -1)`, `torch.zeros(n)`); everywhere else a Python value is
//! needed (a branch, `range(n)`, a dict key, a call the trace evaluates), they are
//! specialised: torch's ShapeEnv answers with the value and records the guard that makes
//! the answer hold (`2*s0 < 16`, `Eq(s0, 4)`), which the entry's shape guard checks.

use crate::imports::ImportModule;
use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::graph::{Arg, NodeId, Op};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// Keyword arguments of a call, as trackers.
type Keywords = Vec<(String, VarId)>;

/// Functions of `torch.fx.experimental.symbolic_shapes` that ask the ShapeEnv about a
/// symbolic value without specialising it (`statically_known_true(n > 9)` is False for a
/// dynamic `n` however large its hint): called with the trace's symbolic value itself, as
/// TorchDynamo answers them. Evaluating their Python body on a specialised number would
/// answer as if the size were static.
const SHAPE_ENV_QUERIES: [&str; 6] = [
    "statically_known_true",
    "statically_known_false",
    "guard_or_false",
    "guard_or_true",
    "has_static_value",
    "has_free_unbacked_symbols",
];

impl<'py> Tracer<'py> {
    /// `obj(value)` for one of `SHAPE_ENV_QUERIES` with a symbolic argument: its answer, a
    /// constant (guards the query itself records are the ShapeEnv's, as torch's). None for
    /// other calls.
    pub(super) fn shape_env_query(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let [value] = args else { return Ok(None) };
        if !kwargs.is_empty() || !self.is_symbolic(*value) {
            return Ok(None);
        }
        let module = obj
            .getattr("__module__")
            .map(|m| m.to_string())
            .unwrap_or_default();
        if module != "torch.fx.experimental.symbolic_shapes" {
            return Ok(None);
        }
        let name: String = obj.getattr("__name__")?.extract()?;
        if !SHAPE_ENV_QUERIES.contains(&name.as_str()) {
            return Ok(None);
        }
        let VarKind::Symbolic { fake, .. } = self.kind(*value) else {
            return Ok(None);
        };
        let answer = obj.call1((fake.bind(self.py),))?;
        if !answer.is_instance_of::<pyo3::types::PyBool>() {
            return Ok(None);
        }
        Ok(Some(self.constant(&answer)))
    }

    /// Whether `id` is a symbolic value.
    pub fn is_symbolic(&self, id: VarId) -> bool {
        matches!(self.kind(id), VarKind::Symbolic { .. })
    }

    /// Refuses to turn a symbolic float among `ids` (in tuples and lists too) into text: a
    /// float the frame is handed anew on every call (the `.item()` of a loss passed on at a
    /// graph break, made symbolic when it changed) would be guarded by its exact value, and
    /// the frame traced again on every call. At a graph break the generated code formats it.
    pub(super) fn refuse_formatting_symbolic_floats(&self, ids: &[VarId]) -> CResult<()> {
        let py = self.py;
        for &id in ids {
            match self.kind_unobserved(id) {
                VarKind::Symbolic { fake, .. }
                    if fake.bind(py).get_type().name()? == "SymFloat" =>
                {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        "formatting a float that changes from call to call (its value would \
                         be guarded)",
                    );
                }
                VarKind::Tuple(items) | VarKind::List(items) => {
                    let items = items.clone();
                    self.refuse_formatting_symbolic_floats(&items)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `str(v)`, `repr(v)`, `format(v, spec)` and a string's own methods (`"{}".format(v)`,
    /// `", ".join(...)`) given a symbolic float: see `refuse_formatting_symbolic_floats`.
    pub(super) fn refuse_formatting_call(
        &self,
        callee: VarId,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<()> {
        let (VarKind::Object(obj) | VarKind::Const(obj)) = self.kind_unobserved(callee) else {
            return Ok(());
        };
        let obj = obj.bind(self.py).clone();
        if !obj.is_instance_of::<pyo3::types::PyCFunction>() {
            return Ok(());
        }
        let b = &self.h.builtins;
        let formats = ["str", "repr", "format", "ascii"]
            .iter()
            .any(|n| b.getattr(*n).is_ok_and(|f| f.is(&obj)))
            || obj
                .getattr("__self__")
                .is_ok_and(|s| s.is_instance_of::<pyo3::types::PyString>());
        if formats {
            self.refuse_formatting_symbolic_floats(args)?;
            let values: Vec<VarId> = kwargs.iter().map(|(_, v)| *v).collect();
            self.refuse_formatting_symbolic_floats(&values)?;
        }
        Ok(())
    }

    /// The Python value of a symbolic value, specialised: the ShapeEnv records the guard.
    /// Notes where, so a `mark_dynamic` dimension specialised here can name the line.
    pub fn specialize(&self, fake: &Bound<'py, PyAny>) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        let shapes = py.import_module("torch.fx.experimental.symbolic_shapes")?;
        if fake.get_type().name()? == "SymFloat" {
            py.import_module("dynamo_rs._shapes")?
                .call_method1("pin_float_inputs", (fake,))?;
        }
        let value = match shapes.getattr("guard_scalar")?.call1((fake,)) {
            Ok(value) => value,
            // A value read from a tensor (`.item()` under `capture_scalar_outputs`) has no
            // example to specialise to: Python needs the data here, as for a tensor.
            Err(err) if err.is_instance(py, &shapes.getattr("GuardOnDataDependentSymNode")?) => {
                return unsupported(
                    BreakKind::DataDependentBranch,
                    "a Python value needed from a scalar read out of a tensor",
                );
            }
            Err(err) => return Err(err.into()),
        };
        let recorded = self
            .fake_mode
            .getattr("shape_env")?
            .getattr("guards")?
            .len()?;
        self.specializations
            .borrow_mut()
            .push((recorded, self.location()));
        Ok(value)
    }

    /// The tracker for a fake result that is a `SymInt`/`SymFloat`/`SymBool` of `node`; a
    /// result the ShapeEnv already knows to be one number (`s0 * 0`) is that constant, of
    /// the result's own Python type (`float(s0)` with `s0` specialised to 4 is `4.0`, not
    /// `4`: `maybe_as_int` would say 4 for a float too).
    pub(super) fn symbolic_result(
        &mut self,
        node: NodeId,
        fake: &Bound<'py, PyAny>,
    ) -> CResult<VarId> {
        let sym_node = fake.getattr("node")?;
        let expr = sym_node.getattr("expr")?;
        if expr.getattr("is_number")?.is_truthy()? {
            let value = sym_node.getattr("pytype")?.call1((expr,))?;
            return Ok(self.constant(&value));
        }
        Ok(self.add(
            VarKind::Symbolic {
                node,
                fake: OwnedRef::from_bound(fake),
            },
            None,
        ))
    }

    /// `a op b` where an operand is symbolic and none is a tensor: a graph node on the
    /// Python operator (`operator.mul(s0, 2)`), when every operand is symbolic or a number;
    /// None otherwise (the caller specialises).
    pub fn symbolic_operator(
        &mut self,
        op: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        if !args.iter().any(|&a| self.is_symbolic(a)) {
            return Ok(None);
        }
        let numbers = args.iter().all(|&a| match self.kind(a) {
            VarKind::Symbolic { .. } => true,
            VarKind::Const(v) => {
                let v = v.bind(self.py);
                v.is_instance_of::<pyo3::types::PyInt>()
                    || v.is_instance_of::<pyo3::types::PyFloat>()
            }
            _ => false,
        });
        if !numbers {
            return Ok(None);
        }
        // `n += 1` on an int is `n = n + 1`.
        let (op, name) = match name.strip_prefix('i') {
            Some(plain) if self.h.operator.hasattr(plain)? && name != "invert" => {
                (self.h.operator.getattr(plain)?, plain.to_string())
            }
            _ => (op.clone(), name.to_string()),
        };
        let fakes = args
            .iter()
            .map(|&a| self.fake_value(a))
            .collect::<CResult<Vec<_>>>()?;
        let result = op.call1(pyo3::types::PyTuple::new(self.py, fakes)?)?;
        if !result.is_instance(&self.h.symbolic_types)? {
            return Ok(Some(self.constant(&result)));
        }
        let graph_args = args
            .iter()
            .map(|&a| self.graph_arg(a))
            .collect::<CResult<Vec<_>>>()?;
        let node = self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&op)),
            &name,
            graph_args,
            Vec::new(),
            OwnedRef::from_bound(&result),
        );
        self.symbolic_result(node, &result).map(Some)
    }

    /// Builtins that stay symbolic on symbolic numbers, as torch's symbolic equivalents
    /// (`_shapes.SYMBOLIC_BUILTINS`: `min`/`max` of two, `float()`, `int()`,
    /// `math.floor`/`ceil`/`trunc`/`sqrt`), and `isinstance`. None for anything else (the
    /// caller specialises).
    pub(super) fn symbolic_builtin(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let builtins = &self.h.builtins;
        // `isinstance(n, int)` answers from the symbol's type, without specialising it.
        if obj.is(&builtins.getattr("isinstance")?) && args.len() == 2 && self.is_symbolic(args[0])
        {
            let fake = self.fake_value(args[0])?;
            let stand_in = if fake.is_instance(&self.h.torch.getattr("SymBool")?)? {
                true.into_pyobject(py)?.to_owned().into_any()
            } else if fake.is_instance(&self.h.torch.getattr("SymFloat")?)? {
                2.5f64.into_pyobject(py)?.into_any()
            } else {
                2i64.into_pyobject(py)?.into_any()
            };
            let cls = self.python_value(args[1])?;
            let answer = builtins.getattr("isinstance")?.call1((stand_in, cls))?;
            return Ok(Some(self.constant(&answer)));
        }
        let table = py
            .import_module("dynamo_rs._shapes")?
            .getattr("SYMBOLIC_BUILTINS")?;
        let Ok(entry) = table.get_item(obj) else {
            return Ok(None); // not in the table (or unhashable)
        };
        let (name, op, arity): (String, Bound<'py, PyAny>, usize) = entry.extract()?;
        if args.len() == arity {
            return self.symbolic_operator(&op, &name, args);
        }
        Ok(None)
    }

    /// Size `dim` of a tensor whose fake is `fake`: a constant, or for a symbolic size a
    /// `sym_size` node (as TorchDynamo records it).
    pub fn tensor_size(
        &mut self,
        tensor: VarId,
        fake: &Bound<'py, PyAny>,
        dim: usize,
    ) -> CResult<VarId> {
        let value = fake.getattr("shape")?.get_item(dim)?;
        self.size_value(tensor, &value, "sym_size", dim)
    }

    /// `x.shape` / `x.size()` / `x.stride()` with symbolic entries: a `torch.Size` (or tuple)
    /// of constants and symbolic values; None when every entry is a number.
    pub fn tensor_sizes(
        &mut self,
        tensor: VarId,
        fake: &Bound<'py, PyAny>,
        stride: bool,
    ) -> CResult<Option<VarId>> {
        let values = if stride {
            fake.call_method0("stride")?
        } else {
            fake.getattr("shape")?
        };
        let items: Vec<Bound<'py, PyAny>> = values.try_iter()?.collect::<PyResult<_>>()?;
        if !items
            .iter()
            .any(|v| v.is_instance(&self.h.symbolic_types).unwrap_or(false))
        {
            return Ok(None);
        }
        let what = if stride { "sym_stride" } else { "sym_size" };
        let mut ids = Vec::with_capacity(items.len());
        for (dim, value) in items.iter().enumerate() {
            ids.push(self.size_value(tensor, value, what, dim)?);
        }
        let id = self.add(VarKind::Tuple(ids), None);
        if !stride {
            let size = self.h.torch.getattr("Size")?;
            self.tuple_classes.insert(id, OwnedRef::from_bound(&size));
        }
        Ok(Some(id))
    }

    fn size_value(
        &mut self,
        tensor: VarId,
        value: &Bound<'py, PyAny>,
        what: &str,
        dim: usize,
    ) -> CResult<VarId> {
        if !value.is_instance(&self.h.symbolic_types)? {
            return Ok(self.constant(value));
        }
        let VarKind::Tensor { node, .. } = self.kind(tensor) else {
            unreachable!("sizes are read from tensors");
        };
        let node = *node;
        let target = self
            .h
            .torch
            .getattr("ops")?
            .getattr("aten")?
            .getattr(what)?
            .getattr("int")?;
        let dim_arg = (dim as i64).into_pyobject(self.py)?.into_any();
        let size = self.graph.add(
            Op::CallFunction(OwnedRef::from_bound(&target)),
            &format!("{what}_int"),
            vec![Arg::Node(node), Arg::Const(OwnedRef::from_bound(&dim_arg))],
            Vec::new(),
            OwnedRef::from_bound(value),
        );
        self.symbolic_result(size, value)
    }

    /// `x.size()`, `x.size(d)`, `x.stride(...)`, `x.numel()` of a tensor with symbolic sizes:
    /// symbolic where the answer is; None when it is a number (answered as before).
    pub(super) fn symbolic_tensor_query(
        &mut self,
        receiver: VarId,
        fake: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        match name {
            "size" | "stride" => {
                let stride = name == "stride";
                let dim = args
                    .first()
                    .copied()
                    .or_else(|| kwargs.iter().find(|(k, _)| k == "dim").map(|(_, v)| *v));
                let Some(dim) = dim else {
                    return self.tensor_sizes(receiver, fake, stride);
                };
                let Ok(dim) = self.python_value(dim)?.extract::<i64>() else {
                    return Ok(None);
                };
                let ndim = fake.call_method0("dim")?.extract::<i64>()?;
                let dim = if dim < 0 { dim + ndim } else { dim };
                if !(0..ndim).contains(&dim) {
                    return Ok(None); // the fake tensor raises IndexError, as eager does
                }
                let value = fake.call_method1(name, (dim,))?;
                if !value.is_instance(&self.h.symbolic_types)? {
                    return Ok(None);
                }
                let what = if stride { "sym_stride" } else { "sym_size" };
                self.size_value(receiver, &value, what, dim as usize)
                    .map(Some)
            }
            "numel" | "nelement" => {
                let value = fake.call_method0("numel")?;
                if !value.is_instance(&self.h.symbolic_types)? {
                    return Ok(None);
                }
                let VarKind::Tensor { node, .. } = self.kind(receiver) else {
                    return Ok(None);
                };
                let node = self.graph.add(
                    Op::CallMethod("numel".into()),
                    "numel",
                    vec![Arg::Node(*node)],
                    Vec::new(),
                    OwnedRef::from_bound(&value),
                );
                self.symbolic_result(node, &value).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The arguments of a call the trace evaluates itself (a builtin, a class, a method of
    /// a constant): symbolic values among them specialised to constants.
    pub fn specialize_args(
        &mut self,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    ) -> CResult<(Vec<VarId>, Keywords)> {
        if !args
            .iter()
            .chain(kwargs.iter().map(|(_, v)| v))
            .any(|&a| self.is_symbolic(a))
        {
            return Ok((args, kwargs));
        }
        let one = |tracer: &mut Self, id: VarId| -> CResult<VarId> {
            match tracer.kind(id) {
                VarKind::Symbolic { fake, .. } => {
                    let fake = fake.bind(tracer.py).clone();
                    let value = tracer.specialize(&fake)?;
                    Ok(tracer.constant(&value))
                }
                _ => Ok(id),
            }
        };
        let args = args
            .into_iter()
            .map(|a| one(self, a))
            .collect::<CResult<Vec<_>>>()?;
        let kwargs = kwargs
            .into_iter()
            .map(|(k, v)| Ok((k, one(self, v)?)))
            .collect::<CResult<Vec<_>>>()?;
        Ok((args, kwargs))
    }
}
