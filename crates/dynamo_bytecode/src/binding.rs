//! Argument binding: which call argument (or default) each parameter of a code object
//! receives, following CPython's rules for positional, positional-only, keyword-only,
//! `*args` and `**kwargs` parameters.
//!
//! The translator inlines calls to Python functions and needs, for each parameter, the
//! tracker of the value CPython would bind. Doing it here, from the code object's counts and
//! names, replaces `inspect.signature(f).bind(...)`, which builds a `Signature` object per
//! call and was a visible part of capture time on deep models.

/// The parameter layout of a code object (`co_varnames` starts with the parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parameters {
    /// Positional parameters, then keyword-only ones, then `*args`' and `**kwargs`' names
    /// when present: the first `argcount + kwonly + varargs + varkw` of `co_varnames`.
    pub names: Vec<String>,
    /// `co_argcount`: positional parameters, positional-only ones included.
    pub argcount: usize,
    /// `co_posonlyargcount`.
    pub posonly: usize,
    /// `co_kwonlyargcount`.
    pub kwonly: usize,
    /// `CO_VARARGS`.
    pub varargs: bool,
    /// `CO_VARKEYWORDS`.
    pub varkw: bool,
}

/// Where a parameter's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamValue {
    /// The call's positional argument at this index.
    Positional(usize),
    /// The call's keyword argument at this index.
    Keyword(usize),
    /// `__defaults__[i]`.
    Default(usize),
    /// `__kwdefaults__[name]` (the parameter's own name).
    KwDefault,
    /// `*args`: the positional arguments at these indices, as a tuple.
    VarArgs(Vec<usize>),
    /// `**kwargs`: the keyword arguments at these indices, as a dict.
    VarKeywords(Vec<usize>),
}

/// Binds a call of `positional` positional arguments and the given keyword names to
/// `params`, with `defaults` trailing positional defaults and keyword-only defaults for
/// the names in `kwdefaults`. Returns one [`ParamValue`] per entry of `params.names`, or
/// the `TypeError` message CPython would raise (without the function's name).
pub fn bind(
    params: &Parameters,
    positional: usize,
    keywords: &[&str],
    defaults: usize,
    kwdefaults: &[&str],
) -> Result<Vec<ParamValue>, String> {
    let named = params.argcount + params.kwonly;
    if params.names.len() != named + usize::from(params.varargs) + usize::from(params.varkw) {
        return Err("parameter names do not match the counts".to_string());
    }
    if defaults > params.argcount {
        return Err("more defaults than positional parameters".to_string());
    }
    let mut bound: Vec<Option<ParamValue>> = vec![None; params.names.len()];
    let filled = positional.min(params.argcount);
    for (i, slot) in bound.iter_mut().enumerate().take(filled) {
        *slot = Some(ParamValue::Positional(i));
    }
    if positional > params.argcount && !params.varargs {
        return Err(format!(
            "takes {} positional argument{} but {} {} given",
            params.argcount,
            if params.argcount == 1 { "" } else { "s" },
            positional,
            if positional == 1 { "was" } else { "were" }
        ));
    }
    let mut extra_keywords = Vec::new();
    for (k, name) in keywords.iter().enumerate() {
        // Positional-only parameters cannot be named; such a keyword goes to **kwargs.
        let target = (params.posonly..named).find(|&i| params.names[i] == *name);
        match target {
            Some(i) if bound[i].is_some() => {
                return Err(format!("got multiple values for argument '{name}'"));
            }
            Some(i) => bound[i] = Some(ParamValue::Keyword(k)),
            None if params.varkw => {
                if keywords[..k].contains(name) {
                    return Err(format!("got multiple values for keyword argument '{name}'"));
                }
                extra_keywords.push(k);
            }
            None if params.names[..params.posonly].iter().any(|p| p == name) => {
                return Err(format!(
                    "got some positional-only arguments passed as keyword arguments: '{name}'"
                ));
            }
            None => return Err(format!("got an unexpected keyword argument '{name}'")),
        }
    }
    let first_default = params.argcount - defaults;
    let mut missing = Vec::new();
    for (i, slot) in bound.iter_mut().enumerate().take(params.argcount) {
        if slot.is_none() {
            if i >= first_default {
                *slot = Some(ParamValue::Default(i - first_default));
            } else {
                missing.push(params.names[i].as_str());
            }
        }
    }
    if !missing.is_empty() {
        return Err(missing_error("positional", &missing));
    }
    for (i, slot) in bound
        .iter_mut()
        .enumerate()
        .take(named)
        .skip(params.argcount)
    {
        if slot.is_none() {
            if kwdefaults.contains(&params.names[i].as_str()) {
                *slot = Some(ParamValue::KwDefault);
            } else {
                missing.push(params.names[i].as_str());
            }
        }
    }
    if !missing.is_empty() {
        return Err(missing_error("keyword-only", &missing));
    }
    let mut next = named;
    if params.varargs {
        bound[next] = Some(ParamValue::VarArgs((params.argcount..positional).collect()));
        next += 1;
    }
    if params.varkw {
        bound[next] = Some(ParamValue::VarKeywords(extra_keywords));
    }
    Ok(bound
        .into_iter()
        .map(|b| b.expect("every parameter is bound or reported missing"))
        .collect())
}

/// CPython's message for required parameters left without a value.
fn missing_error(kind: &str, names: &[&str]) -> String {
    format!(
        "missing {} required {kind} argument{}: {}",
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        quote_list(names)
    )
}

fn quote_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    match quoted.len() {
        1 => quoted[0].clone(),
        2 => format!("{} and {}", quoted[0], quoted[1]),
        n => format!("{}, and {}", quoted[..n - 1].join(", "), quoted[n - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ParamValue::*;

    fn params(
        names: &[&str],
        argcount: usize,
        posonly: usize,
        kwonly: usize,
        varargs: bool,
        varkw: bool,
    ) -> Parameters {
        Parameters {
            names: names.iter().map(|n| n.to_string()).collect(),
            argcount,
            posonly,
            kwonly,
            varargs,
            varkw,
        }
    }

    #[test]
    fn positional_keywords_and_defaults() {
        // def f(a, b, c=1, d=2)
        let p = params(&["a", "b", "c", "d"], 4, 0, 0, false, false);
        assert_eq!(
            bind(&p, 1, &["d", "b"], 2, &[]),
            Ok(vec![Positional(0), Keyword(1), Default(0), Keyword(0)])
        );
        assert_eq!(
            bind(&p, 0, &["a"], 2, &[]),
            Err("missing 1 required positional argument: 'b'".to_string())
        );
        assert_eq!(
            bind(&p, 5, &[], 2, &[]),
            Err("takes 4 positional arguments but 5 were given".to_string())
        );
        assert_eq!(
            bind(&p, 1, &["a"], 2, &[]),
            Err("got multiple values for argument 'a'".to_string())
        );
        assert_eq!(
            bind(&p, 2, &["e"], 2, &[]),
            Err("got an unexpected keyword argument 'e'".to_string())
        );
    }

    #[test]
    fn star_args_kwargs_and_keyword_only() {
        // def f(a, /, b, *rest, c, d=3, **extra)
        let p = params(&["a", "b", "c", "d", "rest", "extra"], 2, 1, 2, true, true);
        assert_eq!(
            bind(&p, 4, &["c", "a", "z"], 0, &["d"]),
            Ok(vec![
                Positional(0),
                Positional(1),
                Keyword(0),
                KwDefault,
                VarArgs(vec![2, 3]),
                VarKeywords(vec![1, 2]),
            ])
        );
        assert_eq!(
            bind(&p, 2, &[], 0, &["d"]),
            Err("missing 1 required keyword-only argument: 'c'".to_string())
        );
    }

    #[test]
    fn positional_only_cannot_be_named_without_kwargs() {
        // def f(a, b, /)
        let p = params(&["a", "b"], 2, 2, 0, false, false);
        assert_eq!(
            bind(&p, 1, &["b"], 0, &[]),
            Err("got some positional-only arguments passed as keyword arguments: 'b'".to_string())
        );
        assert_eq!(
            bind(&p, 0, &[], 0, &[]),
            Err("missing 2 required positional arguments: 'a' and 'b'".to_string())
        );
    }

    #[test]
    fn comprehension_parameter() {
        // A comprehension's code takes its iterator as the positional parameter `.0`.
        let p = params(&[".0"], 1, 0, 0, false, false);
        assert_eq!(bind(&p, 1, &[], 0, &[]), Ok(vec![Positional(0)]));
    }
}
