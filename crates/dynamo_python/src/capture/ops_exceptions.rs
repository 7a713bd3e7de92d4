//! Exceptions raised and caught inside inlined code: `try: return table[key] except
//! KeyError: return default` (`Mapping.get`), `raise` inside a helper whose caller catches.
//!
//! An exception counts as raised by the traced code only where the trace knows it would be
//! raised on every call the guards admit: a trace-time evaluation on constants, a lookup in a
//! container whose keys or length are guarded (the missing key is guarded to stay missing),
//! a `raise` statement. Such sites record the exception (`Tracer::raised`); `run` then hands
//! it to the handler of the instruction that failed, as CPython's exception table says:
//! the stack unwound to the handler's depth, the exception pushed, the handler traced like
//! any code. The compiled frame's own handlers are left to the graph-break machinery (what
//! raises there runs for real). Any other failure keeps breaking the graph.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, CaptureError, Flow, FrameState, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use dynamo_bytecode::{ExceptionHandler, Instruction, Opcode};

/// Whether `handler` is the cleanup of an `except` block — restoring the exception state,
/// unbinding `as name`, re-raising — which changes nothing a graph could observe: code in
/// the block is not "inside a try" for the graph's purposes.
pub fn is_except_cleanup(f: &FrameState<'_>, handler: ExceptionHandler) -> bool {
    for ins in &f.instructions[handler.target.index()..] {
        match ins.opcode {
            Opcode::Reraise => return true,
            Opcode::Copy
            | Opcode::PopExcept
            | Opcode::LoadConst
            | Opcode::StoreFast
            | Opcode::DeleteFast
            | Opcode::Nop => {}
            _ => return false,
        }
    }
    false
}

impl<'py> Tracer<'py> {
    /// Fails the current instruction with `err`, which the traced code's own handlers may
    /// catch (see the module doc for when a site may call this).
    pub fn raised<T>(&mut self, err: PyErr, detail: impl Into<String>) -> CResult<T> {
        self.raised = Some(OwnedRef::from_bound(err.value(self.py).as_any()));
        unsupported(BreakKind::ExceptionWhileTracing, detail)
    }

    /// `raised` with a new builtin exception (`IndexError`, `KeyError`, ...).
    pub fn raise_builtin<T>(&mut self, class: &str, argument: Bound<'py, PyAny>) -> CResult<T> {
        let exception = self.h.builtins.getattr(class)?.call1((&argument,))?;
        let detail = format!("{class}: {argument} while tracing");
        self.raised(PyErr::from_value(exception), detail)
    }

    /// `result` of work begun with `locations` frames on the location stack: None when it
    /// failed with an exception of builtin class `class` that the traced code raised, caught
    /// here (the frames it came through left, as `catch` does); any other failure as is.
    pub fn catch_builtin<T>(
        &mut self,
        result: CResult<T>,
        class: &str,
        locations: usize,
    ) -> CResult<Option<T>> {
        let err = match result {
            Ok(value) => return Ok(Some(value)),
            Err(err) => err,
        };
        let class = self.h.builtins.getattr(class)?;
        let caught = matches!(&err, CaptureError::Unsupported(r)
            if r.kind == BreakKind::ExceptionWhileTracing)
            && self
                .raised
                .as_ref()
                .is_some_and(|e| e.bind(self.py).is_instance(&class).unwrap_or(false));
        if !caught {
            return Err(err);
        }
        self.raised = None;
        self.location_stack.truncate(locations);
        self.unwound.retain(|u| u.depth < locations);
        Ok(None)
    }

    /// `value[key]` of a real object raised `err`: raised by the traced code when it would
    /// raise on every call — a constant, or a plain dict read from a source whose missing
    /// key is then guarded to stay missing.
    pub fn subscript_failed<T>(
        &mut self,
        container: VarId,
        value: &Bound<'py, PyAny>,
        key: &Bound<'py, PyAny>,
        err: PyErr,
        detail: String,
    ) -> CResult<T> {
        if matches!(self.kind(container), VarKind::Const(_)) {
            return self.raised(err, detail);
        }
        let key_error = err.is_instance_of::<pyo3::exceptions::PyKeyError>(self.py);
        if let (Some(source), true) = (self.source(container), key_error) {
            if value.is_exact_instance_of::<pyo3::types::PyDict>() && self.h.is_constant(key)? {
                self.guards.add(
                    source,
                    super::guards::GuardKind::Contains(OwnedRef::from_bound(key), false),
                );
                return self.raised(err, detail);
            }
        }
        unsupported(BreakKind::ExceptionWhileTracing, detail)
    }

    /// `obj.name` of a real object raised `err`: raised by the traced code for a constant,
    /// and for an object read from a source when it is an `AttributeError` (the attribute is
    /// then guarded to stay missing).
    pub fn getattr_failed<T>(
        &mut self,
        obj: VarId,
        name: &str,
        err: PyErr,
        detail: String,
    ) -> CResult<T> {
        if matches!(self.kind(obj), VarKind::Const(_)) {
            return self.raised(err, detail);
        }
        let attribute_error = err.is_instance_of::<pyo3::exceptions::PyAttributeError>(self.py);
        if let (Some(source), true) = (self.source(obj), attribute_error) {
            self.guards.add(
                source,
                super::guards::GuardKind::HasAttr(name.to_string(), false),
            );
            return self.raised(err, detail);
        }
        unsupported(BreakKind::ExceptionWhileTracing, detail)
    }

    /// Calling an exception class with constants: the exception, made now (`raise E(...)`).
    pub fn construct_exception(
        &mut self,
        class: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let Ok(class) = class.cast::<pyo3::types::PyType>() else {
            return Ok(None);
        };
        let base = self.h.builtins.getattr("BaseException")?;
        if !class.is_subclass(&base)? || !self.all_constant(args, kwargs) {
            return Ok(None);
        }
        let positional = self.python_args(args)?;
        let keywords = self.python_kwargs(kwargs)?;
        let exception = class.call(positional, Some(&keywords))?;
        Ok(Some(self.add(
            VarKind::Object(OwnedRef::from_bound(&exception)),
            None,
        )))
    }

    /// Whether every one of `args` is a constant (guarded by value): a trace-time call on them
    /// raises on every call.
    pub fn all_constant(&self, args: &[VarId], kwargs: &[(String, VarId)]) -> bool {
        args.iter()
            .chain(kwargs.iter().map(|(_, v)| v))
            .all(|&a| matches!(self.kind(a), VarKind::Const(_)))
    }

    /// The message of the `AttributeError` Python raises for `attr` missing from `id`:
    /// `module 'm' has no attribute 'a'`, `type object 'C' has ...`, `'C' object has ...`.
    pub fn missing_attribute_message(&self, id: VarId, attr: &str) -> CResult<String> {
        let py = self.py;
        let name_of = |cls: &Bound<'py, PyAny>| -> CResult<String> {
            Ok(cls.getattr("__name__")?.extract::<String>()?)
        };
        let class = match self.kind(id) {
            VarKind::Const(v) | VarKind::Object(v) => {
                let value = v.bind(py);
                if value.is_instance_of::<pyo3::types::PyModule>() {
                    let module = name_of(&value)?;
                    return Ok(format!("module '{module}' has no attribute '{attr}'"));
                }
                if value.is_instance_of::<pyo3::types::PyType>() {
                    let class = name_of(&value)?;
                    return Ok(format!("type object '{class}' has no attribute '{attr}'"));
                }
                name_of(value.get_type().as_any())?
            }
            VarKind::Instance { cls, .. } => name_of(&cls.bind(py).clone())?,
            VarKind::Tuple(_) | VarKind::List(_) => name_of(&self.class_of_sequence(id))?,
            VarKind::Function(_) => "function".to_owned(),
            _ => "Tensor".to_owned(),
        };
        Ok(format!("'{class}' object has no attribute '{attr}'"))
    }

    /// Whether every argument is a constant or a list or tuple of them, nested: values
    /// whose builtins (`max`, `sorted`, `int`, ...) run no user code, so an exception they
    /// raise is the one the program raises, and the trace may raise it too.
    pub fn all_plain_values(&self, args: &[VarId], kwargs: &[(String, VarId)]) -> bool {
        args.iter()
            .chain(kwargs.iter().map(|(_, v)| v))
            .all(|&a| self.is_plain_value_tree(a))
    }

    fn is_plain_value_tree(&self, id: VarId) -> bool {
        match self.kind(id) {
            VarKind::Const(_) => true,
            VarKind::Tuple(items) | VarKind::List(items) => {
                items.iter().all(|&i| self.is_plain_value_tree(i))
            }
            _ => false,
        }
    }

    /// Whether `id` is a constant or a tuple of them, nested: a value that cannot change
    /// after it is handed to a call (a list could be changed later through the trace).
    pub fn is_constant_tuple_tree(&self, id: VarId) -> bool {
        match self.kind(id) {
            VarKind::Const(_) => true,
            VarKind::Tuple(items) => items.iter().all(|&i| self.is_constant_tuple_tree(i)),
            _ => false,
        }
    }

    /// After `ins` of `f` failed with `err`: when an exception the traced code raised is
    /// covered by a handler of this (inlined) frame, unwinds to it and returns true.
    pub(super) fn catch(
        &mut self,
        f: &mut FrameState<'py>,
        ins: &Instruction,
        err: &CaptureError,
        locations: usize,
    ) -> CResult<bool> {
        let CaptureError::Unsupported(reason) = err else {
            return Ok(false);
        };
        if reason.kind != BreakKind::ExceptionWhileTracing {
            self.raised = None;
            return Ok(false);
        }
        let Some(handler) = ins.handler else {
            // Not here: the caller's call instruction may have a handler.
            return Ok(false);
        };
        let Some(exception) = self.raised.take() else {
            return Ok(false);
        };
        f.stack.truncate(handler.depth as usize);
        if handler.lasti {
            // Only `RERAISE` reads it (to set `f_lasti`); the trace never does.
            let lasti = self.constant(&0i64.into_pyobject(self.py)?.into_any());
            f.stack.push(lasti);
        }
        let exception = self.add(VarKind::Object(exception), None);
        f.stack.push(exception);
        self.caught_in_root |= f.is_root;
        f.pc = handler.target.index();
        // The frames the exception came through were left without popping their place.
        self.location_stack.truncate(locations);
        self.unwound.retain(|u| u.depth < locations);
        Ok(true)
    }

    /// Whether the handler opcodes of `f` are traced: in inlined code always, in the compiled
    /// frame once the trace entered one of its handlers (a resume function that starts in
    /// a handler is the graph-break machinery's).
    pub(super) fn tracing_handler(&self, f: &FrameState<'py>) -> bool {
        !f.is_root || self.caught_in_root
    }

    /// `PUSH_EXC_INFO`: the exception being handled goes below the new one. Traced code
    /// does not read it (`sys.exc_info()` is not evaluated), so it is None.
    pub(super) fn op_push_exc_info(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let exception = self.pop(f)?;
        let previous = self.constant(&self.py.None().into_bound(self.py));
        f.stack.push(previous);
        f.stack.push(exception);
        f.handled.push(exception);
        self.handled_exceptions.push(exception);
        Ok(Flow::Continue)
    }

    /// `sys.exc_info()` inside an `except` block the trace entered: the exception being
    /// handled, its class and traceback. Outside one the answer is a caller's (the frame may
    /// be called from a handler the trace never saw): None then, and the call breaks.
    pub(super) fn exc_info(&mut self) -> CResult<Option<VarId>> {
        let Some(&exception) = self.handled_exceptions.last() else {
            return Ok(None);
        };
        let value = self.python_value(exception)?;
        let class = self.constant(&value.get_type().into_any());
        let traceback = value.getattr("__traceback__")?;
        let traceback = self.add(VarKind::Object(OwnedRef::from_bound(&traceback)), None);
        Ok(Some(self.add(
            VarKind::Tuple(vec![class, exception, traceback]),
            None,
        )))
    }

    /// `CHECK_EXC_MATCH`: `isinstance(exception, classes)`, the exception kept.
    pub(super) fn op_check_exc_match(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let classes = self.pop(f)?;
        let exception = *f.stack.last().ok_or_else(|| {
            CaptureError::Unsupported(super::break_reasons::Break::new(
                BreakKind::Internal,
                "CHECK_EXC_MATCH on an empty stack",
            ))
        })?;
        let classes = self.python_value(classes)?;
        let exception = self.python_value(exception)?;
        let matches = self
            .h
            .builtins
            .getattr("isinstance")?
            .call1((exception, classes))?;
        let matches = self.constant(&matches);
        f.stack.push(matches);
        Ok(Flow::Continue)
    }

    /// `WITH_EXCEPT_START`: an exception raised while tracing a `with` block reaches its
    /// cleanup; the bound `__exit__` below it (an entered user context manager's, traced as
    /// any call; a grad-mode or autocast block's, which puts the mode back and answers None)
    /// is called with `(type, exception, traceback)` and its answer pushed: true swallows the
    /// exception (`contextlib.suppress`), false raises it again.
    pub(super) fn op_with_except_start(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let n = f.stack.len();
        let exit_kind_known = n >= 4
            && (self.with_exits.contains(&f.stack[n - 4])
                || matches!(
                    self.kind(f.stack[n - 4]),
                    VarKind::GradModeExit { .. }
                        | VarKind::StateContext(super::vars::StateContextVar::Exit { .. })
                ));
        if !exit_kind_known {
            return unsupported(
                BreakKind::UnsupportedInstruction,
                "the WITH_EXCEPT_START instruction (an exception leaving a with block that is not a traced context manager)",
            );
        }
        let (exit, exception) = (f.stack[n - 4], f.stack[n - 1]);
        let value = self.python_value(exception)?;
        let class = self.constant(&value.get_type().into_any());
        let traceback = value.getattr("__traceback__")?;
        let traceback = self.add(VarKind::Object(OwnedRef::from_bound(&traceback)), None);
        let answer = self.call_function(exit, vec![class, exception, traceback], Vec::new())?;
        f.stack.push(answer);
        Ok(Flow::Continue)
    }

    /// `RERAISE`: the exception on top raised again.
    pub(super) fn op_reraise(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let exception = self.pop(f)?;
        let exception = self.python_value(exception)?;
        self.raised(
            PyErr::from_value(exception),
            "an exception re-raised while tracing",
        )
    }

    /// Whether an exception raised by the instruction just stepped in `f` reaches a handler
    /// of `f`'s own `try` statements or a traced context manager's `__exit__`: directly, or
    /// through the cleanups of the `except` blocks it is raised in (each ends in a `RERAISE`
    /// whose handler is the next one out) — `raise ValueError(...) from e` inside an
    /// `except` block of an outer `try`.
    fn caught_in_frame(&self, f: &FrameState<'py>) -> bool {
        let Some(ins) = f.pc.checked_sub(1).and_then(|i| f.instructions.get(i)) else {
            return false;
        };
        let mut handler = ins.handler;
        // Each step moves one `except` block out; nesting is shallow.
        for _ in 0..32 {
            let Some(h) = handler else {
                return false;
            };
            if self.is_grad_mode_cleanup(f, h) {
                // A traced context manager's `__exit__` sees it (and may swallow it:
                // `contextlib.suppress`, a `contextmanager` catching it). A grad-mode or
                // autocast block's cleanup puts its mode back and raises it again, on to the
                // next handler out: caught if that one is.
                let exit = (h.depth as usize)
                    .checked_sub(1)
                    .and_then(|d| f.stack.get(d));
                if exit.is_some_and(|e| self.with_exits.contains(e)) {
                    return true;
                }
            } else if !is_except_cleanup(f, h) {
                return true;
            }
            handler = f.instructions[h.target.index()..]
                .iter()
                .find(|i| i.opcode == Opcode::Reraise)
                .and_then(|i| i.handler);
        }
        false
    }

    /// `RAISE_VARARGS` in inlined code, or in a `try` block of the compiled frame (or an
    /// `except` block inside one): `raise E`, `raise E(...)`, `raise E from cause`.
    /// A bare `raise` (the exception being handled) is not traced.
    pub(super) fn op_raise(&mut self, f: &mut FrameState<'py>, argc: u32) -> CResult<Flow> {
        // In the compiled frame itself only inside a `try` whose handler the trace follows
        // (`catch`); a raise that would leave the frame is a graph break.
        if f.is_root && !self.in_try && !self.caught_in_frame(f) {
            return unsupported(
                BreakKind::UnsupportedInstruction,
                "the RAISE_VARARGS instruction",
            );
        }
        if argc == 0 {
            // A bare `raise` in an `except` block of this frame: that exception again (as
            // it is, traceback and all). Outside one, the exception being handled is a
            // caller's, which the trace does not follow.
            let Some(&handled) = f.handled.last() else {
                return unsupported(
                    BreakKind::UnsupportedInstruction,
                    "a bare raise outside an except block of the same function",
                );
            };
            let exception = self.python_value(handled)?;
            let detail = format!(
                "{} raised again while tracing",
                exception.get_type().name()?
            );
            return self.raised(PyErr::from_value(exception), detail);
        }
        let cause = if argc == 2 { Some(self.pop(f)?) } else { None };
        let raised = self.pop(f)?;
        let raised = self.python_value(raised)?;
        let base = self.h.builtins.getattr("BaseException")?;
        let is_class = match raised.cast::<pyo3::types::PyType>() {
            Ok(class) => class.is_subclass(&base)?,
            Err(_) => false,
        };
        let exception = if is_class {
            raised.call0()?
        } else if raised.is_instance(&base)? {
            raised
        } else {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                "raising something that is not an exception",
            );
        };
        // Python chains the exception being handled (`__context__`), and `from` sets the
        // cause and hides that context in tracebacks.
        if let Some(&handled) = f.handled.last() {
            let context = self.python_value(handled)?;
            if !context.is(&exception) {
                exception.setattr("__context__", context)?;
            }
        }
        if let Some(cause) = cause {
            let cause = self.python_value(cause)?;
            exception.setattr("__cause__", cause)?;
        }
        let detail = format!("{} raised while tracing", exception.get_type().name()?);
        self.raised(PyErr::from_value(exception), detail)
    }
}
