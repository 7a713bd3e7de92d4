//! Calls of `operator.itemgetter`, `attrgetter` and `methodcaller` objects: what they were
//! made with (read from `__reduce__`, all constants) turned into the subscripts, attribute
//! reads and method calls they stand for, traced as if written out.

use pyo3::prelude::*;

use super::break_reasons::BreakKind;
use super::translator::{unsupported, CResult, Tracer};
use super::vars::{VarId, VarKind};
use crate::imports::ImportModule;

impl<'py> Tracer<'py> {
    /// `getter(obj)` for an `operator` getter object; None for other callables.
    pub(super) fn operator_getter_call(
        &mut self,
        obj: &Bound<'py, PyAny>,
        args: &[VarId],
        kwargs: &[(String, VarId)],
    ) -> CResult<Option<VarId>> {
        let py = self.py;
        let operator = py.import_module("operator")?;
        let kind = ["itemgetter", "attrgetter", "methodcaller"]
            .into_iter()
            .find(|name| {
                operator
                    .getattr(*name)
                    .is_ok_and(|cls| obj.is_exact_instance(&cls))
            });
        let Some(kind) = kind else {
            return Ok(None);
        };
        let ([target], []) = (args, kwargs) else {
            return unsupported(
                BreakKind::ExceptionWhileTracing,
                format!("operator.{kind} object called with other than one argument"),
            );
        };
        let target = *target;
        let (maker, made_with) = obj
            .call_method0("__reduce__")?
            .extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>()?;
        let mut constants = Vec::new();
        for item in made_with.try_iter()? {
            let item = item?;
            if !self.h.is_constant(&item)? {
                return unsupported(
                    BreakKind::UnsupportedCall,
                    format!("an operator.{kind} made with something other than constants"),
                );
            }
            constants.push(item);
        }
        match kind {
            "itemgetter" => {
                let mut values = Vec::with_capacity(constants.len());
                for key in &constants {
                    let key = self.constant(key);
                    values.push(self.subscript(target, key)?);
                }
                Ok(Some(self.one_or_tuple(values)))
            }
            "attrgetter" => {
                let mut values = Vec::with_capacity(constants.len());
                for path in &constants {
                    let path: String = path.extract()?;
                    let mut value = target;
                    for name in path.split('.') {
                        value = self.get_attr(value, name)?;
                    }
                    values.push(value);
                }
                Ok(Some(self.one_or_tuple(values)))
            }
            _ => {
                // `methodcaller(name, *args)` reduces to `(methodcaller, (name, *args))`; with
                // keywords, to `(partial(methodcaller, name, **kwargs), args)`.
                let mut keywords = Vec::new();
                let (name, positional) = if maker.hasattr("keywords")? {
                    let name: String = maker.getattr("args")?.get_item(0)?.extract()?;
                    for (k, v) in maker
                        .getattr("keywords")?
                        .cast_into::<pyo3::types::PyDict>()
                        .map_err(PyErr::from)?
                        .iter()
                    {
                        if !self.h.is_constant(&v)? {
                            return unsupported(
                                BreakKind::UnsupportedCall,
                                "an operator.methodcaller made with something other than constants",
                            );
                        }
                        keywords.push((k.extract::<String>()?, self.constant(&v)));
                    }
                    (name, &constants[..])
                } else {
                    let Some((name, rest)) = constants.split_first() else {
                        return unsupported(BreakKind::Internal, "a methodcaller without a name");
                    };
                    (name.extract::<String>()?, rest)
                };
                let positional = positional.iter().map(|c| self.constant(c)).collect();
                let method = self.get_attr(target, &name)?;
                self.call_function(method, positional, keywords).map(Some)
            }
        }
    }

    fn one_or_tuple(&mut self, mut values: Vec<VarId>) -> VarId {
        if values.len() == 1 {
            values.pop().expect("one value")
        } else {
            self.add(VarKind::Tuple(values), None)
        }
    }
}
