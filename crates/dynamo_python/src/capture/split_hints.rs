//! Split hints: where a failed trace's inlined frames will split, remembered so that each
//! callee's own frame is traced once, stopped there (see [`SplitHint`]).

use pyo3::prelude::*;

use super::break_reasons::Break;
use super::translator::Tracer;
use super::Converter;
use crate::eval_frame::owned::OwnedRef;

/// A frame split at a graph break inside an inlined call runs that call as it is, and the
/// hook is then called for the callee's frame, whose trace fails at the same place (the call
/// into the next function, or the unsupported instruction itself). The first trace already
/// saw where: the callee's frame is traced once, stopped right there, instead of once to
/// fail and once more to stop. A hint is used once; a trace that fails before reaching its
/// instruction (another path) is done again the usual way.
#[derive(Debug)]
pub(super) struct SplitHint {
    pub(super) code: OwnedRef,
    pub(super) index: usize,
    /// The object the failing frame's first argument held: the hint is for that frame's
    /// calls only (`UnwoundFrame::receiver`).
    pub(super) receiver: Option<OwnedRef>,
    /// The break's place and reason, as the failing trace reported them.
    pub(super) location: String,
    pub(super) reason: Break,
}

/// Hints kept at most (the oldest are dropped): they are taken right after being made.
const MAX_SPLIT_HINTS: usize = 64;

impl Converter {
    /// Records where the inlined frames a failed trace unwound through will split (see
    /// `SplitHint`).
    pub(super) fn remember_split_hints(&self, tracer: &Tracer<'_>, reason: &Break) {
        if tracer.unwound.is_empty() {
            return;
        }
        let mut hints = self.split_hints.lock().unwrap_or_else(|e| e.into_inner());
        for unwound in &tracer.unwound {
            hints.retain(|h| h.code.as_ptr() != unwound.code.as_ptr());
            hints.push(SplitHint {
                code: unwound.code.clone(),
                index: unwound.index,
                receiver: unwound.receiver.clone(),
                location: tracer.location_from(unwound.depth),
                reason: reason.clone(),
            });
        }
        let excess = hints.len().saturating_sub(MAX_SPLIT_HINTS);
        hints.drain(..excess);
    }

    /// The hint made for `frame`'s code, if any (removed: a hint is used once).
    pub(super) fn take_split_hint(&self, frame: &Bound<'_, PyAny>) -> PyResult<Option<SplitHint>> {
        if self.fullgraph {
            return Ok(None);
        }
        let mut hints = self.split_hints.lock().unwrap_or_else(|e| e.into_inner());
        if hints.is_empty() {
            return Ok(None);
        }
        let code = frame.getattr("f_code")?;
        let Some(i) = hints.iter().position(|h| h.code.as_ptr() == code.as_ptr()) else {
            return Ok(None);
        };
        if let Some(receiver) = &hints[i].receiver {
            // Another object running the same code (the next layer): traced the usual way;
            // the hint stays for the object it was made for.
            let first_name = code.getattr("co_varnames")?.get_item(0)?;
            let first = frame.getattr("f_locals")?.get_item(first_name).ok();
            if first.is_none_or(|f| f.as_ptr() != receiver.as_ptr()) {
                return Ok(None);
            }
        }
        Ok(Some(hints.remove(i)))
    }
}
