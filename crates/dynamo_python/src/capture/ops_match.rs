//! `match` statements: `GET_LEN`, `MATCH_SEQUENCE`, `MATCH_MAPPING`, `MATCH_KEYS` on what the
//! trace holds. Each answers from the subject's kind (a tuple or list tracker is a sequence, a
//! dict tracker a mapping) or, for constants and objects, from the type's flags as CPython
//! does; the answers are constants, so the branches the compiler made are followed as any
//! constant branch. `MATCH_CLASS` asks `isinstance` and reads the attributes as the traced
//! code would.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::translator::{kind_name, unsupported, CResult, Flow, FrameState, Tracer};
use super::vars::{VarId, VarKind};

/// `Py_TPFLAGS_SEQUENCE` and `Py_TPFLAGS_MAPPING`: what `match` tests on a type.
const TPFLAGS_SEQUENCE: u64 = 1 << 5;
const TPFLAGS_MAPPING: u64 = 1 << 6;

impl<'py> Tracer<'py> {
    fn subject(&self, f: &FrameState<'py>) -> CResult<VarId> {
        match f.stack.last() {
            Some(&id) => Ok(id),
            None => unsupported(BreakKind::Internal, "a match instruction on an empty stack"),
        }
    }

    fn push_bool(&mut self, f: &mut FrameState<'py>, value: bool) -> CResult<Flow> {
        let value = value.into_pyobject(self.py)?.to_owned().into_any();
        let id = self.constant(&value);
        f.stack.push(id);
        Ok(Flow::Continue)
    }

    /// Whether the subject's type carries `flag`, for trackers with a real value.
    fn type_flag(&self, id: VarId, flag: u64) -> CResult<Option<bool>> {
        let py = self.py;
        Ok(match self.kind(id) {
            VarKind::Const(v) | VarKind::Object(v) => {
                let flags: u64 = v.bind(py).get_type().getattr("__flags__")?.extract()?;
                Some(flags & flag != 0)
            }
            _ => None,
        })
    }

    /// `GET_LEN`: `len(subject)` pushed above it.
    pub(super) fn op_get_len(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let subject = self.subject(f)?;
        let n = match self.kind(subject) {
            VarKind::Tuple(items) | VarKind::List(items) => items.len(),
            VarKind::Dict(entries) => entries.len(),
            VarKind::Const(v) => v.bind(self.py).len()?,
            other @ (VarKind::Tensor { .. }
            | VarKind::Unrealized(_)
            | VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Object(_)
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
                    format!("len() of {} in a match statement", kind_name(other)),
                )
            }
        };
        let n = self.constant(&n.into_pyobject(self.py)?.into_any());
        f.stack.push(n);
        Ok(Flow::Continue)
    }

    /// `MATCH_SEQUENCE`: whether the subject is a sequence (not str, bytes or bytearray).
    pub(super) fn op_match_sequence(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        self.match_kind(f, TPFLAGS_SEQUENCE, "a sequence")
    }

    /// `MATCH_MAPPING`: whether the subject is a mapping.
    pub(super) fn op_match_mapping(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        self.match_kind(f, TPFLAGS_MAPPING, "a mapping")
    }

    /// Whether the subject is a sequence or a mapping (`flag`): tuple and list trackers are
    /// sequences, dict trackers mappings, tensors and symbolic sizes neither; constants and
    /// objects answer by their type's flags.
    fn match_kind(&mut self, f: &mut FrameState<'py>, flag: u64, what: &str) -> CResult<Flow> {
        let subject = self.subject(f)?;
        let answer = match self.kind(subject) {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::Tuple(_) | VarKind::List(_) => flag == TPFLAGS_SEQUENCE,
            VarKind::Dict(_) => flag == TPFLAGS_MAPPING,
            VarKind::Tensor { .. } | VarKind::Symbolic { .. } => false,
            VarKind::Slice(_)
            | VarKind::Const(_)
            | VarKind::Object(_)
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
            | VarKind::NdArray(_) => match self.type_flag(subject, flag)? {
                Some(answer) => answer,
                None => {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("matching {} as {what}", kind_name(self.kind(subject))),
                    )
                }
            },
        };
        self.push_bool(f, answer)
    }

    /// `MATCH_KEYS`: with the keys (a constant tuple) on top and the mapping below, pushes a
    /// tuple of their values, or None if a key is missing. Only dicts the trace holds.
    pub(super) fn op_match_keys(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let py = self.py;
        let n = f.stack.len();
        if n < 2 {
            return unsupported(BreakKind::Internal, "MATCH_KEYS on a short stack");
        }
        let (subject, keys) = (f.stack[n - 2], f.stack[n - 1]);
        let VarKind::Dict(entries) = self.kind(subject) else {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("matching keys of {}", kind_name(self.kind(subject))),
            );
        };
        let entries = entries.clone();
        let keys = self.python_value(keys)?;
        let mut values = Vec::new();
        for key in keys.try_iter()? {
            let key = key?;
            let mut found = None;
            for (k, v) in &entries {
                if k.bind(py).eq(&key)? {
                    found = Some(*v);
                    break;
                }
            }
            match found {
                Some(v) => values.push(v),
                None => {
                    let none = self.constant(&py.None().into_bound(py));
                    f.stack.push(none);
                    return Ok(Flow::Continue);
                }
            }
        }
        let tuple = self.add(VarKind::Tuple(values), None);
        f.stack.push(tuple);
        Ok(Flow::Continue)
    }

    /// `MATCH_CLASS(count)`: with the keyword names on top, the class and the subject below,
    /// pushes the tuple of the subject's matched attributes (`__match_args__[:count]`, then
    /// the names) if it is an instance of the class, else None. `isinstance` and the
    /// attribute reads are traced as the same calls in the code would be (and guarded so).
    pub(super) fn op_match_class(&mut self, f: &mut FrameState<'py>, count: u32) -> CResult<Flow> {
        let py = self.py;
        let names = self.pop(f)?;
        let cls = self.pop(f)?;
        let subject = self.pop(f)?;
        let isinstance = self.h.builtins.getattr("isinstance")?;
        let answer = self.call_builtin(&isinstance, vec![subject, cls], Vec::new())?;
        if !self.truth(answer)? {
            let none = self.constant(&py.None().into_bound(py));
            f.stack.push(none);
            return Ok(Flow::Continue);
        }
        let class = self.python_value(cls)?;
        let mut attributes: Vec<String> = Vec::new();
        if count > 0 {
            let Ok(match_args) = class.getattr("__match_args__") else {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "a positional class pattern on a class without __match_args__",
                );
            };
            let match_args: Vec<String> = match_args.extract()?;
            if (count as usize) > match_args.len() {
                return unsupported(
                    BreakKind::ExceptionWhileTracing,
                    "more positional sub-patterns than __match_args__ names",
                );
            }
            attributes.extend(match_args.into_iter().take(count as usize));
        }
        let names: Vec<String> = self.python_value(names)?.extract()?;
        attributes.extend(names);
        let mut values = Vec::with_capacity(attributes.len());
        for name in &attributes {
            values.push(self.get_attr(subject, name)?);
        }
        let tuple = self.add(VarKind::Tuple(values), None);
        f.stack.push(tuple);
        Ok(Flow::Continue)
    }
}
