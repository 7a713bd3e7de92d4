//! The graph IR: an arena of nodes in execution order, exported to `torch.fx` once at the
//! end. Placeholders are the graph inputs (with the source each is loaded from); every
//! other node is a call of a torch function, a Python operator or a tensor method.

use std::collections::{HashMap, HashSet};

use crate::eval_frame::owned::OwnedRef;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeId(pub u32);

#[derive(Clone, Debug)]
pub enum Arg {
    Node(NodeId),
    Const(OwnedRef),
    Tuple(Vec<Arg>),
    List(Vec<Arg>),
    /// `slice(start, stop, step)` with symbolic bounds.
    Slice(Vec<Arg>),
    Dict(Vec<(OwnedRef, Arg)>),
}

#[derive(Clone, Debug)]
pub enum Op {
    Placeholder,
    CallFunction(OwnedRef),
    CallMethod(String),
    /// `self.<name>`: a submodule of the exported GraphModule (the body of a higher-order
    /// operation, see `ops_checkpoint`), which export registers under that name.
    GetAttr {
        name: String,
        module: OwnedRef,
    },
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
    /// The next suffix to try per base name, so naming the n-th `linear` costs O(1)
    /// rather than probing `linear_1` … `linear_{n-1}` again (quadratic on deep models).
    next_suffix: HashMap<String, usize>,
}

impl Graph {
    pub fn add(
        &mut self,
        op: Op,
        base_name: &str,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
        fake: OwnedRef,
    ) -> NodeId {
        let name = self.unique_name(base_name);
        self.nodes.push(Node {
            op,
            name,
            args,
            kwargs,
            fake,
        });
        NodeId(self.nodes.len() as u32 - 1)
    }

    fn unique_name(&mut self, base: &str) -> String {
        let base: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let base = if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
            format!("n_{base}")
        } else {
            base
        };
        if self.names.insert(base.clone()) {
            return base;
        }
        let next = self.next_suffix.entry(base.clone()).or_insert(1);
        loop {
            let candidate = format!("{base}_{next}");
            *next += 1;
            if self.names.insert(candidate.clone()) {
                return candidate;
            }
        }
    }

    /// Which nodes to keep when dropping `operator.getitem` nodes nothing uses (made for
    /// every item of a tuple result, whether or not the code reads it).
    pub fn unused_getitems(
        &self,
        outputs: &[NodeId],
        is_getitem: impl Fn(&Node) -> bool,
    ) -> Vec<bool> {
        let mut used = vec![false; self.nodes.len()];
        for out in outputs {
            used[out.0 as usize] = true;
        }
        fn mark(arg: &Arg, used: &mut [bool]) {
            match arg {
                Arg::Node(n) => used[n.0 as usize] = true,
                Arg::Tuple(items) | Arg::List(items) | Arg::Slice(items) => {
                    items.iter().for_each(|a| mark(a, used))
                }
                Arg::Dict(entries) => entries.iter().for_each(|(_, a)| mark(a, used)),
                Arg::Const(_) => {}
            }
        }
        for node in &self.nodes {
            node.args.iter().for_each(|a| mark(a, &mut used));
            node.kwargs.iter().for_each(|(_, a)| mark(a, &mut used));
        }
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| used[i] || !is_getitem(n))
            .collect()
    }

    /// Which nodes to keep when dropping grad-mode switches that change nothing, as
    /// TorchDynamo does: first a switch immediately overridden by another (no operation
    /// between), then a switch to the mode already in force (starting from `initial`).
    /// `mode_of` says whether a node is a switch and to which mode.
    pub fn useless_grad_mode_switches(
        &self,
        initial: bool,
        mode_of: impl Fn(&Node) -> Option<bool>,
    ) -> Vec<bool> {
        let mut keep = vec![true; self.nodes.len()];
        let mut unfollowed: Option<usize> = None;
        for (i, node) in self.nodes.iter().enumerate() {
            if mode_of(node).is_some() {
                if let Some(previous) = unfollowed.replace(i) {
                    keep[previous] = false;
                }
            } else if !matches!(node.op, Op::Placeholder) {
                unfollowed = None;
            }
        }
        let mut current = initial;
        for (i, node) in self.nodes.iter().enumerate() {
            if let (true, Some(mode)) = (keep[i], mode_of(node)) {
                if mode == current {
                    keep[i] = false;
                }
                current = mode;
            }
        }
        keep
    }

    /// Keeps the nodes marked in `keep`, renumbering references; returns the old → new map.
    /// A dropped node must not be referenced by a kept one.
    /// Marks in `keep` every node that an output or a kept node refers to (arguments always
    /// refer to earlier nodes, so one pass from the end reaches them all).
    pub fn keep_referenced(&self, keep: &mut [bool], outputs: &[NodeId]) {
        fn mark(arg: &Arg, keep: &mut [bool]) {
            match arg {
                Arg::Node(n) => keep[n.0 as usize] = true,
                Arg::Tuple(items) | Arg::List(items) | Arg::Slice(items) => {
                    items.iter().for_each(|a| mark(a, keep))
                }
                Arg::Dict(entries) => entries.iter().for_each(|(_, a)| mark(a, keep)),
                Arg::Const(_) => {}
            }
        }
        for output in outputs {
            keep[output.0 as usize] = true;
        }
        for (i, node) in self.nodes.iter().enumerate().rev() {
            if keep[i] {
                node.args.iter().for_each(|a| mark(a, keep));
                node.kwargs.iter().for_each(|(_, a)| mark(a, keep));
            }
        }
    }

    pub fn retain(&mut self, keep: &[bool]) -> Vec<Option<NodeId>> {
        let mut map = Vec::with_capacity(self.nodes.len());
        let mut kept = Vec::with_capacity(self.nodes.len());
        for (i, node) in std::mem::take(&mut self.nodes).into_iter().enumerate() {
            if keep[i] {
                map.push(Some(NodeId(kept.len() as u32)));
                kept.push(node);
            } else {
                map.push(None);
            }
        }
        fn remap(arg: &mut Arg, map: &[Option<NodeId>]) {
            match arg {
                Arg::Node(n) => {
                    *n = map[n.0 as usize].expect("kept nodes only refer to kept nodes")
                }
                Arg::Tuple(items) | Arg::List(items) | Arg::Slice(items) => {
                    items.iter_mut().for_each(|a| remap(a, map))
                }
                Arg::Dict(entries) => entries.iter_mut().for_each(|(_, a)| remap(a, map)),
                Arg::Const(_) => {}
            }
        }
        for node in &mut kept {
            node.args.iter_mut().for_each(|a| remap(a, &map));
            node.kwargs.iter_mut().for_each(|(_, a)| remap(a, &map));
        }
        self.nodes = kept;
        map
    }

    /// Operations in the graph (calls: not placeholders nor submodules), as CompileCounter
    /// counts them.
    /// `op_count` over the nodes `keep` keeps.
    pub fn op_count_where(&self, keep: &[bool]) -> usize {
        self.nodes
            .iter()
            .zip(keep)
            .filter(|(n, &k)| k && !matches!(n.op, Op::Placeholder | Op::GetAttr { .. }))
            .count()
    }

    pub fn op_count(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| !matches!(n.op, Op::Placeholder | Op::GetAttr { .. }))
            .count()
    }
}
