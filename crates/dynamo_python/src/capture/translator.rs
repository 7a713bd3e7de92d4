//! The instruction translator: runs a frame's bytecode over variable trackers instead of
//! values. Tensor operations become graph nodes (their metadata from torch's
//! `FakeTensorMode`); everything else is evaluated at trace time on real objects, with a
//! guard on every value the trace read. User functions and `nn.Module.forward` are inlined
//! by translating their code in a nested frame.
//!
//! One opcode family per file (`ops_*.rs`); [`Tracer::step`] is the single exhaustive match
//! that dispatches them, so an opcode without a handler is a compile error, and an opcode we
//! do not trace yet is an explicit "unsupported" that sends the frame back to eager.

use super::break_reasons::{Break, BreakKind};
use std::collections::HashMap;
use std::rc::Rc;

use crate::imports::ImportModule;
use dynamo_bytecode::{Instruction, Opcode};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

pub use super::frame_state::{frame_state, FrameState};
use super::graph::{Graph, NodeId};
use super::guards::{GuardKind, GuardSet};
use super::helpers::Helpers;
use super::source::{ItemKey, Source};
use super::vars::{Var, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// Why a frame cannot be captured: a reason and where in the user's source.
#[derive(Debug)]
pub enum CaptureError {
    Unsupported(Break),
    Python(PyErr),
    /// The trace reached the root instruction it was asked to stop before (the graph break
    /// it splits the frame at); the frame state is as it was right before that instruction.
    BreakPoint,
}

impl From<std::convert::Infallible> for CaptureError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl From<PyErr> for CaptureError {
    fn from(err: PyErr) -> Self {
        CaptureError::Python(err)
    }
}

pub type CResult<T> = Result<T, CaptureError>;

/// Gives up on the frame: a graph break of `kind`, `detail` saying what exactly.
pub fn unsupported<T>(kind: BreakKind, detail: impl Into<String>) -> CResult<T> {
    Err(CaptureError::Unsupported(Break::new(kind, detail)))
}

/// Deepest inlining before we give up (runaway recursion in traced code).
const MAX_INLINE_DEPTH: usize = 64;
/// How deeply nested lists, tuples, dicts and deques handed to the trace may be (real
/// nestings are a handful deep; the limit keeps the stack of `wrap` bounded).
const MAX_CONTAINER_NESTING: usize = 100;

#[derive(Debug)]
pub enum Flow {
    Continue,
    Return(VarId),
    /// A generator run lazily yielded this value (see `FrameState::suspends`).
    Yield(VarId),
}

/// A graph input: the placeholder node and where the transformed code loads it from.
#[derive(Debug)]
pub struct GraphInput {
    pub node: NodeId,
    pub source: Rc<Source>,
    pub example: OwnedRef,
}

/// An inlined frame a failed trace unwound through (see `Tracer::unwound`).
#[derive(Debug)]
pub struct UnwoundFrame {
    pub code: OwnedRef,
    /// The instruction it was at: the failing one, or the call into the next frame.
    pub index: usize,
    /// Its depth in `location_stack`.
    pub depth: usize,
    /// The object its first argument held (`self` of a method), if one: the same code run
    /// for another object (the next layer of a stack, only some of which break) need not
    /// fail where this one did.
    pub receiver: Option<OwnedRef>,
}

pub struct Tracer<'py> {
    pub py: Python<'py>,
    pub h: Rc<Helpers<'py>>,
    pub vars: Vec<Var>,
    pub graph: Graph,
    pub fake_mode: Bound<'py, PyAny>,
    pub inputs: Vec<GraphInput>,
    /// Graph inputs by source name, so each source is one placeholder.
    /// Graph inputs by interned source (see `guards::SourceTable`).
    pub(super) input_by_source: HashMap<u32, VarId>,
    /// Parameter layouts of inlined code objects, by address (the code is kept alive).
    pub parameter_cache: HashMap<usize, (OwnedRef, Rc<dynamo_bytecode::binding::Parameters>)>,
    pub guards: GuardSet,
    pub depth: usize,
    /// `file:line` of each frame being translated, innermost last, for messages.
    /// The frames being translated, innermost last: (qualname, filename, current line).
    /// Only the line changes per instruction; the text is made when an error needs it.
    pub location_stack: Vec<(Rc<str>, Rc<str>, u32)>,
    /// Inlined frames a failure unwound through, innermost first: their code, the
    /// instruction each was at (the failing one, or the call into the next), when the frame
    /// could be split there as a root, and its depth in `location_stack`. The frame hook
    /// calls those functions next as frames of their own, which then fail at the same place
    /// (see `Converter::split_hints`).
    pub unwound: Vec<UnwoundFrame>,
    /// Whether the trace stopped at `stop_at`.
    pub reached_stop: bool,
    /// Whether the instruction being translated is covered by an exception handler of its
    /// own frame.
    pub in_try: bool,
    /// Whether it runs inside a call made from a `try` block of a frame it was inlined from.
    pub in_outer_try: bool,
    /// Whether a graph of this frame may hold operations from inside `try` blocks: the
    /// generated code then runs the frame's original code eagerly when the graph raises
    /// (see `CodeGen::call_graph`), so the handlers see the exception as in eager. Off for
    /// generators and coroutines (their code cannot be run again as a call).
    pub rerun_on_error: bool,
    /// Whether the graph holds an operation from inside a `try` block (of any frame).
    pub graph_ops_in_try: bool,
    /// Whether it holds one from inside a `try` block of the operation's own frame.
    pub graph_ops_in_own_try: bool,
    /// The first graph operation that changes state a second run would see changed (an
    /// in-place operation, the random generator, running statistics): running the frame
    /// again after such a graph raised would apply it twice, so a graph with one is not run
    /// again (see `graph_call` for what that means for operations inside `try` blocks).
    pub state_changing_op: Option<String>,
    /// The graph draws random numbers from the default generators (see `StateChange`): a
    /// rerun after it raised restores them first.
    pub draws_random: bool,
    /// Grad mode as the traced code sees it (changed by grad-mode `with` blocks).
    pub grad_enabled: bool,
    /// Tensors made in the trace and turned into leaves that need gradients with grad mode
    /// off (`ops_tensor_method`, `requires_grad_`): their nodes. The graph refuses to use
    /// one with grad mode on or to hand one out.
    pub no_grad_leaves: Vec<super::graph::NodeId>,
    /// The exceptions being handled by `except` blocks the trace is inside, innermost last,
    /// across inlined frames (Python's per-thread stack that `sys.exc_info()` reads).
    pub handled_exceptions: Vec<VarId>,
    /// Torch's global settings as the frame was called: the guard's self-check runs in them.
    pub(super) entry_state: Option<super::global_state::SavedGlobalState<'py>>,
    /// Field names of tuples that came from named tuples (`torch.topk(...).values`).
    pub tuple_fields: HashMap<VarId, Vec<String>>,
    /// The class of those tuples (a `torch.return_types` struct sequence, a `namedtuple`):
    /// `type()`, `isinstance()` and the rebuilt value are of it.
    pub tuple_classes: HashMap<VarId, OwnedRef>,
    /// Attribute stores on objects that existed before the call, in order; the transformed
    /// code replays the last value of each after running the graph.
    pub mutations: Vec<Mutation>,
    /// Objects whose identity the trace came to depend on (see `pin_identity`).
    pub pins: std::cell::RefCell<Vec<VarId>>,
    /// Trackers with a pending guard the trace looked at (see `Var::pending_guard`).
    pending_reads: std::cell::RefCell<Vec<VarId>>,
    /// The next `wrap` is of an item of a container wrapped whole: a constant's guard is left
    /// pending (`Var::pending_guard`). Taken (reset) by each `wrap`.
    pub(super) item_of_container: bool,
    /// Every value on the stack after each instruction counts as looked at (its pending
    /// guard is added): while tracing code whose effect is then had by running it for real
    /// (a module's `__init__` in `construct_module`), a value it only moves still decided
    /// what the real run made.
    pub observe_every_value: bool,
    /// The root instruction to stop before (a graph break found by an earlier trace).
    pub stop_at: Option<usize>,
    /// The class of each dict made in the trace that is not a plain `dict`
    /// (`collections.OrderedDict`): it behaves as a dict while tracing and is rebuilt, compared
    /// and type-checked as its class.
    pub dict_classes: HashMap<VarId, OwnedRef>,
    /// The user class of a traced list that has one (see `ops_list_subclass`).
    pub list_classes: HashMap<VarId, OwnedRef>,
    /// Fields of a ModelOutput made in the trace set as attributes only, not items (a None
    /// field given a value by `out.name = v`; see `model_output_store`).
    pub model_output_attribute_only: HashMap<VarId, Vec<String>>,
    /// The default factory of each `collections.defaultdict` the trace made (its class is
    /// in `dict_classes`).
    pub dict_defaults: HashMap<VarId, VarId>,
    /// Lists, dicts and sets that existed before the call (read from a source), by object address:
    /// one tracker per object however it is reached, so a change made through one name
    /// shows through every other. The trace may change them; the generated code then
    /// replays their final contents (see `written_containers`).
    /// The objects are kept alive while tracing, so an address cannot come back for
    /// another object (a property that makes a new list on every read).
    pub container_by_object: HashMap<usize, (VarId, OwnedRef)>,
    /// Every (source, object class) such a container was reached through; the classes
    /// number the distinct objects. Guarded (`GuardKind::SameObjectClass`) when the trace
    /// changed one of them or reached one through two sources.
    pub container_sources: Vec<(Rc<Source>, usize)>,
    /// Whether some existing list or dict was reached through two different sources.
    pub containers_shared: bool,
    /// Objects compared with `is` (read from two sources, guarded by what the trace reads
    /// rather than identity): (source, object class, object address), the classes numbering
    /// the distinct objects from `IDENTITY_CLASSES` on; guarded as `GuardKind::SameObjectClass`, so the
    /// answer holds for new objects in the same arrangement (see `is_between_sources`).
    pub identity_sources: Vec<(Rc<Source>, usize, usize)>,
    /// Existing lists, dicts and sets the trace changed, in the order of their first change.
    pub written_containers: Vec<VarId>,
    /// How many entries each dict tracker has lost (`del`, `pop`, reordering): part of a
    /// dict's fingerprint, so an iterator sees a key deleted and added again (same length,
    /// same order), which Python's dict iterator does not let pass.
    pub dict_removals: HashMap<VarId, usize>,
    /// Builtin methods read from a tracked object (`g.manual_seed` of a `torch.Generator`
    /// local): the receiver and the name, so a break that hands one on looks it up again on
    /// the receiver, as the original's `LOAD_METHOD` did (the bound method itself is a new
    /// object on every read, and bound to this call's receiver).
    pub bound_builtin_receivers: HashMap<VarId, (VarId, String)>,
    /// Sets the trace made, by object address (kept alive): see `ops_sets`.
    pub fresh_sets: HashMap<usize, (VarId, OwnedRef)>,
    /// Existing sets the trace changes, by the address of the real set: the copy that
    /// stands for it while tracing (see `ops_sets::set_standing_for`).
    pub set_copies: HashMap<usize, OwnedRef>,
    /// Deques the trace made, by object address (kept alive): see `ops_deque`.
    pub fresh_deques: HashMap<usize, (VarId, OwnedRef)>,
    /// Stand-ins for tensors held by sets and dicts the trace made (they hold a tensor by
    /// identity, as Python's do): the key object of each tensor — by graph node, which is
    /// what `is` compares (the same tensor passed twice, `x.contiguous()` of a contiguous
    /// `x`, `x.add_(1)` are one node) — and, in `key_tensors`, back to a tracker of it.
    pub tensor_keys: HashMap<super::ops_sets::StandIn, OwnedRef>,
    /// The bound `__exit__` of each user context manager entered by the trace: see
    /// `ops_with::user_context_enter`.
    pub with_exits: std::collections::HashSet<VarId>,
    /// Iterators over what a generator the trace made yielded, run ahead (in a trace that
    /// stops at a graph break): `isinstance(it, types.GeneratorType)` still holds of them.
    pub generators_run_ahead: std::collections::HashSet<VarId>,
    /// The trace stopped at a call that reads the calling frame (`eval`, `exec`,
    /// `sys._getframe`): a split there hands that call the frame's locals as the original
    /// code has them (see `ops_frame_locals`).
    pub frame_read_break: bool,
    /// The next body `trace_body` traces may draw random numbers: a checkpointed function,
    /// whose recomputation restores the random generators' state first (see
    /// `ops_checkpoint`). Taken (reset) by `trace_body`.
    pub random_in_next_body: bool,
    /// See `Converter::random_recompute`.
    pub random_recompute: bool,
    /// The frames of the generators the trace made (see `VarKind::Generator`).
    pub generators: Vec<super::ops_generators::GeneratorFrame<'py>>,
    /// The cells of the compiled frame's own cell variables, by address: a function made in
    /// the trace that closes over one shares it with the frame (see `rebuild`).
    /// The compiled frame's cells, by address, with their slot when the frame's prologue
    /// makes them (so the generated code has them too; see `op_make_cell`).
    pub root_cells: HashMap<usize, Option<u32>>,
    /// Cells standing for free variables of the compiled frame (its closure's cells, which
    /// the code that made the closure shares), by address, with the frame's slot: made
    /// when the frame passes one on (`LOAD_CLOSURE`, a comprehension or nested function
    /// reading it). Stores through them are replayed into the frame's real cell.
    pub root_free_cells: HashMap<usize, u32>,
    pub key_tensors: HashMap<usize, VarId>,
    /// Objects in sets the trace made that stand there without their identity guarded, by
    /// address: what `in` and `add` answer depends only on which of them are one object
    /// (guarded through `identity_sources`); anything that sees the objects themselves —
    /// iterating the set, handing it on — pins them (see `ops_sets::identity_member`).
    pub identity_members: HashMap<usize, VarId>,
    /// Objects only the trace can reach (deep copies made while tracing), by address (kept
    /// alive): see `ops_copy`.
    pub private_objects: HashMap<usize, OwnedRef>,
    /// How to make again each module made in `forward` that nothing changed since: (class,
    /// positional, keyword arguments), by the module's address (see `ops_module_new`).
    pub private_recipes: HashMap<usize, (OwnedRef, OwnedRef, OwnedRef)>,
    /// List trackers that are slices of module containers (see `ops_module_slice`).
    pub module_slices: HashMap<VarId, super::ops_module_slice::ModuleSlice>,
    /// Each `torch.autocast(...)`, `inference_mode(...)`, `sdpa_kernel(...)` the trace made
    /// or was given (see `ops_state_context`).
    pub state_specs: Vec<super::ops_state_context::StateSpec>,
    /// The blocks of those entered and not left, innermost last.
    pub open_states: Vec<super::ops_state_context::OpenStateContext>,
    /// The exception of the instruction that just failed, when the traced code raised it
    /// (see `ops_exceptions`).
    pub raised: Option<OwnedRef>,
    /// Whether the trace entered a handler of the compiled frame itself.
    pub caught_in_root: bool,
    /// Stores to free variables of the compiled frame, in order: (slot, value).
    pub deref_stores: Vec<(u32, VarId)>,
    /// Changes the trace has made to Python state (containers, attributes, globals, cells,
    /// sets), counted: a generator run ahead of its consumer must make none.
    pub effects: u64,
    /// Trackers numbered from here on were made by the generator being run ahead: changes
    /// to them stay inside it and are not counted in `effects`.
    pub effects_floor: u32,
    /// Trackers of the lists and dicts read from private objects (not to be changed).
    pub private_containers: std::collections::HashSet<VarId>,
    /// While wrapping a value read from a class or a Python module: its floats (and those of
    /// what it holds) stay constants, never symbolic (see `wrap`).
    pub static_floats: bool,
    /// The same for ints, while wrapping a value read through a module (see `wrap`).
    pub static_ints: bool,
    /// An optimizer's param groups whose `capturable` entry the trace reads as True (see
    /// `ops_optimizer`): not to be changed.
    pub capturable_groups: std::collections::HashSet<VarId>,
    /// Values read through an `nn.Module`'s attributes (`self.config`, and what is read
    /// from those in turn): their int attributes stay specialised, as TorchDynamo keeps ints
    /// read through modules (`allow_unspec_int_on_nn_module` off).
    pub module_reached: std::collections::HashSet<VarId>,
    /// While the frame's arguments are wrapped: the tensors in tuples among them are left
    /// unrealized (`VarKind::Unrealized`, see `lazy_inputs`). Taken (reset) by each `wrap`.
    pub lazy_tuple_items: bool,
    /// The lists, tuples, dicts and deques whose items `wrap` is wrapping, outermost first
    /// (by address): a cycle or too deep a nesting is a graph break, not a stack overflow.
    containers_being_wrapped: Vec<usize>,
    /// Some tracker is `VarKind::Unrealized` (the stack is checked before each instruction).
    pub has_unrealized: bool,
    /// `obj.__dict__` of each instance made in the trace whose `__dict__` was read: a dict
    /// tracker kept equal to the instance's attributes (stores and deletes update both; the
    /// dict itself may not be changed, and it is not rebuilt after the graph).
    pub instance_dicts: HashMap<VarId, VarId>,
    /// What the trace stored on functions it made (`functools.wraps`), by function tracker.
    pub function_attrs: super::ops_function_attrs::FunctionAttrTable,
    /// `STORE_GLOBAL`s, in order: (the globals dict, name, value). Later loads of the name
    /// see the value; the generated code replays the last store to each name.
    pub global_stores: Vec<(OwnedRef, String, VarId)>,
    /// The compiled frame's code object: what automatic dynamic shapes remember sizes by.
    pub root_code: Option<OwnedRef>,
    /// `dynamic=` of `dynamo_rs.compile` (None: automatic).
    pub dynamic: Option<bool>,
    /// Graph inputs with symbolic sizes or strides, in graph-input order.
    pub dynamic_inputs: Vec<DynamicInput>,
    /// (shape guards recorded so far, where): noted each time the trace specialised a
    /// symbolic value, so a specialised `mark_dynamic` dimension can name its line.
    pub specializations: std::cell::RefCell<Vec<(usize, String)>>,
    /// Graph nodes made by traces whose result was not used (see `ops_autograd`): dropped
    /// from the graph unless a kept node refers to them.
    pub discarded_nodes: Vec<std::ops::Range<usize>>,
    /// The subgraphs of nested compile regions made so far, by fingerprint: an identical
    /// region called again calls the same subgraph (see `ops_compile_region`).
    pub compile_regions: Vec<(String, String, OwnedRef)>,
    /// Modules (by address) whose buffer this trace replaced through `Module.__setattr__`
    /// (replayed after the graph): their `_buffers` dict is not read in the same trace.
    pub buffer_stores: std::collections::HashSet<usize>,
}

/// A graph input whose fake has symbolic sizes or strides.
#[derive(Debug)]
pub struct DynamicInput {
    pub source: Rc<Source>,
    pub fake: OwnedRef,
    /// The dimensions the user marked dynamic (a list), or None.
    pub user_marks: OwnedRef,
}

/// `obj.name = value` on an object from a source.
#[derive(Debug)]
pub struct Mutation {
    pub source: Rc<Source>,
    pub object: OwnedRef,
    pub name: String,
    pub value: Option<VarId>,
}

impl std::fmt::Debug for Tracer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tracer({} vars, {} nodes)",
            self.vars.len(),
            self.graph.nodes.len()
        )
    }
}

impl Drop for Tracer<'_> {
    /// The fake mode may outlive the tracer (a backend's compiled code can hold it), but what
    /// it remembers about real tensors must not: see `_capture.release_real_tensor_memos`
    /// (a crash in CPython's weak-reference clearing otherwise).
    fn drop(&mut self) {
        self.restore_global_state();
        if let Err(err) = self.h.release_real_tensor_memos.call1((&self.fake_mode,)) {
            err.write_unraisable(self.py, Some(&self.fake_mode));
        }
    }
}

impl<'py> Tracer<'py> {
    pub fn new(py: Python<'py>, h: Helpers<'py>) -> PyResult<Tracer<'py>> {
        let h = Rc::new(h);
        let fake_mode = h.new_fake_mode.call0()?;
        Ok(Tracer {
            py,
            h,
            vars: Vec::new(),
            graph: Graph::default(),
            fake_mode,
            inputs: Vec::new(),
            input_by_source: HashMap::new(),
            parameter_cache: HashMap::new(),
            guards: GuardSet::default(),
            depth: 0,
            location_stack: Vec::new(),
            unwound: Vec::new(),
            reached_stop: false,
            in_try: false,
            in_outer_try: false,
            rerun_on_error: false,
            graph_ops_in_try: false,
            graph_ops_in_own_try: false,
            state_changing_op: None,
            draws_random: false,
            grad_enabled: true,
            no_grad_leaves: Vec::new(),
            handled_exceptions: Vec::new(),
            entry_state: None,
            tuple_fields: HashMap::new(),
            tuple_classes: HashMap::new(),
            mutations: Vec::new(),
            pins: std::cell::RefCell::new(Vec::new()),
            pending_reads: std::cell::RefCell::new(Vec::new()),
            item_of_container: false,
            observe_every_value: false,
            stop_at: None,
            dict_classes: HashMap::new(),
            list_classes: HashMap::new(),
            model_output_attribute_only: HashMap::new(),
            dict_defaults: HashMap::new(),
            container_by_object: HashMap::new(),
            container_sources: Vec::new(),
            containers_shared: false,
            identity_sources: Vec::new(),
            written_containers: Vec::new(),
            dict_removals: HashMap::new(),
            bound_builtin_receivers: HashMap::new(),
            fresh_sets: HashMap::new(),
            set_copies: HashMap::new(),
            fresh_deques: HashMap::new(),
            tensor_keys: HashMap::new(),
            with_exits: std::collections::HashSet::new(),
            generators: Vec::new(),
            root_cells: HashMap::new(),
            root_free_cells: HashMap::new(),
            key_tensors: HashMap::new(),
            identity_members: HashMap::new(),
            private_objects: HashMap::new(),
            private_recipes: HashMap::new(),
            module_slices: HashMap::new(),
            state_specs: Vec::new(),
            open_states: Vec::new(),
            raised: None,
            caught_in_root: false,
            deref_stores: Vec::new(),
            effects: 0,
            effects_floor: u32::MAX,
            private_containers: Default::default(),
            capturable_groups: Default::default(),
            generators_run_ahead: Default::default(),
            frame_read_break: false,
            random_in_next_body: false,
            random_recompute: false,
            static_floats: false,
            static_ints: false,
            module_reached: Default::default(),
            lazy_tuple_items: false,
            containers_being_wrapped: Vec::new(),
            has_unrealized: false,
            instance_dicts: HashMap::new(),
            function_attrs: HashMap::new(),
            global_stores: Vec::new(),
            root_code: None,
            dynamic: None,
            dynamic_inputs: Vec::new(),
            specializations: Default::default(),
            discarded_nodes: Vec::new(),
            compile_regions: Vec::new(),
            buffer_stores: Default::default(),
        })
    }

    pub fn add(&mut self, kind: VarKind, source: Option<Rc<Source>>) -> VarId {
        self.vars.push(Var {
            kind,
            source,
            identity_pending: false,
            pending_guard: None,
            observed: std::cell::Cell::new(false),
        });
        VarId(self.vars.len() as u32 - 1)
    }

    /// The trace depends on which object `id` is: guard its identity (see
    /// `Var::identity_pending`). Callable from `&self` paths: recorded, applied by
    /// [`Tracer::apply_pins`].
    pub fn pin_identity(&self, id: VarId) {
        if self.vars[id.0 as usize].identity_pending {
            self.pins.borrow_mut().push(id);
        }
    }

    /// Adds the identity guards asked for by `pin_identity`.
    pub fn apply_pins(&mut self) {
        let pins = std::mem::take(&mut *self.pins.borrow_mut());
        for id in pins {
            let var = &mut self.vars[id.0 as usize];
            if !var.identity_pending {
                continue;
            }
            var.identity_pending = false;
            if let (Some(source), VarKind::Object(value)) = (var.source.clone(), &var.kind) {
                let value = value.clone();
                self.guards.add(source, GuardKind::Id(value));
            }
        }
        for id in std::mem::take(&mut *self.pending_reads.borrow_mut()) {
            if let Some((source, guard)) = self.vars[id.0 as usize].pending_guard.take() {
                self.guards.add(source, guard);
            }
        }
    }

    /// The source of `id` if it is a constant item whose pending guard the trace has not
    /// asked for (see `Var::pending_guard`).
    pub fn unread_item_source(&self, id: VarId) -> Option<Rc<Source>> {
        let var = &self.vars[id.0 as usize];
        match &var.pending_guard {
            Some((source, _)) if !var.observed.get() => Some(source.clone()),
            _ => None,
        }
    }

    /// What the trace knows of `id` without looking at its value: for questions whose
    /// answer is the same for every constant (is it a tensor?), so an unread item's pending
    /// guard stays pending. Anything that uses a value goes through [`Tracer::kind`].
    pub fn kind_unobserved(&self, id: VarId) -> &VarKind {
        &self.vars[id.0 as usize].kind
    }

    /// A method of a tracked value: `func` is the Python function to inline with `receiver`
    /// as `self`, or None for methods of tensors and containers, handled by name.
    pub fn method(&mut self, receiver: VarId, name: &str, func: Option<OwnedRef>) -> VarId {
        self.add(
            VarKind::Method {
                receiver,
                name: name.to_string(),
                func,
            },
            None,
        )
    }

    pub fn var(&self, id: VarId) -> &Var {
        &self.vars[id.0 as usize]
    }

    pub fn kind(&self, id: VarId) -> &VarKind {
        let var = &self.vars[id.0 as usize];
        if var.pending_guard.is_some() && !var.observed.get() {
            var.observed.set(true);
            self.pending_reads.borrow_mut().push(id);
        }
        &var.kind
    }

    pub fn source(&self, id: VarId) -> Option<Rc<Source>> {
        self.vars[id.0 as usize].source.clone()
    }

    pub fn constant(&mut self, value: &Bound<'py, PyAny>) -> VarId {
        self.add(VarKind::Const(OwnedRef::from_bound(value)), None)
    }

    /// The real Python value of a trace-time value (constants and objects), if it has one.
    pub fn real(&self, id: VarId) -> Option<Bound<'py, PyAny>> {
        self.pin_identity(id);
        self.real_unpinned(id)
    }

    /// The real object of `id` for the trace's own bookkeeping, where which object it is
    /// does not reach the result: attribute stores (replayed through the object's source)
    /// and `super()` (resolved by the object's guarded type).
    pub fn real_unpinned(&self, id: VarId) -> Option<Bound<'py, PyAny>> {
        match self.kind(id) {
            VarKind::Const(v) | VarKind::Object(v) => Some(v.bind(self.py).clone()),
            _ => None,
        }
    }

    /// The Python values of `ids` as a tuple: the arguments of a call evaluated at trace time.
    pub fn python_args(&self, ids: &[VarId]) -> CResult<Bound<'py, PyTuple>> {
        let values = ids
            .iter()
            .map(|&v| self.python_value(v))
            .collect::<CResult<Vec<_>>>()?;
        Ok(PyTuple::new(self.py, values)?)
    }

    /// The Python values of keyword arguments as a dict, for a call evaluated at trace time.
    pub fn python_kwargs(&self, kwargs: &[(String, VarId)]) -> CResult<Bound<'py, PyDict>> {
        let keywords = PyDict::new(self.py);
        for (name, value) in kwargs {
            keywords.set_item(name, self.python_value(*value)?)?;
        }
        Ok(keywords)
    }

    /// A Python value for a tracker with no tensors inside (containers rebuilt), for calls
    /// evaluated at trace time.
    pub fn python_value(&self, id: VarId) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        self.pin_identity(id);
        Ok(match self.kind(id) {
            VarKind::Unrealized(_) => return super::lazy_inputs::unrealized_reached(),
            VarKind::Object(v) if !self.fresh_deques.is_empty() => {
                self.check_deque_as_value(id)?;
                v.bind(py).clone()
            }
            VarKind::Object(v) if !self.identity_members.is_empty() => {
                let value = v.bind(py).clone();
                self.pin_set_members(&value)?;
                value
            }
            VarKind::Const(v) | VarKind::Object(v) => v.bind(py).clone(),
            VarKind::Symbolic { fake, .. } => self.specialize(&fake.bind(py).clone())?,
            VarKind::Slice(parts) => {
                self.slice_bound_check(parts)?;
                let parts = parts
                    .iter()
                    .map(|&p| self.python_value(p))
                    .collect::<CResult<Vec<_>>>()?;
                py.import_module("builtins")?
                    .getattr("slice")?
                    .call1(PyTuple::new(py, parts)?)?
            }
            VarKind::Tuple(items) => {
                let items = items
                    .iter()
                    .map(|&i| self.python_value(i))
                    .collect::<CResult<Vec<_>>>()?;
                let tuple = PyTuple::new(py, items)?.into_any();
                match self.tuple_classes.get(&id) {
                    Some(cls) => {
                        super::ops_build::named_tuple_maker(&cls.bind(py))?.call1((tuple,))?
                    }
                    None => tuple,
                }
            }
            VarKind::List(items) => {
                let items = items
                    .iter()
                    .map(|&i| self.python_value(i))
                    .collect::<CResult<Vec<_>>>()?;
                let list = pyo3::types::PyList::new(py, items)?.into_any();
                match self.list_classes.get(&id) {
                    Some(cls) => cls.bind(py).call1((list,))?,
                    None => list,
                }
            }
            VarKind::Dict(entries) => {
                let d = PyDict::new(py);
                for (k, v) in entries {
                    if self.key_tensors.contains_key(&(k.as_ptr() as usize)) {
                        return unsupported(
                            BreakKind::TensorValueNeeded,
                            "a dict with a tensor key used where a Python value is needed",
                        );
                    }
                    d.set_item(k.bind(py), self.python_value(*v)?)?;
                }
                match self.dict_classes.get(&id) {
                    Some(cls) => cls.bind(py).call1((d,))?,
                    None => d.into_any(),
                }
            }
            VarKind::Tensor { .. } => {
                return unsupported(
                    BreakKind::TensorValueNeeded,
                    "a tensor used where a Python value is needed",
                )
            }
            VarKind::Method {
                receiver,
                func: Some(func),
                ..
            } => match self.real(*receiver) {
                Some(real) => self.h.method_type.call1((func.bind(py), real))?,
                None => {
                    return unsupported(
                        BreakKind::ValueNotRebuildable,
                        "a method of a traced value used as a Python value",
                    )
                }
            },
            VarKind::Iter { items, next, .. } => {
                let items = items[*next..]
                    .iter()
                    .map(|&i| self.python_value(i))
                    .collect::<CResult<Vec<_>>>()?;
                pyo3::types::PyList::new(py, items)?.into_any()
            }
            VarKind::Partial { func, args, kwargs } => {
                let mut all = vec![*func];
                all.extend(args);
                py.import_module("functools")?
                    .getattr("partial")?
                    .call(self.python_args(&all)?, Some(&self.python_kwargs(kwargs)?))?
            }
            // A view of a dict rebuilt now: the call it is passed to runs right away.
            VarKind::DictView { dict, which } => {
                self.python_value(*dict)?.call_method0(which.method())?
            }
            other @ (VarKind::Null
            | VarKind::Method { .. }
            | VarKind::Generator { .. }
            | VarKind::Lazy(_)
            | VarKind::Function(_)
            | VarKind::CellRef(_)
            | VarKind::Super { .. }
            | VarKind::Instance { .. }
            | VarKind::GradModeContext { .. }
            | VarKind::GradModeWrapped { .. }
            | VarKind::GradModeExit { .. }
            | VarKind::StateContext(_)
            | VarKind::NdArray(_)) => {
                return unsupported(
                    BreakKind::ValueNotRebuildable,
                    format!("{} used as a Python value", kind_name(other)),
                )
            }
        })
    }

    /// Whether an existing object can be used at trace time as a constant — an operand of an
    /// operator evaluated now, a constant argument of a graph node: it cannot change while
    /// the guards hold and its operators run no user code (`_capture.operator_safe`).
    pub fn immutable_object(&self, value: &Bound<'py, PyAny>) -> PyResult<bool> {
        self.py
            .import_module("dynamo_rs._capture")?
            .call_method1("operator_safe", (value,))?
            .is_truthy()
    }

    pub fn contains_tensor(&self, id: VarId) -> bool {
        match self.kind_unobserved(id) {
            VarKind::Tensor { .. } | VarKind::Unrealized(_) => true,
            VarKind::Tuple(items) | VarKind::List(items) | VarKind::Slice(items) => {
                items.iter().any(|&i| self.contains_tensor(i))
            }
            VarKind::Dict(entries) => entries.iter().any(|(_, v)| self.contains_tensor(*v)),
            VarKind::Iter { items, next, .. } => {
                items[*next..].iter().any(|&i| self.contains_tensor(i))
            }
            VarKind::DictView { dict, which } => {
                *which != super::vars::DictViewKind::Keys && self.contains_tensor(*dict)
            }
            VarKind::Object(_) if self.is_fresh_deque(id) => self
                .fresh_deque_trackers(id)
                .any(|i| self.contains_tensor(i)),
            _ => false,
        }
    }

    /// Turns a real value read from `source` into a tracker, recording the guard that keeps
    /// the trace valid: tensors become graph inputs, constants are guarded by value,
    /// containers by type and length (their items by their own guards), other objects by
    /// identity.
    pub fn wrap(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: Option<Rc<Source>>,
    ) -> CResult<VarId> {
        // Lists, tuples, dicts and deques are wrapped item by item, recursively: one that
        // contains itself (a module's globals reached through a registry stored in them)
        // would recurse without end, and a very deep one would exhaust the stack.
        let ty = value.get_type();
        let h = &self.h;
        let container = ty.is(&h.list_type)
            || ty.is(&h.tuple_type)
            || ty.is(&h.dict_type)
            || ty.is(&h.deque_type);
        if !container {
            return self.wrap_value(value, source);
        }
        let ptr = value.as_ptr() as usize;
        if self.containers_being_wrapped.contains(&ptr) {
            return unsupported(
                BreakKind::RecursionDepth,
                "a container that contains itself",
            );
        }
        if self.containers_being_wrapped.len() >= MAX_CONTAINER_NESTING {
            return unsupported(
                BreakKind::RecursionDepth,
                format!("containers nested more than {MAX_CONTAINER_NESTING} deep"),
            );
        }
        self.containers_being_wrapped.push(ptr);
        let wrapped = self.wrap_value(value, source);
        self.containers_being_wrapped.pop();
        wrapped
    }

    fn wrap_value(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: Option<Rc<Source>>,
    ) -> CResult<VarId> {
        let h = self.h.clone();
        let lazy_items = std::mem::take(&mut self.lazy_tuple_items);
        let item_of_container = std::mem::take(&mut self.item_of_container);
        if value.is_instance(&h.tensor_type)? {
            let Some(source) = source else {
                return unsupported(
                    BreakKind::ValueNotRebuildable,
                    "a tensor that does not come from the frame's inputs",
                );
            };
            return self.graph_input(value, source);
        }
        if let Some(s) = &source {
            if let Some(array) = self.ndarray_input(value, s)? {
                return Ok(array);
            }
            if let Some(context) = self.state_context_input(value, s)? {
                return Ok(context);
            }
        }
        let argument_item = source.as_deref().is_some_and(Source::is_argument_item);
        let float = !self.static_floats && value.is_exact_instance_of::<pyo3::types::PyFloat>();
        let int = value.is_exact_instance_of::<pyo3::types::PyInt>();
        if let Some(s) = source.as_ref().filter(|s| {
            float || (int && (argument_item || (!self.static_ints && s.is_rooted_in_locals())))
        }) {
            // The frame's int and float arguments; floats read from anywhere else (a
            // learning rate in an optimizer's param group, a scale in a global config dict,
            // a module's attribute) but classes and Python modules; ints reached from the
            // frame's locals other than through modules (a step count in an optimizer's
            // state, a counter in a dict handed in) — as TorchDynamo wraps numbers: symbolic
            // once seen with two values, instead of one recompile per value. Only the
            // arguments are made symbolic from the start by `dynamic=True`.
            if let Some(id) = self.int_input(value, s.clone(), !argument_item)? {
                return Ok(id);
            }
        }
        // A tuple among the frame's arguments (an image size, a shape, a batch's metadata) is
        // wrapped item by item, not as one constant: only the items the trace reads are
        // guarded, and its ints seen with other values before become symbolic (automatic
        // dynamic), as TorchDynamo wraps them.
        let tuple_fields = if value.get_type().is(&h.tuple_type) {
            None
        } else {
            super::ops_build::named_tuple_input_fields(value)?
        };
        let argument_tuple =
            argument_item && (value.get_type().is(&h.tuple_type) || tuple_fields.is_some());
        if !argument_tuple && h.is_constant(value)? {
            let guard = source
                .clone()
                .map(|s| (s, GuardKind::Equals(OwnedRef::from_bound(value))));
            // A constant the frame is given (a flag, a mode string, a resume function's
            // `print` argument formatted before the break, a new text on every call) is
            // guarded only if the trace reads it, as an item of a container is: passed on
            // as it is at a graph break, or returned, it is loaded again (TorchDynamo's
            // lazy arguments), so a flag only the code after a break reads does not
            // compile the part before it again when it changes.
            let frame_constant = matches!(source.as_deref(), Some(Source::Local(_)));
            let pending = if item_of_container || frame_constant {
                guard
            } else {
                if let Some((s, guard)) = guard {
                    self.guards.add(s, guard);
                }
                None
            };
            // A slice with NumPy integer bounds is traced with the ints they are (the graph's
            // code names no `np`); the guard keeps the slice as it is.
            let traced = match value.cast::<pyo3::types::PySlice>() {
                Ok(slice) => {
                    let index = h.operator.getattr("index")?;
                    let mut bounds = Vec::with_capacity(3);
                    for bound in ["start", "stop", "step"] {
                        let bound = slice.getattr(bound)?;
                        bounds.push(if super::helpers::is_numpy_integer(&bound)? {
                            index.call1((bound,))?
                        } else {
                            bound
                        });
                    }
                    h.builtins
                        .getattr("slice")?
                        .call1(pyo3::types::PyTuple::new(self.py, bounds)?)?
                }
                Err(_) => value.clone(),
            };
            let id = self.add(VarKind::Const(OwnedRef::from_bound(&traced)), source);
            self.vars[id.0 as usize].pending_guard = pending;
            return Ok(id);
        }
        let exact_tuple = value.get_type().is(&h.tuple_type);
        let exact_list = value.get_type().is(&h.list_type);
        // A list subclass that behaves as a list (see `ops_list_subclass`), read from a
        // source: a traced list of its class.
        let list_subclass = source.is_some()
            && !exact_list
            && value.is_instance(&h.list_type)?
            && self.admitted_list_subclass(&value.get_type())?
            && value
                .getattr("__dict__")
                .ok()
                .map_or(Ok(true), |d| d.len().map(|n| n == 0))?;
        let exact_set = value.is_exact_instance_of::<pyo3::types::PySet>();
        if let Some(s) = &source {
            // Lists, dicts, sets and deques: one tracker per object.
            if let Some(existing) = self.existing_container(value, s) {
                return Ok(existing);
            }
            if let Some(deque) = self.wrap_existing_deque(value, s)? {
                return Ok(deque);
            }
        }
        if exact_tuple || exact_list || list_subclass || tuple_fields.is_some() {
            let len = value.len()?;
            if let Some(s) = &source {
                self.guards.add(
                    s.clone(),
                    GuardKind::Type(OwnedRef::from_bound(value.get_type().as_any())),
                );
                self.guards.add(s.clone(), GuardKind::Len(len));
                if (tuple_fields.is_some() || list_subclass) && value.hasattr("__dict__")? {
                    // Attributes set on the instance would shadow what its class gives.
                    self.guards.add(
                        Rc::new(Source::Attr(s.clone(), "__dict__".into())),
                        GuardKind::Len(0),
                    );
                }
            }
            let mut items = Vec::with_capacity(len);
            for (i, item) in value.try_iter()?.enumerate() {
                let item = item?;
                let item_source = source
                    .as_ref()
                    .map(|s| Rc::new(Source::Item(s.clone(), ItemKey::Int(i as i64))));
                let lazy_item = lazy_items && exact_tuple && item_source.is_some();
                if lazy_item && item.is_instance(&h.tensor_type)? {
                    items.push(self.unrealized(&item, item_source.expect("checked")));
                    continue;
                }
                // A tuple inside it: its tensors are left unrealized too.
                self.lazy_tuple_items = lazy_item && item.get_type().is(&h.tuple_type);
                self.item_of_container = true;
                let wrapped = self.wrap(&item, item_source);
                self.lazy_tuple_items = false;
                items.push(wrapped?);
            }
            let kind = if exact_list || list_subclass {
                VarKind::List(items)
            } else {
                VarKind::Tuple(items)
            };
            let id = self.add(kind, source);
            if let Some(fields) = tuple_fields {
                // A named tuple: a tuple tracker that knows its class and field names, as
                // for one made in the trace.
                self.tuple_fields.insert(id, fields);
                self.tuple_classes
                    .insert(id, OwnedRef::from_bound(value.get_type().as_any()));
            }
            if exact_list || list_subclass {
                self.note_container(value, id);
            }
            if list_subclass {
                self.list_classes
                    .insert(id, OwnedRef::from_bound(value.get_type().as_any()));
            }
            return Ok(id);
        }
        // An existing `OrderedDict`, or `defaultdict` with a factory, is a dict tracker too,
        // its class (and factory) known as for one made in the trace: reads, stores and
        // missing keys are modelled, and changes replayed into the object itself.
        let dict_class = value.get_type();
        let ordered = dict_class.is(&h.ordered_dict_type);
        let default_factory = if source.is_some() && dict_class.is(&h.defaultdict_type) {
            Some(value.getattr("default_factory")?).filter(|f| !f.is_none())
        } else {
            None
        };
        if dict_class.is(&h.dict_type)
            || (source.is_some() && (ordered || default_factory.is_some()))
        {
            let dict = value.cast::<PyDict>().map_err(PyErr::from)?;
            // Keys that are values, or objects that equal only themselves (an enum member,
            // a class, a module): the keys guard then finds exactly the same keys.
            let stable_key = |k: &Bound<'py, PyAny>| {
                h.is_constant(k).unwrap_or(false)
                    || super::ops_build::compares_by_identity(k).unwrap_or(false)
            };
            if dict.keys().iter().all(|k| stable_key(&k)) {
                let entries = self.dict_entries(dict, source.as_ref())?;
                let factory_source = source
                    .as_ref()
                    .map(|s| Rc::new(Source::Attr(s.clone(), "default_factory".into())));
                let id = self.add(VarKind::Dict(entries), source);
                if self.source(id).is_some() {
                    self.note_container(value, id);
                }
                if ordered || default_factory.is_some() {
                    self.dict_classes
                        .insert(id, OwnedRef::from_bound(dict_class.as_any()));
                }
                if let Some(factory) = default_factory {
                    let factory = self.wrap(&factory, factory_source)?;
                    self.dict_defaults.insert(id, factory);
                }
                return Ok(id);
            }
        }
        if let Ok(exit) = value.cast::<super::ops_with::GradModeExit>() {
            // A grad-mode block's `__exit__` handed over by a graph break (one object per
            // mode, so identity says which).
            if let Some(s) = &source {
                self.guards
                    .add(s.clone(), GuardKind::Id(OwnedRef::from_bound(value)));
            }
            let previous = exit.get().previous();
            return Ok(self.add(VarKind::GradModeExit { previous }, source));
        }
        if let Some(s) = &source {
            if let Some(iterator) = self.wrap_resume_iterator(value, s)? {
                return Ok(iterator);
            }
            if let Some(method) = self.wrap_constant_method(value, s)? {
                return Ok(method);
            }
            if let Some(method) = self.wrap_tensor_method(value, s)? {
                return Ok(method);
            }
            if let Some(method) = self.wrap_bound_method(value, s)? {
                return Ok(method);
            }
            if self.guard_by_contents(value, s)? {
                // A set's elements are all the trace can depend on (changes the trace makes
                // to an existing set go to a copy and are replayed into it, see
                // `ops_sets::set_standing_for`; it is returned as itself); other objects may
                // need their identity later.
                let is_set = exact_set || value.is_exact_instance_of::<pyo3::types::PyFrozenSet>();
                let id = self.add(VarKind::Object(OwnedRef::from_bound(value)), source);
                self.vars[id.0 as usize].identity_pending = !is_set;
                if exact_set {
                    // One tracker per set object, as for lists and dicts.
                    self.note_container(value, id);
                }
                return Ok(id);
            }
            self.guards
                .add(s.clone(), GuardKind::Id(OwnedRef::from_bound(value)));
        }
        Ok(self.add(VarKind::Object(OwnedRef::from_bound(value)), source))
    }

    /// Translates `frame` until it returns.
    pub fn run(&mut self, frame: &mut FrameState<'py>) -> CResult<VarId> {
        match self.run_frame(frame)? {
            Flow::Return(value) => Ok(value),
            Flow::Continue | Flow::Yield(_) => {
                unsupported(BreakKind::Internal, "a frame yielded outside a generator")
            }
        }
    }

    /// Runs `frame` from its current instruction until it returns or — a generator's frame
    /// run lazily — yields: `Flow::Return` or `Flow::Yield`.
    pub fn run_frame(&mut self, frame: &mut FrameState<'py>) -> CResult<Flow> {
        let locations = self.location_stack.len() + 1;
        // A call made inside the caller's `try` block: the handler covers the callee too.
        let (caller_in_try, caller_outer_try) = (self.in_try, self.in_outer_try);
        self.in_outer_try = caller_in_try || caller_outer_try;
        self.location_stack.push((
            Rc::from(frame.qualname.as_str()),
            Rc::from(frame.filename.as_str()),
            frame.lines.first().copied().flatten().unwrap_or(0) as u32,
        ));
        let result = loop {
            let Some(instruction) = frame.instructions.get(frame.pc).copied() else {
                break unsupported(BreakKind::Internal, "ran past the end of the code");
            };
            if let Some(loc) = self.location_stack.last_mut() {
                loc.2 = frame.lines[frame.pc].unwrap_or(0) as u32;
            }
            if frame.is_root && self.stop_at == Some(frame.pc) {
                self.reached_stop = true;
                break Err(CaptureError::BreakPoint);
            }
            frame.pc += 1;
            // Inside a try block Python code is traced as usual (it ran without raising at
            // trace time); a graph operation there could raise at run time where the
            // handler would not see it, so `graph_call` refuses it. The cleanup of a
            // grad-mode `with` block only restores the mode, which the graph does itself.
            self.in_try = instruction.handler.is_some_and(|h| {
                !self.is_grad_mode_cleanup(frame, h)
                    && !super::ops_exceptions::is_except_cleanup(frame, h)
            });
            self.raised = None;
            let stepped = if self.has_unrealized {
                self.realize_for(frame, &instruction)
                    .and_then(|()| self.step(frame, &instruction))
            } else {
                self.step(frame, &instruction)
            };
            if self.observe_every_value {
                for &id in &frame.stack {
                    self.kind(id);
                }
            }
            match stepped {
                Ok(Flow::Continue) => {}
                Ok(done) => break Ok(done),
                Err(err) => match self.catch(frame, &instruction, &err, locations) {
                    Ok(true) => {}
                    Ok(false) => break Err(err),
                    Err(failure) => break Err(failure),
                },
            }
        };
        (self.in_try, self.in_outer_try) = (caller_in_try, caller_outer_try);
        match &result {
            Ok(_) => {
                self.location_stack.pop();
            }
            Err(CaptureError::Unsupported(_)) if !frame.is_root && self.stop_at.is_none() => {
                let index = frame.pc.saturating_sub(1);
                if super::graph_break::can_split_at(&frame.instructions, &frame.code, index)? {
                    let receiver = self.first_argument_object(frame)?;
                    self.unwound.push(UnwoundFrame {
                        code: OwnedRef::from_bound(&frame.code),
                        index,
                        depth: locations - 1,
                        receiver,
                    });
                }
            }
            Err(_) => {}
        }
        result
    }

    /// The object (not a tensor, container or constant) `frame`'s first argument holds.
    fn first_argument_object(&self, frame: &FrameState<'py>) -> PyResult<Option<OwnedRef>> {
        if frame.code.getattr("co_argcount")?.extract::<usize>()? == 0 {
            return Ok(None);
        }
        let Some(Some(first)) = frame.locals.first() else {
            return Ok(None);
        };
        Ok(match self.kind_unobserved(*first) {
            VarKind::Object(value) => Some(value.clone()),
            _ => None,
        })
    }

    /// Where the translator is: the innermost frame first, then the frames it was inlined from.
    pub fn location(&self) -> String {
        self.location_from(0)
    }

    /// `location()` as seen from the frame at `depth` of `location_stack` outward-in: that
    /// frame and those inlined into it.
    pub fn location_from(&self, depth: usize) -> String {
        let mut parts: Vec<String> = self
            .location_stack
            .get(depth..)
            .unwrap_or_default()
            .iter()
            .rev()
            .map(|(qualname, filename, line)| format!("{qualname} ({filename}:{line})"))
            .collect();
        if parts.is_empty() {
            return "<unknown>".into();
        }
        let first = parts.remove(0);
        if parts.is_empty() {
            first
        } else {
            format!("{first}, inlined from {}", parts.join(" <- "))
        }
    }

    pub fn push(&mut self, frame: &mut FrameState<'py>, id: VarId) {
        frame.stack.push(id);
    }

    pub fn pop(&mut self, frame: &mut FrameState<'py>) -> CResult<VarId> {
        match frame.stack.pop() {
            Some(id) => Ok(id),
            None => unsupported(BreakKind::Internal, "stack underflow while translating"),
        }
    }

    pub fn popn(&mut self, frame: &mut FrameState<'py>, n: usize) -> CResult<Vec<VarId>> {
        if frame.stack.len() < n {
            return unsupported(BreakKind::Internal, "stack underflow while translating");
        }
        let at = frame.stack.len() - n;
        Ok(frame.stack.split_off(at))
    }

    fn step(&mut self, f: &mut FrameState<'py>, ins: &Instruction) -> CResult<Flow> {
        use Opcode::*;
        let arg = ins.effect_arg();
        match ins.opcode {
            Nop | Resume | ExtendedArg | Cache | Precall => Ok(Flow::Continue),
            PopTop => self.pop(f).map(|_| Flow::Continue),
            PushNull => {
                let null = self.add(VarKind::Null, None);
                self.push(f, null);
                Ok(Flow::Continue)
            }
            Copy => self.op_copy(f, arg),
            Swap => self.op_swap(f, arg),
            LoadFast => self.op_load_fast(f, arg),
            StoreFast => self.op_store_fast(f, arg),
            DeleteFast => self.op_delete_fast(f, arg),
            LoadConst => self.op_load_const(f, arg),
            LoadGlobal => self.op_load_global(f, arg),
            LoadAttr => self.op_load_attr(f, arg),
            LoadMethod => self.op_load_method(f, arg),
            MakeCell => self.op_make_cell(f, arg),
            CopyFreeVars => Ok(Flow::Continue),
            LoadClosure => self.op_load_closure(f, arg),
            LoadDeref => self.op_load_deref(f, arg),
            StoreDeref => self.op_store_deref(f, arg),
            KwNames => {
                f.kw_names = Some(
                    f.consts
                        .get_item(arg as usize)?
                        .cast_into::<PyTuple>()
                        .map_err(PyErr::from)?,
                );
                Ok(Flow::Continue)
            }
            Call => self.op_call(f, arg),
            CallFunctionEx => self.op_call_function_ex(f, arg),
            MakeFunction => self.op_make_function(f, arg),
            ImportName => self.op_import_name(f, arg),
            BeforeWith => self.op_before_with(f),
            StoreAttr => self.op_store_attr(f, arg),
            StoreGlobal => self.op_store_global(f, arg),
            DeleteAttr => self.op_delete_attr(f, arg),
            ImportFrom => self.op_import_from(f, arg),
            BinaryOp => self.op_binary(f, arg),
            CompareOp => self.op_compare(f, arg),
            IsOp => self.op_is(f, arg),
            ContainsOp => self.op_contains(f, arg),
            UnaryNot => self.op_unary(f, "not"),
            UnaryNegative => self.op_unary(f, "neg"),
            UnaryPositive => self.op_unary(f, "pos"),
            UnaryInvert => self.op_unary(f, "invert"),
            BinarySubscr => self.op_subscr(f),
            StoreSubscr => self.op_store_subscr(f),
            BuildTuple => self.op_build_tuple(f, arg),
            BuildList => self.op_build_list(f, arg),
            BuildMap => self.op_build_map(f, arg),
            BuildConstKeyMap => self.op_build_const_key_map(f, arg),
            BuildSlice => self.op_build_slice(f, arg),
            BuildString => self.op_build_string(f, arg),
            FormatValue => self.op_format_value(f, arg),
            ListAppend => self.op_list_append(f, arg),
            BuildSet => self.op_build_set(f, arg),
            SetAdd => self.op_set_add_or_update(f, arg, false),
            SetUpdate => self.op_set_add_or_update(f, arg, true),
            ListExtend => self.op_list_extend(f, arg),
            ListToTuple => self.op_list_to_tuple(f),
            MapAdd => self.op_map_add(f, arg),
            DictUpdate | DictMerge => self.op_dict_update(f, arg),
            UnpackSequence => self.op_unpack_sequence(f, arg),
            UnpackEx => self.op_unpack_ex(f, arg),
            GetIter => self.op_get_iter(f),
            ForIter => self.op_for_iter(f, ins),
            Jump | JumpNoInterrupt => {
                f.pc = ins.jump_target().map_or(f.pc, |t| t.index());
                Ok(Flow::Continue)
            }
            PopJumpIfFalse | PopJumpIfTrue | PopJumpIfNone | PopJumpIfNotNone
            | JumpIfFalseOrPop | JumpIfTrueOrPop => self.op_branch(f, ins),
            ReturnValue => {
                let value = self.pop(f)?;
                match f.yields.take() {
                    // A generator expression ran to the end: the caller gets its items.
                    Some(items) => Ok(Flow::Return(self.new_iter(items, &[]))),
                    None => Ok(Flow::Return(value)),
                }
            }
            YieldValue if f.suspends => {
                let value = self.pop(f)?;
                Ok(Flow::Yield(value))
            }
            ReturnGenerator if f.yields.is_some() || f.suspends => {
                let none = self.constant(&self.py.None().into_bound(self.py));
                f.stack.push(none); // what the first next() sends
                Ok(Flow::Continue)
            }
            YieldValue if f.yields.is_some() => {
                let value = self.pop(f)?;
                if let Some(items) = f.yields.as_mut() {
                    if items.len() >= super::ops_generators::MAX_YIELDS {
                        return unsupported(
                            BreakKind::Generator,
                            "a generator that yields too many items to run ahead",
                        );
                    }
                    items.push(value);
                }
                let none = self.constant(&self.py.None().into_bound(self.py));
                f.stack.push(none); // what next() sends back
                Ok(Flow::Continue)
            }
            // A class statement: `__build_class__`, whose call (running the class body,
            // making a new class on every call) breaks the graph — the generated code runs it.
            LoadBuildClass => self.push_builtin(f, "__build_class__"),
            // `assert` failing: the exception class (raised by RAISE_VARARGS, a break point
            // the generated code runs itself).
            LoadAssertionError => self.push_builtin(f, "AssertionError"),
            // Not traced yet: the frame runs eagerly.
            // Handlers the trace entered (see `ops_exceptions`); otherwise the compiled
            // frame's are only reached through the graph-break machinery.
            PushExcInfo if self.tracing_handler(f) => self.op_push_exc_info(f),
            CheckExcMatch if self.tracing_handler(f) => self.op_check_exc_match(f),
            PopExcept if self.tracing_handler(f) => {
                f.handled.pop();
                self.handled_exceptions.pop();
                self.pop(f).map(|_| Flow::Continue)
            }
            Reraise if self.tracing_handler(f) => self.op_reraise(f),
            WithExceptStart if self.tracing_handler(f) => self.op_with_except_start(f),
            GetLen => self.op_get_len(f),
            MatchSequence => self.op_match_sequence(f),
            MatchMapping => self.op_match_mapping(f),
            MatchKeys => self.op_match_keys(f),
            MatchClass => self.op_match_class(f, arg),
            RaiseVarargs => self.op_raise(f, arg),
            GetYieldFromIter if f.yields.is_some() || f.suspends => self.op_get_yield_from_iter(f),
            Send if f.yields.is_some() || f.suspends => self.op_send(f, ins),
            DeleteSubscr => self.op_delete_subscr(f),
            PushExcInfo | CheckExcMatch | CheckEgMatch | WithExceptStart | GetAiter | GetAnext
            | BeforeAsyncWith | EndAsyncFor | GetYieldFromIter | PrintExpr | ReturnGenerator
            | ImportStar | SetupAnnotations | YieldValue | AsyncGenWrap | PrepReraiseStar
            | PopExcept | StoreName | DeleteName | DeleteGlobal | LoadName | Reraise | Send
            | GetAwaitable | DeleteDeref | LoadClassderef => unsupported(
                BreakKind::UnsupportedInstruction,
                format!("the {} instruction", ins.opcode.name()),
            ),
        }
    }

    /// Pushes the builtin `name` (what `LOAD_BUILD_CLASS` and `LOAD_ASSERTION_ERROR` load).
    fn push_builtin(&mut self, f: &mut FrameState<'py>, name: &str) -> CResult<Flow> {
        let builtin = self.py.import_module("builtins")?.getattr(name)?;
        let builtin = self.constant(&builtin);
        f.stack.push(builtin);
        Ok(Flow::Continue)
    }

    /// Starts translating a call of `code` (an inlined function).
    pub fn enter_depth(&mut self) -> CResult<()> {
        self.depth += 1;
        if self.depth > MAX_INLINE_DEPTH {
            return unsupported(
                BreakKind::RecursionDepth,
                format!("calls nested deeper than {MAX_INLINE_DEPTH} (recursion?)"),
            );
        }
        Ok(())
    }
}

pub fn kind_name(kind: &VarKind) -> &'static str {
    match kind {
        VarKind::Tensor { .. } | VarKind::Unrealized(_) => "a tensor",
        VarKind::Symbolic { .. } => "a symbolic size",
        VarKind::Slice(_) => "a slice with a symbolic bound",
        VarKind::Const(_) => "a constant",
        VarKind::Object(_) => "an object",
        VarKind::Tuple(_) => "a tuple",
        VarKind::List(_) => "a list",
        VarKind::Dict(_) => "a dict",
        VarKind::DictView { .. } => "a dict view",
        VarKind::Null => "NULL",
        VarKind::Method { .. } => "a method",
        VarKind::Iter { .. } => "an iterator",
        VarKind::Generator { .. } => "a generator",
        VarKind::Lazy(_) => "an iterator made lazily (over a generator, or endless)",
        VarKind::Function(_) => "a function",
        VarKind::Partial { .. } => "a functools.partial made while tracing",
        VarKind::CellRef(_) => "a cell",
        VarKind::Super { .. } => "super()",
        VarKind::Instance { .. } => "an object made while tracing",
        VarKind::GradModeContext { .. } => "a grad-mode context manager",
        VarKind::GradModeExit { .. } => "a grad-mode __exit__",
        VarKind::StateContext(_) => "a torch.autocast, inference_mode or sdpa_kernel context",
        VarKind::NdArray(_) => "a NumPy array",
        VarKind::GradModeWrapped { .. } => "a function decorated by a grad-mode context",
    }
}
