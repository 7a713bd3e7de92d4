//! `locals()`, `vars()` and `dir()` without arguments: the frame being translated, read from
//! the trace's own view of it. Left to run at a graph break they would read the generated
//! code's frame, which holds only what is live after the break (a constant the trace folded
//! is never stored there), so `locals()["a"]` raised `KeyError`.

use pyo3::prelude::*;
use pyo3::types::PyString;

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, FrameState, Tracer};
use super::vars::{Cell, VarId, VarKind};
use crate::eval_frame::owned::OwnedRef;

/// The builtins that read the calling frame's locals.
pub(super) const FRAME_READING_BUILTINS: [&str; 5] = ["locals", "vars", "dir", "eval", "exec"];

/// `CO_OPTIMIZED`: a function's frame, whose locals live in fast slots.
const CO_OPTIMIZED: u32 = 0x1;

impl<'py> Tracer<'py> {
    /// `name()` with no arguments, for a builtin that reads the calling frame; None when
    /// `name` is not one of them.
    pub(super) fn frame_reading_builtin(
        &mut self,
        f: &mut FrameState<'py>,
        name: &str,
    ) -> CResult<Option<VarId>> {
        match name {
            "locals" | "vars" => Ok(Some(self.frame_locals(f)?)),
            "dir" => {
                let dict = self.frame_locals(f)?;
                let mut names: Vec<String> = match self.kind(dict) {
                    VarKind::Dict(entries) => entries
                        .iter()
                        .map(|(k, _)| k.bind(self.py).to_string())
                        .collect(),
                    _ => Vec::new(),
                };
                names.sort();
                let items = names
                    .iter()
                    .map(|n| self.constant(PyString::new(self.py, n).as_any()))
                    .collect();
                Ok(Some(self.add(VarKind::List(items), None)))
            }
            _ => Ok(None),
        }
    }

    /// The frame's locals as a dict, in the order CPython 3.11 fills it (arguments and
    /// locals, then cell and free variables; unbound names left out). Python hands out the
    /// frame's one `f_locals` dict, refreshed at each call: a second `locals()` in the same
    /// frame updates and returns the first one.
    fn frame_locals(&mut self, f: &mut FrameState<'py>) -> CResult<VarId> {
        let flags: u32 = f.code.getattr("co_flags")?.extract()?;
        if flags & CO_OPTIMIZED == 0 {
            return unsupported(
                BreakKind::UnsupportedCall,
                "locals() outside a function (a class body or a module)",
            );
        }
        let mut entries = Vec::new();
        for slot in 0..f.slot_names.len() {
            let value = if f.cells.contains_key(&slot) {
                if self.cell_is_empty(f, slot) {
                    continue;
                }
                self.op_load_deref(f, slot as u32)?;
                self.pop(f)?
            } else {
                match f.locals[slot] {
                    Some(v) => v,
                    None => continue,
                }
            };
            // The dict hands its values to any code: a tensor argument not used yet is
            // made a graph input now (`lazy_inputs`).
            self.realize_within(value)?;
            let key = PyString::new(self.py, &f.slot_names[slot]).into_any();
            entries.push((OwnedRef::from_bound(&key), value));
        }
        match f.locals_dict {
            Some(dict) => {
                self.note_effect(Some(dict));
                if let VarKind::Dict(old) = &self.vars[dict.0 as usize].kind {
                    let py = self.py;
                    let dropped = old.iter().any(|(k, _)| {
                        !entries
                            .iter()
                            .any(|(n, _)| n.bind(py).eq(k.bind(py)).unwrap_or(false))
                    });
                    if dropped {
                        self.note_dict_removal(dict);
                    }
                }
                self.vars[dict.0 as usize].kind = VarKind::Dict(entries);
                Ok(dict)
            }
            None => {
                let dict = self.add(VarKind::Dict(entries), None);
                f.locals_dict = Some(dict);
                Ok(dict)
            }
        }
    }

    /// A call that reads the calling frame: `eval` and `exec` (their default namespace),
    /// `sys._getframe` (what `inspect.currentframe`, `inspect.stack` and loggers call). It
    /// runs at a graph break, and the split gives the generated frame the original code's
    /// locals first (`frame_read_break`).
    pub(super) fn refuse_frame_reading_call(&mut self, callee: VarId) -> CResult<()> {
        let VarKind::Object(obj) = self.kind(callee) else {
            return Ok(());
        };
        let obj = obj.bind(self.py).clone();
        if !obj.is_instance_of::<pyo3::types::PyCFunction>() {
            return Ok(());
        }
        let b = &self.h.builtins;
        let reads_frame = FRAME_READING_BUILTINS
            .iter()
            .any(|n| b.getattr(*n).is_ok_and(|f| f.is(&obj)))
            || pyo3::types::PyModule::import(self.py, "sys")?
                .getattr("_getframe")
                .is_ok_and(|f| f.is(&obj));
        if reads_frame {
            self.frame_read_break = true;
            return unsupported(
                BreakKind::UnsupportedCall,
                format!(
                    "calling {} (it reads the calling frame)",
                    super::ops_call::function_name(&obj)
                ),
            );
        }
        Ok(())
    }

    /// Whether the cell in `slot` holds nothing (a name deleted, or not assigned yet).
    fn cell_is_empty(&self, f: &FrameState<'py>, slot: usize) -> bool {
        match f.cells.get(&slot) {
            Some(Cell::Traced(cell)) => cell.borrow().is_none(),
            Some(Cell::Real(cell, _)) => {
                match self.mutated_attr(&cell.bind(self.py), "cell_contents") {
                    Some(stored) => stored.is_none(),
                    None => cell.bind(self.py).getattr("cell_contents").is_err(),
                }
            }
            None => true,
        }
    }
}
