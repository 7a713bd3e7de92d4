//! Lazy iteration made eager: `map`, `filter`, and `itertools` (`chain`,
//! `chain.from_iterable`, `islice`, `product`, `combinations`, `permutations`,
//! `combinations_with_replacement`, `accumulate`, `zip_longest`, `pairwise`, `starmap`,
//! `takewhile`, `dropwhile`, `compress`, `repeat(x, n)`) over items the trace holds, handed
//! on as iterators over their results. `count` and `repeat(x)`, endless, are made lazily
//! (`ops_lazy_iter`), as is `groupby`, whose groups are computed here but handed out one by
//! one (Python empties a group when the outer iterator moves on); `cycle` is traced as a
//! generator (`_polyfills.cycle`), run as far as its consumer asks.
//!
//! Python computes these one item at a time as they are consumed; here every item is
//! computed when the iterator is made. The two agree when computing an item changes nothing
//! (the functions called are checked as generators run ahead are: `Tracer::without_effects`)
//! and the iterables are not iterators that other code also advances (then the lengths must
//! agree, so that nothing is pulled that Python would have left).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{LazyIter, VarId, VarKind};
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// Runs `body`, refusing it if it changed Python state older than it or a tensor in place
    /// (see `ops_generators`).
    pub fn without_effects<T>(
        &mut self,
        what: &str,
        body: impl FnOnce(&mut Self) -> CResult<T>,
    ) -> CResult<T> {
        let nodes = self.graph.nodes.len();
        let (result, changed_python) = self.counting_effects(body)?;
        let all = &self.graph.nodes;
        let changed_tensors = all[nodes..].iter().any(|node| {
            super::node_calls_in_place(self.py, node)
                && super::in_place::changes_older_tensor(self.py, all, nodes, node)
        });
        if changed_python || changed_tensors {
            return unsupported(
                BreakKind::Generator,
                format!("{what} that changes state (it cannot run ahead of its consumer)"),
            );
        }
        // Random draws made ahead of their turn would shift every later draw.
        if self.graph.nodes[nodes..]
            .iter()
            .any(|node| super::node_draws_random(self.py, node))
        {
            return unsupported(
                BreakKind::Generator,
                format!("{what} that draws random numbers (it cannot run ahead of its consumer)"),
            );
        }
        Ok(result)
    }

    /// Runs `body`; with whether it changed Python state older than it (stores to objects
    /// and containers made before it: see `note_effect`).
    pub fn counting_effects<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> CResult<T>,
    ) -> CResult<(T, bool)> {
        let effects = self.effects;
        let outer_floor = self.effects_floor.min(self.vars.len() as u32);
        let floor = std::mem::replace(&mut self.effects_floor, outer_floor);
        let result = body(self);
        self.effects_floor = floor;
        Ok((result?, self.effects != effects))
    }

    /// A call of `map`, `filter` or an `itertools` function listed in the module doc, or
    /// None. Iterators among the arguments are handed on: Python pulls from them only as the
    /// result is consumed, so using them directly afterwards is refused (see `VarKind::Iter`).
    pub(super) fn lazy_iteration_call(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let made = self.lazy_iteration(func, args, kwargs)?;
        if made.is_some() {
            self.hand_on_iterators(args);
        }
        Ok(made)
    }

    fn lazy_iteration(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let builtins = self.h.builtins.clone();
        let itertools = py.import_module("itertools")?;
        let is = |module: &Bound<'py, PyAny>, name: &str| -> bool {
            module.getattr(name).is_ok_and(|f| f.is(func))
        };
        // A classmethod of a C type: a new bound object at every lookup.
        let chain = itertools.getattr("chain")?;
        let chain_from_iterable = func.getattr("__self__").is_ok_and(|s| s.is(&chain))
            && func
                .getattr("__name__")
                .is_ok_and(|n| n.to_string() == "from_iterable");
        let builtins_any = builtins.as_any().clone();
        let itertools_any = itertools.as_any().clone();
        if is(&builtins_any, "map") && args.len() >= 2 && kwargs.is_empty() {
            let lists = self.aligned_items(&args[1..])?;
            let n = lists.iter().map(Vec::len).min().unwrap_or(0);
            let f = args[0];
            let results = self.without_effects("a function mapped", |t| {
                (0..n)
                    .map(|i| t.call_function(f, lists.iter().map(|l| l[i]).collect(), Vec::new()))
                    .collect::<CResult<Vec<_>>>()
            })?;
            return Ok(Some(self.new_iter(results, &args[1..])));
        }
        if is(&builtins_any, "sorted")
            && args.len() == 1
            && !(self.all_constant(args, kwargs))
            && !matches!(self.kind(args[0]), VarKind::Object(_))
        {
            let items = self.items_of(args[0])?;
            let sorted = self.sorted_items(items, kwargs)?;
            return Ok(Some(self.add(VarKind::List(sorted), None)));
        }
        if is(&builtins_any, "filter") && args.len() == 2 && kwargs.is_empty() {
            let items = self.items_of(args[1])?;
            let f = args[0];
            let no_function = matches!(self.kind(f), VarKind::Const(c) if c.bind(py).is_none());
            let kept = self.without_effects("a filter function", |t| {
                let mut kept = Vec::new();
                for item in items {
                    let test = if no_function {
                        item
                    } else {
                        t.call_function(f, vec![item], Vec::new())?
                    };
                    if t.truth(test)? {
                        kept.push(item);
                    }
                }
                Ok(kept)
            })?;
            return Ok(Some(self.new_iter(kept, &args[1..])));
        }
        if is(&itertools_any, "groupby")
            && (1..=2).contains(&(args.len() + kwargs.len()))
            && !args.is_empty()
            && kwargs.iter().all(|(k, _)| k == "key")
        {
            let key = args
                .get(1)
                .copied()
                .or_else(|| kwargs.first().map(|(_, v)| *v));
            let items = self.items_of(args[0])?;
            return self.group_by(items, key).map(Some);
        }
        if is(&itertools_any, "chain") && kwargs.is_empty() {
            let mut items = Vec::new();
            for list in self.aligned_items(args)? {
                items.extend(list);
            }
            return Ok(Some(self.new_iter(items, args)));
        }
        if chain_from_iterable && args.len() == 1 && kwargs.is_empty() {
            let mut items = Vec::new();
            for inner in self.items_of(args[0])? {
                items.extend(self.items_of(inner)?);
            }
            return Ok(Some(self.new_iter(items, args)));
        }
        if is(&itertools_any, "islice") && (2..=4).contains(&args.len()) && kwargs.is_empty() {
            return self.islice(func, args).map(Some);
        }
        for name in [
            "product",
            "combinations",
            "permutations",
            "combinations_with_replacement",
        ] {
            if is(&itertools_any, name) {
                return self.index_combinatorics(func, name, args, kwargs).map(Some);
            }
        }
        if is(&itertools_any, "accumulate") && (1..=2).contains(&args.len()) {
            return self.accumulate(args, kwargs).map(Some);
        }
        if is(&itertools_any, "pairwise") && args.len() == 1 && kwargs.is_empty() {
            let items = self.items_of(args[0])?;
            let pairs = items
                .windows(2)
                .map(|w| self.add(VarKind::Tuple(w.to_vec()), None))
                .collect();
            return Ok(Some(self.new_iter(pairs, args)));
        }
        if is(&itertools_any, "starmap") && args.len() == 2 && kwargs.is_empty() {
            let f = args[0];
            let argument_tuples = self.items_of(args[1])?;
            let results = self.without_effects("a function mapped", |t| {
                argument_tuples
                    .into_iter()
                    .map(|tuple| {
                        let arguments = t.items_of(tuple)?;
                        t.call_function(f, arguments, Vec::new())
                    })
                    .collect::<CResult<Vec<_>>>()
            })?;
            return Ok(Some(self.new_iter(results, &args[1..])));
        }
        let take = is(&itertools_any, "takewhile");
        if (take || is(&itertools_any, "dropwhile")) && args.len() == 2 && kwargs.is_empty() {
            // The predicate is asked until it first answers false, as Python asks it.
            let f = args[0];
            let items = self.items_of(args[1])?;
            let split = self.without_effects("a predicate", |t| {
                for (i, &item) in items.iter().enumerate() {
                    let test = t.call_function(f, vec![item], Vec::new())?;
                    if !t.truth(test)? {
                        return Ok(i);
                    }
                }
                Ok(items.len())
            })?;
            let kept = if take {
                items[..split].to_vec()
            } else {
                items[split..].to_vec()
            };
            return Ok(Some(self.new_iter(kept, &args[1..])));
        }
        if is(&itertools_any, "compress") && args.len() == 2 && kwargs.is_empty() {
            let lists = [self.items_of(args[0])?, self.items_of(args[1])?];
            let mut kept = Vec::new();
            for (&item, &selector) in lists[0].iter().zip(&lists[1]) {
                if self.truth(selector)? {
                    kept.push(item);
                }
            }
            return Ok(Some(self.new_iter(kept, args)));
        }
        if is(&itertools_any, "repeat") && args.len() == 2 && kwargs.is_empty() {
            // `repeat(x, n)` (without `n` it never ends: not made eager).
            let VarKind::Const(times) = self.kind(args[1]) else {
                return Ok(None);
            };
            let Ok(times) = times.bind(py).extract::<i64>() else {
                return Ok(None);
            };
            let copies = vec![args[0]; times.max(0) as usize];
            return Ok(Some(self.new_iter(copies, &[])));
        }
        if is(&itertools_any, "zip_longest") {
            let fill = match kwargs {
                [] => self.constant(&py.None().into_bound(py)),
                [(name, v)] if name == "fillvalue" => *v,
                _ => return Ok(None),
            };
            let lists = self.aligned_items(args)?;
            let n = lists.iter().map(Vec::len).max().unwrap_or(0);
            let tuples = (0..n)
                .map(|i| {
                    let items = lists
                        .iter()
                        .map(|l| l.get(i).copied().unwrap_or(fill))
                        .collect();
                    self.add(VarKind::Tuple(items), None)
                })
                .collect();
            return Ok(Some(self.new_iter(tuples, args)));
        }
        Ok(None)
    }

    /// `items` in the order `sorted(items, key=..., reverse=...)` gives (`kwargs`): the sort
    /// keys (the items, or what `key` returns for each, called as a function that changes
    /// nothing) must be constants; Python's own stable sort orders their positions.
    pub fn sorted_items(
        &mut self,
        items: Vec<VarId>,
        kwargs: &[(String, VarId)],
    ) -> CResult<Vec<VarId>> {
        let py = self.py;
        let mut key = None;
        let mut reverse = false;
        for (name, value) in kwargs {
            match name.as_str() {
                "key" if !matches!(self.kind(*value), VarKind::Const(c) if c.bind(py).is_none()) => {
                    key = Some(*value)
                }
                "key" => {}
                "reverse" => reverse = self.python_value(*value)?.is_truthy()?,
                _ => {
                    return unsupported(
                        BreakKind::ExceptionWhileTracing,
                        format!("sort() got an unexpected keyword {name}"),
                    )
                }
            }
        }
        let keys = self.keys_of(&items, key, "a sort key")?;
        let values = self.key_values(&keys, "sorting")?;
        let order = py.import_module("builtins")?.getattr("sorted")?.call(
            (PyTuple::new(py, 0..items.len())?,),
            Some(&{
                let kw = PyDict::new(py);
                kw.set_item("key", values.getattr("__getitem__")?)?;
                kw.set_item("reverse", reverse)?;
                kw
            }),
        );
        let order: Vec<usize> = match order {
            Ok(order) => order.extract()?,
            Err(err) => return self.order_failed(err, "sorting"),
        };
        Ok(order.into_iter().map(|i| items[i]).collect())
    }

    /// What ordering raised: an item compared that the trace does not know (a tensor in a
    /// tuple whose known items were equal) is a graph break; anything else, the user's error.
    fn order_failed<T>(&mut self, err: PyErr, what: &str) -> CResult<T> {
        let compared = self
            .py
            .import_module("dynamo_rs._polyfills")?
            .getattr("ComparedWhileTracing")?;
        if err.value(self.py).is_instance(&compared)? {
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("{what} of tuples whose known items are equal (a tensor compared)"),
            );
        }
        self.raised(err, format!("{what} raised while tracing"))
    }

    /// A tuple key as Python compares it: its constants as they are, each other item (a
    /// tensor: `sorted(d.items())` of a dict of tensors) a stand-in that raises if compared.
    fn tuple_key_value(&mut self, k: VarId) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        let VarKind::Tuple(items) = self.kind(k) else {
            return self.python_value(k);
        };
        let items = items.clone();
        let incomparable = py
            .import_module("dynamo_rs._polyfills")?
            .getattr("Incomparable")?;
        let mut values = Vec::with_capacity(items.len());
        for item in items {
            let value = match self.kind(item) {
                VarKind::Const(v) => v.bind(py).clone(),
                VarKind::Tuple(_) => self.tuple_key_value(item)?,
                _ => incomparable.call0()?,
            };
            values.push(value);
        }
        Ok(PyTuple::new(py, values)?.into_any())
    }

    /// The keys things are ordered by, as Python values: constants, or tuples (`sorted(d.items())`)
    /// compared as Python compares them — by their constants, a tensor in one must never
    /// decide; anything else is refused (`what` names the ordering in the message).
    fn key_values(&mut self, keys: &[VarId], what: &str) -> CResult<Bound<'py, PyTuple>> {
        let py = self.py;
        let mut values = Vec::with_capacity(keys.len());
        for &k in keys {
            if matches!(self.kind(k), VarKind::Tuple(_)) {
                values.push(self.tuple_key_value(k)?);
                continue;
            }
            match self.kind(k) {
                VarKind::Const(v) => values.push(v.bind(py).clone()),
                other @ (VarKind::Tensor { .. }
                | VarKind::Unrealized(_)
                | VarKind::Symbolic { .. }
                | VarKind::Slice(_)
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
                | VarKind::StateContext(_)
                | VarKind::NdArray(_)) => {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!(
                            "{what} by {} (only constants are compared while tracing)",
                            super::translator::kind_name(other)
                        ),
                    )
                }
            }
        }
        Ok(PyTuple::new(py, values)?)
    }

    /// `max(...)`/`min(...)` with `key=` or `default=`: of one iterable's items or of several
    /// arguments, the first whose key (the item itself without `key`, else what `key` returns
    /// for it, called as a function that changes nothing) is greatest (least); `default` for
    /// no items. Keys must be known values; Python's own `max`/`min` picks among the
    /// positions, raising what it raises (no items and no default, `default` with several
    /// arguments, an unknown keyword).
    pub(super) fn min_max_by_key(
        &mut self,
        is_max: bool,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        let py = self.py;
        let items = match args {
            [one] => self.items_of(*one)?,
            several => several.to_vec(),
        };
        let mut key = None;
        let mut default = None;
        let python_kwargs = PyDict::new(py);
        for (name, value) in kwargs {
            match name.as_str() {
                "key" if matches!(self.kind(*value), VarKind::Const(c) if c.bind(py).is_none()) => {
                }
                "key" => key = Some(*value),
                // Stands for the default: only whether one is given matters to Python.
                "default" => {
                    default = Some(*value);
                    python_kwargs.set_item("default", -1)?;
                }
                _ => python_kwargs.set_item(name, py.None())?,
            }
        }
        let keys = self.keys_of(&items, key, "a max()/min() key")?;
        let values = self.key_values(&keys, if is_max { "max()" } else { "min()" })?;
        python_kwargs.set_item("key", values.getattr("__getitem__")?)?;
        let positions = PyTuple::new(py, 0..items.len())?;
        let positions = if args.len() == 1 {
            PyTuple::new(py, [positions])?
        } else {
            positions
        };
        let name = if is_max { "max" } else { "min" };
        let chosen = self
            .h
            .builtins
            .getattr(name)?
            .call(positions, Some(&python_kwargs));
        match chosen.and_then(|c| c.extract::<i64>()) {
            Ok(-1) => Ok(default.expect("-1 stands for the default")),
            Ok(i) => Ok(items[i as usize]),
            Err(err) => self.order_failed(err, &format!("{name}()")),
        }
    }

    /// `key(item)` for each of `items` (the items themselves without `key`), all called
    /// now — so only if that changes nothing (`what` names the function in messages).
    fn keys_of(&mut self, items: &[VarId], key: Option<VarId>, what: &str) -> CResult<Vec<VarId>> {
        match key {
            Some(f) => self.without_effects(what, |t| {
                items
                    .iter()
                    .map(|&item| t.call_function(f, vec![item], Vec::new()))
                    .collect::<CResult<Vec<_>>>()
            }),
            None => Ok(items.to_vec()),
        }
    }

    /// `itertools.groupby(items, key)`: runs of items whose keys (the items themselves
    /// without `key`) compare equal to the run's first, as a lazy iterator of `(key, group)`
    /// (see `LazyIter::GroupBy`). Keys must be known values; `key` is called on every item
    /// now, so only if that changes nothing.
    fn group_by(&mut self, items: Vec<VarId>, key: Option<VarId>) -> CResult<VarId> {
        let py = self.py;
        let key =
            key.filter(|&k| !matches!(self.kind(k), VarKind::Const(c) if c.bind(py).is_none()));
        let keys = self.keys_of(&items, key, "a groupby key function")?;
        let mut runs: Vec<(VarId, Bound<'py, PyAny>, Vec<VarId>)> = Vec::new();
        for (item, key) in items.into_iter().zip(keys) {
            if self.contains_tensor(key) {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "itertools.groupby with tensor keys",
                );
            }
            let value = self.python_value(key)?;
            match runs.last_mut() {
                Some((_, first, run)) if first.eq(&value)? => run.push(item),
                _ => runs.push((key, value, vec![item])),
            }
        }
        let groups = runs
            .into_iter()
            .map(|(key, _, run)| (key, self.new_iter(run, &[])))
            .collect();
        Ok(self.add(
            VarKind::Lazy(super::vars::LazyIter::GroupBy { groups, next: 0 }),
            None,
        ))
    }

    /// The items of each of `iterables`; an iterator among them must be of the length all
    /// share (pulling a shorter zip's extra item from it is what Python would not do).
    fn aligned_items(&mut self, iterables: &[VarId]) -> CResult<Vec<Vec<VarId>>> {
        let lists = iterables
            .iter()
            .map(|&a| self.items_of(a))
            .collect::<CResult<Vec<_>>>()?;
        let n = lists.iter().map(Vec::len).min().unwrap_or(0);
        let uneven_iterator = iterables
            .iter()
            .zip(&lists)
            .any(|(&a, l)| matches!(self.kind(a), VarKind::Iter { .. }) && l.len() != n);
        if uneven_iterator && iterables.len() > 1 {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "iterators of different lengths combined lazily",
            );
        }
        Ok(lists)
    }

    /// `islice(it, stop)` / `islice(it, start, stop[, step])`: from an iterator the trace
    /// holds only the items Python's islice would take are pulled (and the iterator is then
    /// handed on, as Python's islice pulls them later).
    fn islice(&mut self, func: &Bound<'py, PyAny>, args: &[VarId]) -> CResult<VarId> {
        let py = self.py;
        let bounds = args[1..]
            .iter()
            .map(|&a| self.python_value(a))
            .collect::<CResult<Vec<_>>>()?;
        let is_iter = matches!(self.kind(args[0]), VarKind::Iter { .. });
        // `count()` and `repeat(x)` make their items without running anything: pulled now.
        let endless = matches!(
            self.kind(args[0]),
            VarKind::Lazy(LazyIter::Count { .. } | LazyIter::Repeat { .. })
        );
        let items = if is_iter || endless {
            // Python's islice stops pulling at `stop`: pull no further here either.
            let stop = match bounds.as_slice() {
                [stop] | [_, stop] | [_, stop, _] => stop.clone(),
                _ => py.None().into_bound(py),
            };
            let mut items = Vec::new();
            let limit: Option<usize> = if stop.is_none() {
                None
            } else {
                Some(stop.extract()?)
            };
            if endless && limit.is_none() {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "islice() of an endless iterator without a stop",
                );
            }
            while limit.is_none_or(|l| items.len() < l) {
                let next = if endless {
                    self.advance_lazy(args[0])?
                } else {
                    self.iter_advance(args[0])?
                };
                match next {
                    Some(item) => items.push(item),
                    None => break,
                }
            }
            items
        } else {
            self.items_of(args[0])?
        };
        let positions = PyTuple::new(py, 0..items.len())?;
        let mut call_args = vec![positions.into_any()];
        call_args.extend(bounds);
        let picked: Vec<usize> = match func.call1(PyTuple::new(py, call_args)?) {
            Ok(sliced) => sliced
                .try_iter()?
                .map(|p| p?.extract())
                .collect::<PyResult<_>>()?,
            Err(err) => return self.raised(err, "islice() raised while tracing"),
        };
        let chosen = picked.into_iter().map(|i| items[i]).collect();
        Ok(self.new_iter(chosen, &args[..1]))
    }

    /// `product`, `combinations`, `permutations`, `combinations_with_replacement`: Python's
    /// own function over the positions decides the tuples, which then hold the trackers.
    fn index_combinatorics(
        &mut self,
        func: &Bound<'py, PyAny>,
        name: &str,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<VarId> {
        let py = self.py;
        let iterables = if name == "product" {
            args
        } else {
            &args[..args.len().min(1)]
        };
        let lists = iterables
            .iter()
            .map(|&a| self.items_of(a))
            .collect::<CResult<Vec<_>>>()?;
        let mut call_args: Vec<Bound<'py, PyAny>> = lists
            .iter()
            .map(|l| Ok(PyTuple::new(py, 0..l.len())?.into_any()))
            .collect::<PyResult<_>>()?;
        for &extra in &args[iterables.len()..] {
            call_args.push(self.python_value(extra)?);
        }
        let keywords = self.python_kwargs(kwargs)?;
        let combos = match func.call(PyTuple::new(py, call_args)?, Some(&keywords)) {
            Ok(c) => c,
            Err(err) => return self.raised(err, format!("{name}() raised while tracing")),
        };
        let mut tuples = Vec::new();
        for combo in combos.try_iter()? {
            let combo = combo?;
            let mut items = Vec::new();
            for (k, position) in combo.try_iter()?.enumerate() {
                let position: usize = position?.extract()?;
                // product: the k-th position is into the k-th iterable (cycled by `repeat`).
                let list = if name == "product" {
                    &lists[k % lists.len()]
                } else {
                    &lists[0]
                };
                items.push(list[position]);
            }
            tuples.push(self.add(VarKind::Tuple(items), None));
        }
        Ok(self.new_iter(tuples, iterables))
    }

    /// `accumulate(it[, func], *, initial=None)`: running results, left to right.
    fn accumulate(&mut self, args: &[VarId], kwargs: &[(String, VarId)]) -> CResult<VarId> {
        let py = self.py;
        let mut func = args.get(1).copied();
        let mut initial = None;
        for (name, value) in kwargs {
            match name.as_str() {
                "func" => func = Some(*value),
                "initial" => initial = Some(*value),
                _ => {
                    return unsupported(
                        BreakKind::ExceptionWhileTracing,
                        format!("accumulate() got an unexpected keyword {name}"),
                    )
                }
            }
        }
        let func =
            func.filter(|&f| !matches!(self.kind(f), VarKind::Const(c) if c.bind(py).is_none()));
        let items = self.items_of(args[0])?;
        let add = self.h.operator.getattr("add")?;
        let results = self.without_effects("an accumulate function", |t| {
            let mut out = Vec::new();
            let mut total = initial
                .filter(|&i| !matches!(t.kind(i), VarKind::Const(c) if c.bind(py).is_none()));
            if let Some(start) = total {
                out.push(start);
            }
            for item in items {
                let next = match total {
                    None => item,
                    Some(acc) => match func {
                        Some(f) => t.call_function(f, vec![acc, item], Vec::new())?,
                        None => t.apply_operator(&add, vec![acc, item])?,
                    },
                };
                out.push(next);
                total = Some(next);
            }
            Ok(out)
        })?;
        Ok(self.new_iter(results, &args[..1]))
    }
}
