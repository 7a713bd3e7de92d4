//! Generators in traced code.
//!
//! A generator function called in the trace (`self.children()`, a user generator, the
//! function under `contextlib.contextmanager`) makes a `VarKind::Generator`: its frame runs
//! only as items are asked for — `next()`, a `for` loop, `yield from`, `send` — and stays
//! suspended at its `yield` in between, as in Python, so its body and its consumer
//! interleave in their real order.
//!
//! A consumer that takes every item at once (`list(gen)`, `zip`, `sum`) runs it to the end
//! there; as for generator expressions (which always run ahead when made), that is only
//! what Python does when the two do not interleave observably: the body must change nothing
//! while it runs ahead (no container, attribute, global, cell or set written, no tensor
//! changed in place — counted by `Tracer::effects`), else the graph breaks. A trace that
//! stops at a graph break runs every generator ahead when it is made, so that what is live
//! at the break is an iterator the generated code can rebuild.

use pyo3::prelude::*;

use super::break_reasons::{Break, BreakKind};
use super::frame_state::FrameState;
use super::translator::{unsupported, CResult, CaptureError, Flow, Tracer};
use super::vars::{LazyIter, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;
use dynamo_bytecode::Instruction;

/// Items a generator may yield before the trace gives up on running it ahead (an endless
/// generator would never finish).
pub const MAX_YIELDS: usize = 10_000;

/// The methods of a generator the trace models (`throw` is not: the trace would have to
/// raise inside the generator's frame).
pub const GENERATOR_METHODS: [&str; 4] = ["send", "__next__", "close", "throw"];

/// The frame of a generator the trace made.
#[derive(Debug)]
pub enum GeneratorFrame<'py> {
    /// Not running: at its start, or suspended at a `yield`.
    Suspended(Box<FrameState<'py>>),
    /// Being resumed (resuming it again from inside is Python's ValueError).
    Running,
    /// Returned or raised: it yields nothing more.
    Finished,
}

/// What resuming a generator gave.
#[derive(Debug)]
pub enum Resumed {
    Yielded(VarId),
    /// It returned this value (`StopIteration.value`, the value of `yield from`).
    Returned(VarId),
}

impl<'py> Tracer<'py> {
    /// A generator over the frame `state` (its arguments bound), not started — or, in a
    /// trace that stops at a graph break, run ahead now (see the module doc): what is live
    /// at the break must be rebuilt by the generated code, which can make an iterator over
    /// known items but not a generator suspended mid-way.
    pub(super) fn new_generator(&mut self, mut state: FrameState<'py>) -> CResult<VarId> {
        if self.stop_at.is_some() {
            let iterator = self.run_ahead(state, "a generator")?;
            self.generators_run_ahead.insert(iterator);
            return Ok(iterator);
        }
        state.suspends = true;
        let frame = self.generators.len();
        self.generators
            .push(GeneratorFrame::Suspended(Box::new(state)));
        Ok(self.add(VarKind::Generator { frame }, None))
    }

    /// Runs the generator frame `state` to its end now, `what` it is for messages: an
    /// iterator over what it yielded — if that changes nothing and draws no random numbers.
    pub(super) fn run_ahead(&mut self, mut state: FrameState<'py>, what: &str) -> CResult<VarId> {
        state.yields = Some(Vec::new());
        self.without_effects(what, |t| {
            t.enter_depth()?;
            let result = t.run(&mut state);
            t.depth -= 1;
            result.map_err(|err| t.out_of_generator(err))
        })
    }

    /// `err`, raised out of a generator's frame, as its consumer sees it: a StopIteration
    /// the body raised becomes `RuntimeError("generator raised StopIteration")` caused by
    /// it (PEP 479; CPython converts it as the exception leaves the generator).
    fn out_of_generator(&mut self, err: CaptureError) -> CaptureError {
        let py = self.py;
        let stop_iteration = matches!(&err, CaptureError::Unsupported(r)
            if r.kind == BreakKind::ExceptionWhileTracing)
            && self.raised.as_ref().is_some_and(|e| {
                e.bind(py)
                    .is_instance_of::<pyo3::exceptions::PyStopIteration>()
            });
        if !stop_iteration {
            return err;
        }
        let converted = (|| -> PyResult<Bound<'py, PyAny>> {
            let cause = self.raised.as_ref().expect("checked").bind(py).clone();
            let runtime = self
                .h
                .builtins
                .getattr("RuntimeError")?
                .call1(("generator raised StopIteration",))?;
            runtime.setattr("__cause__", cause)?;
            Ok(runtime)
        })();
        match converted {
            Ok(runtime) => {
                self.raised = Some(OwnedRef::from_bound(&runtime));
                CaptureError::Unsupported(Break::new(
                    BreakKind::ExceptionWhileTracing,
                    "RuntimeError: generator raised StopIteration while tracing",
                ))
            }
            Err(py_err) => CaptureError::Python(py_err),
        }
    }

    /// Resumes generator `id`, `sent` being what its `yield` evaluates to (None for
    /// `next()`): runs its frame to the next `yield` or to its end.
    pub fn resume_generator(&mut self, id: VarId, sent: Option<VarId>) -> CResult<Resumed> {
        self.resume_generator_with(id, sent, None)
    }

    /// `resume_generator`, or with `thrown`: `gen.throw(exception)` — the exception raised
    /// at the `yield` the generator is suspended at, where its own handlers may catch it
    /// (`contextlib.contextmanager`'s `__exit__` throws the `with` block's exception into
    /// the generator); a generator not started yet is finished and raises it at once.
    fn resume_generator_with(
        &mut self,
        id: VarId,
        sent: Option<VarId>,
        thrown: Option<Bound<'py, PyAny>>,
    ) -> CResult<Resumed> {
        let py = self.py;
        let &VarKind::Generator { frame } = self.kind(id) else {
            return unsupported(BreakKind::Internal, "resuming something not a generator");
        };
        let none = self.constant(&py.None().into_bound(py));
        let taken = std::mem::replace(&mut self.generators[frame], GeneratorFrame::Running);
        let mut state = match taken {
            GeneratorFrame::Suspended(state) => state,
            GeneratorFrame::Finished => {
                self.generators[frame] = GeneratorFrame::Finished;
                return Ok(Resumed::Returned(none));
            }
            GeneratorFrame::Running => {
                let message = pyo3::types::PyString::new(py, "generator already executing");
                return self.raise_builtin("ValueError", message.into_any());
            }
        };
        let started = state.pc > 0;
        let thrown_in = thrown.is_some();
        if let Some(exception) = thrown {
            let detail = format!("{} thrown into a generator", exception.get_type().name()?);
            let raised = self.raised::<()>(PyErr::from_value(exception), detail);
            let err = raised.expect_err("raised always fails");
            let at_yield = state.pc.checked_sub(1).map(|i| state.instructions[i]);
            let caught = match at_yield {
                Some(ins) if started => {
                    let locations = self.location_stack.len();
                    self.catch(&mut state, &ins, &err, locations)?
                }
                _ => false,
            };
            if !caught {
                self.generators[frame] = GeneratorFrame::Finished;
                return Err(err);
            }
        }
        match sent {
            // What the `yield` it is suspended at evaluates to.
            // Thrown in: the handler runs instead of the `yield` evaluating to a value.
            _ if thrown_in => {}
            _ if started => state.stack.push(sent.unwrap_or(none)),
            Some(value) if !matches!(self.kind(value), VarKind::Const(v) if v.bind(py).is_none()) =>
            {
                self.generators[frame] = GeneratorFrame::Suspended(state);
                let message = pyo3::types::PyString::new(
                    py,
                    "can't send non-None value to a just-started generator",
                );
                return self.raise_builtin("TypeError", message.into_any());
            }
            _ => {}
        }
        // The consumer's instruction goes on after the generator's ran: as it was.
        let in_try = self.in_try;
        self.enter_depth()?;
        let result = self.run_frame(&mut state);
        self.depth -= 1;
        if result.is_ok() {
            self.in_try = in_try;
        }
        match result {
            Ok(Flow::Yield(item)) => {
                self.generators[frame] = GeneratorFrame::Suspended(state);
                Ok(Resumed::Yielded(item))
            }
            Ok(Flow::Return(value)) => {
                self.generators[frame] = GeneratorFrame::Finished;
                Ok(Resumed::Returned(value))
            }
            Ok(Flow::Continue) => unsupported(BreakKind::Internal, "a generator stopped early"),
            Err(err) => {
                // An exception out of a generator finishes it.
                self.generators[frame] = GeneratorFrame::Finished;
                Err(self.out_of_generator(err))
            }
        }
    }

    /// The exception `gen.throw(...)` raises: `throw(exception)`, `throw(cls)`,
    /// `throw(cls, value[, traceback])` (the forms contextlib's `__exit__` uses).
    fn thrown_exception(&mut self, args: &[VarId]) -> CResult<Bound<'py, PyAny>> {
        let first = self.python_value(args[0])?;
        let value = match args.get(1) {
            Some(&v) => Some(self.python_value(v)?),
            None => None,
        };
        let base = self.h.builtins.getattr("BaseException")?;
        if first.is_instance(&base)? {
            return Ok(first);
        }
        let is_class = first
            .cast::<pyo3::types::PyType>()
            .is_ok_and(|c| c.is_subclass(&base).unwrap_or(false));
        if !is_class {
            return unsupported(
                BreakKind::Generator,
                "throw() of something that is not an exception",
            );
        }
        match value {
            Some(v) if v.is_instance(&first)? => Ok(v),
            Some(v) if !v.is_none() => Ok(first.call1((v,))?),
            _ => Ok(first.call0()?),
        }
    }

    /// `next()` of a generator that returned `value`: StopIteration, raised by the traced
    /// code (its handlers may catch it, as `contextlib`'s `__exit__` does).
    pub(super) fn stop_iteration<T>(&mut self, value: VarId) -> CResult<T> {
        let VarKind::Const(value) = self.kind(value) else {
            return unsupported(
                BreakKind::Generator,
                "StopIteration carrying a value computed while tracing",
            );
        };
        let value = value.bind(self.py).clone();
        self.raise_builtin("StopIteration", value)
    }

    /// `gen.send(value)`, `gen.__next__()`, `gen.throw(...)`, `gen.close()` (see
    /// `GENERATOR_METHODS`).
    pub(super) fn generator_method(
        &mut self,
        generator: VarId,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        let py = self.py;
        let resumed = match (name, args) {
            ("send", &[value]) if kwargs.is_empty() => {
                self.resume_generator(generator, Some(value))?
            }
            ("__next__", []) if kwargs.is_empty() => self.resume_generator(generator, None)?,
            ("throw", [_, ..]) if kwargs.is_empty() && args.len() <= 3 => {
                let exception = self.thrown_exception(args)?;
                self.resume_generator_with(generator, None, Some(exception))?
            }
            ("close", []) if kwargs.is_empty() => {
                let &VarKind::Generator { frame } = self.kind(generator) else {
                    unreachable!("checked by the caller");
                };
                // Closing raises GeneratorExit at its `yield`: nothing runs unless that is
                // inside a try or with block of the generator (refused: not modelled).
                if let GeneratorFrame::Suspended(state) = &self.generators[frame] {
                    if state.pc > 0 && state.instructions[state.pc - 1].handler.is_some() {
                        return unsupported(
                            BreakKind::Generator,
                            "close() of a generator suspended inside a try or with block",
                        );
                    }
                }
                self.generators[frame] = GeneratorFrame::Finished;
                return Ok(self.constant(&py.None().into_bound(py)));
            }
            _ => {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    format!("the generator method {name}() with these arguments"),
                )
            }
        };
        match resumed {
            Resumed::Yielded(item) => Ok(item),
            Resumed::Returned(value) => self.stop_iteration(value),
        }
    }

    /// Generators and lazy iterators (`ops_lazy_iter`) among the arguments of `callee`, a
    /// callable evaluated now rather than inlined (a builtin, `list`, a class): run to the end
    /// first, each becoming an iterator over the items it had left. `next` and `iter` take
    /// them lazily instead.
    pub(super) fn settle_generators(
        &mut self,
        callee: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<()> {
        let builtins = &self.h.builtins;
        // `next` and `iter` advance them lazily; `type`, `isinstance`, `id`, ... ask what the
        // generator is, not what it yields.
        let leaves = [
            "next",
            "iter",
            "type",
            "isinstance",
            "issubclass",
            "id",
            "callable",
        ];
        if leaves
            .iter()
            .any(|n| builtins.getattr(*n).is_ok_and(|b| b.is(callee)))
        {
            return Ok(());
        }
        // `islice(count(), n)`: the model of `islice` pulls the items it takes from the
        // endless iterators, which make them without running anything.
        let islice = self.py.import_module("itertools")?.getattr("islice")?;
        if callee.is(&islice)
            && args.first().is_some_and(|&a| {
                matches!(
                    self.kind(a),
                    VarKind::Lazy(LazyIter::Count { .. } | LazyIter::Repeat { .. })
                )
            })
        {
            return Ok(());
        }
        // `list(gen)`, `tuple(gen)`, `sorted(gen)`, `sep.join(gen)` take every item before
        // doing anything else: running it to the end first is Python's own order, whatever its body does.
        let is = |name: &str| builtins.getattr(name).is_ok_and(|b| b.is(callee));
        let collector = ["list", "tuple", "sorted"].iter().any(|name| is(name))
            || super::builtins::joins_an_iterable(callee)?;
        // `sum(gen)`, `max(gen)`, `min(gen)` take every item too, combining each with the
        // ones before as it comes: the same as taking them all first, unless the generator
        // changes a tensor in place that an earlier item is (checked below).
        let accumulator = kwargs.is_empty()
            && ((is("sum") && args.len() <= 2) || ((is("max") || is("min")) && args.len() == 1));
        let lazy = args.iter().chain(kwargs.iter().map(|(_, v)| v));
        let in_order =
            (collector || accumulator) && lazy.filter(|&&a| self.is_lazy_iterator(a)).count() == 1;
        for &arg in args.iter().chain(kwargs.iter().map(|(_, v)| v)) {
            if self.is_lazy_iterator(arg) {
                let items = if in_order {
                    let nodes = self.graph.nodes.len();
                    let items = self.take_all(arg)?;
                    if accumulator
                        && self.graph.nodes[nodes..]
                            .iter()
                            .any(|node| super::node_calls_in_place(self.py, node))
                    {
                        return unsupported(
                            BreakKind::Generator,
                            "sum(), max() or min() of a generator that changes a tensor in place \
                             (the items taken before the change would see it)",
                        );
                    }
                    items
                } else {
                    self.items_of(arg)?
                };
                self.vars[arg.0 as usize].kind = VarKind::Iter {
                    items,
                    next: 0,
                    watched: Vec::new(),
                    handed_on: false,
                    exhausted: false,
                };
            }
        }
        Ok(())
    }

    /// Whether a generator the trace made is suspended inside a `try` or `with` block of its
    /// own: dropping it would run that block's cleanup (Python closes it), which the trace
    /// did not.
    pub fn generator_left_in_try(&self) -> bool {
        self.generators.iter().any(|g| match g {
            GeneratorFrame::Suspended(state) => {
                state.pc > 0 && state.instructions[state.pc - 1].handler.is_some()
            }
            _ => false,
        })
    }

    /// Counts a change to Python state; `target` is the tracker changed, if any (one made
    /// inside the generator being run ahead does not count, unless it stands for an object
    /// that existed before: a global list first read there is still the caller's).
    pub fn note_effect(&mut self, target: Option<VarId>) {
        let private = target.is_some_and(|t| {
            t.0 >= self.effects_floor && self.source(t).is_none() && !self.is_existing_container(t)
        });
        if !private {
            self.effects += 1;
        }
    }

    /// `GET_YIELD_FROM_ITER` in a generator run ahead: an iterator over the operand.
    pub(super) fn op_get_yield_from_iter(&mut self, f: &mut FrameState<'py>) -> CResult<Flow> {
        let iterable = self.pop(f)?;
        let iterator = if matches!(
            self.kind(iterable),
            VarKind::Iter { .. } | VarKind::Generator { .. } | VarKind::Lazy(_)
        ) {
            iterable
        } else {
            let items = self.items_of(iterable)?;
            self.new_iter(items, &[iterable])
        };
        f.stack.push(iterator);
        Ok(Flow::Continue)
    }

    /// `SEND` of `yield from`: the next item of the sub-iterator in place of the value sent
    /// (always None here), or, once it is exhausted, both popped and None (its return
    /// value, which the trace does not keep) pushed at the jump target.
    pub(super) fn op_send(&mut self, f: &mut FrameState<'py>, ins: &Instruction) -> CResult<Flow> {
        let sent = self.pop(f)?;
        let iterator = *f.stack.last().ok_or_else(|| {
            super::translator::CaptureError::Unsupported(super::break_reasons::Break::new(
                BreakKind::Internal,
                "SEND on an empty stack",
            ))
        })?;
        let advanced = if matches!(self.kind(iterator), VarKind::Generator { .. }) {
            self.resume_generator(iterator, Some(sent))?
        } else {
            match self.iter_advance(iterator)? {
                Some(item) => Resumed::Yielded(item),
                None => Resumed::Returned(self.constant(&self.py.None().into_bound(self.py))),
            }
        };
        match advanced {
            Resumed::Yielded(item) => f.stack.push(item),
            // Exhausted: the value of `yield from` is what the sub-generator returned.
            Resumed::Returned(value) => {
                f.stack.pop();
                f.stack.push(value);
                f.pc = ins.jump_target().map_or(f.pc, |t| t.index());
            }
        }
        Ok(Flow::Continue)
    }
}
