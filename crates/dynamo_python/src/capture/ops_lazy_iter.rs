//! Iterators made one item at a time, as Python makes them, where taking every item when
//! the iterator is made (what `builtins` and `ops_itertools` do with items the trace holds)
//! would be wrong: `zip`, `enumerate` and `map` over a generator the trace runs lazily (its
//! body may change state between items, see `ops_generators`), and the endless
//! `itertools.count(start, step)` and `itertools.repeat(x)`. `for` loops and `next()` take
//! their items one by one; a consumer that takes them all at once runs them to the end
//! (refused for an endless one) — like a generator, only if that changes nothing.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::ops_generators::{Resumed, MAX_YIELDS};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{LazyIter, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// Whether `id` makes its items only as they are asked for (a generator the trace runs
    /// lazily, a `VarKind::Lazy` iterator).
    pub fn is_lazy_iterator(&self, id: VarId) -> bool {
        matches!(self.kind(id), VarKind::Generator { .. } | VarKind::Lazy(_))
    }

    /// `zip`, `enumerate` or `map` over a lazy iterator, `itertools.count`, or
    /// `itertools.repeat(x)` without a count: the lazy iterator; None for other calls.
    pub(super) fn lazy_iterator_call(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let builtins = self.h.builtins.clone();
        let itertools = py.import_module("itertools")?;
        let any_lazy = args.iter().any(|&a| self.is_lazy_iterator(a));
        let lazy = if func.is(&builtins.getattr("zip")?) && any_lazy && kwargs.is_empty() {
            let iterators = self.iterators_of(args)?;
            LazyIter::Zip { iterators }
        } else if func.is(&builtins.getattr("enumerate")?)
            && (1..=2).contains(&(args.len() + kwargs.len()))
            && self.is_lazy_iterator(args[0])
            && kwargs.iter().all(|(k, _)| k == "start")
        {
            let start = args
                .get(1)
                .copied()
                .or_else(|| kwargs.first().map(|(_, v)| *v));
            let index = match start {
                Some(s) => self.python_value(s)?.extract()?,
                None => 0,
            };
            LazyIter::Enumerate {
                iterator: args[0],
                index,
            }
        } else if func.is(&builtins.getattr("map")?)
            && args.len() >= 2
            && kwargs.is_empty()
            && args[1..].iter().any(|&a| self.is_lazy_iterator(a))
        {
            let iterators = self.iterators_of(&args[1..])?;
            LazyIter::Map {
                func: args[0],
                iterators,
            }
        } else if func.is(&itertools.getattr("count")?)
            && args.len() <= 2
            && kwargs.is_empty()
            && self.all_constant(args, kwargs)
        {
            let mut numbers = Vec::new();
            for &a in args {
                numbers.push(self.python_value(a)?);
            }
            let zero = 0i64.into_pyobject(py)?.into_any();
            let one = 1i64.into_pyobject(py)?.into_any();
            let next = numbers.first().cloned().unwrap_or(zero);
            let step = numbers.get(1).cloned().unwrap_or(one);
            // `count` takes numbers only; anything else raises here as it would there.
            itertools.getattr("count")?.call1((&next, &step))?;
            LazyIter::Count {
                next: OwnedRef::from_bound(&next),
                step: OwnedRef::from_bound(&step),
            }
        } else if func.is(&itertools.getattr("repeat")?) && args.len() == 1 && kwargs.is_empty() {
            LazyIter::Repeat { item: args[0] }
        } else {
            return Ok(None);
        };
        Ok(Some(self.add(VarKind::Lazy(lazy), None)))
    }

    /// An iterator for each of `args`: lazy ones and iterators as they are, others over
    /// their items (as `iter()` would make).
    fn iterators_of(&mut self, args: &[VarId]) -> CResult<Vec<VarId>> {
        let mut iterators = Vec::with_capacity(args.len());
        for &arg in args {
            if self.is_lazy_iterator(arg) || matches!(self.kind(arg), VarKind::Iter { .. }) {
                iterators.push(arg);
            } else {
                let items = self.items_of(arg)?;
                iterators.push(self.new_iter(items, &[arg]));
            }
        }
        Ok(iterators)
    }

    /// The next item of a generator or lazy iterator, or what it returned once exhausted
    /// (None for a lazy iterator), as `next()` needs it.
    pub(super) fn next_item(&mut self, id: VarId) -> CResult<Resumed> {
        if matches!(self.kind(id), VarKind::Generator { .. }) {
            return self.resume_generator(id, None);
        }
        Ok(match self.advance_lazy(id)? {
            Some(item) => Resumed::Yielded(item),
            None => Resumed::Returned(self.constant(&self.py.None().into_bound(self.py))),
        })
    }

    /// `any(it)` / `all(it)` of a generator or lazy iterator: its items pulled one at a time
    /// until the answer is known, as Python stops pulling there (what the items' making
    /// changes happens as far as Python gets); None for other calls.
    pub(super) fn short_circuit_consumer(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let builtins = &self.h.builtins;
        let is_any = func.is(&builtins.getattr("any")?);
        if !(is_any || func.is(&builtins.getattr("all")?)) {
            return Ok(None);
        }
        let ([items], true) = (args, kwargs.is_empty()) else {
            return Ok(None);
        };
        if !self.is_lazy_iterator(*items) {
            return Ok(None);
        }
        let mut answer = !is_any;
        while let Some(item) = self.iter_advance(*items)? {
            if self.truth(item)? == is_any {
                answer = is_any;
                break;
            }
        }
        Ok(Some(self.constant(
            pyo3::types::PyBool::new(self.py, answer).as_any(),
        )))
    }

    /// `iterator.__next__()` of an iterator class written in Python, inlined: None when it
    /// raised StopIteration (caught here, as `for` and `next(it, default)` catch it).
    pub(super) fn python_next(&mut self, iterator: VarId) -> CResult<Option<VarId>> {
        let locations = self.location_stack.len();
        let method = self.get_attr(iterator, "__next__")?;
        let next = self.call_function(method, Vec::new(), Vec::new());
        self.catch_builtin(next, "StopIteration", locations)
    }

    /// The next item of lazy iterator `id` (None: exhausted), made now.
    pub(super) fn advance_lazy(&mut self, id: VarId) -> CResult<Option<VarId>> {
        let py = self.py;
        let lazy = match self.kind(id) {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::Lazy(lazy) => lazy.clone(),
            VarKind::Tensor { .. }
            | VarKind::Symbolic { .. }
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
            | VarKind::Function(_)
            | VarKind::Partial { .. }
            | VarKind::CellRef(_)
            | VarKind::Super { .. }
            | VarKind::Instance { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_) => {
                return unsupported(BreakKind::Internal, "advancing a lazy iterator that is not")
            }
        };
        let (item, after) = match lazy {
            LazyIter::Count { next, step } => {
                let value = next.bind(py).clone();
                let following = value.add(step.bind(py))?;
                let item = self.constant(&value);
                let after = LazyIter::Count {
                    next: OwnedRef::from_bound(&following),
                    step,
                };
                (Some(item), Some(after))
            }
            LazyIter::Repeat { item } => (Some(item), None),
            LazyIter::Zip { iterators } => match self.one_of_each(&iterators)? {
                Some(items) => (Some(self.add(VarKind::Tuple(items), None)), None),
                None => (None, None),
            },
            LazyIter::Enumerate { iterator, index } => match self.iter_advance(iterator)? {
                Some(item) => {
                    let i = self.constant(&index.into_pyobject(py)?.into_any());
                    let pair = self.add(VarKind::Tuple(vec![i, item]), None);
                    let after = LazyIter::Enumerate {
                        iterator,
                        index: index + 1,
                    };
                    (Some(pair), Some(after))
                }
                None => (None, None),
            },
            LazyIter::Map { func, iterators } => match self.one_of_each(&iterators)? {
                Some(items) => (Some(self.call_function(func, items, Vec::new())?), None),
                None => (None, None),
            },
            LazyIter::GroupBy { groups, next } => {
                if let Some(&(_, before)) = next.checked_sub(1).and_then(|at| groups.get(at)) {
                    if let VarKind::Iter { items, next, .. } =
                        &mut self.vars[before.0 as usize].kind
                    {
                        *next = items.len();
                    }
                }
                let item = groups
                    .get(next)
                    .map(|&(key, group)| self.add(VarKind::Tuple(vec![key, group]), None));
                let after = LazyIter::GroupBy {
                    next: (next + 1).min(groups.len() + 1),
                    groups,
                };
                (item, Some(after))
            }
            LazyIter::Protocol { iterator } => (self.python_next(iterator)?, None),
        };
        if let Some(after) = after {
            self.vars[id.0 as usize].kind = VarKind::Lazy(after);
        }
        Ok(item)
    }

    /// One item of each iterator, pulled in order (None once one is exhausted: the items
    /// pulled before it in this round are lost, as in Python's `zip`).
    fn one_of_each(&mut self, iterators: &[VarId]) -> CResult<Option<Vec<VarId>>> {
        let mut items = Vec::with_capacity(iterators.len());
        for &iterator in iterators {
            match self.iter_advance(iterator)? {
                Some(item) => items.push(item),
                None => return Ok(None),
            }
        }
        Ok(Some(items))
    }

    /// Every item generator or lazy iterator `id` has left, made now in Python's order;
    /// refused past `MAX_YIELDS` (an endless one).
    pub(super) fn take_all(&mut self, id: VarId) -> CResult<Vec<VarId>> {
        let mut items = Vec::new();
        while let Some(item) = self.iter_advance(id)? {
            if items.len() >= MAX_YIELDS {
                return unsupported(
                    BreakKind::Generator,
                    "an endless iterator (or one of over 10,000 items) taken whole",
                );
            }
            items.push(item);
        }
        Ok(items)
    }

    /// `take_all` for a consumer that may do other work between the items (see the module
    /// doc): only if making them changes nothing.
    pub(super) fn take_all_unobserved(&mut self, id: VarId) -> CResult<Vec<VarId>> {
        self.without_effects("a generator", |t| t.take_all(id))
    }
}
