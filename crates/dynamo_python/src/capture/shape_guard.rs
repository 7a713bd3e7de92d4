//! The symbolic-shape part of a cache entry's guard: built from what torch's ShapeEnv
//! recorded while tracing (by `_shapes.guard_plan`, after the backend, which may add guards
//! of its own), evaluated natively on every call (`dynamo_capture::shape_expr`).

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

pub use dynamo_capture::shape_expr::{
    Binary, Many, ShapeExpr, ShapePlan, TensorProperty, Unary, Value,
};

use super::translator::{CResult, Tracer};

/// The shape checks of an entry: `inputs` are the source ids of the tensors the plan's
/// reads refer to (by position), `plan` the reads and checks.
#[derive(Debug, Clone)]
pub struct ShapeGuard {
    pub inputs: Vec<u32>,
    pub plan: ShapePlan,
}

impl ShapeGuard {
    /// The values the plan reads from `tensors` (one per input, in order).
    pub fn read(&self, tensors: &[Bound<'_, PyAny>]) -> PyResult<Vec<Value>> {
        let mut sizes: Vec<Option<Vec<i64>>> = vec![None; tensors.len()];
        let mut strides: Vec<Option<Vec<i64>>> = vec![None; tensors.len()];
        let mut values = Vec::with_capacity(self.plan.reads.len());
        for &(input, property, dim) in &self.plan.reads {
            let tensor = &tensors[input];
            let cache = match property {
                TensorProperty::Size => &mut sizes[input],
                TensorProperty::Stride => &mut strides[input],
                TensorProperty::Value => {
                    values.push(number_value(tensor)?);
                    continue;
                }
            };
            if cache.is_none() {
                *cache = Some(match property {
                    TensorProperty::Size => tensor.getattr("shape")?.extract()?,
                    _ => tensor.call_method0("stride")?.extract()?,
                });
            }
            let all = cache.as_ref().expect("filled above");
            values.push(Value::Int(*all.get(dim).ok_or_else(|| {
                pyo3::exceptions::PyIndexError::new_err("a tensor lost a dimension")
            })?));
        }
        Ok(values)
    }
}

/// The value of an int or float argument the shape guard reads (the entry's type guard keeps
/// each argument of the type it was traced with).
pub fn number_value(value: &Bound<'_, PyAny>) -> PyResult<Value> {
    if value.is_exact_instance_of::<pyo3::types::PyFloat>() {
        return Ok(Value::Float(value.extract()?));
    }
    Ok(Value::Int(value.extract()?))
}

/// The shape guard of the trace, if any input has symbolic sizes; raises the user's error
/// (`ConstraintViolation`) when a dimension marked dynamic was specialised.
pub fn build(tracer: &mut Tracer<'_>) -> CResult<Option<ShapeGuard>> {
    let py = tracer.py;
    if tracer.dynamic_inputs.is_empty() {
        return Ok(None);
    }
    let fakes: Vec<Bound<'_, PyAny>> = tracer
        .dynamic_inputs
        .iter()
        .map(|i| i.fake.bind(py).clone())
        .collect();
    let names: Vec<String> = tracer
        .dynamic_inputs
        .iter()
        .map(|i| i.source.describe())
        .collect();
    let marks: Vec<Bound<'_, PyAny>> = tracer
        .dynamic_inputs
        .iter()
        .map(|i| i.user_marks.bind(py).clone())
        .collect();
    let locations = tracer.specializations.borrow().clone();
    // Where each dynamic input sits among the backend's example inputs: AOTAutograd gives
    // an int example a symbol of its own, named after that position (`sym_3`).
    let positions: Vec<Option<usize>> = tracer
        .dynamic_inputs
        .iter()
        .map(|d| {
            let name = d.source.describe();
            tracer
                .inputs
                .iter()
                .position(|i| i.source.describe() == name)
        })
        .collect();
    let plan = py.import_module("dynamo_rs._shapes")?.call_method1(
        "guard_plan",
        (&tracer.fake_mode, fakes, names, marks, locations, positions),
    )?;
    let (reads, checks): (Bound<'_, PyList>, Bound<'_, PyList>) = plan.extract()?;
    let mut plan = ShapePlan::default();
    for read in reads.iter() {
        let (input, which, dim): (usize, u8, usize) = read.extract()?;
        let property = match which {
            0 => TensorProperty::Size,
            1 => TensorProperty::Stride,
            _ => TensorProperty::Value,
        };
        plan.reads.push((input, property, dim));
    }
    for check in checks.iter() {
        let (expr, what): (Bound<'_, PyAny>, String) = check.extract()?;
        plan.checks.push((parse(&expr)?, what));
    }
    let inputs = tracer
        .dynamic_inputs
        .iter()
        .map(|i| tracer.guards.sources.intern(&i.source))
        .collect();
    Ok(Some(ShapeGuard { inputs, plan }))
}

/// An expression from `_shapes` (nested tuples, see there) as a [`ShapeExpr`].
fn parse(expr: &Bound<'_, PyAny>) -> PyResult<ShapeExpr> {
    let tuple = expr.cast::<PyTuple>()?;
    let tag: String = tuple.get_item(0)?.extract()?;
    let arg = |i: usize| -> PyResult<Box<ShapeExpr>> { Ok(Box::new(parse(&tuple.get_item(i)?)?)) };
    let list = || -> PyResult<Vec<ShapeExpr>> {
        tuple
            .get_item(1)?
            .try_iter()?
            .map(|item| parse(&item?))
            .collect()
    };
    Ok(match tag.as_str() {
        "v" => ShapeExpr::Read(tuple.get_item(1)?.extract()?),
        "i" => ShapeExpr::Const(Value::Int(tuple.get_item(1)?.extract()?)),
        "f" => ShapeExpr::Const(Value::Float(tuple.get_item(1)?.extract()?)),
        "b" => ShapeExpr::Const(Value::Bool(tuple.get_item(1)?.extract()?)),
        "add" => ShapeExpr::Many(Many::Add, list()?),
        "mul" => ShapeExpr::Many(Many::Mul, list()?),
        "max" => ShapeExpr::Many(Many::Max, list()?),
        "min" => ShapeExpr::Many(Many::Min, list()?),
        "and" => ShapeExpr::Many(Many::And, list()?),
        "or" => ShapeExpr::Many(Many::Or, list()?),
        "not" => ShapeExpr::Unary(Unary::Not, arg(1)?),
        "floor" => ShapeExpr::Unary(Unary::Floor, arg(1)?),
        "ceil" => ShapeExpr::Unary(Unary::Ceil, arg(1)?),
        "trunc" => ShapeExpr::Unary(Unary::Trunc, arg(1)?),
        "float" => ShapeExpr::Unary(Unary::ToFloat, arg(1)?),
        other => {
            let op = match other {
                "pow" => Binary::Pow,
                "floordiv" => Binary::FloorDiv,
                "mod" => Binary::Mod,
                "truediv" => Binary::TrueDiv,
                "eq" => Binary::Eq,
                "ne" => Binary::Ne,
                "lt" => Binary::Lt,
                "le" => Binary::Le,
                "gt" => Binary::Gt,
                "ge" => Binary::Ge,
                _ => {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "unknown shape expression {other}"
                    )))
                }
            };
            ShapeExpr::Binary(op, arg(1)?, arg(2)?)
        }
    })
}
