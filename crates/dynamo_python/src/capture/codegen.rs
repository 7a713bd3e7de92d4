//! Code generation: the code object that replaces a captured frame. It keeps the original
//! prologue (`MAKE_CELL`, `COPY_FREE_VARS`, `RESUME`), loads every graph input from its
//! source, calls the compiled graph (stored in `co_consts`), and rebuilds the frame's return
//! value from the graph's outputs, constants and sources.

use super::break_reasons::{Break, BreakKind};
use std::rc::Rc;

use crate::imports::ImportModule;
use dynamo_bytecode::{ExceptionHandler, InstrIndex, Instruction, Opcode, Operand, Positions};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::source::Source;
use super::translator::{unsupported, CResult, CaptureError};
use crate::eval_frame::owned::OwnedRef;

/// How the transformed code rebuilds the value the frame returns.
#[derive(Debug)]
pub enum Rebuild {
    /// Item `k` of the graph's output tuple.
    Output(usize),
    Const(OwnedRef),
    Source(Rc<Source>),
    Tuple(Vec<Rebuild>),
    List(Vec<Rebuild>),
    /// Keys are constants but for a tensor key (a tensor the graph made or was given).
    Dict(Vec<(Rebuild, Rebuild)>),
    /// A plain object made while tracing: `object.__new__(cls)`, then its attributes.
    Instance {
        cls: OwnedRef,
        attrs: Vec<(String, Rebuild)>,
    },
    /// `base.name` (a bound method on the stack at a graph break).
    Attr {
        base: Box<Rebuild>,
        name: String,
    },
    /// `types.MethodType(func, receiver)`: a method the trace resolved to `func` (through
    /// `super()` too, where `receiver.name` would find another).
    BoundMethod {
        func: OwnedRef,
        receiver: Box<Rebuild>,
    },
    /// `into(value)`: a dict of another class (`OrderedDict`) made from a plain one, an
    /// iterator (`iter`) over the items left.
    Converted {
        into: OwnedRef,
        value: Box<Rebuild>,
    },
    /// An object made in the trace that several values reach, built once into a temp
    /// (`CodeGen::define_shared`), by its tracker's number.
    Shared(u32),
    /// `func(*args, **kwargs)`: a transformers `ModelOutput` (its class, called with the hook
    /// off, with its fields), a `functools.partial` made in the trace.
    Call {
        func: Box<Rebuild>,
        args: Vec<Rebuild>,
        kwargs: Vec<(String, Rebuild)>,
    },
    /// The compiled frame's own cell `slot`, first set to `value` (what the trace holds in
    /// it): the closure of a function made in the trace that the frame shares.
    FrameCell {
        slot: u32,
        value: Option<Box<Rebuild>>,
    },
}

impl Rebuild {
    /// The same plan with every graph output replaced by what `source_of` gives for it (a
    /// graph with no operations: each output is an input, loaded from its source); None if
    /// some output has none.
    pub fn map_outputs(self, source_of: &dyn Fn(usize) -> Option<Rc<Source>>) -> Option<Rebuild> {
        let all = |items: Vec<Rebuild>| -> Option<Vec<Rebuild>> {
            items
                .into_iter()
                .map(|i| i.map_outputs(source_of))
                .collect()
        };
        let named = |items: Vec<(String, Rebuild)>| -> Option<Vec<(String, Rebuild)>> {
            items
                .into_iter()
                .map(|(n, i)| Some((n, i.map_outputs(source_of)?)))
                .collect()
        };
        Some(match self {
            Rebuild::Output(k) => Rebuild::Source(source_of(k)?),
            Rebuild::Tuple(items) => Rebuild::Tuple(all(items)?),
            Rebuild::List(items) => Rebuild::List(all(items)?),
            Rebuild::Dict(entries) => Rebuild::Dict(
                entries
                    .into_iter()
                    .map(|(k, v)| Some((k.map_outputs(source_of)?, v.map_outputs(source_of)?)))
                    .collect::<Option<_>>()?,
            ),
            Rebuild::Instance { cls, attrs } => Rebuild::Instance {
                cls,
                attrs: named(attrs)?,
            },
            Rebuild::Call { func, args, kwargs } => Rebuild::Call {
                func: Box::new(func.map_outputs(source_of)?),
                args: all(args)?,
                kwargs: named(kwargs)?,
            },
            Rebuild::Attr { base, name } => Rebuild::Attr {
                base: Box::new(base.map_outputs(source_of)?),
                name,
            },
            Rebuild::BoundMethod { func, receiver } => Rebuild::BoundMethod {
                func,
                receiver: Box::new(receiver.map_outputs(source_of)?),
            },
            Rebuild::Converted { into, value } => Rebuild::Converted {
                into,
                value: Box::new(value.map_outputs(source_of)?),
            },
            Rebuild::FrameCell { slot, value } => Rebuild::FrameCell {
                slot,
                value: match value {
                    Some(v) => Some(Box::new(v.map_outputs(source_of)?)),
                    None => None,
                },
            },
            other @ (Rebuild::Const(_) | Rebuild::Source(_) | Rebuild::Shared(_)) => other,
        })
    }
}

/// A side effect on an object that existed before the call, which the generated code
/// replays after the graph ran (the last store to each attribute).
#[derive(Debug)]
pub enum Replay {
    /// `obj.name = value`.
    SetAttr {
        source: Rc<Source>,
        name: String,
        value: Rebuild,
    },
    /// `del obj.name`.
    DelAttr { source: Rc<Source>, name: String },
    /// `globals[name] = value` (a `STORE_GLOBAL`), into the globals dict the code ran with.
    SetGlobal {
        globals: OwnedRef,
        name: String,
        value: Rebuild,
    },
    /// An existing list or dict the trace changed: it is made to hold `value` (a fresh list
    /// or dict of its final contents) by `_capture.replace_contents`.
    Contents { source: Rc<Source>, value: Rebuild },
    /// A free variable of the compiled frame written (`nonlocal` in a closure that is itself
    /// compiled): `STORE_DEREF slot` into the frame's own cell.
    SetDeref { slot: u32, value: Rebuild },
}

impl Replay {
    /// The same replay with graph outputs mapped as [`Rebuild::map_outputs`] does.
    pub fn map_outputs(self, source_of: &dyn Fn(usize) -> Option<Rc<Source>>) -> Option<Replay> {
        Some(match self {
            Replay::SetAttr {
                source,
                name,
                value,
            } => Replay::SetAttr {
                source,
                name,
                value: value.map_outputs(source_of)?,
            },
            Replay::Contents { source, value } => Replay::Contents {
                source,
                value: value.map_outputs(source_of)?,
            },
            Replay::SetGlobal {
                globals,
                name,
                value,
            } => Replay::SetGlobal {
                globals,
                name,
                value: value.map_outputs(source_of)?,
            },
            Replay::SetDeref { slot, value } => Replay::SetDeref {
                slot,
                value: value.map_outputs(source_of)?,
            },
            other @ Replay::DelAttr { .. } => other,
        })
    }
}

/// What the generated code needs to run a frame's original code again (see
/// `CodeGen::call_graph`).
#[derive(Debug, Clone, Copy)]
pub struct Rerun {
    /// Grad mode when the frame was entered (the guard checks it): a graph that raised
    /// after changing the mode leaves it changed.
    pub grad_mode: bool,
    /// How many of the code's first `co_varnames` are parameters (`*args` and `**kwargs`
    /// included).
    pub parameters: usize,
    /// The graph draws random numbers: the default generators' state is taken before it
    /// runs and put back before the rerun, which then draws the same numbers eager would.
    pub restore_random: bool,
}

pub struct CodeGen<'py> {
    py: Python<'py>,
    code: Bound<'py, PyAny>,
    consts: Vec<Bound<'py, PyAny>>,
    names: Vec<String>,
    slot_names: Vec<String>,
    /// Slots holding cells once the prologue has run (cell and free variables).
    cell_slots: Vec<bool>,
    out: Vec<Instruction>,
    positions: Positions,
    /// Locals the generated code adds after the original `co_varnames` (graph outputs and
    /// values held across a graph break). Cell and free slots move up by their number.
    temps: Vec<String>,
    /// The original `co_varnames` count: slots from here on are cells and free variables.
    varnames: u32,
    /// The local holding the graph's output tuple, when it is kept in one (graph breaks);
    /// otherwise the tuple stays on the stack.
    outputs_local: Option<u32>,
    /// Where an exception raised by the instructions emitted now goes (None: out of the
    /// frame). A handler whose target is [`PENDING_HANDLER`] is patched later.
    handler: Option<ExceptionHandler>,
    /// The temp holding each shared object (see `Rebuild::Shared`).
    shared_slots: std::collections::HashMap<u32, u32>,
    /// Cell slots bound when the frame starts (arguments kept in cells, free variables):
    /// what a `Source::Local` of theirs reads.
    entry_cells: Vec<bool>,
    /// The temp holding the value a cell had when the frame started, for each cell the
    /// generated code has stored into (a closure made in the trace sharing the frame's cell,
    /// a `nonlocal` store replayed): loads of the local's source read the value it had then,
    /// as the trace did.
    cell_originals: std::collections::HashMap<u32, u32>,
    /// Instructions of the copied prologue that name a cell slot as a plain local (a resume
    /// function storing the cells it is handed, `dynamo_bytecode::resume`): moved up past the
    /// temps with the cell slots.
    prologue_cell_locals: Vec<usize>,
}

/// The target of a handler whose code is not emitted yet (`CodeGen::patch_handlers_here`).
const PENDING_HANDLER: InstrIndex = InstrIndex(u32::MAX);

impl std::fmt::Debug for CodeGen<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CodeGen({} instructions)", self.out.len())
    }
}

impl<'py> CodeGen<'py> {
    pub fn new(
        code: &Bound<'py, PyAny>,
        prologue: &[Instruction],
        slot_names: Vec<String>,
    ) -> CResult<CodeGen<'py>> {
        let py = code.py();
        let consts: Vec<_> = code
            .getattr("co_consts")?
            .try_iter()?
            .collect::<PyResult<_>>()?;
        let names: Vec<String> = code
            .getattr("co_names")?
            .try_iter()?
            .map(|n| n.map(|n| n.to_string()))
            .collect::<PyResult<_>>()?;
        let cellvars: Vec<String> = code.getattr("co_cellvars")?.extract()?;
        let varnames = code.getattr("co_varnames")?.len()? as u32;
        let freevars: Vec<String> = code.getattr("co_freevars")?.extract()?;
        let cell_slots: Vec<bool> = slot_names
            .iter()
            .map(|n| cellvars.contains(n) || freevars.contains(n))
            .collect();
        let all_varnames: Vec<String> = code.getattr("co_varnames")?.extract()?;
        let arguments = super::helpers::argument_slots(code)?;
        let argument_names = &all_varnames[..arguments.min(all_varnames.len())];
        let entry_cells = slot_names
            .iter()
            .zip(&cell_slots)
            .map(|(n, &cell)| cell && (argument_names.contains(n) || freevars.contains(n)))
            .collect();
        let positions = prologue.last().map(|i| i.positions).unwrap_or_default();
        let prologue_cell_locals = prologue
            .iter()
            .enumerate()
            .filter(|(_, i)| matches!(i.operand, Operand::Local(slot) if slot >= varnames))
            .map(|(at, _)| at)
            .collect();
        let out = prologue
            .iter()
            .map(|i| Instruction {
                handler: None,
                ..*i
            })
            .collect();
        Ok(CodeGen {
            py,
            code: code.clone(),
            consts,
            names,
            slot_names,
            cell_slots,
            out,
            positions,
            temps: Vec::new(),
            varnames,
            outputs_local: None,
            handler: None,
            shared_slots: std::collections::HashMap::new(),
            entry_cells,
            cell_originals: std::collections::HashMap::new(),
            prologue_cell_locals,
        })
    }

    /// Leaves the frame's cell `slot` empty, as the trace left it (a cell bound when the frame
    /// started, whose variable the frame deleted), its entry value kept first.
    pub fn empty_frame_cell(&mut self, slot: u32) {
        if self.entry_cells[slot as usize] {
            self.keep_entry_value(slot);
            self.emit(Opcode::DeleteDeref, Operand::Cell(slot));
        }
    }

    /// Stores the value on top of the stack into the frame's cell `slot`, its entry value
    /// kept first.
    pub fn store_frame_cell(&mut self, slot: u32) {
        self.keep_entry_value(slot);
        self.emit(Opcode::StoreDeref, Operand::Cell(slot));
    }

    /// Before the generated code first changes the frame's cell `slot`: the value it had when
    /// the frame started, into a temp that loads of the local's source read from then on
    /// (see `cell_originals`). Cells unbound at entry have nothing to keep.
    fn keep_entry_value(&mut self, slot: u32) {
        if self.entry_cells[slot as usize] && !self.cell_originals.contains_key(&slot) {
            let name = format!("___entry_{}", self.slot_names[slot as usize]);
            let temp = self.temp(&name);
            self.emit(Opcode::LoadDeref, Operand::Cell(slot));
            self.emit(Opcode::StoreFast, Operand::Local(temp));
            self.cell_originals.insert(slot, temp);
        }
    }

    /// A new local for the generated code's own use; its slot.
    pub fn temp(&mut self, name: &str) -> u32 {
        // Unique among the temps and the original names (a resume function's arguments).
        let mut name = name.to_string();
        while self.temps.contains(&name) || self.slot_names.contains(&name) {
            name.push('_');
        }
        self.temps.push(name);
        self.varnames + self.temps.len() as u32 - 1
    }

    /// Emits one instruction (graph breaks emit the original instruction they stopped at).
    pub fn emit_instruction(&mut self, opcode: Opcode, operand: Operand) {
        self.emit(opcode, operand);
    }

    /// Index of the next instruction to be emitted (for jumps patched later).
    pub fn next_index(&self) -> usize {
        self.out.len()
    }

    /// Points the jump at `at` to the next instruction to be emitted.
    pub fn patch_jump_here(&mut self, at: usize) {
        self.out[at].operand = Operand::Jump(InstrIndex(self.out.len() as u32));
    }

    /// Stores the output tuple (on top of the stack) in a local; later rebuilds read it there.
    pub fn keep_outputs_in_local(&mut self) {
        let slot = self.temp("___graph_out");
        self.emit(Opcode::StoreFast, Operand::Local(slot));
        self.outputs_local = Some(slot);
    }

    /// Unbinds the temps rebuilds read (the graph's outputs, shared objects): nothing is
    /// rebuilt after this.
    pub fn drop_rebuild_temps(&mut self) {
        let mut slots: Vec<u32> = self.shared_slots.values().copied().collect();
        slots.extend(self.outputs_local.take());
        slots.sort_unstable();
        for slot in slots {
            self.emit(Opcode::DeleteFast, Operand::Local(slot));
        }
        self.shared_slots.clear();
    }

    /// Builds each shared object once, in order, into a temp of its own.
    pub fn define_shared(&mut self, shared: &[(u32, Rebuild)]) -> CResult<()> {
        for (id, plan) in shared {
            self.rebuild(plan, 0)?;
            let slot = self.temp(&format!("___shared_{id}"));
            self.emit(Opcode::StoreFast, Operand::Local(slot));
            self.shared_slots.insert(*id, slot);
        }
        Ok(())
    }

    /// Pushes the value `plan` describes (outputs read from the outputs local).
    pub fn push_rebuilt(&mut self, plan: &Rebuild) -> CResult<()> {
        self.rebuild(plan, 0)
    }

    /// `KW_NAMES` for the call about to be emitted.
    pub fn emit_kw_names(&mut self, names: &Bound<'py, PyAny>) {
        let i = self.const_index(names);
        self.emit(Opcode::KwNames, Operand::Const(i));
    }

    /// Pushes `func(*args)`, every one of them a constant.
    pub fn call_constant(&mut self, func: &Bound<'py, PyAny>, args: &[Bound<'py, PyAny>]) {
        self.emit(Opcode::PushNull, Operand::None);
        self.load_const(func);
        for arg in args {
            self.load_const(arg);
        }
        let argc = Operand::Int(args.len() as u32);
        self.emit(Opcode::Precall, argc);
        self.emit(Opcode::Call, argc);
    }

    /// `torch._C._set_grad_enabled(mode)`; nothing for None. (Where a graph of nothing but
    /// grad-mode switches was dropped — `CompiledGraph::grad_mode_after` — and after a graph
    /// that ended in the frame's entry mode — `Tracer::end_in_entry_grad_mode`.)
    pub fn set_grad_mode(&mut self, mode: Option<bool>) -> CResult<()> {
        let Some(mode) = mode else {
            return Ok(());
        };
        let py = self.py;
        let setter = py
            .import("torch")?
            .getattr("_C")?
            .getattr("_set_grad_enabled")?;
        let mode = pyo3::types::PyBool::new(py, mode).to_owned().into_any();
        self.call_constant(&setter, &[mode]);
        self.emit(Opcode::PopTop, Operand::None);
        Ok(())
    }

    /// Loads the cell of free or cell variable `slot` (original numbering), for a closure.
    pub fn load_closure(&mut self, slot: u32) {
        self.emit(Opcode::LoadClosure, Operand::Cell(slot));
    }

    /// Sets the positions (source line) of instructions emitted from now on.
    pub fn set_positions(&mut self, positions: Positions) {
        self.positions = positions;
    }

    fn emit(&mut self, opcode: Opcode, operand: Operand) {
        self.out.push(Instruction {
            opcode,
            operand,
            positions: self.positions,
            handler: self.handler,
        });
    }

    /// Instructions emitted from now on unwind to `depth` (pushing the raising offset if
    /// `lasti`) and jump to a handler emitted later, at [`CodeGen::patch_handlers_here`].
    pub fn begin_handled(&mut self, depth: u32, lasti: bool) {
        self.handler = Some(ExceptionHandler {
            target: PENDING_HANDLER,
            depth,
            lasti,
        });
    }

    /// Instructions emitted from now on have no handler.
    pub fn end_handled(&mut self) {
        self.handler = None;
    }

    /// Points the pending handlers at the next instruction to be emitted.
    pub fn patch_handlers_here(&mut self) {
        let here = InstrIndex(self.out.len() as u32);
        for ins in &mut self.out {
            if let Some(h) = &mut ins.handler {
                if h.target == PENDING_HANDLER {
                    h.target = here;
                }
            }
        }
    }

    fn const_index(&mut self, value: &Bound<'py, PyAny>) -> u32 {
        // Identity, not equality: 1 and True are equal but must stay distinct.
        if let Some(i) = self.consts.iter().position(|c| c.is(value)) {
            return i as u32;
        }
        self.consts.push(value.clone());
        (self.consts.len() - 1) as u32
    }

    fn name_index(&mut self, name: &str) -> u32 {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return i as u32;
        }
        self.names.push(name.to_string());
        (self.names.len() - 1) as u32
    }

    pub fn load_const(&mut self, value: &Bound<'py, PyAny>) {
        let i = self.const_index(value);
        self.emit(Opcode::LoadConst, Operand::Const(i));
    }

    /// Emits code that pushes the value of `source`.
    pub fn load_source(&mut self, source: &Source) -> CResult<()> {
        let py = self.py;
        match source {
            Source::Local(name) => {
                let Some(slot) = self.slot_names.iter().position(|n| n == name) else {
                    return unsupported(
                        BreakKind::Internal,
                        format!("no local named {name} to load"),
                    );
                };
                if let Some(&original) = self.cell_originals.get(&(slot as u32)) {
                    self.emit(Opcode::LoadFast, Operand::Local(original));
                } else if self.cell_slots[slot] {
                    self.emit(Opcode::LoadDeref, Operand::Cell(slot as u32));
                } else {
                    self.emit(Opcode::LoadFast, Operand::Local(slot as u32));
                }
            }
            Source::Global {
                globals,
                builtins,
                name,
                root,
            } => {
                let in_globals = globals
                    .bind(py)
                    .cast::<PyDict>()
                    .map_err(PyErr::from)?
                    .contains(name)?;
                if *root {
                    let i = self.name_index(name);
                    self.emit(Opcode::LoadGlobal, Operand::Name(i << 1));
                } else {
                    let container = if in_globals {
                        globals.bind(py).clone()
                    } else {
                        builtins.bind(py).clone()
                    };
                    self.load_const(&container);
                    let key = pyo3::types::PyString::new(py, name).into_any();
                    if container.cast::<PyDict>().is_ok() {
                        self.load_const(&key);
                        self.emit(Opcode::BinarySubscr, Operand::None);
                    } else {
                        let i = self.name_index(name);
                        self.emit(Opcode::LoadAttr, Operand::Name(i));
                    }
                }
            }
            Source::Object(object, _) => self.load_const(&object.bind(py).clone()),
            Source::Cell(cell) => {
                self.load_const(&cell.bind(py).clone());
                let i = self.name_index("cell_contents");
                self.emit(Opcode::LoadAttr, Operand::Name(i));
            }
            Source::Attr(base, attr) => {
                self.load_source(base)?;
                let i = self.name_index(attr);
                self.emit(Opcode::LoadAttr, Operand::Name(i));
            }
            // The entry of a class the guard holds, which the guard checks to be this very
            // object (`Tracer::guard_class`): loaded as that object.
            Source::ClassAttr(base, name) => {
                let found = match base.as_ref() {
                    Source::Object(class, _) => super::guard_values::class_lookup(
                        &class.bind(py).clone(),
                        &pyo3::types::PyString::new(py, name),
                    ),
                    _ => None,
                };
                let Some(found) = found else {
                    return unsupported(
                        BreakKind::Internal,
                        "internal: loading a class-lookup source",
                    );
                };
                self.load_const(&found);
            }
            Source::AsTensor(base) => {
                let as_tensor = py.import_module("torch")?.getattr("as_tensor")?;
                self.emit(Opcode::PushNull, Operand::None);
                self.load_const(&as_tensor);
                self.load_source(base)?;
                self.emit(Opcode::Precall, Operand::Int(1));
                self.emit(Opcode::Call, Operand::Int(1));
            }
            // `dict.__getitem__(base, key)`: `base[key]` would run the class's override.
            Source::DictItem(base, key) => {
                let getitem = py
                    .get_type::<pyo3::types::PyDict>()
                    .getattr("__getitem__")?;
                self.emit(Opcode::PushNull, Operand::None);
                self.load_const(&getitem);
                self.load_source(base)?;
                let key = key.to_python(py)?;
                self.load_const(&key);
                self.emit(Opcode::Precall, Operand::Int(2));
                self.emit(Opcode::Call, Operand::Int(2));
            }
            Source::Item(base, key) => {
                self.load_source(base)?;
                let key = key.to_python(py)?;
                self.load_const(&key);
                self.emit(Opcode::BinarySubscr, Operand::None);
            }
        }
        Ok(())
    }

    /// Emits the call of the compiled graph with its inputs; leaves the output tuple on the
    /// stack. With `rerun` (the graph holds operations from inside `try` blocks, and
    /// nothing that changes state: `Tracer::rerun_on_error`), a graph that raises makes the
    /// frame run its original code eagerly instead and return what that returns: the frame
    /// has done nothing else yet (stores are replayed after the graph), so the exception
    /// reaches the user's handlers as in eager.
    pub fn call_graph(
        &mut self,
        compiled: &Bound<'py, PyAny>,
        inputs: &[Rc<Source>],
        rerun: Option<&Rerun>,
    ) -> CResult<()> {
        let random_state = match rerun {
            Some(r) if r.restore_random => {
                //     ___random_state = random_state()
                let take = self
                    .py
                    .import_module("dynamo_rs._rerun")?
                    .getattr("random_state")?;
                self.emit(Opcode::PushNull, Operand::None);
                self.load_const(&take);
                self.emit(Opcode::Precall, Operand::Int(0));
                self.emit(Opcode::Call, Operand::Int(0));
                let slot = self.temp("___random_state");
                self.emit(Opcode::StoreFast, Operand::Local(slot));
                Some(slot)
            }
            _ => None,
        };
        if rerun.is_some() {
            // Depth 0: the graph is called first, on an empty stack.
            self.begin_handled(0, false);
        }
        self.emit_graph_call(compiled, inputs)?;
        let Some(rerun) = rerun else {
            return Ok(());
        };
        self.end_handled();
        let over_handler = self.out.len();
        self.emit(Opcode::Jump, Operand::Jump(InstrIndex(0)));
        self.patch_handlers_here();
        // The handler, with the exception on the stack:
        //     return rerun_eagerly(exc, code, grad_mode, (parameters...), (free cells...)
        //                          [, ___random_state])
        let helper = self
            .py
            .import_module("dynamo_rs._rerun")?
            .getattr("rerun_eagerly")?;
        self.emit(Opcode::PushNull, Operand::None);
        self.load_const(&helper);
        self.emit(Opcode::Copy, Operand::Int(3));
        let code = self.code.clone();
        self.load_const(&code);
        let mode = pyo3::types::PyBool::new(self.py, rerun.grad_mode)
            .to_owned()
            .into_any();
        self.load_const(&mode);
        let parameters: Vec<String> = code
            .getattr("co_varnames")?
            .extract::<Vec<String>>()?
            .into_iter()
            .take(rerun.parameters)
            .collect();
        for name in &parameters {
            self.load_source(&Source::Local(name.clone()))?;
        }
        self.emit(Opcode::BuildTuple, Operand::Int(parameters.len() as u32));
        let free = code.getattr("co_freevars")?.len()?;
        let first_free = self.slot_names.len() - free;
        for slot in first_free..self.slot_names.len() {
            self.load_closure(slot as u32);
        }
        self.emit(Opcode::BuildTuple, Operand::Int(free as u32));
        let mut count = 5;
        if let Some(slot) = random_state {
            self.emit(Opcode::LoadFast, Operand::Local(slot));
            count += 1;
        }
        self.emit(Opcode::Precall, Operand::Int(count));
        self.emit(Opcode::Call, Operand::Int(count));
        self.emit(Opcode::Swap, Operand::Int(2));
        self.emit(Opcode::PopTop, Operand::None);
        self.emit(Opcode::ReturnValue, Operand::None);
        self.patch_jump_here(over_handler);
        Ok(())
    }

    fn emit_graph_call(
        &mut self,
        compiled: &Bound<'py, PyAny>,
        inputs: &[Rc<Source>],
    ) -> CResult<()> {
        // graph(*inputs), where inputs are the values the passing guard just read
        // (`take_graph_inputs`), or, on the first call (no guard ran), loaded here:
        //     inputs = take_graph_inputs(graph)
        //     if inputs is None: inputs = (<source 0>, <source 1>, ...)
        let take = self
            .py
            .import_module("dynamo_rs._native")?
            .getattr("take_graph_inputs")?;
        self.emit(Opcode::PushNull, Operand::None);
        self.load_const(compiled);
        self.emit(Opcode::PushNull, Operand::None);
        self.load_const(&take);
        self.load_const(compiled);
        self.emit(Opcode::Precall, Operand::Int(1));
        self.emit(Opcode::Call, Operand::Int(1));
        self.emit(Opcode::Copy, Operand::Int(1));
        let branch = self.out.len();
        self.emit(Opcode::PopJumpIfNotNone, Operand::Jump(InstrIndex(0)));
        self.emit(Opcode::PopTop, Operand::None);
        for source in inputs {
            self.load_source(source)?;
        }
        self.emit(Opcode::BuildTuple, Operand::Int(inputs.len() as u32));
        let call = self.out.len() as u32;
        self.out[branch].operand = Operand::Jump(InstrIndex(call));
        self.emit(Opcode::CallFunctionEx, Operand::Int(0));
        Ok(())
    }

    /// Pushes the return value; `above` is how many values sit above the output tuple.
    fn rebuild(&mut self, plan: &Rebuild, above: u32) -> CResult<()> {
        let py = self.py;
        match plan {
            Rebuild::Output(k) => {
                match self.outputs_local {
                    Some(slot) => self.emit(Opcode::LoadFast, Operand::Local(slot)),
                    None => self.emit(Opcode::Copy, Operand::Int(above + 1)),
                }
                let index = (*k as i64).into_pyobject(py)?.into_any();
                self.load_const(&index);
                self.emit(Opcode::BinarySubscr, Operand::None);
            }
            Rebuild::Const(v) => self.load_const(&v.bind(py).clone()),
            Rebuild::Attr { base, name } => {
                self.rebuild(base, above)?;
                let i = self.name_index(name);
                self.emit(Opcode::LoadAttr, Operand::Name(i));
            }
            Rebuild::BoundMethod { func, receiver } => {
                let method_type = py.import_module("types")?.getattr("MethodType")?;
                self.emit(Opcode::PushNull, Operand::None);
                self.load_const(&method_type);
                self.load_const(&func.bind(py).clone());
                self.rebuild(receiver, above + 3)?;
                self.emit(Opcode::Precall, Operand::Int(2));
                self.emit(Opcode::Call, Operand::Int(2));
            }
            Rebuild::Converted { into, value } => {
                self.emit(Opcode::PushNull, Operand::None);
                self.load_const(&into.bind(py).clone());
                self.rebuild(value, above + 2)?;
                self.emit(Opcode::Precall, Operand::Int(1));
                self.emit(Opcode::Call, Operand::Int(1));
            }
            Rebuild::Source(s) => self.load_source(s)?,
            Rebuild::FrameCell { slot, value } => {
                if let Some(value) = value {
                    self.rebuild(value, above)?;
                    self.store_frame_cell(*slot);
                }
                self.load_closure(*slot);
            }
            Rebuild::Shared(id) => match self.shared_slots.get(id) {
                Some(&slot) => self.emit(Opcode::LoadFast, Operand::Local(slot)),
                None => {
                    return unsupported(
                        BreakKind::Internal,
                        "internal: a shared object used before it was built",
                    )
                }
            },
            Rebuild::Tuple(items) | Rebuild::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.rebuild(item, above + i as u32)?;
                }
                let n = Operand::Int(items.len() as u32);
                let op = if matches!(plan, Rebuild::Tuple(_)) {
                    Opcode::BuildTuple
                } else {
                    Opcode::BuildList
                };
                self.emit(op, n);
            }
            Rebuild::Instance { cls, attrs } => {
                let object = py.import_module("builtins")?.getattr("object")?;
                let new = object.getattr("__new__")?;
                self.call_constant(&new, &[cls.bind(py).clone()]);
                let object_setattr = object.getattr("__setattr__")?;
                if !cls.bind(py).getattr("__setattr__")?.is(&object_setattr) {
                    // `attrs` is the state the trace stored (what `object.__setattr__` in a
                    // frozen dataclass's `__init__` stored): a class's own `__setattr__`
                    // (frozen, validating, `nn.Module`'s) must not run on it again.
                    for (name, value) in attrs {
                        self.emit(Opcode::PushNull, Operand::None);
                        self.load_const(&object_setattr);
                        self.emit(Opcode::Copy, Operand::Int(3));
                        self.load_const(&pyo3::types::PyString::new(py, name).into_any());
                        self.rebuild(value, above + 5)?;
                        self.emit(Opcode::Precall, Operand::Int(3));
                        self.emit(Opcode::Call, Operand::Int(3));
                        self.emit(Opcode::PopTop, Operand::None);
                    }
                    return Ok(());
                }
                for (name, value) in attrs {
                    self.emit(Opcode::Copy, Operand::Int(1));
                    self.rebuild(value, above + 2)?;
                    self.emit(Opcode::Swap, Operand::Int(2));
                    let i = self.name_index(name);
                    self.emit(Opcode::StoreAttr, Operand::Name(i));
                }
            }
            Rebuild::Call { func, args, kwargs } => {
                // NULL, func, (args...), {kwargs...}: CALL_FUNCTION_EX 1.
                self.emit(Opcode::PushNull, Operand::None);
                self.rebuild(func, above + 1)?;
                for (i, arg) in args.iter().enumerate() {
                    self.rebuild(arg, above + 2 + i as u32)?;
                }
                self.emit(Opcode::BuildTuple, Operand::Int(args.len() as u32));
                for (i, (name, value)) in kwargs.iter().enumerate() {
                    self.load_const(&pyo3::types::PyString::new(py, name).into_any());
                    self.rebuild(value, above + 4 + 2 * i as u32)?;
                }
                self.emit(Opcode::BuildMap, Operand::Int(kwargs.len() as u32));
                self.emit(Opcode::CallFunctionEx, Operand::Int(1));
            }
            Rebuild::Dict(entries) => {
                for (i, (key, value)) in entries.iter().enumerate() {
                    self.rebuild(key, above + 2 * i as u32)?;
                    self.rebuild(value, above + 2 * i as u32 + 1)?;
                }
                self.emit(Opcode::BuildMap, Operand::Int(entries.len() as u32));
            }
        }
        Ok(())
    }

    /// Replays the side effects the trace made on objects that existed before the call, in
    /// two phases: first every stored value and every target object is pushed, all read
    /// while the objects still hold what the trace started from (`a.p, a.q = a.q, a.p`
    /// must not read a `.q` already replayed), then the stores run in the trace's order.
    /// What sits below on the stack is left as it is; outputs must be in a local (see
    /// `keep_outputs_in_local`).
    pub fn replay(&mut self, replays: &[Replay]) -> CResult<()> {
        let replace = if replays.iter().any(|r| matches!(r, Replay::Contents { .. })) {
            Some(
                self.py
                    .import_module("dynamo_rs._capture")?
                    .getattr("replace_contents")?,
            )
        } else {
            None
        };
        for replay in replays.iter().rev() {
            match replay {
                Replay::SetAttr { source, value, .. } => {
                    self.rebuild(value, 0)?;
                    self.load_source(source)?;
                }
                Replay::DelAttr { source, .. } => self.load_source(source)?,
                Replay::SetGlobal {
                    globals,
                    name,
                    value,
                } => {
                    self.rebuild(value, 0)?;
                    self.load_const(&globals.bind(self.py).clone());
                    self.load_const(&pyo3::types::PyString::new(self.py, name).into_any());
                }
                Replay::Contents { source, value } => {
                    self.emit(Opcode::PushNull, Operand::None);
                    self.load_const(replace.as_ref().expect("looked up above"));
                    self.load_source(source)?;
                    self.rebuild(value, 0)?;
                }
                Replay::SetDeref { value, .. } => self.rebuild(value, 0)?,
            }
        }
        for replay in replays {
            match replay {
                Replay::SetAttr { name, .. } => {
                    let i = self.name_index(name);
                    self.emit(Opcode::StoreAttr, Operand::Name(i));
                }
                Replay::DelAttr { name, .. } => {
                    let i = self.name_index(name);
                    self.emit(Opcode::DeleteAttr, Operand::Name(i));
                }
                Replay::SetGlobal { .. } => self.emit(Opcode::StoreSubscr, Operand::None),
                Replay::Contents { .. } => {
                    self.emit(Opcode::Precall, Operand::Int(2));
                    self.emit(Opcode::Call, Operand::Int(2));
                    self.emit(Opcode::PopTop, Operand::None);
                }
                Replay::SetDeref { slot, .. } => self.store_frame_cell(*slot),
            }
        }
        Ok(())
    }

    /// Finishes the code: returns the value on top of the stack.
    pub fn finish_return(mut self) -> CResult<Bound<'py, PyAny>> {
        self.emit(Opcode::ReturnValue, Operand::None);
        self.assemble()
    }

    /// The code object of the instructions emitted so far (which must end every path).
    pub fn assemble(mut self) -> CResult<Bound<'py, PyAny>> {
        let py = self.py;
        if !self.temps.is_empty() {
            // The temps sit between the original varnames and the cells: move cell and free
            // slots up past them.
            let shift = self.temps.len() as u32;
            for ins in &mut self.out {
                if let Operand::Cell(slot) = ins.operand {
                    if slot >= self.varnames {
                        ins.operand = Operand::Cell(slot + shift);
                    }
                }
            }
            for &at in &self.prologue_cell_locals {
                if let Operand::Local(slot) = self.out[at].operand {
                    self.out[at].operand = Operand::Local(slot + shift);
                }
            }
        }
        let first_line: i32 = self.code.getattr("co_firstlineno")?.extract()?;
        let flags: u32 = self.code.getattr("co_flags")?.extract()?;
        let assembled = dynamo_bytecode::assemble(&self.out, first_line, flags).map_err(|e| {
            CaptureError::Unsupported(Break::new(
                BreakKind::Internal,
                format!("internal: generated code does not assemble: {e}"),
            ))
        })?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("co_consts", PyTuple::new(py, &self.consts)?)?;
        kwargs.set_item("co_names", PyTuple::new(py, &self.names)?)?;
        if !self.temps.is_empty() {
            let mut varnames: Vec<String> = self.code.getattr("co_varnames")?.extract()?;
            varnames.extend(self.temps.iter().cloned());
            kwargs.set_item("co_nlocals", varnames.len())?;
            kwargs.set_item("co_varnames", PyTuple::new(py, &varnames)?)?;
        }
        Ok(crate::api::bytecode::code_with_tables(
            &self.code, &assembled, kwargs,
        )?)
    }
}

/// The prologue of a code object: everything up to and including its first `RESUME`.
pub fn prologue(instructions: &[Instruction]) -> CResult<Vec<Instruction>> {
    match instructions.iter().position(|i| i.opcode == Opcode::Resume) {
        Some(end) => {
            let head = &instructions[..=end];
            if head.iter().any(|i| i.jump_target().is_some()) {
                return unsupported(BreakKind::Internal, "a prologue with jumps");
            }
            Ok(head
                .iter()
                .map(|i| Instruction {
                    operand: fix_jump(i.operand),
                    ..*i
                })
                .collect())
        }
        None => unsupported(BreakKind::Internal, "code without RESUME"),
    }
}

fn fix_jump(operand: Operand) -> Operand {
    match operand {
        Operand::Jump(t) => Operand::Jump(InstrIndex(t.0)),
        other => other,
    }
}
