//! Sources: where a value the trace depends on came from, relative to the compiled frame.
//! A source is how guards find the value again on the next call, and how the transformed
//! code loads a graph input.

use std::rc::Rc;

use crate::eval_frame::owned::OwnedRef;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ItemKey {
    Int(i64),
    Str(String),
    /// Any other hashable key (a dtype, a type, a tuple, a float), kept alive; told apart by
    /// identity, looked up by the dict's own hash and `==`.
    Object(ObjectKey),
}

/// A dict key that is neither an int nor a str, with its repr for descriptions.
#[derive(Clone, Debug)]
pub struct ObjectKey {
    pub value: OwnedRef,
    pub repr: String,
}

impl PartialEq for ObjectKey {
    fn eq(&self, other: &Self) -> bool {
        self.value.as_ptr() == other.value.as_ptr()
    }
}

impl Eq for ObjectKey {}

impl std::hash::Hash for ObjectKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.value.as_ptr() as usize).hash(state);
    }
}

impl ItemKey {
    /// The key for looking `key` up again: ints and strs by value (what a guard or the
    /// generated code rebuilds), anything else by the object itself.
    pub fn of(key: &pyo3::Bound<'_, pyo3::PyAny>) -> ItemKey {
        use pyo3::types::{PyAnyMethods, PyBool, PyInt, PyString};
        if key.is_instance_of::<PyInt>() && !key.is_instance_of::<PyBool>() {
            if let Ok(i) = key.extract::<i64>() {
                return ItemKey::Int(i);
            }
        }
        if key.is_exact_instance_of::<PyString>() {
            if let Ok(s) = key.extract::<String>() {
                return ItemKey::Str(s);
            }
        }
        ItemKey::Object(ObjectKey {
            value: OwnedRef::from_bound(key),
            repr: key.repr().map(|r| r.to_string()).unwrap_or_default(),
        })
    }

    /// The key as a Python object.
    pub fn to_python<'py>(
        &self,
        py: pyo3::Python<'py>,
    ) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::PyAny>> {
        use pyo3::IntoPyObject;
        Ok(match self {
            ItemKey::Int(i) => i.into_pyobject(py)?.into_any(),
            ItemKey::Str(s) => pyo3::types::PyString::new(py, s).into_any(),
            ItemKey::Object(k) => k.value.bind(py).clone(),
        })
    }
}

/// One component of a source's readable path (`L["self"]`, `._modules`, `["fc"]`): what
/// [`Source::describe`] and the guard plan's descriptions are made of.
#[derive(Clone, Debug)]
pub enum PathPart {
    Local(String),
    Global(String),
    Cell,
    Object(String),
    Attr(String),
    ClassAttr(String),
    Item(ItemKey),
    DictItem(ItemKey),
    AsTensor,
}

impl PathPart {
    /// This component written after `parent`, the readable path of the source it was read
    /// from (roots ignore it).
    pub fn render(&self, parent: &str) -> String {
        match self {
            PathPart::Local(name) => format!("L[{name:?}]"),
            PathPart::Global(name) => format!("G[{name:?}]"),
            PathPart::Cell => "<closure cell>".to_string(),
            PathPart::Object(what) => what.clone(),
            PathPart::Attr(attr) => format!("{parent}.{attr}"),
            PathPart::ClassAttr(attr) => format!("getattr_static({parent}, {attr:?})"),
            PathPart::Item(ItemKey::Int(i)) => format!("{parent}[{i}]"),
            PathPart::Item(ItemKey::Str(k)) => format!("{parent}[{k:?}]"),
            PathPart::Item(ItemKey::Object(k)) => format!("{parent}[{}]", k.repr),
            PathPart::DictItem(ItemKey::Int(i)) => format!("dict.__getitem__({parent}, {i})"),
            PathPart::DictItem(ItemKey::Str(k)) => format!("dict.__getitem__({parent}, {k:?})"),
            PathPart::DictItem(ItemKey::Object(k)) => {
                format!("dict.__getitem__({parent}, {})", k.repr)
            }
            PathPart::AsTensor => format!("torch.as_tensor({parent})"),
        }
    }
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
    /// An object the compiled code holds itself (a class, a function, `sys.modules`): the
    /// root for state read from objects that are not reached from the frame, so that what
    /// is read from them is guarded like anything else.
    Object(OwnedRef, String),
    Attr(Rc<Source>, String),
    /// `name` as found along the MRO of the class that is the parent's value: the raw entry
    /// of a class `__dict__` (a function, a classmethod object, a property), descriptors not
    /// invoked — what a method call inlines. Only guards read it.
    ClassAttr(Rc<Source>, String),
    Item(Rc<Source>, ItemKey),
    /// `dict.__getitem__(parent, key)`: the dict's own lookup, past a `__getitem__` its class
    /// defines in Python (`super().__getitem__(key)` inside that override reads this, and
    /// so do `dict.get` and the other C methods). Only guards read it.
    DictItem(Rc<Source>, ItemKey),
    /// `torch.as_tensor(parent)` of the NumPy array at the parent: the tensor (sharing its
    /// memory) a frame's array input is traced as, as TorchDynamo traces it.
    AsTensor(Rc<Source>),
}

impl Source {
    /// The graph-input name for a value from this source, as TorchDynamo makes it: the
    /// readable source with every run of other characters than ASCII letters and digits
    /// turned into one `_` (`L['self']._modules['fc']` → `L_self_modules_fc_`). Names can
    /// coincide for different sources; graph inputs are told apart by source, and the graph
    /// makes names unique.
    pub fn graph_name(&self) -> String {
        let mut name = String::new();
        let mut in_run = false;
        for c in self.describe().chars() {
            if c.is_ascii_alphanumeric() {
                name.push(c);
                in_run = false;
            } else if !in_run {
                name.push('_');
                in_run = true;
            }
        }
        name
    }

    /// The readable path, written as TorchDynamo writes sources (`L["self"]._modules["fc"]`).
    pub fn describe(&self) -> String {
        let parent = match self {
            Source::Attr(base, _)
            | Source::ClassAttr(base, _)
            | Source::Item(base, _)
            | Source::DictItem(base, _)
            | Source::AsTensor(base) => base.describe(),
            _ => String::new(),
        };
        self.part().render(&parent)
    }

    /// Whether this source starts at a local of the compiled frame.
    /// A frame argument, or an item of one (`L["size"][0]`, `L["kwargs"]["shape"][1]`):
    /// where ints are subject to automatic dynamic shapes, as TorchDynamo's are.
    pub fn is_argument_item(&self) -> bool {
        match self {
            Source::Local(_) => true,
            Source::Item(base, _) => base.is_argument_item(),
            _ => false,
        }
    }

    pub fn is_rooted_in_locals(&self) -> bool {
        match self {
            Source::Local(_) => true,
            Source::Attr(base, _)
            | Source::ClassAttr(base, _)
            | Source::Item(base, _)
            | Source::DictItem(base, _)
            | Source::AsTensor(base) => base.is_rooted_in_locals(),
            Source::Global { .. } | Source::Cell(_) | Source::Object(..) => false,
        }
    }

    /// The last component of this source's path.
    pub fn part(&self) -> PathPart {
        match self {
            Source::Local(name) => PathPart::Local(name.clone()),
            Source::Global { name, .. } => PathPart::Global(name.clone()),
            Source::Cell(_) => PathPart::Cell,
            Source::Object(_, what) => PathPart::Object(what.clone()),
            Source::Attr(_, attr) => PathPart::Attr(attr.clone()),
            Source::ClassAttr(_, attr) => PathPart::ClassAttr(attr.clone()),
            Source::Item(_, key) => PathPart::Item(key.clone()),
            Source::DictItem(_, key) => PathPart::DictItem(key.clone()),
            Source::AsTensor(_) => PathPart::AsTensor,
        }
    }
}
