//! The graph IR: an arena of nodes in execution order, exported to `torch.fx` once at the
//! end. Placeholders are the graph inputs (with the source each is loaded from); every
//! other node is a call of a torch function, a Python operator or a tensor method.

use std::collections::HashSet;

use crate::eval_frame::owned::OwnedRef;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeId(pub u32);

#[derive(Clone, Debug)]
pub enum Arg {
    Node(NodeId),
    Const(OwnedRef),
    Tuple(Vec<Arg>),
    List(Vec<Arg>),
    Dict(Vec<(OwnedRef, Arg)>),
}

#[derive(Debug)]
pub enum Op {
    Placeholder,
    CallFunction(OwnedRef),
    CallMethod(String),
}

#[derive(Debug)]
pub struct Node {
    pub op: Op,
    pub name: String,
    pub args: Vec<Arg>,
    pub kwargs: Vec<(String, Arg)>,
    pub fake: OwnedRef,
}

#[derive(Debug, Default)]
pub struct Graph {
    pub nodes: Vec<Node>,
    names: HashSet<String>,
}

impl Graph {
    pub fn add(&mut self, op: Op, base_name: &str, args: Vec<Arg>, kwargs: Vec<(String, Arg)>, fake: OwnedRef) -> NodeId {
        let name = self.unique_name(base_name);
        self.nodes.push(Node { op, name, args, kwargs, fake });
        NodeId(self.nodes.len() as u32 - 1)
    }

    fn unique_name(&mut self, base: &str) -> String {
        let base: String = base.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        let base = if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) { format!("n_{base}") } else { base };
        if self.names.insert(base.clone()) {
            return base;
        }
        let mut i = 1;
        loop {
            let candidate = format!("{base}_{i}");
            if self.names.insert(candidate.clone()) {
                return candidate;
            }
            i += 1;
        }
    }

    /// Operations in the graph (everything but placeholders), as CompileCounter counts them.
    pub fn op_count(&self) -> usize {
        self.nodes.iter().filter(|n| !matches!(n.op, Op::Placeholder)).count()
    }
}
