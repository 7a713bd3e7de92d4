//! Slices of `nn.Sequential` and `nn.ModuleList` (`self.blocks[1:]`, `self.seq[:2](x)`).
//!
//! Python makes a new container of the container's class each time (sharing the child
//! modules). The trace holds a slice as a list tracker of the children (which keep their
//! sources: iterating, indexing and `len` work as on any list) and remembers what it is:
//! `type()`/`isinstance` answer the container's class, calling a slice of an `nn.Sequential`
//! runs `Sequential.forward` on it, and wherever the slice must exist after the graph
//! (returned, live at a graph break) the generated code slices the container again — a new
//! container, as eager makes. A slice the trace changed (`append`) is not made again.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::codegen::Rebuild;
use super::rebuild::{rebuild_plan, Rebuilder};
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;
use crate::imports::ImportModule;

/// What a list tracker made by slicing a module container stands for.
#[derive(Clone, Debug)]
pub struct ModuleSlice {
    container: VarId,
    key: OwnedRef,
    items: Vec<VarId>,
    class: OwnedRef,
}

impl<'py> Tracer<'py> {
    /// `container[key]` for a slice `key` of the `nn.Sequential`/`nn.ModuleList` object
    /// `value` the tracker `container` holds.
    pub(super) fn slice_module_sequence(
        &mut self,
        container: VarId,
        value: &Bound<'py, PyAny>,
        key: &Bound<'py, PyAny>,
    ) -> CResult<VarId> {
        // Only torch's own slicing is modelled (a subclass's `__getitem__` could pick
        // anything); the class's entry is guarded.
        let class = value.get_type().into_any();
        let nn = self.py.import_module("torch.nn")?;
        let own = class.getattr("__getitem__")?;
        let torch_slicing = ["Sequential", "ModuleList"].iter().any(|name| {
            nn.getattr(*name)
                .and_then(|c| c.getattr("__getitem__"))
                .is_ok_and(|g| g.is(&own))
        });
        if !torch_slicing {
            return unsupported(
                BreakKind::UnsupportedOperation,
                "slicing a module container whose class defines its own __getitem__",
            );
        }
        self.guard_class(&class, "__getitem__")?;
        let items = self.items_of(container)?;
        let positions = pyo3::types::PyList::new(self.py, 0..items.len())?;
        let picked: Vec<usize> = positions.as_any().get_item(key)?.extract()?;
        let chosen: Vec<VarId> = picked.into_iter().map(|i| items[i]).collect();
        let id = self.add(VarKind::List(chosen.clone()), None);
        let slice = ModuleSlice {
            container,
            key: OwnedRef::from_bound(key),
            items: chosen,
            class: OwnedRef::from_bound(value.get_type().as_any()),
        };
        self.module_slices.insert(id, slice);
        Ok(id)
    }

    /// The class of the container `id` is a slice of (None: not such a slice).
    pub(super) fn module_slice_class(&self, id: VarId) -> Option<Bound<'py, PyAny>> {
        self.module_slices
            .get(&id)
            .map(|s| s.class.bind(self.py).clone())
    }

    /// Calling the slice `callee`: `Sequential.forward` run on it when its class keeps that
    /// forward; None when `callee` is no slice.
    pub(super) fn call_module_slice(
        &mut self,
        callee: VarId,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let Some(class) = self.module_slice_class(callee) else {
            return Ok(None);
        };
        let sequential_forward = self
            .py
            .import_module("torch.nn")?
            .getattr("Sequential")?
            .getattr("forward")?;
        if !class.getattr("forward")?.is(&sequential_forward) || !kwargs.is_empty() {
            return unsupported(
                BreakKind::UnsupportedCall,
                "calling a slice of a module container without Sequential's forward",
            );
        }
        let mut all = vec![callee];
        all.extend_from_slice(args);
        self.call_python(&sequential_forward, all, Vec::new())
            .map(Some)
    }
}

/// `operator.getitem(container, key)`: the slice made again, or None when `id` is no slice;
/// refused if the trace changed the slice.
pub fn module_slice_plan(
    tracer: &Tracer<'_>,
    id: VarId,
    r: &mut Rebuilder,
) -> CResult<Option<Rebuild>> {
    let Some(slice) = tracer.module_slices.get(&id).cloned() else {
        return Ok(None);
    };
    if !matches!(tracer.kind(id), VarKind::List(items) if *items == slice.items) {
        return unsupported(
            BreakKind::ValueNotRebuildable,
            "a slice of a module container changed while tracing",
        );
    }
    let getitem = tracer.py.import_module("operator")?.getattr("getitem")?;
    Ok(Some(Rebuild::Call {
        func: Box::new(Rebuild::Const(OwnedRef::from_bound(&getitem))),
        args: vec![
            rebuild_plan(tracer, slice.container, r)?,
            Rebuild::Const(slice.key),
        ],
        kwargs: Vec::new(),
    }))
}
