//! Guards that stand for an object without its identity (`Tracer::guard_by_contents`): what
//! lets objects made anew on every call — functions, closures, plain instances, transformers'
//! cache and output objects — share the compiled code.

use std::rc::Rc;

use pyo3::prelude::*;

use super::guards::GuardKind;
use super::source::Source;
use super::translator::{CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// The methods through which the trace reads a dict's entries; a dict subclass overriding
/// none of them is read like a dict (see `guard_by_contents`).
const DICT_LOOKUPS: &[&str] = &[
    "__getitem__",
    "get",
    "__contains__",
    "keys",
    "items",
    "values",
    "__iter__",
    "__len__",
];

/// Object classes (`GuardKind::SameObjectClass`) of objects compared with `is` are numbered
/// from here, apart from those of containers (numbered from 0).
const IDENTITY_CLASSES: usize = 1 << 32;

impl<'py> Tracer<'py> {
    /// `a is b` for two objects read from two sources: the answer, with the arrangement it
    /// depends on — which of the sources hold one object — recorded to be guarded
    /// (`identity_sources`) instead of each object's identity. Objects made anew on every
    /// call (a module or config handed to a resume function under two names) then keep the
    /// compiled code. None for other operands.
    pub(super) fn is_between_sources(&mut self, a: VarId, b: VarId) -> Option<bool> {
        let (VarKind::Object(x), VarKind::Object(y)) = (self.kind(a), self.kind(b)) else {
            return None;
        };
        let (x, y) = (x.as_ptr() as usize, y.as_ptr() as usize);
        let (sa, sb) = (self.source(a)?, self.source(b)?);
        if self.guards.sources.intern(&sa) == self.guards.sources.intern(&sb) {
            return None;
        }
        for (source, address) in [(sa, x), (sb, y)] {
            self.note_identity_source(source, address);
        }
        Some(x == y)
    }

    /// Records that the trace depends on which sources hold the object at `address` and
    /// which hold others compared with it (`identity_sources`), not on the object itself.
    pub(super) fn note_identity_source(&mut self, source: Rc<Source>, address: usize) {
        let class = match self
            .identity_sources
            .iter()
            .find(|(_, _, at)| *at == address)
        {
            Some((_, class, _)) => *class,
            None => {
                let distinct = self
                    .identity_sources
                    .iter()
                    .map(|(_, _, at)| *at)
                    .collect::<std::collections::HashSet<_>>()
                    .len();
                IDENTITY_CLASSES + distinct
            }
        };
        self.identity_sources.push((source, class, address));
    }

    /// For a Python function or an instance of a plain Python class read from `source`:
    /// records the guards that stand for it without its identity — a function's code,
    /// globals and closure layout (its cells, defaults and attributes are guarded when read),
    /// an instance's type (its attributes are guarded when read) — and returns true.
    /// Objects made anew on every call (transformers' cache objects, mask closures) then
    /// reuse the compiled code. False for anything else, which is guarded by identity.
    pub(super) fn guard_by_contents(
        &mut self,
        value: &Bound<'py, PyAny>,
        source: &Rc<Source>,
    ) -> CResult<bool> {
        let py = self.py;
        let ty = value.get_type();
        // A set of constants, wherever it comes from (a global set is read by value as much
        // as an argument is): its type and its elements.
        if value.is_exact_instance_of::<pyo3::types::PySet>()
            || value.is_exact_instance_of::<pyo3::types::PyFrozenSet>()
        {
            let mut constant = true;
            for item in value.try_iter()? {
                constant &= self.h.is_constant(&item?)?;
            }
            if !constant {
                return Ok(false);
            }
            // A copy of the same type (the check compares types); only the guard holds it.
            let copy = ty.call1((value,))?;
            self.guards.add(
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
            );
            self.guards.add(
                source.clone(),
                GuardKind::Equals(OwnedRef::from_bound(&copy)),
            );
            return Ok(true);
        }
        // What is made anew per call reaches a frame through its locals (arguments, and what
        // hangs off them); globals, classes and closure cells of module-level functions hold
        // long-lived definitions, which one identity check covers most cheaply.
        if !source.is_rooted_in_locals() {
            return Ok(false);
        }
        if super::existing_tensor_keys::keyed_by_parameters(value)? {
            // Looked up by tensors (`existing_tensor_keys`: each key's identity and each
            // value read are guarded); anything else done with it guards its identity.
            self.guards.add(
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
            );
            return Ok(true);
        }
        if ty.is(&self.h.function_type) {
            let attr = |name: &str| Rc::new(Source::Attr(source.clone(), name.to_string()));
            self.guards.add(
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
            );
            self.guards.add(
                attr("__code__"),
                GuardKind::Id(OwnedRef::from_bound(&value.getattr("__code__")?)),
            );
            self.guards.add(
                attr("__globals__"),
                GuardKind::Id(OwnedRef::from_bound(&value.getattr("__globals__")?)),
            );
            let closure = value.getattr("__closure__")?;
            if closure.is_none() {
                self.guards.add(
                    attr("__closure__"),
                    GuardKind::Equals(OwnedRef::from_bound(&closure)),
                );
            } else {
                self.guards
                    .add(attr("__closure__"), GuardKind::Len(closure.len()?));
            }
            return Ok(true);
        }
        // A cell handed to a resume function (the original frame's own): read and written
        // through its source (`cell_contents`), a new one on every call.
        // So are a frame (`sys._getframe()` handed on at a break; the trace reads nothing of
        // it, see `read_attr`) and a weak reference (calling it is a graph break); what the
        // trace does with the object itself guards its identity (`pin_identity`). A
        // `torch.Generator` too: its methods run on the real object at graph breaks (read
        // through the type), and a draw given one breaks the graph, so a generator made per
        // call (`torch.Generator().manual_seed(s)`) is no reason to compile again.
        let types = py.import_module("types")?;
        if ty.is(&types.getattr("CellType")?)
            || ty.is(&types.getattr("FrameType")?)
            || ty.is(&py.import_module("weakref")?.getattr("ReferenceType")?)
            || ty.is(&py.import_module("torch")?.getattr("Generator")?)
        {
            self.guards.add(
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
            );
            return Ok(true);
        }
        // An nn.Module: its children, parameters, buffers, hooks and flags are read through
        // sources (`_modules[...]`, `_parameters[...]`, ...) and guarded there, and its
        // forward through its class; so every instance of one class with the same structure
        // shares the compiled code, as under TorchDynamo.
        if value.is_instance(&self.h.module_type)? {
            self.guards.add(
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
            );
            self.guards.example(source, value);
            return Ok(true);
        }
        // An `OrderedDict` (or a subclass: a transformers `ModelOutput`, a user's), made anew
        // by every forward and handed on (to resume functions after graph breaks): the trace
        // reads its entries only through guarded item reads, `in` and `len` (its `keys()`,
        // `items()`, iteration are not evaluated on existing objects), and a ModelOutput's
        // fields through guarded attribute reads, so its type is what the code depends on,
        // as for a plain instance.
        // The `ctx` of an autograd.Function's forward, compiled as its own frame (apply ran
        // eagerly): a new one per call, read and stored to through its source.
        let backward_function = py
            .import_module("torch.autograd.function")?
            .getattr("BackwardCFunction")?;
        let ordered_dict = py.import_module("collections")?.getattr("OrderedDict")?;
        if value.is_instance(&ordered_dict)? || value.is_instance(&backward_function)? {
            self.guards.add(
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
            );
            self.guards.example(source, value);
            return Ok(true);
        }
        if let Ok(generic) = py
            .import_module("sys")?
            .getattr("modules")?
            .get_item("transformers.utils.generic")
        {
            if let Ok(model_output) = generic.getattr("ModelOutput") {
                if value.is_instance(&model_output)? {
                    self.guards.add(
                        source.clone(),
                        GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
                    );
                    self.guards.example(source, value);
                    return Ok(true);
                }
            }
        }
        // A `functools.partial` made anew per call (`partial(f, y=t)` handed to the frame):
        // calling it reads its `func`, `args` and `keywords` through guarded attribute reads
        // (`ops_functools`), so two partials of the same function swap without recompiling.
        if ty.is(&self.h.partial_type) {
            self.guards.add(
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
            );
            self.guards.example(source, value);
            return Ok(true);
        }
        // A namedtuple (made anew per call and handed to resume functions like the above):
        // immutable, its fields read through guarded attribute reads; its type and length.
        if value.is_instance(&self.h.tuple_type)? && ty.hasattr("_fields")? {
            self.guards.add(
                source.clone(),
                GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
            );
            self.guards
                .add(source.clone(), GuardKind::Len(value.len()?));
            self.guards.example(source, value);
            return Ok(true);
        }
        // A plain instance: a Python class all the way up (no builtin base with state of its
        // own), an instance dict, not a module, callable only through a Python `__call__`
        // (looked up on the class, guarded there). Or a dict subclass of such classes that
        // leaves dict's lookups alone: its entries are read only through guarded lookups
        // (`dict_object_lookup`: its type and keys), as an OrderedDict's above.
        const HEAP_TYPE: u64 = 1 << 9;
        let python_call = ty
            .getattr("__call__")
            .is_ok_and(|c| c.is_instance(&self.h.function_type).unwrap_or(false));
        if (value.is_callable() && !python_call)
            || value.is_instance(&self.h.module_type)?
            || value.is_instance_of::<pyo3::types::PyType>()
            || value.is_instance_of::<pyo3::types::PyModule>()
        {
            return Ok(false);
        }
        let object = py.import_module("builtins")?.getattr("object")?;
        let is_dict = value.is_instance(&self.h.dict_type)?;
        for klass in ty.getattr("__mro__")?.try_iter()? {
            let klass = klass?;
            if klass.is(&object) || (is_dict && klass.is(&self.h.dict_type)) {
                continue;
            }
            let flags: u64 = klass.getattr("__flags__")?.extract()?;
            if flags & HEAP_TYPE == 0 {
                return Ok(false);
            }
            if is_dict {
                let own = klass.getattr("__dict__")?;
                for lookup in DICT_LOOKUPS {
                    if own.contains(*lookup)? {
                        return Ok(false);
                    }
                }
            }
        }
        // SAFETY: `value` is live and the GIL is held; PyObject_GenericGetDict returns a new
        // reference to the instance dict or NULL with an exception set.
        let dict =
            unsafe { pyo3::ffi::PyObject_GenericGetDict(value.as_ptr(), std::ptr::null_mut()) };
        if dict.is_null() {
            let _ = PyErr::take(py);
            // No instance dict: only `__slots__` members, read through guarded sources.
            let slotted = ty.getattr("__mro__")?.try_iter()?.any(|k| {
                k.is_ok_and(|k| {
                    k.getattr("__dict__")
                        .is_ok_and(|d| d.contains("__slots__").unwrap_or(false))
                })
            });
            if !slotted {
                return Ok(false);
            }
        } else {
            // SAFETY: the new reference just returned; dropped at once.
            drop(unsafe { Bound::from_owned_ptr(py, dict) });
        }
        self.guards.add(
            source.clone(),
            GuardKind::Type(OwnedRef::from_bound(ty.as_any())),
        );
        self.guards.example(source, value);
        Ok(true)
    }
}
