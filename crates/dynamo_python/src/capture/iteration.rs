//! Iteration at trace time: the items of a tracker (containers, iterators, dict views,
//! module containers, Python sequences), with sources for what is read from real objects.

use super::break_reasons::BreakKind;
use std::rc::Rc;

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::ops_call::describe;
use super::ops_generators::Resumed;
use super::source::Source;
use super::translator::{kind_name, unsupported, CResult, Tracer};
use super::vars::{DictViewKind, VarId, VarKind, Watched};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// The items of a tracker that can be iterated at trace time.
    pub fn items_of(&mut self, id: VarId) -> CResult<Vec<VarId>> {
        let py = self.py;
        match self.kind(id) {
            VarKind::Unrealized(_) => super::lazy_inputs::unrealized_reached(),
            VarKind::Tuple(items) | VarKind::List(items) => Ok(items.clone()),
            VarKind::Generator { .. } | VarKind::Lazy(_) => self.take_all_unobserved(id),
            VarKind::Iter { .. } => {
                // Iterating an iterator to the end (`list(it)`, `sum(it)`) exhausts it.
                let mut rest = Vec::new();
                while let Some(item) = self.iter_advance(id)? {
                    rest.push(item);
                }
                Ok(rest)
            }
            VarKind::Dict(entries) => {
                let keys: Vec<OwnedRef> = entries.iter().map(|(k, _)| k.clone()).collect();
                keys.into_iter().map(|k| self.dict_key(k)).collect()
            }
            &VarKind::DictView { dict, which } => self.dict_view_items(dict, which),
            VarKind::Const(v) => {
                let v = v.bind(py).clone();
                let mut out = Vec::new();
                for item in v.try_iter()? {
                    let item = item?;
                    out.push(self.wrap(&item, None)?);
                }
                Ok(out)
            }
            VarKind::Object(v) => {
                let v = v.bind(py).clone();
                if let Some(items) = self.fresh_set_items(id)? {
                    return Ok(items);
                }
                if let Some(items) = self.fresh_deque_items(id)? {
                    return Ok(items);
                }
                self.object_items(id, &v)
            }
            VarKind::Instance { cls, .. } => {
                let cls = cls.bind(py).clone();
                if let Some(items) = self.sequence_items(id, &cls)? {
                    return Ok(items);
                }
                match self.python_iter_items(id, &cls)? {
                    Some(items) => Ok(items),
                    None => unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("iterating over a {} made while tracing", describe(&cls)),
                    ),
                }
            }
            VarKind::Tensor { fake, .. } => {
                // `for row in x`: x[0], x[1], ... along the first dimension, whose size the
                // guards fix.
                let shape: Vec<i64> = fake.bind(py).getattr("shape")?.extract()?;
                let Some(&n) = shape.first() else {
                    return unsupported(
                        BreakKind::ExceptionWhileTracing,
                        "iteration over a 0-d tensor",
                    );
                };
                let getitem = self.h.operator.getattr("getitem")?;
                let mut rows = Vec::with_capacity(n as usize);
                for i in 0..n {
                    let index = self.constant(&i.into_pyobject(py)?.into_any());
                    rows.push(self.apply_operator(&getitem, vec![id, index])?);
                }
                Ok(rows)
            }
            other @ (VarKind::Symbolic { .. }
            | VarKind::Slice(_)
            | VarKind::Null
            | VarKind::Method { .. }
            | VarKind::Function(_)
            | VarKind::Partial { .. }
            | VarKind::CellRef(_)
            | VarKind::Super { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)) => unsupported(
                BreakKind::UnsupportedOperation,
                format!("iterating over {}", kind_name(other)),
            ),
        }
    }

    /// `iter(x)`, `reversed(seq)` and `next(it[, default])` on what the trace holds; None for
    /// other calls.
    pub(super) fn iteration_builtin(
        &mut self,
        func: &Bound<'py, PyAny>,
        args: &[VarId],
    ) -> CResult<Option<VarId>> {
        let builtins = &self.h.builtins;
        if func.is(&builtins.getattr("iter")?) && args.len() == 1 {
            if matches!(self.kind(args[0]), VarKind::Iter { .. }) || self.is_lazy_iterator(args[0])
            {
                return Ok(Some(args[0])); // an iterator is its own iterator
            }
            if let Some(iterator) = self.python_iter_of(args[0])? {
                return Ok(Some(iterator));
            }
            if matches!(self.kind(args[0]), VarKind::Object(_)) {
                return Ok(None); // a real object's own __iter__: evaluated as before
            }
            let items = self.items_of(args[0])?;
            return Ok(Some(self.new_iter(items, &args[..1])));
        }
        if func.is(&builtins.getattr("reversed")?) && args.len() == 1 {
            // Sequences the trace holds: their items from the end (watched, like `iter`).
            if let VarKind::Const(value) = self.kind(args[0]) {
                // `reversed(range(n))`, of a string, of a constant tuple: its items now.
                let value = value.bind(self.py).clone();
                let Ok(reversed) = func.call1((value,)) else {
                    return Ok(None);
                };
                let mut items = Vec::new();
                for item in reversed.try_iter()? {
                    items.push(self.constant(&item?));
                }
                return Ok(Some(self.new_iter(items, &[])));
            }
            if !matches!(self.kind(args[0]), VarKind::List(_) | VarKind::Tuple(_)) {
                return Ok(None);
            }
            let mut items = self.items_of(args[0])?;
            let len = items.len();
            items.reverse();
            let made = self.new_iter_watching(items, &args[..1], false);
            if let VarKind::Iter { watched, .. } = &mut self.vars[made.0 as usize].kind {
                if let [w] = watched.as_mut_slice() {
                    w.reversed_len = Some(len);
                }
            }
            return Ok(Some(made));
        }
        if func.is(&builtins.getattr("next")?) && (1..=2).contains(&args.len()) {
            if self.is_lazy_iterator(args[0]) {
                return match self.next_item(args[0])? {
                    Resumed::Yielded(item) => Ok(Some(item)),
                    Resumed::Returned(_) if args.len() == 2 => Ok(Some(args[1])),
                    Resumed::Returned(value) => self.stop_iteration(value).map(Some),
                };
            }
            if self.defines_python_next(args[0]) {
                // An iterator class of the user's: its `__next__` inlined; a StopIteration
                // raised there gives the default, or reaches the caller as raised.
                return match args.get(1) {
                    Some(&default) => Ok(Some(self.python_next(args[0])?.unwrap_or(default))),
                    None => {
                        let method = self.get_attr(args[0], "__next__")?;
                        self.call_function(method, Vec::new(), Vec::new()).map(Some)
                    }
                };
            }
            if !matches!(self.kind(args[0]), VarKind::Iter { .. }) {
                return Ok(None);
            }
            if let Some(item) = self.iter_advance(args[0])? {
                return Ok(Some(item));
            }
            return match args.get(1) {
                Some(&default) => Ok(Some(default)),
                // Raised on every call: the iterator's items are fixed by the guards.
                None => {
                    let stop = self.h.builtins.getattr("StopIteration")?.call0()?;
                    self.raised(
                        PyErr::from_value(stop),
                        "next() of an exhausted iterator (StopIteration)",
                    )
                }
            };
        }
        Ok(None)
    }

    /// An iterator over `items`, taken now from the containers in `over` (watched, see
    /// `VarKind::Iter`).
    pub fn new_iter(&mut self, items: Vec<VarId>, over: &[VarId]) -> VarId {
        self.new_iter_watching(items, over, true)
    }

    /// `new_iter`; `positional` says whether the n-th item is each container's n-th (not so
    /// for `reversed`).
    pub fn new_iter_watching(
        &mut self,
        items: Vec<VarId>,
        over: &[VarId],
        positional: bool,
    ) -> VarId {
        let mut watched = Vec::new();
        for &container in over {
            match self.kind(container) {
                // Wrapped iterators may have advanced already: their positions are not ours.
                VarKind::Iter { watched: inner, .. } => {
                    watched.extend(inner.iter().map(|w| Watched {
                        positional: false,
                        reversed_len: None,
                        ..w.clone()
                    }))
                }
                &VarKind::DictView { dict, .. } => watched.push(Watched {
                    container: dict,
                    then: self.contents_fingerprint(dict),
                    positional,
                    reversed_len: None,
                }),
                VarKind::List(_) | VarKind::Dict(_) => watched.push(Watched {
                    container,
                    then: self.contents_fingerprint(container),
                    positional,
                    reversed_len: None,
                }),
                _ => {}
            }
        }
        self.add(
            VarKind::Iter {
                items,
                next: 0,
                watched,
                handed_on: false,
                exhausted: false,
            },
            None,
        )
    }

    /// `enumerate(it)`/`zip(it, ...)` took the items of the iterators among `args`.
    pub fn hand_on_iterators(&mut self, args: &[VarId]) {
        for &arg in args {
            if let VarKind::Iter { handed_on, .. } = &mut self.vars[arg.0 as usize].kind {
                *handed_on = true;
            }
        }
    }

    /// What a list or dict tracker holds, as numbers that change when its contents do (a
    /// dict's: its (key, value) pairs, then how many entries it has lost).
    pub(super) fn contents_fingerprint(&self, container: VarId) -> Vec<usize> {
        match self.kind(container) {
            VarKind::List(items) => items.iter().map(|i| i.0 as usize).collect(),
            VarKind::Dict(entries) => entries
                .iter()
                .flat_map(|(k, v)| [k.as_ptr() as usize, v.0 as usize])
                .chain([self.dict_removals.get(&container).copied().unwrap_or(0)])
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Counts an entry removed from a dict tracker (see `dict_removals`).
    pub(super) fn note_dict_removal(&mut self, dict: VarId) {
        *self.dict_removals.entry(dict).or_insert(0) += 1;
    }

    /// The next item of an iterator tracker (None: exhausted). Refuses when a container
    /// it reads changed since it was made: Python would see the change (a list grown inside
    /// its own `for` loop) or raise (a dict changing size), the items taken would not.
    pub fn iter_advance(&mut self, iter: VarId) -> CResult<Option<VarId>> {
        if matches!(self.kind(iter), VarKind::Lazy(_)) {
            return self.advance_lazy(iter);
        }
        if matches!(self.kind(iter), VarKind::Generator { .. }) {
            return Ok(match self.resume_generator(iter, None)? {
                Resumed::Yielded(item) => Some(item),
                Resumed::Returned(_) => None,
            });
        }
        let VarKind::Iter {
            handed_on,
            exhausted,
            ..
        } = self.kind(iter)
        else {
            return unsupported(
                BreakKind::Internal,
                format!("internal: advancing {}", kind_name(self.kind(iter))),
            );
        };
        if *handed_on {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "an iterator used directly after enumerate() or zip() was made over it",
            );
        }
        if *exhausted {
            // Python's iterators stay exhausted whatever their container does afterwards.
            return Ok(None);
        }
        self.refresh_list_iterator(iter);
        self.refresh_reversed_list_iterator(iter);
        let VarKind::Iter { watched, next, .. } = self.kind(iter) else {
            unreachable!("checked above");
        };
        for w in watched {
            if !self.change_is_invisible(w, *next) {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    format!(
                        "{} changed while an iterator over it was in use",
                        kind_name(self.kind(w.container))
                    ),
                );
            }
        }
        let VarKind::Iter { items, next, .. } = &mut self.vars[iter.0 as usize].kind else {
            unreachable!("checked above");
        };
        let item = items.get(*next).copied();
        if item.is_some() {
            *next += 1;
        } else if let VarKind::Iter { exhausted, .. } = &mut self.vars[iter.0 as usize].kind {
            // Exhausted for good, as Python's iterators are: a list grown afterwards is not
            // read again (see `refresh_list_iterator`).
            *exhausted = true;
        }
        Ok(item)
    }

    /// A plain iterator over a list (`for x in xs`, `iter(xs)`: its items are the list's as
    /// they were when it was made) reads the list by position at every step in Python, so
    /// items appended, removed or replaced inside the loop are seen: its items are read
    /// again from the list when the list changed.
    fn refresh_list_iterator(&mut self, iter: VarId) {
        let VarKind::Iter {
            items,
            watched,
            exhausted: false,
            ..
        } = self.kind(iter)
        else {
            return;
        };
        let [w] = watched.as_slice() else {
            return;
        };
        let VarKind::List(now) = self.kind(w.container) else {
            return;
        };
        let own_items = w.positional
            && items.len() == w.then.len()
            && items
                .iter()
                .zip(&w.then)
                .all(|(item, &then)| item.0 as usize == then);
        if !own_items {
            return;
        }
        let (now, container) = (now.clone(), w.container);
        let then = self.contents_fingerprint(container);
        if let VarKind::Iter { items, watched, .. } = &mut self.vars[iter.0 as usize].kind {
            *items = now;
            watched[0].then = then;
        }
    }

    /// `reversed(list)` at its next step: the list's item at position `len - 1 - next`
    /// (`len` as it was when the iterator was made) as the list is now, and the ones before
    /// it after; none if the list has shrunk below that position (Python's iterator then
    /// ends, for good).
    fn refresh_reversed_list_iterator(&mut self, iter: VarId) {
        let VarKind::Iter {
            watched,
            next,
            exhausted: false,
            ..
        } = self.kind(iter)
        else {
            return;
        };
        let [Watched {
            container,
            reversed_len: Some(len),
            ..
        }] = watched.as_slice()
        else {
            return;
        };
        let (container, len, next) = (*container, *len, *next);
        let VarKind::List(now) = self.kind(container) else {
            return;
        };
        let position = len.checked_sub(next + 1);
        let remaining: Vec<VarId> = match position {
            Some(p) if p < now.len() => now[..=p].iter().rev().copied().collect(),
            _ => Vec::new(),
        };
        let then = self.contents_fingerprint(container);
        if let VarKind::Iter { items, watched, .. } = &mut self.vars[iter.0 as usize].kind {
            items.truncate(next);
            items.extend(remaining);
            watched[0].then = then;
        }
    }

    /// Whether an iterator `next` items in sees `w`'s container as it was when it was made:
    /// unchanged, or (for a positional iterator) changed only in items already passed — a
    /// list item or a dict value assigned behind the loop (`for k, v in d.items(): d[k] = f(v)`,
    /// `for i, x in enumerate(xs): xs[i] = g(x)`). A dict's keys must stay as they were
    /// (Python raises when they change); a list's length too.
    fn change_is_invisible(&self, w: &Watched, next: usize) -> bool {
        let now = self.contents_fingerprint(w.container);
        if now == w.then {
            return true;
        }
        if !w.positional || now.len() != w.then.len() {
            return false;
        }
        // A dict's fingerprint is (key, value) pairs; a list's one number per item.
        let per_item = if matches!(self.kind(w.container), VarKind::Dict(_)) {
            2
        } else {
            1
        };
        let passed = (next * per_item).min(now.len());
        now[passed..] == w.then[passed..]
            && (per_item == 1 || (0..passed).step_by(2).all(|k| now[k] == w.then[k]))
    }

    /// What iterating a dict view gives now: keys, values or `(key, value)` tuples of the
    /// dict's current entries.
    pub fn dict_view_items(&mut self, dict: VarId, which: DictViewKind) -> CResult<Vec<VarId>> {
        let VarKind::Dict(entries) = self.kind(dict) else {
            return unsupported(
                BreakKind::Internal,
                "internal: a dict view of something that is not a dict",
            );
        };
        let entries = entries.clone();
        let mut items = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            items.push(match which {
                DictViewKind::Keys => self.dict_key(k)?,
                DictViewKind::Values => v,
                DictViewKind::Items => {
                    let k = self.dict_key(k)?;
                    self.add(VarKind::Tuple(vec![k, v]), None)
                }
            });
        }
        Ok(items)
    }

    /// A key of a dict tracker as the trace hands it out: a constant — or an object compared
    /// by identity (a module, an enum member, an instance: the keys guard or the trace pinned
    /// which one), held by the compiled code as the source of what is read from it, so that
    /// a module called reads its parameters from a source and an attribute read is guarded.
    pub fn dict_key(&mut self, key: OwnedRef) -> CResult<VarId> {
        if let Some(&tensor) = self.key_tensors.get(&(key.as_ptr() as usize)) {
            return Ok(tensor);
        }
        let value = key.bind(self.py).clone();
        if self.h.is_constant(&value)? {
            return Ok(self.add(VarKind::Const(key), None));
        }
        let source = Rc::new(Source::Object(key, "a dict key".into()));
        self.wrap(&value, Some(source))
    }

    /// Items of an object whose class is a Python sequence (`__len__` and `__getitem__` in
    /// Python, iteration left to `collections.abc.Sequence`), by inlining those two so what
    /// they read is traced and guarded. `None` if the class is not such a sequence.
    fn sequence_items(
        &mut self,
        id: VarId,
        cls: &Bound<'py, PyAny>,
    ) -> CResult<Option<Vec<VarId>>> {
        let py = self.py;
        let inspect = py.import_module("inspect")?;
        let static_attr = |name: &str| inspect.call_method1("getattr_static", (cls, name)).ok();
        let sequence_iter = py
            .import_module("collections.abc")?
            .getattr("Sequence")?
            .getattr("__iter__")?;
        let (Some(len_fn), Some(getitem_fn)) = (static_attr("__len__"), static_attr("__getitem__"))
        else {
            return Ok(None);
        };
        let iter_ok = static_attr("__iter__").is_none_or(|it| it.is(&sequence_iter));
        if !(iter_ok
            && len_fn.is_instance(&self.h.function_type)?
            && getitem_fn.is_instance(&self.h.function_type)?)
        {
            return Ok(None);
        }
        let n = self.call_python(&len_fn, vec![id], Vec::new())?;
        let n: usize = match self.real(n) {
            Some(v) => v.extract()?,
            None => {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "len() of a sequence that is not a constant",
                )
            }
        };
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let index = self.constant(&(i as i64).into_pyobject(py)?.into_any());
            out.push(self.call_python(&getitem_fn, vec![id, index], Vec::new())?);
        }
        Ok(Some(out))
    }

    /// The arguments of `callee` with each that a builtin iterates (`sorted(bag)`,
    /// `max(bag)`, `sum(bag)`, `zip(a, b)`, ...) and whose class defines `__iter__` in
    /// Python replaced by what Python's builtin makes of it — it calls `iter()` on it once,
    /// at the call: for the lazy consumers (`zip`, `map`, `enumerate`, `filter`) that
    /// iterator, advanced as they are; for the others a list of its items, taken now.
    /// Other arguments are unchanged.
    pub(super) fn settle_python_iterables(
        &mut self,
        callee: &Bound<'py, PyAny>,
        mut args: Vec<VarId>,
    ) -> CResult<Vec<VarId>> {
        let builtins = self.h.builtins.clone();
        let is = |name: &str| builtins.getattr(name).is_ok_and(|b| b.is(callee));
        // Consumers that take every item before doing anything else: running an iterator
        // class's `__next__` to the end first is Python's own order, whatever it changes.
        let collector = ["sorted", "list", "tuple", "set", "frozenset", "sum"]
            .iter()
            .any(|n| is(n))
            || ((is("max") || is("min")) && args.len() == 1);
        let lazy_consumer = ["zip", "map", "enumerate", "filter"].iter().any(|n| is(n));
        let positions: Vec<usize> = if collector || is("any") || is("all") || is("enumerate") {
            vec![0]
        } else if is("zip") {
            (0..args.len()).collect()
        } else if is("map") {
            (1..args.len()).collect()
        } else if is("filter") {
            vec![1]
        } else {
            return Ok(args);
        };
        for position in positions {
            let Some(&arg) = args.get(position) else {
                continue;
            };
            let is_class = self
                .real_unpinned(arg)
                .is_some_and(|v| v.is_instance_of::<pyo3::types::PyType>());
            let Some(cls) = self.class_of_object(arg).filter(|_| !is_class) else {
                continue;
            };
            if !self.defines_python_iter(&cls) {
                continue;
            }
            if lazy_consumer || collector {
                if let Some(iterator) = self.python_iter_of(arg)? {
                    args[position] = if lazy_consumer {
                        iterator
                    } else {
                        let items = self.take_all(iterator)?;
                        self.add(VarKind::List(items), None)
                    };
                    continue;
                }
            }
            let items = self.items_of(arg)?;
            args[position] = self.add(VarKind::List(items), None);
        }
        Ok(args)
    }

    /// Whether the class `cls` defines `__iter__` as a Python function.
    fn defines_python_iter(&self, cls: &Bound<'py, PyAny>) -> bool {
        cls.cast::<pyo3::types::PyType>().is_ok_and(|ty| {
            super::helpers::python_dunder(ty, &["__iter__"], &self.h.function_type).is_some()
        })
    }

    /// The class of an instance made in the trace or of an existing object (None for other
    /// trackers), read without pinning which object it is.
    fn class_of_object(&self, id: VarId) -> Option<Bound<'py, PyAny>> {
        match self.kind(id) {
            VarKind::Instance { cls, .. } => Some(cls.bind(self.py).clone()),
            VarKind::Object(obj) => Some(obj.bind(self.py).get_type().into_any()),
            _ => None,
        }
    }

    /// Whether the class of `id` defines `__next__` in Python (an iterator class of the
    /// user's).
    fn defines_python_next(&self, id: VarId) -> bool {
        let Some(cls) = self.class_of_object(id) else {
            return false;
        };
        cls.cast::<pyo3::types::PyType>().is_ok_and(|ty| {
            super::helpers::python_dunder(ty, &["__next__"], &self.h.function_type).is_some()
        })
    }

    /// `iter(obj)` of an object whose class defines `__iter__` in Python (`nn.ParameterList`,
    /// a user collection returning a generator or `iter(self._items)`): that method looked up
    /// as any method call's is (guarded) and inlined. An iterator of a class that defines
    /// `__next__` in Python (often `obj` itself) becomes a lazy iterator calling it per item.
    /// None if the class's `__iter__` is not a Python function.
    pub(super) fn python_iter(
        &mut self,
        id: VarId,
        cls: &Bound<'py, PyAny>,
    ) -> CResult<Option<VarId>> {
        if !self.defines_python_iter(cls) {
            return Ok(None);
        }
        let method = self.get_attr(id, "__iter__")?;
        let iterator = self.call_function(method, Vec::new(), Vec::new())?;
        if self.defines_python_next(iterator) {
            let lazy = VarKind::Lazy(super::vars::LazyIter::Protocol { iterator });
            return Ok(Some(self.add(lazy, None)));
        }
        let not_an_iterator = self
            .class_of_object(iterator)
            .is_some_and(|cls| !cls.hasattr("__next__").unwrap_or(false));
        if not_an_iterator {
            // Python's `iter()` raises TypeError ("returned non-iterator"); iterating it as a
            // container would call its `__iter__` again, perhaps without end (two objects
            // whose `__iter__` return each other).
            let cls = self.class_of_object(iterator).expect("checked");
            return unsupported(
                BreakKind::UnsupportedOperation,
                format!("__iter__ returned a {}, not an iterator", describe(&cls)),
            );
        }
        Ok(Some(iterator))
    }

    /// `python_iter` for an object or instance tracker whose class's own `__iter__` is
    /// Python code — not a module (torch's containers keep their guarded modelling) nor a
    /// sequence iterated by index (see `sequence_items`); None for anything else.
    pub(super) fn python_iter_of(&mut self, id: VarId) -> CResult<Option<VarId>> {
        let is_module = self
            .real_unpinned(id)
            .is_some_and(|v| v.is_instance(&self.h.module_type).unwrap_or(true));
        let Some(cls) = self.class_of_object(id).filter(|_| !is_module) else {
            return Ok(None);
        };
        let sequence_iter = self
            .py
            .import_module("collections.abc")?
            .getattr("Sequence")?
            .getattr("__iter__")?;
        if cls
            .getattr("__iter__")
            .is_ok_and(|it| it.is(&sequence_iter))
        {
            return Ok(None);
        }
        let Some(iterator) = self.python_iter(id, &cls)? else {
            return Ok(None);
        };
        if matches!(
            self.kind(iterator),
            VarKind::Iter { .. } | VarKind::Generator { .. } | VarKind::Lazy(_)
        ) {
            return Ok(Some(iterator));
        }
        let items = self.items_of(iterator)?;
        Ok(Some(self.new_iter(items, &[iterator])))
    }

    /// The items of `python_iter(id, cls)`, all taken now.
    fn python_iter_items(
        &mut self,
        id: VarId,
        cls: &Bound<'py, PyAny>,
    ) -> CResult<Option<Vec<VarId>>> {
        let made_from = self.vars.len() as u32;
        let Some(iterator) = self.python_iter(id, cls)? else {
            return Ok(None);
        };
        if !matches!(
            self.kind(iterator),
            VarKind::Lazy(super::vars::LazyIter::Protocol { .. })
        ) {
            return self.items_of(iterator).map(Some);
        }
        // All items now, as a consumer taking them at once does: only if `__next__` changes
        // nothing but what `__iter__` just made (the iterator's own position).
        let floor = self.effects_floor.min(made_from);
        let outer = std::mem::replace(&mut self.effects_floor, floor);
        let items = self.without_effects("an iterator's __next__", |t| t.take_all(iterator));
        self.effects_floor = outer;
        items.map(Some)
    }

    /// Items of a real container: nn.Module containers and dict views, with sources.
    fn object_items(&mut self, id: VarId, obj: &Bound<'py, PyAny>) -> CResult<Vec<VarId>> {
        let py = self.py;
        let source = self.source(id);
        let type_name = obj.get_type().name()?.to_string();
        let is_module_dict = obj.is_instance(&self.h.module_dict)?;
        if is_module_dict || obj.is_instance(&self.h.module_sequences)? {
            // Iterating a module container reads its `_modules`: wrapped from its source, the
            // keys are guarded (a module appended later recompiles) and each child by
            // identity.
            let modules = obj.getattr("_modules")?;
            let modules_source = source.map(|s| Rc::new(Source::Attr(s, "_modules".into())));
            // A dict subclass too (`ModuleList.pop` leaves an OrderedDict).
            let Ok(modules) = modules.cast::<PyDict>() else {
                return unsupported(
                    BreakKind::UnsupportedOperation,
                    "a module container whose _modules is not a dict",
                );
            };
            // Already reached by the trace (perhaps changed: `m._modules["0"] = other`): what
            // its tracker holds.
            let tracked = self
                .container_by_object
                .get(&(modules.as_ptr() as usize))
                .map(|&(tracker, _)| tracker);
            let entries = match tracked.map(|t| self.kind(t)) {
                Some(VarKind::Dict(entries)) => entries.clone(),
                _ => self.dict_entries(modules, modules_source.as_ref())?,
            };
            return Ok(entries
                .into_iter()
                .map(|(key, child)| {
                    if is_module_dict {
                        self.add(VarKind::Const(key), None)
                    } else {
                        child
                    }
                })
                .collect());
        }
        // (A read-only view made while tracing — `inspect.signature(f).parameters` — is
        // what it was made from; one reached from a source, a class's `__dict__`, is not
        // guarded by its keys.)
        let fresh_mapping_proxy = type_name == "mappingproxy" && source.is_none();
        if fresh_mapping_proxy
            || matches!(
                type_name.as_str(),
                "odict_values"
                    | "dict_values"
                    | "dict_keys"
                    | "odict_keys"
                    | "dict_items"
                    | "odict_items"
            )
        {
            let mut out = Vec::new();
            for item in obj.try_iter()? {
                out.push(self.wrap(&item?, None)?);
            }
            return Ok(out);
        }
        if obj.is_exact_instance_of::<pyo3::types::PyFrozenSet>() {
            // A frozenset (a constant of the code, or reached by a guarded source) never
            // changes; its order is fixed for the life of the process. Only constants are
            // taken as items: anything else would need a source of its own.
            let mut out = Vec::new();
            for item in obj.try_iter()? {
                let item = item?;
                if !self.h.is_constant(&item)? {
                    return unsupported(
                        BreakKind::UnsupportedOperation,
                        format!("iterating over a frozenset holding {}", describe(&item)),
                    );
                }
                out.push(self.constant(&item));
            }
            return Ok(out);
        }
        // A dict subclass that keeps dict's `__iter__` and `keys` (`class Config(dict)`):
        // iterating it is iterating its keys, read as `keys()` reads them (guarded).
        let dict_type = &self.h.dict_type;
        if obj.is_instance(dict_type)? && !obj.get_type().is(dict_type) {
            let ty = obj.get_type();
            let keeps = |name: &str| -> PyResult<bool> {
                Ok(ty.getattr(name)?.is(dict_type.getattr(name)?))
            };
            if keeps("__iter__")? && keeps("keys")? {
                let keys = self.get_attr(id, "keys")?;
                let view = self.call_function(keys, Vec::new(), Vec::new())?;
                return self.items_of(view);
            }
        }
        let _ = py;
        if let Some(items) = self.sequence_items(id, &obj.get_type().into_any())? {
            return Ok(items);
        }
        if let Some(items) = self.python_iter_items(id, &obj.get_type().into_any())? {
            return Ok(items);
        }
        unsupported(
            BreakKind::UnsupportedOperation,
            format!("iterating over {}", describe(obj)),
        )
    }
}
