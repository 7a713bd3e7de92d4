//! Variable trackers: what the translator knows about each value on its stacks and in its
//! locals. Tensors are symbolic (a graph node and its fake value); everything else is known
//! at trace time, either as a real Python object or as a container of other trackers.

use std::cell::RefCell;
use std::rc::Rc;

use super::graph::NodeId;
use super::source::Source;
use crate::eval_frame::owned::OwnedRef;
use pyo3::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VarId(pub u32);

/// A closure cell as the translator sees it: a real cell of a function defined outside the
/// trace, or a cell created inside it (shared by the frame and the functions it makes).
#[derive(Clone, Debug)]
pub enum Cell {
    /// A real cell, with the cell's own source when the function it belongs to has one (its
    /// contents are then read through it, so a new closure of the same code is read afresh).
    Real(OwnedRef, Option<Rc<Source>>),
    Traced(Rc<RefCell<Option<VarId>>>),
}

/// A container an iterator reads (see `VarKind::Iter`), with its contents when the iterator
/// was made (`Tracer::contents_fingerprint`). `positional`: the iterator's n-th item is the
/// container's n-th (`for x in lst`, `enumerate(d.items())`), so a change to items it has
/// already passed is one Python's iterator would not see either.
#[derive(Debug, Clone)]
pub struct Watched {
    pub container: VarId,
    pub then: Vec<usize>,
    pub positional: bool,
    /// `reversed(list)`: the list's length when the iterator was made. Python's reversed
    /// list iterator reads position `len - 1 - n` of the list as it is at step `n` (items
    /// appended meanwhile are not seen, a list shrunk below the position ends it).
    pub reversed_len: Option<usize>,
}

#[derive(Debug)]
pub enum VarKind {
    /// A tensor computed by the graph (or a graph input).
    Tensor {
        node: NodeId,
        fake: OwnedRef,
    },
    /// A Python int, float or bool computed from symbolic sizes (`x.shape[0]` of an input
    /// with a dynamic dimension, arithmetic on it): a graph node whose fake value is a torch
    /// `SymInt`/`SymFloat`/`SymBool`. Used as a Python value it is specialised (torch's
    /// ShapeEnv records the guard); passed to graph operations it stays symbolic.
    Symbolic {
        node: NodeId,
        fake: OwnedRef,
    },
    /// `slice(start, stop, step)` with a symbolic bound (`x[:, :n]` where n is a symbolic
    /// size): indexing a tensor with it stays symbolic; anywhere else it is specialised.
    Slice(Vec<VarId>),
    /// A tensor inside a tuple among the frame's arguments (`out, _ = self.lstm(x)` hands a
    /// resume function the LSTM's `(output, (h, c))`), not yet a graph input: it becomes one
    /// when the trace first uses it (`Tracer::realize`), as TorchDynamo realises its inputs
    /// lazily. One that is only moved between the stack and locals, stored in a dead local or
    /// returned, never costs a placeholder, a fake tensor or a guard (see `lazy_inputs`).
    Unrealized(OwnedRef),
    /// An immutable Python value: None, bools, numbers, strings, dtypes, devices, sizes,
    /// slices, ranges and tuples of those.
    Const(OwnedRef),
    /// Any other real Python object: functions, classes, modules, nn.Modules, objects.
    Object(OwnedRef),
    Tuple(Vec<VarId>),
    List(Vec<VarId>),
    /// Keys are constants, in insertion order.
    Dict(Vec<(OwnedRef, VarId)>),
    /// `d.keys()`, `d.values()` or `d.items()` of a dict tracker: live, like Python's views,
    /// so a store into `d` after the view was taken shows through it.
    DictView {
        dict: VarId,
        which: DictViewKind,
    },
    /// The NULL that `PUSH_NULL` and `LOAD_GLOBAL` put below a callable.
    Null,
    /// `receiver.name`, a method of a tracked value (a tensor method, or a Python method
    /// whose `self` must stay the tracked receiver).
    Method {
        receiver: VarId,
        name: String,
        func: Option<OwnedRef>,
    },
    /// An iterator over known items, taken when it was made. Python's iterators over lists
    /// and dicts read their container live, so `watched` holds each container it reads
    /// with its contents then: if one changes while the iterator is in use, the trace gives
    /// up rather than answer from the old contents (see `Tracer::iter_advance`).
    Iter {
        items: Vec<VarId>,
        next: usize,
        watched: Vec<Watched>,
        /// Its items were taken by an `enumerate()` or `zip()` made over it, which in Python
        /// pull them one by one later: using it directly afterwards is refused, as how far
        /// it got is not known here.
        handed_on: bool,
        /// It has answered "no more items" once: a list iterator then stays exhausted even
        /// if its list grows.
        exhausted: bool,
    },
    /// A generator object made by calling a generator function in the trace. Its frame
    /// (`Tracer::generators[frame]`) runs only when an item is asked for — `next()`, a `for`
    /// loop, `yield from` — as in Python, so its body and its consumer interleave in their
    /// real order (`contextlib.contextmanager` runs up to its `yield` on entering, the rest
    /// on leaving). A consumer that takes every item at once runs it to the end then.
    Generator {
        frame: usize,
    },
    /// An iterator made as its items are asked for, where taking them all when it is made
    /// would be wrong: over a generator the trace runs lazily, or endless (see `LazyIter`).
    Lazy(LazyIter),
    /// A function made by `MAKE_FUNCTION` inside the trace.
    Function(Rc<TracedFunction>),
    /// `functools.partial(func, *args, **kwargs)` made inside the trace: calling it calls
    /// `func` with `args` first and `kwargs` as defaults.
    Partial {
        func: VarId,
        args: Vec<VarId>,
        kwargs: Vec<(String, VarId)>,
    },
    /// A closure cell pushed by `LOAD_CLOSURE`.
    CellRef(Cell),
    /// `super()` inside a method: attribute lookups start after `cls` in the receiver's MRO.
    Super {
        cls: OwnedRef,
        receiver: VarId,
    },
    /// An instance of a user class created inside the trace: its attributes are trackers,
    /// its methods come from the class. If it escapes, the transformed code builds it.
    /// `model_output` marks transformers' `ModelOutput` dataclasses, which are rebuilt by
    /// calling the class with their fields.
    Instance {
        cls: OwnedRef,
        attrs: Vec<(String, VarId)>,
        model_output: bool,
    },
    /// A context manager modelled through grad mode (`torch.no_grad()`, `enable_grad()`,
    /// `set_grad_enabled(mode)`, `contextlib.nullcontext()`, a disabled autocast): what
    /// entering it does to the mode.
    GradModeContext {
        on_enter: GradModeEntry,
    },
    /// A function decorated by a grad-mode context (`@torch.no_grad()` on a function made in
    /// the trace): calling it calls `func` with the mode set as entering would, then restores
    /// the mode.
    GradModeWrapped {
        on_enter: GradModeEntry,
        func: VarId,
    },
    /// The `__exit__` of an entered grad-mode context: restores `previous`.
    GradModeExit {
        previous: bool,
    },
    /// `torch.autocast(...)`, `torch.inference_mode(...)` or `sdpa_kernel(...)` made in the
    /// trace, or the `__exit__` of one it entered (see
    /// `ops_state_context`).
    StateContext(StateContextVar),
    /// A NumPy array the trace made from a tensor (`x.numpy()`, `np.*` of such arrays): the
    /// tensor tracker that holds its values (see `ops_numpy`).
    NdArray(VarId),
}

/// A [`VarKind::StateContext`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateContextVar {
    /// Made, not entered: `Tracer::state_specs[spec]` holds its arguments.
    Context { spec: usize },
    /// The `__exit__` of the block entered from `Tracer::state_specs[spec]`.
    Exit { spec: usize },
}

/// What a `VarKind::Lazy` iterator computes its next item from (see `ops_lazy_iter`).
#[derive(Clone, Debug)]
pub enum LazyIter {
    /// `itertools.count(start, step)`: `next` then `next + step`, ... (numbers).
    Count { next: OwnedRef, step: OwnedRef },
    /// `itertools.repeat(item)`: the same item forever.
    Repeat { item: VarId },
    /// `zip(*iterators)`: one item of each, in order, until one is exhausted.
    Zip { iterators: Vec<VarId> },
    /// `enumerate(iterator, start)`: `(index, item)`.
    Enumerate { iterator: VarId, index: i64 },
    /// `map(func, *iterators)`: `func` called on one item of each.
    Map { func: VarId, iterators: Vec<VarId> },
    /// `itertools.groupby(items, key)`: `(key, group)` pairs, the groups (iterators over
    /// runs of items with equal keys) computed when it was made. Moving on empties the
    /// group handed out before, as Python's shared underlying iterator does.
    GroupBy {
        groups: Vec<(VarId, VarId)>,
        next: usize,
    },
    /// What a Python-written `__iter__` returned, whose class defines `__next__` in Python
    /// (an iterator class of the user's, often the container itself): each item is its
    /// `__next__()`, traced; a StopIteration raised there (traced) ends it.
    Protocol { iterator: VarId },
}

/// `d[key] = value` on a dict tracker's entries, as Python does it: an existing (equal) key
/// keeps its place and takes the new value, a new key goes last.
pub fn dict_set(
    py: pyo3::Python<'_>,
    entries: &mut Vec<(OwnedRef, VarId)>,
    key: OwnedRef,
    value: VarId,
) {
    let existing = entries
        .iter_mut()
        .find(|(k, _)| k.bind(py).eq(key.bind(py)).unwrap_or(false));
    match existing {
        Some(slot) => slot.1 = value,
        None => entries.push((key, value)),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DictViewKind {
    Keys,
    Values,
    Items,
}

impl DictViewKind {
    /// The dict method that makes this view.
    pub fn method(self) -> &'static str {
        match self {
            DictViewKind::Keys => "keys",
            DictViewKind::Values => "values",
            DictViewKind::Items => "items",
        }
    }
}

#[derive(Debug)]
pub struct TracedFunction {
    pub code: OwnedRef,
    pub globals: OwnedRef,
    pub builtins: OwnedRef,
    pub defaults: Option<VarId>,
    pub kwdefaults: Option<VarId>,
    pub closure: Vec<Cell>,
}

#[derive(Debug)]
pub struct Var {
    pub kind: VarKind,
    pub source: Option<Rc<Source>>,
    /// An object from a source that is guarded by what the trace reads of it (its type, its
    /// attributes, a function's code and closure), not by identity: a new object of the same
    /// kind each call (a cache object, a closure) reuses the compiled code. Where the trace
    /// depends on which object it is (`is`, a trace-time call given the object), its identity
    /// is guarded after all (`Tracer::pin_identity`).
    pub identity_pending: bool,
    /// A constant read as an item of a list, tuple, dict or deque wrapped whole: the guard
    /// that fixes its value is added only once the trace looks at it (`Tracer::kind`), so
    /// items the code never reads — a step counter or a file name in a batch dict — do not
    /// recompile when they change (TorchDynamo's lazily wrapped items).
    pub pending_guard: Option<(std::rc::Rc<super::source::Source>, super::guards::GuardKind)>,
    /// `pending_guard` was asked for (recorded in `Tracer::pins`, applied by `apply_pins`).
    pub observed: std::cell::Cell<bool>,
}

/// What entering a [`VarKind::GradModeContext`] does; leaving restores the mode it found
/// (or, for `AlreadySet`, the mode before the context was made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradModeEntry {
    /// `torch.no_grad()` / `torch.enable_grad()`: sets the mode.
    Set(bool),
    /// `contextlib.nullcontext()`, a disabled autocast: changes nothing.
    Keep,
    /// `torch.set_grad_enabled(mode)`: making it already set the mode (as in eager, where
    /// the call alone switches it); `previous` is what leaving the block restores.
    AlreadySet { previous: bool },
}
