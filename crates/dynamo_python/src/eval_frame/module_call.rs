//! Calling a compiled module without the Python frames of `nn.Module.__call__` when they would
//! only call `forward`.
//!
//! `module(x)` runs `Module._wrapped_call_impl` then `Module._call_impl`, two Python frames
//! that test the module's `_compiled_call_impl`, its four hook tables, the four global hook
//! tables and whether the JIT tracer is on, and then call `self.forward(x)` — about a
//! microsecond of a compiled module's call. Here the same tests are made natively, on the
//! same objects (`_call_impl`'s own globals, the instance dict), and `forward` is called
//! directly when they find nothing to do; otherwise the module is called the normal way.
//!
//! The shortcut is only taken for a module whose type resolves `__call__`,
//! `_wrapped_call_impl`, `_call_impl` and `__getattribute__` to torch's own (and defines
//! none of the attributes those functions read), and while torch's two functions still have
//! the code they had in `torch/nn/modules/module.py`: a class or a library that overrides or
//! patches any of it gets the normal call.

use std::cell::RefCell;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::capture::guard_values::{instance_dict_of, MODULE_CALL_HOOKS as HOOK_TABLES};

/// The module globals `_call_impl` tests for hooks (its instance attributes are
/// `HOOK_TABLES`).
const GLOBAL_HOOK_TABLES: [&str; 4] = [
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
];

/// torch's `Module` call machinery, as found (and verified) at first use.
struct TorchModuleCall {
    wrapped_call_impl: Py<PyAny>,
    wrapped_call_impl_code: Py<PyAny>,
    call_impl: Py<PyAny>,
    call_impl_code: Py<PyAny>,
    /// `Module.__getattribute__` (object's).
    getattribute: Py<PyAny>,
    /// `module.py`'s globals, where `_call_impl` finds the global hook tables.
    globals: Py<PyDict>,
    ordered_dict: Py<PyAny>,
    hook_tables: Vec<Py<PyString>>,
    global_hook_tables: Vec<Py<PyString>>,
    names: Names,
}

struct Names {
    call: Py<PyString>,
    wrapped_call_impl: Py<PyString>,
    call_impl: Py<PyString>,
    getattribute: Py<PyString>,
    compiled_call_impl: Py<PyString>,
    forward: Py<PyString>,
}

fn intern(py: Python<'_>, name: &str) -> Py<PyString> {
    PyString::intern(py, name).unbind()
}

impl TorchModuleCall {
    /// None when torch's `Module` does not look as this file expects (then no shortcut).
    fn get(py: Python<'_>) -> Option<&'static TorchModuleCall> {
        static STATE: PyOnceLock<Option<TorchModuleCall>> = PyOnceLock::new();
        STATE
            .get_or_init(py, || TorchModuleCall::find(py).ok().flatten())
            .as_ref()
    }

    fn find(py: Python<'_>) -> PyResult<Option<TorchModuleCall>> {
        let module_py = py.import("torch.nn.modules.module")?;
        let file = module_py.getattr("__file__")?;
        let class_dict = module_py.getattr("Module")?.getattr("__dict__")?;
        let wrapped = class_dict.get_item("_wrapped_call_impl")?;
        let call_impl = class_dict.get_item("_call_impl")?;
        if !class_dict.get_item("__call__")?.is(&wrapped) {
            return Ok(None);
        }
        // torch's own functions, not replacements installed before dynamo-rs looked.
        for (function, name) in [(&wrapped, "_wrapped_call_impl"), (&call_impl, "_call_impl")] {
            let code = function.getattr("__code__")?;
            if !code.getattr("co_filename")?.eq(&file)? || code.getattr("co_name")?.ne(name)? {
                return Ok(None);
            }
        }
        let globals = call_impl.getattr("__globals__")?.cast_into::<PyDict>()?;
        if !globals.is(module_py.dict()) {
            return Ok(None);
        }
        let module_class = module_py.getattr("Module")?;
        let Some(getattribute) = crate::capture::guard_values::class_lookup(
            &module_class,
            &PyString::intern(py, "__getattribute__"),
        ) else {
            return Ok(None);
        };
        Ok(Some(TorchModuleCall {
            wrapped_call_impl_code: wrapped.getattr("__code__")?.unbind(),
            wrapped_call_impl: wrapped.unbind(),
            call_impl_code: call_impl.getattr("__code__")?.unbind(),
            call_impl: call_impl.unbind(),
            getattribute: getattribute.unbind(),
            globals: globals.unbind(),
            ordered_dict: py.import("collections")?.getattr("OrderedDict")?.unbind(),
            hook_tables: HOOK_TABLES.iter().map(|n| intern(py, n)).collect(),
            global_hook_tables: GLOBAL_HOOK_TABLES.iter().map(|n| intern(py, n)).collect(),
            names: Names {
                call: intern(py, "__call__"),
                wrapped_call_impl: intern(py, "_wrapped_call_impl"),
                call_impl: intern(py, "_call_impl"),
                getattribute: intern(py, "__getattribute__"),
                compiled_call_impl: intern(py, "_compiled_call_impl"),
                forward: intern(py, "forward"),
            },
        }))
    }

    /// torch's two functions still run the code they were found with.
    fn functions_unchanged(&self) -> bool {
        // SAFETY: both are live function objects (held here); GIL held.
        unsafe {
            ffi::PyFunction_GetCode(self.wrapped_call_impl.as_ptr())
                == self.wrapped_call_impl_code.as_ptr()
                && ffi::PyFunction_GetCode(self.call_impl.as_ptr()) == self.call_impl_code.as_ptr()
        }
    }

    /// An empty hook table: an exact dict or `OrderedDict` (whose truth is dict's length).
    fn empty_table(&self, table: Option<Bound<'_, PyAny>>) -> bool {
        let Some(table) = table else { return false };
        let ty = table.get_type();
        let exact = ty.as_ptr() == self.ordered_dict.as_ptr()
            || ty.as_ptr() == (&raw mut ffi::PyDict_Type).cast();
        // SAFETY: `table` is a dict (its exact type is dict or OrderedDict, a dict subclass).
        exact && unsafe { ffi::PyDict_Size(table.as_ptr()) } == 0
    }

    /// No global hook is registered (as `_call_impl` reads them, from its globals).
    fn no_global_hooks(&self, py: Python<'_>) -> bool {
        let globals = self.globals.bind(py);
        self.global_hook_tables
            .iter()
            .all(|name| self.empty_table(globals.get_item(name.bind(py)).ok().flatten()))
    }

    /// `type(module)` resolves the call machinery to torch's own and defines none of the
    /// attributes it reads; remembered by the type's version tag.
    fn type_is_plain(&self, py: Python<'_>, ty: &Bound<'_, pyo3::types::PyType>) -> bool {
        thread_local! {
            static PLAIN: RefCell<Vec<(usize, u32)>> = const { RefCell::new(Vec::new()) };
        }
        let address = ty.as_ptr() as usize;
        // SAFETY: a live type object; GIL held.
        let tag = unsafe { (*ty.as_type_ptr()).tp_version_tag };
        if tag != 0 && PLAIN.with(|p| p.borrow().contains(&(address, tag))) {
            return true;
        }
        let lookup = |name: &Py<PyString>| {
            crate::capture::guard_values::class_lookup(ty.as_any(), name.bind(py))
                .map_or(std::ptr::null_mut(), |found| found.as_ptr())
        };
        let names = &self.names;
        let compiled = lookup(&names.compiled_call_impl);
        let plain = lookup(&names.call) == self.wrapped_call_impl.as_ptr()
            && lookup(&names.wrapped_call_impl) == self.wrapped_call_impl.as_ptr()
            && lookup(&names.call_impl) == self.call_impl.as_ptr()
            && lookup(&names.getattribute) == self.getattribute.as_ptr()
            && (compiled.is_null() || compiled == py.None().as_ptr())
            && self.hook_tables.iter().all(|name| lookup(name).is_null());
        if plain {
            // SAFETY: as above; the lookups gave the type a tag if it can have one.
            let tag = unsafe { (*ty.as_type_ptr()).tp_version_tag };
            if tag != 0 {
                PLAIN.with(|p| {
                    let mut p = p.borrow_mut();
                    if p.len() >= 256 {
                        p.clear();
                    }
                    p.push((address, tag));
                });
            }
        }
        plain
    }

    /// Calling `module` runs torch's own call machinery (see [`calls_like_torch`]).
    fn machinery_is_torchs(&self, module: &Bound<'_, PyAny>) -> bool {
        let py = module.py();
        if !self.functions_unchanged() || !self.type_is_plain(py, &module.get_type()) {
            return false;
        }
        let Some(dict) = instance_dict_of(module) else {
            return false;
        };
        let names = &self.names;
        // `_wrapped_call_impl` calls `self._call_impl`: an instance attribute would win.
        if dict.contains(names.call_impl.bind(py)).unwrap_or(true) {
            return false;
        }
        match dict.get_item(names.compiled_call_impl.bind(py)) {
            Ok(None) => true,
            Ok(Some(compiled)) => compiled.is_none(),
            Err(_) => false,
        }
    }

    /// `module.forward` when `module(*args, **kwargs)` would do nothing but call it: torch's
    /// call machinery, no hook on the module. The caller has checked the global hooks and
    /// the tracer.
    fn plain_forward<'py>(&self, module: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
        let py = module.py();
        if !self.machinery_is_torchs(module) {
            return None;
        }
        let dict = instance_dict_of(module)?;
        let hooks_empty = self
            .hook_tables
            .iter()
            .all(|name| self.empty_table(dict.get_item(name.bind(py)).ok().flatten()));
        if !hooks_empty {
            return None;
        }
        module.getattr(self.names.forward.bind(py)).ok()
    }
}

/// Whether calling `module` runs torch's own call machinery and nothing else of its class's
/// or instance's: its type resolves `__call__`, `_wrapped_call_impl`, `_call_impl` and
/// `__getattribute__` to torch's (unpatched, with their original code) and defines none of
/// the hook tables' names; the instance has no `_call_impl` of its own and no
/// `_compiled_call_impl` other than None. Then `module(...)` is `forward(...)` with the
/// module's and the global hooks around it, which is how the trace models module calls.
pub fn calls_like_torch(module: &Bound<'_, PyAny>) -> bool {
    TorchModuleCall::get(module.py()).is_some_and(|torch| torch.machinery_is_torchs(module))
}

/// torch's `_wrapped_call_impl` and `_call_impl` still have the code they had when first
/// looked at (no version tag covers a function's `__code__`).
pub fn torch_call_functions_unchanged(py: Python<'_>) -> bool {
    TorchModuleCall::get(py).is_some_and(|torch| torch.functions_unchanged())
}

/// The body of `OptimizedModule.__call__`: when nothing hooks the wrapper (nor globally) and
/// the tracer is off, the wrapped module's `forward` (or the module itself, when something
/// hooks it) is called with `converter` as the frame callback, as `OptimizedModule.forward`
/// would; otherwise `nn.Module.__call__(wrapper, *args, **kwargs)`.
#[pyfunction]
#[pyo3(signature = (wrapper, args, kwargs=None, /))]
pub fn call_compiled_module<'py>(
    py: Python<'py>,
    wrapper: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(torch) = TorchModuleCall::get(py) {
        if let Some(Shortcut { converter, target }) = shortcut(py, torch, wrapper)? {
            return super::call_with_callback(py, &converter, &target, args, kwargs);
        }
    }
    let module_call = py
        .import("torch")?
        .getattr("nn")?
        .getattr("Module")?
        .getattr("__call__")?;
    let mut all = Vec::with_capacity(args.len() + 1);
    all.push(wrapper.clone());
    all.extend(args.iter());
    module_call.call(PyTuple::new(py, all)?, kwargs)
}

struct Shortcut<'py> {
    converter: Bound<'py, PyAny>,
    target: Bound<'py, PyAny>,
}

fn shortcut<'py>(
    py: Python<'py>,
    torch: &TorchModuleCall,
    wrapper: &Bound<'py, PyAny>,
) -> PyResult<Option<Shortcut<'py>>> {
    if !torch.functions_unchanged() || crate::torch_state::is_tracing() {
        return Ok(None);
    }
    if !torch.no_global_hooks(py) {
        return Ok(None);
    }
    let Some(dict) = instance_dict_of(wrapper) else {
        return Ok(None);
    };
    // The wrapper's own hooks (its class is ours; its `__call__` is this function).
    let names = &torch.names;
    if let Some(compiled) = dict.get_item(names.compiled_call_impl.bind(py))? {
        if !compiled.is_none() {
            return Ok(None);
        }
    }
    let wrapper_hooks_empty = torch
        .hook_tables
        .iter()
        .all(|name| torch.empty_table(dict.get_item(name.bind(py)).ok().flatten()));
    if !wrapper_hooks_empty {
        return Ok(None);
    }
    let (Some(converter), Some(modules), Some(code)) = (
        dict.get_item(pyo3::intern!(py, "_dynamo_rs_converter"))?,
        dict.get_item(pyo3::intern!(py, "_modules"))?,
        dict.get_item(pyo3::intern!(py, "_dynamo_rs_forward_code"))?,
    ) else {
        return Ok(None);
    };
    let Ok(module) = modules.get_item(pyo3::intern!(py, "_orig_mod")) else {
        return Ok(None);
    };
    // The module's own forward is compiled even when it is torch's (`nn.Sequential`).
    if !code.is_none() {
        super::force_intercept(py, &code)?;
    }
    let target = torch.plain_forward(&module).unwrap_or(module);
    Ok(Some(Shortcut { converter, target }))
}
