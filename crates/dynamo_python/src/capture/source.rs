//! Sources: where a value the trace depends on came from, relative to the compiled frame.
//! A source is how guards find the value again on the next call, and how the transformed
//! code loads a graph input.

use std::rc::Rc;

use crate::eval_frame::owned::OwnedRef;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ItemKey {
    Int(i64),
    Str(String),
}

#[derive(Clone, Debug)]
pub enum Source {
    /// A local of the compiled frame (an argument, or a free variable by name).
    Local(String),
    /// `name` looked up in `globals`, then in `builtins`. `root` says whether `globals` are
    /// the compiled frame's own, which its code can load with `LOAD_GLOBAL`.
    Global {
        globals: OwnedRef,
        builtins: OwnedRef,
        name: String,
        root: bool,
    },
    /// The contents of a closure cell of an inlined function (the cell itself is kept).
    Cell(OwnedRef),
    Attr(Rc<Source>, String),
    Item(Rc<Source>, ItemKey),
}

impl Source {
    /// The graph-input name for a value from this source, in TorchDynamo's style
    /// (`L_x_`, `L_self_conv1_weight_`).
    pub fn graph_name(&self) -> String {
        let mut name = self.path();
        name.push('_');
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }

    fn path(&self) -> String {
        match self {
            Source::Local(name) => format!("L_{name}"),
            Source::Global { name, .. } => format!("G_{name}"),
            Source::Cell(_) => "C".to_string(),
            Source::Attr(base, attr) => format!("{}_{attr}", base.path()),
            Source::Item(base, ItemKey::Int(i)) => format!("{}_{i}", base.path()),
            Source::Item(base, ItemKey::Str(k)) => format!("{}_{k}", base.path()),
        }
    }

    /// A readable form for messages: `L['self'].conv1.weight`.
    pub fn describe(&self) -> String {
        match self {
            Source::Local(name) => format!("L[{name:?}]"),
            Source::Global { name, .. } => format!("G[{name:?}]"),
            Source::Cell(_) => "<closure cell>".to_string(),
            Source::Attr(base, attr) => format!("{}.{attr}", base.describe()),
            Source::Item(base, ItemKey::Int(i)) => format!("{}[{i}]", base.describe()),
            Source::Item(base, ItemKey::Str(k)) => format!("{}[{k:?}]", base.describe()),
        }
    }
}
