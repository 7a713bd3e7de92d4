//! Operators: `BINARY_OP`, `COMPARE_OP`, `IS_OP`, `CONTAINS_OP`, the unary operators and
//! subscripts. On known values they are evaluated at trace time; with a tensor operand they
//! become graph nodes calling the Python operator (`operator.add`, `operator.getitem`, ...).

use super::break_reasons::{Break, BreakKind};
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::existing_tensor_keys::TensorKeyLookup;
use super::graph::Op;
use super::source::{ItemKey, Source};
use super::translator::{kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// Python's augmented-assignment operators (`operator.iadd`, ...).
pub(super) const IN_PLACE_OPERATORS: &[&str] = &[
    "iadd",
    "isub",
    "imul",
    "imatmul",
    "itruediv",
    "ifloordiv",
    "imod",
    "ipow",
    "iand",
    "ior",
    "ixor",
    "ilshift",
    "irshift",
];

impl<'py> Tracer<'py> {
    pub(super) fn op_binary(&mut self, f: &mut FrameState<'py>, kind: u32) -> CResult<Flow> {
        let rhs = self.pop(f)?;
        let lhs = self.pop(f)?;
        // `"%.3f" % loss` (printf-style formatting).
        if matches!(self.kind(lhs), VarKind::Const(c) if c.bind(self.py).is_instance_of::<pyo3::types::PyString>())
        {
            self.refuse_formatting_symbolic_floats(&[rhs])?;
        }
        let op = self.h.binary_ops.get_item(kind as usize)?;
        let result = self.apply_operator(&op, vec![lhs, rhs])?;
        f.stack.push(result);
        Ok(Flow::Continue)
    }

    pub(super) fn op_compare(&mut self, f: &mut FrameState<'py>, kind: u32) -> CResult<Flow> {
        let rhs = self.pop(f)?;
        let lhs = self.pop(f)?;
        let op = self.h.compare_ops.get_item(kind as usize)?;
        let result = self.apply_operator(&op, vec![lhs, rhs])?;
        f.stack.push(result);
        Ok(Flow::Continue)
    }

    pub(super) fn op_unary(&mut self, f: &mut FrameState<'py>, name: &str) -> CResult<Flow> {
        let value = self.pop(f)?;
        if name == "not" && matches!(self.kind(value), VarKind::Tensor { .. }) {
            return unsupported(
                BreakKind::DataDependentBranch,
                "`not` of a tensor (its value decides a branch)",
            );
        }
        let op = self
            .h
            .unary_ops
            .get_item(name)?
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(name.to_string()))?;
        let result = if name == "not" {
            let truth = self.truth(value)?;
            self.constant(&(!truth).into_pyobject(self.py)?.to_owned().into_any())
        } else {
            self.apply_operator(&op, vec![value])?
        };
        f.stack.push(result);
        Ok(Flow::Continue)
    }

    pub(super) fn op_is(&mut self, f: &mut FrameState<'py>, invert: u32) -> CResult<Flow> {
        let rhs = self.pop(f)?;
        let lhs = self.pop(f)?;
        if let Some(same) = self.is_singleton_by_type(lhs, rhs)? {
            let result = same != (invert == 1);
            let id = self.constant(&result.into_pyobject(self.py)?.to_owned().into_any());
            f.stack.push(id);
            return Ok(Flow::Continue);
        }
        if let Some(same) = self.is_between_sources(lhs, rhs) {
            let result = same != (invert == 1);
            let id = self.constant(&result.into_pyobject(self.py)?.to_owned().into_any());
            f.stack.push(id);
            return Ok(Flow::Continue);
        }
        self.pin_identity(lhs);
        self.pin_identity(rhs);
        // A symbolic int (`n is None` where n is an int argument made dynamic) is not
        // the same object as anything but an int; against an int it is specialised.
        let (lhs, rhs) = match (self.kind(lhs), self.kind(rhs)) {
            (VarKind::Symbolic { .. }, VarKind::Symbolic { .. }) => (lhs, rhs),
            (VarKind::Symbolic { .. }, _) | (_, VarKind::Symbolic { .. }) => {
                let other = if self.is_symbolic(lhs) { rhs } else { lhs };
                let other_is_int = self
                    .real_unpinned(other)
                    .is_some_and(|v| v.is_instance_of::<pyo3::types::PyInt>());
                if other_is_int {
                    let (args, _) = self.specialize_args(vec![lhs, rhs], Vec::new())?;
                    (args[0], args[1])
                } else {
                    let result = invert == 1;
                    let id = self.constant(&result.into_pyobject(self.py)?.to_owned().into_any());
                    f.stack.push(id);
                    return Ok(Flow::Continue);
                }
            }
            _ => (lhs, rhs),
        };
        let same = match (self.kind(lhs), self.kind(rhs)) {
            (VarKind::Tensor { node: a, .. }, VarKind::Tensor { node: b, .. }) => a == b,
            (VarKind::Tensor { .. }, _) | (_, VarKind::Tensor { .. }) => false,
            (VarKind::Const(a) | VarKind::Object(a), VarKind::Const(b) | VarKind::Object(b)) => {
                a.as_ptr() == b.as_ptr()
            }
            (
                VarKind::Tuple(_) | VarKind::List(_) | VarKind::Dict(_),
                VarKind::Const(_) | VarKind::Object(_),
            )
            | (
                VarKind::Const(_) | VarKind::Object(_),
                VarKind::Tuple(_) | VarKind::List(_) | VarKind::Dict(_),
            ) => {
                // A container built in the trace is never the same object as an existing one,
                // except constants like None, which containers are not.
                false
            }
            _ if lhs == rhs => true,
            (VarKind::Instance { .. }, _) | (_, VarKind::Instance { .. }) => false,
            (a, b) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!("`is` between {} and {}", kind_name(a), kind_name(b)),
                )
            }
        };
        let result = same != (invert == 1);
        let id = self.constant(&result.into_pyobject(self.py)?.to_owned().into_any());
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    /// `obj is None` (or `True`, `False`, `...`, `NotImplemented`) for an existing object of
    /// another type: never the same object, which its type alone says — guarded, not its
    /// identity (a function or config made anew per call compared with None would otherwise
    /// recompile on every call). None when that does not apply.
    fn is_singleton_by_type(&mut self, lhs: VarId, rhs: VarId) -> CResult<Option<bool>> {
        let py = self.py;
        for (object, other) in [(lhs, rhs), (rhs, lhs)] {
            // The singleton may be a literal or a builtin read by name (`NotImplemented`).
            let (VarKind::Object(value), VarKind::Const(constant) | VarKind::Object(constant)) =
                (self.kind(object), self.kind(other))
            else {
                continue;
            };
            let (value, constant) = (value.bind(py).clone(), constant.bind(py).clone());
            let singleton = constant.is_none()
                || constant.is_instance_of::<pyo3::types::PyBool>()
                || constant.is(py.Ellipsis())
                || constant.is(py.NotImplemented());
            let Some(source) = self.source(object) else {
                continue;
            };
            if !singleton || value.get_type().is(constant.get_type()) {
                continue;
            }
            self.guards.add(
                source,
                super::guards::GuardKind::Type(OwnedRef::from_bound(value.get_type().as_any())),
            );
            return Ok(Some(false));
        }
        Ok(None)
    }

    pub(super) fn op_contains(&mut self, f: &mut FrameState<'py>, invert: u32) -> CResult<Flow> {
        let container = self.pop(f)?;
        let item = self.pop(f)?;
        if let Some(found) = self.member_of_fresh_set(item, container)? {
            let answer = (found != (invert == 1)).into_pyobject(self.py)?;
            let id = self.constant(&answer.to_owned().into_any());
            f.stack.push(id);
            return Ok(Flow::Continue);
        }
        if matches!(self.kind(container), VarKind::Instance { .. })
            && self.has_python_method(container, "__contains__")?
        {
            // An object made here whose class answers `in` itself: its method, traced.
            let method = self.get_attr(container, "__contains__")?;
            let answer = self.call_function(method, vec![item], Vec::new())?;
            let found = self.truth(answer)?;
            return self.push_membership(f, found, invert);
        }
        if let Some(found) = self.tensor_in_dict(item, container)? {
            return self.push_membership(f, found, invert);
        }
        if let Some(found) = self.existing_dict_has_tensor(container, item)? {
            return self.push_membership(f, found, invert);
        }
        if self.contains_tensor(item) {
            return unsupported(BreakKind::UnsupportedOperation, "`in` with a tensor");
        }
        if let (
            VarKind::Const(key),
            VarKind::Instance {
                model_output: true, ..
            },
        ) = (self.kind(item), self.kind(container))
        {
            // `"logits" in out` of a ModelOutput made here: among its items (the ordered
            // dict's keys).
            let key = key.bind(self.py).clone();
            let found = self
                .model_output_items(container)
                .iter()
                .any(|(name, _)| key.eq(name).unwrap_or(false));
            return self.push_membership(f, found, invert);
        }
        if let (VarKind::Instance { .. }, VarKind::List(items) | VarKind::Tuple(items)) =
            (self.kind(item), self.kind(container))
        {
            // An object made here in a list or tuple: as CPython compares, each item by
            // identity first, then `item_i == needle`.
            let items = items.clone();
            let eq = self.h.operator.getattr("eq")?;
            let mut found = false;
            for candidate in items {
                found = candidate == item || {
                    let answer = self.apply_operator(&eq, vec![candidate, item])?;
                    self.truth(answer)?
                };
                if found {
                    break;
                }
            }
            return self.push_membership(f, found, invert);
        }
        let needle = self.python_value(item)?;
        // `k in d.keys()` is `k in d`; other views are asked on their items as they are now.
        let container = match *self.kind(container) {
            VarKind::DictView {
                dict,
                which: super::vars::DictViewKind::Keys,
            } => dict,
            VarKind::DictView { dict, which } => {
                let items = self.dict_view_items(dict, which)?;
                self.add(VarKind::Tuple(items), None)
            }
            _ => container,
        };
        if matches!(self.kind(container), VarKind::Dict(_)) {
            self.check_hashable(&needle)?;
        }
        let found = match self.kind(container) {
            VarKind::Dict(entries) => {
                let mut found = false;
                for (k, _) in entries {
                    if k.bind(self.py).eq(&needle)? {
                        found = true;
                        break;
                    }
                }
                found
            }
            VarKind::Tuple(_) | VarKind::List(_) | VarKind::Const(_) | VarKind::Object(_) => {
                if self.contains_tensor(container) {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        "`in` on a container of tensors",
                    );
                }
                let found = self.python_value(container)?.contains(&needle)?;
                // Membership in an existing object (a set attribute, a registry) is its
                // state: guard the answer — unless it is a set guarded by its elements (or
                // the copy standing for one the trace changed: the answer is the copy's).
                if let (VarKind::Object(_), Some(source)) =
                    (self.kind(container), self.source(container))
                {
                    if self.set_elements_known(container) {
                        return self.push_membership(f, found, invert);
                    }
                    self.guards.add(
                        source,
                        super::guards::GuardKind::Contains(OwnedRef::from_bound(&needle), found),
                    );
                }
                found
            }
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::DictView { .. }
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
                    format!("`in` on {}", kind_name(other)),
                )
            }
        };
        self.push_membership(f, found, invert)
    }

    /// Pushes the answer of `in` (`not in` when `invert` is 1) given whether it was found.
    fn push_membership(
        &mut self,
        f: &mut FrameState<'py>,
        found: bool,
        invert: u32,
    ) -> CResult<Flow> {
        let id = self.constant(
            &(found != (invert == 1))
                .into_pyobject(self.py)?
                .to_owned()
                .into_any(),
        );
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    /// Applies a Python operator: on tensors a graph node, on containers the container
    /// operation, on known values the real result.
    pub fn apply_operator(&mut self, op: &Bound<'py, PyAny>, args: Vec<VarId>) -> CResult<VarId> {
        if let Some(result) = self.numpy_operator(op, &args)? {
            return Ok(result);
        }
        if let Some(result) = self.user_operator(op, &args)? {
            return Ok(result);
        }
        if let Some(result) = self.default_equality(op, &args)? {
            return Ok(result);
        }
        if let Some(result) = self.keys_view_set_operator(op, &args)? {
            return Ok(result);
        }
        if args
            .iter()
            .any(|&a| matches!(self.kind(a), VarKind::Tensor { .. }))
        {
            let mut op = op.clone();
            let mut name = super::ops_call::function_name(&op);
            if IN_PLACE_OPERATORS.contains(&name.as_str())
                && !matches!(self.kind(args[0]), VarKind::Tensor { .. })
            {
                // `out = 0; out += t`: an in-place operator on an immutable left operand is
                // the plain operator (Python falls back to `__add__`/`__radd__`); a graph
                // node `iadd(0, t)` is not even valid FX code. Mutable non-tensor left
                // operands (lists) are not traced here.
                if !matches!(self.kind(args[0]), VarKind::Const(_)) {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!(
                            "operator {name} with {} on the left and a tensor on the right",
                            kind_name(self.kind(args[0]))
                        ),
                    );
                }
                name = name[1..].to_string();
                op = self.h.operator.getattr(name.as_str())?;
            }
            let op = &op;
            return self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(op)),
                &name,
                args,
                Vec::new(),
            );
        }
        let name = super::ops_call::function_name(op);
        if let Some(result) = self.symbolic_operator(op, &name, &args)? {
            return Ok(result);
        }
        let (args, _) = self.specialize_args(args, Vec::new())?;
        if IN_PLACE_OPERATORS.contains(&name.as_str()) {
            if let Some(result) = self.in_place_on_container(&name, &args)? {
                return Ok(result);
            }
        }
        // Tuple and list concatenation and repetition keep their trackers; a constant
        // tuple joined to a tracked one (`(-1,) + x.shape[1:]`) is taken apart, so symbolic
        // sizes in the other stay symbolic.
        let joins_tracked_tuple = args.len() == 2
            && matches!(name.as_str(), "add" | "iadd")
            && args
                .iter()
                .any(|&a| matches!(self.kind(a), VarKind::Tuple(_)));
        let args = if joins_tracked_tuple {
            args.iter()
                .map(|&a| Ok(self.constant_tuple_items(a)?.unwrap_or(a)))
                .collect::<CResult<Vec<_>>>()?
        } else {
            args
        };
        if args.len() == 2 && matches!(name.as_str(), "add" | "iadd") {
            if let (VarKind::Tuple(a), VarKind::Tuple(b)) | (VarKind::List(a), VarKind::List(b)) =
                (self.kind(args[0]), self.kind(args[1]))
            {
                let is_tuple = matches!(self.kind(args[0]), VarKind::Tuple(_));
                let mut items = a.clone();
                items.extend(b.iter().copied());
                let kind = if is_tuple {
                    VarKind::Tuple(items)
                } else {
                    VarKind::List(items)
                };
                return Ok(self.add(kind, None));
            }
        }
        // `a | b` of two traced dicts: a new dict of a's class, b's entries last.
        if args.len() == 2 && name == "or_" {
            if let (VarKind::Dict(a), VarKind::Dict(b)) = (self.kind(args[0]), self.kind(args[1])) {
                let mut entries = a.clone();
                for (key, value) in b.clone() {
                    super::vars::dict_set(self.py, &mut entries, key, value);
                }
                let merged = self.add(VarKind::Dict(entries), None);
                if let Some(cls) = self.class_kept_by_copy(args[0])? {
                    self.dict_classes.insert(merged, cls);
                }
                return Ok(merged);
            }
        }
        // `[x] * n`, `n * (a, b)`: the same trackers repeated (the same objects, as in Python).
        if args.len() == 2 && name == "mul" {
            let (seq, count) = match (self.kind(args[0]), self.kind(args[1])) {
                (VarKind::Tuple(_) | VarKind::List(_), VarKind::Const(_)) => (args[0], args[1]),
                (VarKind::Const(_), VarKind::Tuple(_) | VarKind::List(_)) => (args[1], args[0]),
                _ => (args[0], args[0]),
            };
            if seq != count {
                let times = self.real(count).and_then(|c| c.extract::<i64>().ok());
                let is_bool = self
                    .real(count)
                    .is_some_and(|c| c.is_instance_of::<pyo3::types::PyBool>());
                if let (Some(times), false) = (times, is_bool) {
                    let (items, is_tuple) = match self.kind(seq) {
                        VarKind::Tuple(items) => (items.clone(), true),
                        VarKind::List(items) => (items.clone(), false),
                        _ => unreachable!("matched above"),
                    };
                    let repeated: Vec<VarId> = std::iter::repeat_n(items, times.max(0) as usize)
                        .flatten()
                        .collect();
                    let kind = if is_tuple {
                        VarKind::Tuple(repeated)
                    } else {
                        VarKind::List(repeated)
                    };
                    return Ok(self.add(kind, None));
                }
            }
        }
        if args.len() == 2 && matches!(name.as_str(), "lt" | "le" | "gt" | "ge" | "eq" | "ne") {
            if let Some(answer) = self.compare_sequences(&name, args[0], args[1])? {
                return Ok(answer);
            }
        }
        if args.iter().any(|&a| self.contains_tensor(a)) {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("operator {name} on a container holding tensors"),
            );
        }
        // Evaluated now, on the real objects: only where the answer cannot change while the
        // guards hold and no user code runs.
        for &arg in &args {
            if let VarKind::Object(value) = self.kind(arg) {
                let value = value.bind(self.py).clone();
                if !self.immutable_object(&value)? {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("operator {name} on {}", super::ops_call::describe(&value)),
                    );
                }
            }
        }
        let result = match op.call1(self.python_args(&args)?) {
            Ok(r) => r,
            Err(err) => {
                let detail = format!("operator {name} raised {err} while tracing");
                if self.all_plain_values(&args, &[]) {
                    return self.raised(err, detail);
                }
                return unsupported(BreakKind::ExceptionWhileTracing, detail);
            }
        };
        if self.h.is_constant(&result)? {
            return Ok(self.constant(&result));
        }
        // `a | b`, `a - b`, ... of sets: a new set, the trace's own.
        let new_set = result.is_exact_instance_of::<pyo3::types::PySet>()
            && !args
                .iter()
                .any(|&a| self.real(a).is_some_and(|r| r.is(&result)));
        if new_set {
            return Ok(self.fresh_set(&result));
        }
        self.wrap(&result, None)
    }

    /// A constant tuple as a tuple tracker of its items (None for anything else).
    fn constant_tuple_items(&mut self, id: VarId) -> CResult<Option<VarId>> {
        let VarKind::Const(value) = self.kind(id) else {
            return Ok(None);
        };
        let value = value.bind(self.py).clone();
        if !value.get_type().is(&self.h.tuple_type) {
            return Ok(None);
        }
        let items = value
            .try_iter()?
            .map(|item| Ok(self.constant(&item?)))
            .collect::<CResult<Vec<_>>>()?;
        Ok(Some(self.add(VarKind::Tuple(items), None)))
    }

    /// `lhs op= rhs` where `lhs` is a mutable container: Python changes it in place, so every
    /// name bound to it sees the change. Done on containers made in this trace; refused on
    /// existing ones (a side effect the transformed code does not replay) and on objects
    /// whose in-place operator would run on the real object while tracing. `None`: the
    /// left operand is immutable, and the operator is the plain one.
    fn in_place_on_container(&mut self, name: &str, args: &[VarId]) -> CResult<Option<VarId>> {
        let py = self.py;
        let [lhs, rhs] = args else { return Ok(None) };
        let (lhs, rhs) = (*lhs, *rhs);
        if let Some(set) = self.set_in_place(name, lhs, rhs)? {
            return Ok(Some(set));
        }
        let mutable = matches!(
            self.kind(lhs),
            VarKind::List(_) | VarKind::Dict(_) | VarKind::Object(_) | VarKind::Instance { .. }
        );
        if !mutable {
            return Ok(None);
        }
        if !matches!(self.kind(lhs), VarKind::List(_) | VarKind::Dict(_))
            || !self.changeable_container(lhs)
        {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!(
                    "operator {name} on {} that existed before the call",
                    kind_name(self.kind(lhs))
                ),
            );
        }
        let kind = match (name, self.kind(lhs), self.kind(rhs)) {
            ("iadd", VarKind::List(a), VarKind::List(b) | VarKind::Tuple(b)) => {
                VarKind::List(a.iter().chain(b).copied().collect())
            }
            ("imul", VarKind::List(a), VarKind::Const(n)) => {
                let n: i64 = match n.bind(py).extract() {
                    Ok(n) => n,
                    Err(_) => {
                        return unsupported(
                            BreakKind::UnsupportedOperation,
                            "list *= a value that is not an int",
                        )
                    }
                };
                let times = n.max(0) as usize;
                VarKind::List(a.iter().copied().cycle().take(a.len() * times).collect())
            }
            ("ior", VarKind::Dict(a), VarKind::Dict(b)) => {
                let mut entries = a.clone();
                for (key, value) in b {
                    super::vars::dict_set(py, &mut entries, key.clone(), *value);
                }
                VarKind::Dict(entries)
            }
            (_, lhs_kind, rhs_kind) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!(
                        "operator {name} on {} and {}",
                        kind_name(lhs_kind),
                        kind_name(rhs_kind)
                    ),
                )
            }
        };
        self.may_change_container(lhs, &format!("operator {name}"))?;
        self.vars[lhs.0 as usize].kind = kind;
        Ok(Some(lhs))
    }

    /// The truth value of a known value (a tensor's would need its data).
    pub fn truth(&mut self, id: VarId) -> CResult<bool> {
        let py = self.py;
        Ok(match self.kind(id) {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::Const(v) | VarKind::Object(v) => {
                let v = v.bind(py);
                if matches!(self.kind(id), VarKind::Object(_))
                    && !self.set_elements_known(id)
                    && !self.is_fresh_deque(id)
                {
                    let t = v.get_type();
                    let native_container = v.is_instance_of::<pyo3::types::PyDict>()
                        || v.is_instance_of::<pyo3::types::PyList>()
                        || v.is_instance_of::<pyo3::types::PyTuple>();
                    if native_container && !t.hasattr("__bool__")? {
                        // A dict, list or tuple (an OrderedDict of hooks) reached by a
                        // source: its truth is its length, which is guarded — unless its
                        // class measures itself in Python.
                        let len_fn = t.getattr("__len__")?;
                        if let (Some(source), false) =
                            (self.source(id), len_fn.is_instance(&self.h.function_type)?)
                        {
                            let n = v.len()?;
                            self.guards.add(source, super::guards::GuardKind::Len(n));
                            return Ok(n != 0);
                        }
                    }
                    if t.hasattr("__bool__")? || t.hasattr("__len__")? {
                        // The answer depends on the object's state, which no guard covers.
                        if !v.is_instance(&self.h.module_type)? {
                            return unsupported(
                                BreakKind::DataDependentBranch,
                                format!("the truth value of {}", super::ops_call::describe(&v)),
                            );
                        }
                    }
                }
                v.is_truthy()?
            }
            VarKind::Symbolic { fake, .. } => {
                let fake = fake.bind(py).clone();
                self.specialize(&fake)?.is_truthy()?
            }
            VarKind::Tuple(items) | VarKind::List(items) => !items.is_empty(),
            VarKind::Dict(entries) => !entries.is_empty(),
            VarKind::DictView { dict, .. } => {
                matches!(self.kind(*dict), VarKind::Dict(entries) if !entries.is_empty())
            }
            VarKind::Function(_) | VarKind::Method { .. } => true,
            VarKind::Instance {
                model_output: true, ..
            } => !self.model_output_items(id).is_empty(),
            VarKind::Instance { cls, .. } => {
                let cls = cls.bind(py).clone();
                // As Python: the class's `__bool__`, else its `__len__` (transformers'
                // `if past_key_values and ...` on a cache made in the trace), traced.
                let name = if cls.hasattr("__bool__")? {
                    "__bool__"
                } else if cls.hasattr("__len__")? {
                    "__len__"
                } else {
                    return Ok(true);
                };
                let method = self.get_attr(id, name)?;
                let answer = self.call_function(method, Vec::new(), Vec::new())?;
                self.truth(answer)?
            }
            VarKind::Tensor { .. } => {
                return unsupported(
                    BreakKind::DataDependentBranch,
                    "a branch on a tensor's value",
                )
            }
            other @ (VarKind::Slice(_)
            | VarKind::Null
            | VarKind::Iter { .. }
            | VarKind::Generator { .. }
            | VarKind::Lazy(_)
            | VarKind::Partial { .. }
            | VarKind::CellRef(_)
            | VarKind::Super { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)) => {
                return unsupported(
                    BreakKind::DataDependentBranch,
                    format!("the truth value of {}", kind_name(other)),
                )
            }
        })
    }

    pub(super) fn op_subscr(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let index = self.pop(f)?;
        let container = self.pop(f)?;
        let result = self.subscript(container, index)?;
        f.stack.push(result);
        Ok(Flow::Continue)
    }

    /// `obj[index]` of an object (existing, not a module, or made in the trace) whose class
    /// defines `__getitem__` in Python (a registry, a `Mapping`): the method inlined, so what
    /// it reads is guarded and what it raises can be caught; None for other containers.
    pub fn python_getitem(&mut self, container: VarId, index: VarId) -> CResult<Option<VarId>> {
        if !self.has_python_method(container, "__getitem__")? {
            return Ok(None);
        }
        let method = self.get_attr(container, "__getitem__")?;
        self.call_function(method, vec![index], Vec::new())
            .map(Some)
    }

    /// Whether `id` is an object (made in the trace, or existing and not a module or a
    /// class) whose class defines `name` as a Python function.
    pub(super) fn has_python_method(&self, id: VarId, name: &str) -> CResult<bool> {
        Ok(self.user_class(id)?.is_some_and(|cls| {
            cls.getattr(name)
                .is_ok_and(|m| m.is_instance(&self.h.function_type).unwrap_or(false))
        }))
    }

    /// The class of `id` if it is an object whose Python methods the trace inlines: one
    /// made in the trace (not a `ModelOutput`), an instance of a user dict class, or an
    /// existing object that is neither a module nor a class.
    pub(super) fn user_class(&self, id: VarId) -> CResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        Ok(match self.kind(id) {
            VarKind::Instance {
                cls,
                model_output: false,
                ..
            } => Some(cls.bind(py).clone()),
            VarKind::Dict(_) => self.user_dict_class(id),
            VarKind::List(_) => self.user_list_class(id),
            VarKind::Object(value) => {
                let value = value.bind(py);
                if value.is_instance(&self.h.module_type)?
                    || value.is_instance_of::<pyo3::types::PyType>()
                {
                    None
                } else {
                    Some(value.get_type().into_any())
                }
            }
            _ => None,
        })
    }

    pub fn subscript(&mut self, container: VarId, index: VarId) -> CResult<VarId> {
        let py = self.py;
        if matches!(self.kind(container), VarKind::NdArray(_)) {
            let getitem = self.h.operator.getattr("getitem")?;
            return self.apply_operator(&getitem, vec![container, index]);
        }
        if matches!(self.kind(container), VarKind::Tensor { .. }) {
            let getitem = self.h.operator.getattr("getitem")?;
            return self.graph_call(
                Op::CallFunction(OwnedRef::from_bound(&getitem)),
                "getitem",
                vec![container, index],
                Vec::new(),
            );
        }
        if let Some(result) = self.python_getitem(container, index)? {
            return Ok(result);
        }
        if let Some(result) = self.deque_getitem(container, index)? {
            return Ok(result);
        }
        match self.existing_dict_tensor_lookup(container, index)? {
            Some(TensorKeyLookup::Found(value)) => return Ok(value),
            // `__missing__` of a defaultdict would add an entry keyed by the tensor; a
            // dict's KeyError would hold it.
            Some(TensorKeyLookup::Missing) => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "a tensor missing from an existing dict keyed by tensors",
                )
            }
            None => {}
        }
        // A dict the trace holds, indexed by a tensor: by the tensor's identity, as Python.
        let tensor_key = matches!(self.kind(container), VarKind::Dict(_))
            && matches!(self.kind(index), VarKind::Tensor { .. });
        if !tensor_key && self.contains_tensor(index) {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "indexing a container with a tensor",
            );
        }
        let key = self.key_value(index)?;
        // A sequence indexed by an object (not a constant): its `__index__` or the bounds of
        // a slice holding tensors can change without the object changing, and the items
        // picked here would be folded into the trace.
        let sequence = match self.kind(container) {
            VarKind::Tuple(_) | VarKind::List(_) => true,
            VarKind::Object(v) => v.bind(py).is_instance(&self.h.module_sequences)?,
            _ => false,
        };
        if sequence && matches!(self.kind(index), VarKind::Object(_)) {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!(
                    "indexing a sequence with a {} that is not a constant",
                    key.get_type().name()?
                ),
            );
        }
        if matches!(
            self.kind(container),
            VarKind::Instance {
                model_output: true,
                ..
            }
        ) {
            let items = self.model_output_items(container);
            if let Ok(field) = key.extract::<String>() {
                return match items.iter().find(|(k, _)| *k == field) {
                    Some((_, v)) => Ok(*v),
                    None => unsupported(
                        BreakKind::ModelOutput,
                        format!("ModelOutput has no field {field:?} set"),
                    ),
                };
            }
            let values: Vec<VarId> = items.into_iter().map(|(_, v)| v).collect();
            let tuple = self.add(VarKind::Tuple(values), None);
            return self.subscript(tuple, index);
        }
        if matches!(self.kind(container), VarKind::Dict(_)) {
            self.check_hashable(&key)?;
        }
        match self.kind(container) {
            VarKind::Tuple(items) | VarKind::List(items) => {
                let items = items.clone();
                let is_tuple = matches!(self.kind(container), VarKind::Tuple(_));
                if let Ok(i) = key.extract::<i64>() {
                    let n = items.len() as i64;
                    let at = if i < 0 { i + n } else { i };
                    return match items.get(at as usize) {
                        Some(&item) if at >= 0 => Ok(item),
                        _ => {
                            let what = if is_tuple { "tuple" } else { "list" };
                            let message = format!("{what} index out of range");
                            self.raise_builtin("IndexError", PyString::new(py, &message).into_any())
                        }
                    };
                }
                // A slice: index the tracker list with the real slice.
                let positions = pyo3::types::PyList::new(py, 0..items.len())?;
                let picked: Vec<usize> = positions
                    .as_any()
                    .get_item(&key)
                    .and_then(|v| v.extract())
                    .map_err(|e| {
                        super::translator::CaptureError::Unsupported(Break::new(
                            BreakKind::UnsupportedOperation,
                            format!("indexing a sequence with {key}: {e}"),
                        ))
                    })?;
                let chosen = picked.into_iter().map(|i| items[i]).collect();
                Ok(self.add(
                    if is_tuple {
                        VarKind::Tuple(chosen)
                    } else {
                        VarKind::List(chosen)
                    },
                    None,
                ))
            }
            VarKind::Dict(entries) => {
                for (k, v) in entries {
                    if k.bind(py).eq(&key)? {
                        return Ok(*v);
                    }
                }
                // A defaultdict: the factory's value, stored under the key — a change to the
                // dict like `d[key] = value`, replayed into one that existed before the call.
                if let Some(&factory) = self.dict_defaults.get(&container) {
                    self.may_change_container(container, "a missing key's default")?;
                    let value = self.call_function(factory, Vec::new(), Vec::new())?;
                    let key = OwnedRef::from_bound(&key);
                    if let VarKind::Dict(entries) = &mut self.vars[container.0 as usize].kind {
                        super::vars::dict_set(py, entries, key, value);
                    }
                    return Ok(value);
                }
                // The keys of a dict tracker are guarded (or made here): missing on every call.
                self.raise_key_error(key)
            }
            VarKind::Object(v)
                if v.bind(py).is_instance(&self.h.module_sequences)?
                    && key.is_instance_of::<pyo3::types::PySlice>() =>
            {
                // A new container each time: see `ops_module_slice`.
                let value = v.bind(py).clone();
                self.slice_module_sequence(container, &value, &key)
            }
            VarKind::Const(v) | VarKind::Object(v) => {
                let v = v.bind(py).clone();
                let item = match v.get_item(&key) {
                    Ok(item) => item,
                    Err(err) => {
                        let detail = format!("indexing raised {err} while tracing");
                        return self.subscript_failed(container, &v, &key, err, detail);
                    }
                };
                // Hashable keys other than ints and strs (dtype-keyed tables) are guarded too.
                let source = self
                    .source(container)
                    .map(|s| std::rc::Rc::new(Source::Item(s, ItemKey::of(&key))));
                self.wrap(&item, source)
            }
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::DictView { .. }
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
            | VarKind::NdArray(_)) => unsupported(
                BreakKind::UnsupportedOperation,
                format!("indexing {}", kind_name(other)),
            ),
        }
    }

    pub(super) fn op_store_subscr(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let index = self.pop(f)?;
        let container = self.pop(f)?;
        let value = self.pop(f)?;
        self.store_item(container, index, value)
    }

    /// `container[index] = value`.
    pub(super) fn store_item(
        &mut self,
        container: VarId,
        index: VarId,
        value: VarId,
    ) -> CResult<Flow> {
        if let VarKind::Const(key) = self.kind(index) {
            if let Ok(name) = key.bind(self.py).extract::<String>() {
                if self.model_output_store(container, &name, Some(value), true)? {
                    return Ok(Flow::Continue);
                }
            }
        }
        if self.has_python_method(container, "__setitem__")? {
            // A user class's own `__setitem__` (made here or existing): inlined, so what it
            // stores is traced like any other store.
            let method = self.get_attr(container, "__setitem__")?;
            self.call_function(method, vec![index, value], Vec::new())?;
            return Ok(Flow::Continue);
        }
        if self.deque_setitem(container, index, value)? {
            return Ok(Flow::Continue);
        }
        match self.kind(container) {
            VarKind::Unrealized(_) => super::lazy_inputs::unrealized_reached(),
            VarKind::Tensor { .. } => {
                let setitem = self.h.operator.getattr("setitem")?;
                self.graph_call(
                    Op::CallFunction(OwnedRef::from_bound(&setitem)),
                    "setitem",
                    vec![container, index, value],
                    Vec::new(),
                )?;
                Ok(Flow::Continue)
            }
            VarKind::NdArray(_) => {
                // `a[i] = v`: one node changing the array's tensor (see `ops_numpy`).
                let setitem = self.h.operator.getattr("setitem")?;
                self.numpy_operator(&setitem, &[container, index, value])?;
                Ok(Flow::Continue)
            }
            VarKind::Dict(_) if self.changeable_container(container) => {
                let key = self.key_value(index)?;
                self.check_hashable(&key)?;
                self.may_change_container(container, "item assignment")?;
                let py = self.py;
                if let VarKind::Dict(entries) = &mut self.vars[container.0 as usize].kind {
                    super::vars::dict_set(py, entries, OwnedRef::from_bound(&key), value);
                }
                Ok(Flow::Continue)
            }
            VarKind::List(items)
                if self.changeable_container(container)
                    && matches!(self.kind(index), VarKind::Const(k)
                        if k.bind(self.py).is_instance_of::<pyo3::types::PySlice>()) =>
            {
                // `items[a:b] = values`: Python's own slice assignment on the positions
                // decides where the new items go (steps, negative bounds) and what it raises;
                // positions n.. stand for the new items.
                let py = self.py;
                let n = items.len();
                let key = self.python_value(index)?;
                let new_items = self.items_of(value)?;
                let positions = pyo3::types::PyList::new(py, 0..n)?;
                let replacement = pyo3::types::PyList::new(py, n..n + new_items.len())?;
                if let Err(err) = positions.as_any().set_item(&key, replacement) {
                    return self.raised(err, "slice assignment on a list raised while tracing");
                }
                let order: Vec<usize> = positions.extract()?;
                self.may_change_container(container, "item assignment")?;
                if let VarKind::List(items) = &mut self.vars[container.0 as usize].kind {
                    let old = std::mem::take(items);
                    *items = order
                        .into_iter()
                        .map(|i| if i < n { old[i] } else { new_items[i - n] })
                        .collect();
                }
                Ok(Flow::Continue)
            }
            VarKind::List(items) if self.changeable_container(container) => {
                let i: i64 = self.python_value(index)?.extract()?;
                let n = items.len() as i64;
                let at = if i < 0 { i + n } else { i };
                if at < 0 || at >= n {
                    let message = PyString::new(self.py, "list assignment index out of range");
                    return self.raise_builtin("IndexError", message.into_any());
                }
                self.may_change_container(container, "item assignment")?;
                if let VarKind::List(items) = &mut self.vars[container.0 as usize].kind {
                    items[at as usize] = value;
                }
                Ok(Flow::Continue)
            }
            other @ (VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
            | VarKind::Tuple(_)
            | VarKind::List(_)
            | VarKind::Dict(_)
            | VarKind::DictView { .. }
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
            | VarKind::StateContext(_)) => unsupported(
                BreakKind::UnreplayableSideEffect,
                format!(
                    "item assignment on {} (a side effect to replay)",
                    kind_name(other)
                ),
            ),
        }
    }

    /// `DELETE_SUBSCR`: `del container[index]` on a list or dict the trace may change (made
    /// here, or existing and replayed); an index or key that is not there raises as Python
    /// would (the length and keys are guarded).
    pub(super) fn op_delete_subscr(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let py = self.py;
        let index = self.pop(f)?;
        let container = self.pop(f)?;
        let tensor_key = matches!(self.kind(container), VarKind::Dict(_))
            && matches!(self.kind(index), VarKind::Tensor { .. });
        if !self.changeable_container(container) || (!tensor_key && self.contains_tensor(index)) {
            return unsupported(
                BreakKind::UnreplayableSideEffect,
                format!("del on an item of {}", kind_name(self.kind(container))),
            );
        }
        match self.kind(container) {
            VarKind::Dict(_) => {
                let key = self.key_value(index)?;
                self.check_hashable(&key)?;
                let VarKind::Dict(entries) = self.kind(container) else {
                    return unsupported(BreakKind::Internal, "internal: del on a dict");
                };
                let mut at = None;
                for (i, (k, _)) in entries.iter().enumerate() {
                    if k.bind(py).eq(&key)? {
                        at = Some(i);
                        break;
                    }
                }
                let Some(at) = at else {
                    return self.raise_key_error(key);
                };
                self.may_change_container(container, "del")?;
                self.note_dict_removal(container);
                if let VarKind::Dict(entries) = &mut self.vars[container.0 as usize].kind {
                    entries.remove(at);
                }
                Ok(Flow::Continue)
            }
            VarKind::List(items) => {
                // Python's own `del` on the positions decides which items go (ints, slices
                // with steps, negative indices) and what it raises.
                let n = items.len();
                let key = self.python_value(index)?;
                let positions = pyo3::types::PyList::new(py, 0..n)?;
                if let Err(err) = positions.as_any().del_item(&key) {
                    return self.raised(err, "del on a list item raised while tracing");
                }
                let kept: Vec<usize> = positions.extract()?;
                self.may_change_container(container, "del")?;
                if let VarKind::List(items) = &mut self.vars[container.0 as usize].kind {
                    *items = kept.into_iter().map(|i| items[i]).collect();
                }
                Ok(Flow::Continue)
            }
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
            | VarKind::Tuple(_)
            | VarKind::DictView { .. }
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
            | VarKind::NdArray(_)) => unsupported(
                BreakKind::UnreplayableSideEffect,
                format!("del on an item of {}", kind_name(other)),
            ),
        }
    }
}
