//! `super()` and `super(cls, obj)`: a [`VarKind::Super`] whose attribute lookups start after
//! `cls` in the receiver's MRO (see `Tracer::read_attr`).

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, FrameState, Tracer};
use super::vars::{Cell, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

impl<'py> Tracer<'py> {
    /// `super()` in a method: the class from the `__class__` cell, the receiver from the
    /// first argument.
    pub(super) fn zero_arg_super(&mut self, f: &FrameState<'py>) -> CResult<VarId> {
        let Some(slot) = f.slot_names.iter().position(|n| n == "__class__") else {
            return unsupported(BreakKind::SuperCall, "super() without a __class__ cell");
        };
        let cls = match f.cells.get(&slot) {
            Some(Cell::Real(cell, _)) => cell.bind(self.py).getattr("cell_contents")?,
            _ => match f
                .locals
                .get(slot)
                .copied()
                .flatten()
                .and_then(|v| self.real(v))
            {
                Some(cls) => cls,
                None => {
                    return unsupported(
                        BreakKind::SuperCall,
                        "super() whose class cell the translator does not know",
                    )
                }
            },
        };
        let Some(receiver) = f.locals.first().copied().flatten() else {
            return unsupported(BreakKind::SuperCall, "super() without a first argument");
        };
        Ok(self.add(
            VarKind::Super {
                cls: OwnedRef::from_bound(&cls),
                receiver,
            },
            None,
        ))
    }

    /// `super(cls, receiver)`: as `super()` in a method of `cls`, when the receiver is an
    /// instance of `cls` (Python raises otherwise; refused here). The class is guarded where
    /// it was read, the receiver's class where attributes are looked up through it.
    pub(super) fn two_arg_super(&mut self, cls: VarId, receiver: VarId) -> CResult<VarId> {
        let receiver_class = match self
            .instance_class(receiver)
            .or_else(|| self.user_dict_class(receiver))
            .or_else(|| self.user_list_class(receiver))
        {
            Some(class) => Some(class),
            None => self
                .real_unpinned(receiver)
                .map(|r| r.get_type().into_any()),
        };
        let cls_value = self
            .real(cls)
            .filter(|c| c.is_instance_of::<pyo3::types::PyType>());
        let (Some(cls_value), Some(receiver_class)) = (cls_value, receiver_class) else {
            return unsupported(
                BreakKind::SuperCall,
                "super(cls, obj) with a class or receiver the translator does not know",
            );
        };
        let within = receiver_class
            .cast::<pyo3::types::PyType>()
            .map_or(Ok(false), |r| r.is_subclass(&cls_value))?;
        if !within {
            return unsupported(
                BreakKind::SuperCall,
                "super(cls, obj) where obj is not an instance of cls",
            );
        }
        Ok(self.add(
            VarKind::Super {
                cls: OwnedRef::from_bound(&cls_value),
                receiver,
            },
            None,
        ))
    }
}
