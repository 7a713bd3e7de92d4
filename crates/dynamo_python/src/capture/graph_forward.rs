//! The `forward` of an exported graph as bytecode, made from the graph IR directly.
//!
//! torch.fx makes a GraphModule's `forward` by printing the graph as Python source and
//! compiling it: for a few hundred nodes that is 10–20 ms, a fifth to a third of a whole
//! capture. The function here computes the same thing — each node's call in order, its
//! arguments rebuilt from earlier results and constants, every value released after its last
//! use (as fx's generated code sets it to None), the outputs returned as a tuple — assembled
//! in microseconds. The GraphModule still has its `torch.fx.Graph`, and fx's source is
//! generated the first time anyone asks for `.code` (see `_capture.CapturedGraphModule`).

use std::collections::HashMap;

use dynamo_bytecode::{Instruction, Opcode, Operand};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::break_reasons::{Break, BreakKind};
use super::graph::{Arg, Graph, NodeId, Op};
use super::translator::{unsupported, CResult, CaptureError};

/// `co_flags` of the generated function: optimized, new locals.
const CO_OPTIMIZED_NEWLOCALS: u32 = 0x1 | 0x2;

struct Emitter<'py> {
    out: Vec<Instruction>,
    consts: Vec<Bound<'py, PyAny>>,
    /// Constant index by object identity (1 and True are equal but distinct constants).
    const_slots: HashMap<usize, u32>,
    names: Vec<String>,
    /// The local of each node's value: `self` is local 0, the placeholders (graph inputs,
    /// which fx allows anywhere in the node order) are the arguments in their order, then
    /// the call nodes in theirs.
    slots: Vec<u32>,
}

impl<'py> Emitter<'py> {
    fn emit(&mut self, opcode: Opcode, operand: Operand) {
        self.out.push(Instruction::new(opcode, operand));
    }

    fn load_const(&mut self, value: &Bound<'py, PyAny>) {
        let key = value.as_ptr() as usize;
        let index = match self.const_slots.get(&key) {
            Some(&i) => i,
            None => {
                self.consts.push(value.clone());
                let i = (self.consts.len() - 1) as u32;
                self.const_slots.insert(key, i);
                i
            }
        };
        self.emit(Opcode::LoadConst, Operand::Const(index));
    }

    /// Stores the value of node `i` just computed in its local (or drops it when nothing
    /// reads it), then releases the values whose last reader it was.
    fn store_result(
        &mut self,
        i: usize,
        last_use: &[Option<usize>],
        is_output: &[bool],
        released_after: &[Vec<u32>],
    ) {
        if last_use[i].is_none() && !is_output[i] {
            self.emit(Opcode::PopTop, Operand::None); // nothing reads it: released at once
        } else {
            self.emit(Opcode::StoreFast, Operand::Local(self.slots[i]));
        }
        for &slot in &released_after[i] {
            self.emit(Opcode::DeleteFast, Operand::Local(slot));
        }
    }

    fn name_index(&mut self, name: &str) -> u32 {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return i as u32;
        }
        self.names.push(name.to_string());
        (self.names.len() - 1) as u32
    }

    /// Pushes the value of `arg` (node `n`'s value is in local `slots[n]`).
    fn push_arg(&mut self, py: Python<'py>, arg: &Arg) -> PyResult<()> {
        match arg {
            Arg::Node(NodeId(n)) => {
                let slot = self.slots[*n as usize];
                self.emit(Opcode::LoadFast, Operand::Local(slot))
            }
            Arg::Const(value) => self.load_const(&value.bind(py).clone()),
            Arg::Tuple(items) | Arg::List(items) | Arg::Slice(items) => {
                for item in items {
                    self.push_arg(py, item)?;
                }
                let n = Operand::Int(items.len() as u32);
                let opcode = match arg {
                    Arg::Tuple(_) => Opcode::BuildTuple,
                    Arg::List(_) => Opcode::BuildList,
                    _ => Opcode::BuildSlice,
                };
                self.emit(opcode, n);
            }
            Arg::Dict(entries) => {
                for (key, value) in entries {
                    self.load_const(&key.bind(py).clone());
                    self.push_arg(py, value)?;
                }
                self.emit(Opcode::BuildMap, Operand::Int(entries.len() as u32));
            }
        }
        Ok(())
    }
}

/// Every node an argument reads.
fn reads(arg: &Arg, each: &mut impl FnMut(usize)) {
    match arg {
        Arg::Node(NodeId(n)) => each(*n as usize),
        Arg::Tuple(items) | Arg::List(items) | Arg::Slice(items) => {
            items.iter().for_each(|a| reads(a, each))
        }
        Arg::Dict(entries) => entries.iter().for_each(|(_, a)| reads(a, each)),
        Arg::Const(_) => {}
    }
}

/// The code object of `forward(self, <placeholders in order>)` computing `graph` and returning
/// the tuple of `outputs`; `template` is a code object whose other fields it keeps.
pub fn forward_code<'py>(
    py: Python<'py>,
    graph: &Graph,
    outputs: &[NodeId],
    template: &Bound<'py, PyAny>,
) -> CResult<Bound<'py, PyAny>> {
    let count = graph.nodes.len();
    // The last node reading each value (outputs are read by the return, after every node).
    let mut last_use: Vec<Option<usize>> = vec![None; count];
    for (i, node) in graph.nodes.iter().enumerate() {
        let mut mark = |n: usize| last_use[n] = Some(i);
        node.args.iter().for_each(|a| reads(a, &mut mark));
        node.kwargs.iter().for_each(|(_, a)| reads(a, &mut mark));
    }
    let mut is_output = vec![false; count];
    for out in outputs {
        is_output[out.0 as usize] = true;
    }
    let is_placeholder = |i: usize| matches!(graph.nodes[i].op, Op::Placeholder);
    let placeholders = (0..count).filter(|&i| is_placeholder(i)).count();
    let mut slots = vec![0u32; count];
    let (mut next_argument, mut next_local) = (1u32, placeholders as u32 + 1);
    for (i, slot) in slots.iter_mut().enumerate() {
        let next = if is_placeholder(i) {
            &mut next_argument
        } else {
            &mut next_local
        };
        *slot = *next;
        *next += 1;
    }
    let mut order = vec![0usize; count]; // the node whose value local `1 + k` holds
    for (i, &slot) in slots.iter().enumerate() {
        order[slot as usize - 1] = i;
    }
    let mut released_after: Vec<Vec<u32>> = vec![Vec::new(); count];
    for (n, used) in last_use.iter().enumerate() {
        if let Some(i) = used {
            if !is_output[n] {
                released_after[*i].push(slots[n]);
            }
        }
    }
    let mut e = Emitter {
        out: Vec::with_capacity(count * 6),
        consts: Vec::new(),
        const_slots: HashMap::new(),
        names: Vec::new(),
        slots,
    };
    e.emit(Opcode::Resume, Operand::Int(0));
    for (i, node) in graph.nodes.iter().enumerate() {
        match &node.op {
            Op::Placeholder => continue,
            Op::GetAttr { name, .. } => {
                e.emit(Opcode::LoadFast, Operand::Local(0));
                let index = e.name_index(name);
                e.emit(Opcode::LoadAttr, Operand::Name(index));
                e.store_result(i, &last_use, &is_output, &released_after);
                continue;
            }
            Op::CallFunction(target) => {
                e.emit(Opcode::PushNull, Operand::None);
                e.load_const(&target.bind(py).clone());
                for arg in &node.args {
                    e.push_arg(py, arg)?;
                }
            }
            Op::CallMethod(name) => {
                let Some((receiver, rest)) = node.args.split_first() else {
                    return unsupported(BreakKind::Internal, "a method call without a receiver");
                };
                e.push_arg(py, receiver)?;
                let index = e.name_index(name);
                e.emit(Opcode::LoadMethod, Operand::Name(index));
                for arg in rest {
                    e.push_arg(py, arg)?;
                }
            }
        }
        let positional = match &node.op {
            Op::CallMethod(_) => node.args.len() - 1,
            Op::Placeholder | Op::CallFunction(_) | Op::GetAttr { .. } => node.args.len(),
        };
        for (_, value) in &node.kwargs {
            e.push_arg(py, value)?;
        }
        if !node.kwargs.is_empty() {
            let names = PyTuple::new(py, node.kwargs.iter().map(|(k, _)| k.as_str()))?;
            let index = {
                e.consts.push(names.into_any());
                (e.consts.len() - 1) as u32
            };
            e.emit(Opcode::KwNames, Operand::Const(index));
        }
        let argc = Operand::Int((positional + node.kwargs.len()) as u32);
        e.emit(Opcode::Precall, argc);
        e.emit(Opcode::Call, argc);
        e.store_result(i, &last_use, &is_output, &released_after);
    }
    for out in outputs {
        let slot = e.slots[out.0 as usize];
        e.emit(Opcode::LoadFast, Operand::Local(slot));
    }
    e.emit(Opcode::BuildTuple, Operand::Int(outputs.len() as u32));
    e.emit(Opcode::ReturnValue, Operand::None);

    let assembled =
        dynamo_bytecode::assemble(&e.out, 1, CO_OPTIMIZED_NEWLOCALS).map_err(|err| {
            CaptureError::Unsupported(Break::new(
                BreakKind::Internal,
                format!("internal: the graph's forward does not assemble: {err}"),
            ))
        })?;
    let mut varnames: Vec<Bound<'py, PyAny>> = Vec::with_capacity(count + 1);
    varnames.push(PyString::new(py, "self").into_any());
    for &i in &order {
        varnames.push(PyString::new(py, &graph.nodes[i].name).into_any());
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("co_argcount", placeholders + 1)?;
    kwargs.set_item("co_posonlyargcount", 0)?;
    kwargs.set_item("co_kwonlyargcount", 0)?;
    kwargs.set_item("co_nlocals", varnames.len())?;
    kwargs.set_item("co_varnames", PyTuple::new(py, varnames)?)?;
    kwargs.set_item("co_cellvars", PyTuple::empty(py))?;
    kwargs.set_item("co_freevars", PyTuple::empty(py))?;
    kwargs.set_item("co_consts", PyTuple::new(py, &e.consts)?)?;
    kwargs.set_item("co_names", PyTuple::new(py, &e.names)?)?;
    kwargs.set_item("co_flags", CO_OPTIMIZED_NEWLOCALS)?;
    kwargs.set_item("co_firstlineno", 1)?;
    kwargs.set_item("co_name", "forward")?;
    kwargs.set_item("co_qualname", "CapturedGraphModule.forward")?;
    Ok(crate::api::bytecode::code_with_tables(
        template, &assembled, kwargs,
    )?)
}
