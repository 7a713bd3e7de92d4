//! The values a guard check compares against and the caches that make re-reading them cheap:
//! identities held weakly, reads from dicts and dict-derived answers remembered by the dict's
//! version tag, and tensor metadata checked through torch's C++ `TensorGuards`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use crate::imports::ImportModule;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::tensor_check::TensorChecks;
use crate::eval_frame::owned::OwnedRef;

/// The object an identity check expects, held weakly where the object allows it, so a guard
/// does not keep a model (or anything else it compares by identity) alive. A dead weak
/// reference fails the check: a new object at the same address is another object.
#[derive(Debug)]
pub struct Identity {
    address: usize,
    weak: Option<OwnedRef>,
    strong: Option<OwnedRef>,
    pub type_name: String,
}

impl Identity {
    pub fn new(object: &Bound<'_, PyAny>) -> Identity {
        let py = object.py();
        // SAFETY: a live object, GIL held; PyWeakref_NewRef returns a new reference or NULL
        // with an exception set (objects that do not support weak references).
        let weak = unsafe { pyo3::ffi::PyWeakref_NewRef(object.as_ptr(), std::ptr::null_mut()) };
        let weak = if weak.is_null() {
            let _ = PyErr::take(py);
            None
        } else {
            // SAFETY: the new reference just returned, handed over to the OwnedRef.
            unsafe { OwnedRef::from_owned(weak) }
        };
        Identity {
            address: object.as_ptr() as usize,
            strong: weak.is_none().then(|| OwnedRef::from_bound(object)),
            weak,
            type_name: object
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default(),
        }
    }

    /// Whether the object is known to be gone (held weakly and collected): nothing can
    /// match it again.
    pub fn is_dead(&self) -> bool {
        match &self.weak {
            // SAFETY: a live weak reference object (we hold it), GIL held; the result is
            // borrowed and only compared with None.
            Some(weak) => unsafe {
                pyo3::ffi::PyWeakref_GetObject(weak.as_ptr()) == pyo3::ffi::Py_None()
            },
            None => false,
        }
    }

    /// The address the object had (and has, while alive).
    pub fn address(&self) -> usize {
        self.address
    }

    pub fn matches(&self, value: &Bound<'_, PyAny>) -> bool {
        if value.as_ptr() as usize != self.address {
            return false;
        }
        match &self.weak {
            // SAFETY: a live weak reference object (we hold it), GIL held; the result is
            // borrowed and only compared.
            Some(weak) => unsafe {
                pyo3::ffi::PyWeakref_GetObject(weak.as_ptr()) == value.as_ptr()
            },
            None => true,
        }
    }

    /// The object, if still alive.
    pub fn get<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        if let Some(strong) = &self.strong {
            return Some(strong.bind(py).clone());
        }
        let weak = self.weak.as_ref()?;
        // SAFETY: as in `matches`; a borrowed result turned into a new reference at once.
        let object = unsafe { pyo3::ffi::PyWeakref_GetObject(weak.as_ptr()) };
        // SAFETY: a live object (or None when dead).
        let object = unsafe { Bound::from_borrowed_ptr(py, object) };
        (!object.is_none()).then_some(object)
    }
}

/// The value a step last read from a dict, with that dict and its PEP 509 version tag. CPython
/// 3.11 gives a dict a new, globally unique `ma_version_tag` on every change (and on
/// creation, so a new dict at a freed dict's address never matches): while the same dict has
/// the same tag, the key maps to the same value object and the lookup can be skipped.
/// Addresses are kept as integers and only turned back into a reference after that check.
/// (Atomics only because a pyclass must be `Sync`; every access holds the GIL.)
#[derive(Debug, Default)]
pub struct DictReadCache {
    dict: AtomicUsize,
    tag: AtomicU64,
    value: AtomicUsize,
}

impl DictReadCache {
    /// `dict[key]`, or None when the key is missing. `dict` must be an exact `dict`.
    pub fn get<'py>(
        &self,
        dict: &Bound<'py, PyDict>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = dict.py();
        let address = dict.as_ptr();
        // SAFETY: the caller checked that `dict` is an exact dict, so the object is laid out
        // as a PyDictObject; it is alive (we hold a reference) and the GIL is held.
        let tag = unsafe { (*(address as *mut pyo3::ffi::PyDictObject)).ma_version_tag };
        if self.dict.load(Relaxed) == address as usize && self.tag.load(Relaxed) == tag {
            let value = self.value.load(Relaxed) as *mut pyo3::ffi::PyObject;
            // SAFETY: the same dict with the same version tag has not changed since `value`
            // was read from it (see the type's comment), so the dict, which is alive, still
            // holds its reference to `value`; the GIL is held.
            return Ok(Some(unsafe { Bound::from_borrowed_ptr(py, value) }));
        }
        let value = dict.get_item(key)?;
        if let Some(value) = &value {
            // The tag read before the lookup: if the lookup itself changed the dict (a key's
            // __eq__), the next read sees a newer tag and looks up again.
            self.dict.store(address as usize, Relaxed);
            self.tag.store(tag, Relaxed);
            self.value.store(value.as_ptr() as usize, Relaxed);
        }
        Ok(value)
    }
}

/// What a failing tensor check reports against: the example's metadata, not the example
/// (a guard must not keep the first call's tensors alive).
#[derive(Debug)]
pub struct TensorMeta {
    pub step: usize,
    type_name: String,
    dtype: String,
    device: String,
    pub shape: Vec<Option<i64>>,
    pub stride: Vec<Option<i64>>,
    requires_grad: bool,
}

/// Which sizes and which strides of a tensor are symbolic.
pub type DynamicDims = (Vec<bool>, Vec<bool>);

/// A size list as Python prints it, `?` for a symbolic entry.
fn show_sizes(values: &[Option<i64>]) -> String {
    let items: Vec<String> = values
        .iter()
        .map(|v| v.map_or("?".to_string(), |v| v.to_string()))
        .collect();
    format!("[{}]", items.join(", "))
}

impl TensorMeta {
    /// The metadata of `t`, with the sizes and strides marked in `dynamic` left open (None:
    /// the shape guard checks those).
    fn of(
        step: usize,
        t: &Bound<'_, PyAny>,
        dynamic: Option<&DynamicDims>,
    ) -> PyResult<TensorMeta> {
        let open = |values: Vec<i64>, which: Option<&Vec<bool>>| -> Vec<Option<i64>> {
            values
                .into_iter()
                .enumerate()
                .map(|(d, v)| match which {
                    Some(flags) if flags.get(d).copied().unwrap_or(false) => None,
                    _ => Some(v),
                })
                .collect()
        };
        Ok(TensorMeta {
            step,
            type_name: t.get_type().name()?.to_string(),
            dtype: t.getattr("dtype")?.str()?.to_string(),
            device: t.getattr("device")?.str()?.to_string(),
            shape: open(t.getattr("shape")?.extract()?, dynamic.map(|d| &d.0)),
            stride: open(t.call_method0("stride")?.extract()?, dynamic.map(|d| &d.1)),
            requires_grad: t.getattr("requires_grad")?.extract()?,
        })
    }

    fn matches_open(now: &[Option<i64>], was: &[Option<i64>]) -> bool {
        now.len() == was.len() && now.iter().zip(was).all(|(n, w)| w.is_none() || n == w)
    }

    /// How `t` differs from this example, if its metadata does.
    pub fn difference(&self, what: &str, t: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        if !t.hasattr("dtype")? || !t.hasattr("stride")? {
            return Ok(Some(format!(
                "{what} is a {}, was a tensor",
                t.get_type().name()?
            )));
        }
        let now = TensorMeta::of(self.step, t, None)?;
        let field = |name: &str, now: String, was: String| {
            (now != was).then(|| format!("{what}.{name} is {now}, was {was}"))
        };
        Ok(field("dtype", now.dtype, self.dtype.clone())
            .or_else(|| field("device", now.device, self.device.clone()))
            .or_else(|| {
                (!TensorMeta::matches_open(&now.shape, &self.shape)).then(|| {
                    format!(
                        "{what}.shape is {}, was {}",
                        show_sizes(&now.shape),
                        show_sizes(&self.shape)
                    )
                })
            })
            .or_else(|| {
                field(
                    "requires_grad",
                    now.requires_grad.to_string(),
                    self.requires_grad.to_string(),
                )
            })
            .or_else(|| {
                (!TensorMeta::matches_open(&now.stride, &self.stride))
                    .then(|| format!("{what} has a different stride"))
            })
            .or_else(|| field("__class__", now.type_name, self.type_name.clone())))
    }
}

/// Tensors checked together (type, dtype, device, shape, stride, requires_grad, dispatch
/// keys, and that they are distinct objects; see `tensor_check`). The checks are made when
/// the guard is built, from the examples, which are not kept.
#[derive(Debug, Default)]
pub struct TensorGroup {
    pub examples: Vec<TensorMeta>,
    checks: TensorChecks,
}

impl TensorGroup {
    pub fn new(
        py: Python<'_>,
        examples: Vec<(usize, OwnedRef, Option<DynamicDims>)>,
    ) -> PyResult<TensorGroup> {
        let metas = examples
            .iter()
            .map(|(step, t, dynamic)| TensorMeta::of(*step, &t.bind(py), dynamic.as_ref()))
            .collect::<PyResult<Vec<_>>>()?;
        let tensors: Vec<_> = examples
            .iter()
            .map(|(_, t, _)| t.bind(py).clone())
            .collect();
        Ok(TensorGroup {
            checks: TensorChecks::new(py, &tensors, &metas)?,
            examples: metas,
        })
    }

    /// Whether `tensors` (one per example, in order) all match; true for an empty group.
    pub fn passes(&self, tensors: &[Bound<'_, PyAny>]) -> bool {
        self.checks.is_empty() && tensors.is_empty() || self.checks.passes(tensors)
    }
}

/// The keys of `dict` in iteration order, as a tuple. An `OrderedDict` keeps its own order
/// (`move_to_end`, a hook registered with `prepend=True`) apart from the dict storage that
/// CPython's `PyDict_Keys` walks, so anything but an exact dict is iterated.
pub fn keys_in_order<'py>(dict: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyTuple>> {
    if dict.is_exact_instance_of::<PyDict>() {
        return Ok(dict.keys().to_tuple());
    }
    PyTuple::new(dict.py(), dict.try_iter()?.collect::<PyResult<Vec<_>>>()?)
}

extern "C" {
    // CPython's lookup of a name along a type's MRO, through the method cache; exported by
    // libpython (Include/cpython/object.h) though pyo3-ffi leaves it out as private.
    fn _PyType_Lookup(
        ty: *mut pyo3::ffi::PyTypeObject,
        name: *mut pyo3::ffi::PyObject,
    ) -> *mut pyo3::ffi::PyObject;
}

/// `name` found along the MRO of the class `ty`, as the raw class-dict entry (descriptors
/// not invoked), or None.
pub fn class_lookup<'py>(
    ty: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> Option<Bound<'py, PyAny>> {
    let ty = ty.cast::<pyo3::types::PyType>().ok()?;
    // SAFETY: `ty` is a live type object and `name` a live str (we hold both), GIL held.
    // _PyType_Lookup returns a borrowed reference or NULL and never sets an exception.
    let found = unsafe { _PyType_Lookup(ty.as_type_ptr(), name.as_ptr()) };
    // SAFETY: a borrowed reference from the type's MRO dicts, alive while we hold `ty`;
    // `from_borrowed_ptr` takes a new reference of its own.
    (!found.is_null()).then(|| unsafe { Bound::from_borrowed_ptr(ty.py(), found) })
}

/// The lookup a guard step's object had when the guard was built: its type at a version
/// tag (no data descriptor or `__getattribute__` can have appeared while the tag holds), and
/// for a class whose `__getattribute__` only renames through `attribute_map`
/// (`_capture.renamed_attributes`: transformers' configurations) that map.
#[derive(Debug, Clone)]
pub struct KnownLookup {
    /// The type's address, not the type: with its version tag (never reused by another type
    /// object, even at the same address) it says the type is the one traced, without the
    /// guard keeping a class alive.
    pub ty: usize,
    pub tag: u32,
    pub renames: Option<OwnedRef>,
    /// For a name that is a property returning `self.<key>`: its getter's code and the
    /// getter (whose `__code__` could be replaced); the instance-dict key read is then the
    /// step's key, not the name.
    pub property: Option<(OwnedRef, OwnedRef)>,
    /// The instance-dict key that holds its value (the name, what its property returns, or
    /// what `renames` renames it to).
    pub key: Option<OwnedRef>,
    /// The name is renamed to `key` by `renames` (checked to still be so on every read).
    pub renamed: bool,
}

impl KnownLookup {
    /// The instance dict of `object` when it still looks attributes up as when the guard was
    /// built and `name` is not renamed; None to take the general path (`getattr`).
    pub fn instance_dict<'py>(
        &self,
        object: &Bound<'py, PyAny>,
        name: &Bound<'py, PyAny>,
    ) -> Option<Bound<'py, PyDict>> {
        let py = object.py();
        let object_type = object.get_type();
        if object_type.as_ptr() as usize != self.ty {
            return None;
        }
        // SAFETY: a live type object (the object holds its type); GIL held.
        if unsafe { (*object_type.as_type_ptr()).tp_version_tag } != self.tag {
            return None;
        }
        if let Some((code, getter)) = &self.property {
            // SAFETY: `getter` is a function object we hold (checked when the guard was
            // built; a function's code is a field of the object); GIL held.
            let current = unsafe { pyo3::ffi::PyFunction_GetCode(getter.as_ptr()) };
            if current != code.as_ptr() {
                return None;
            }
        }
        let dict = instance_dict_of(object)?;
        if let Some(renames) = &self.renames {
            // What the renaming `__getattribute__`s read of the instance itself.
            let own_map = pyo3::intern!(py, "attribute_map");
            let spec = pyo3::intern!(py, "_heterogeneity_spec");
            let renames = renames.bind(py);
            if dict.contains(own_map).ok()?
                || dict.get_item(spec).ok()?.is_some_and(|s| !s.is_none())
            {
                return None;
            }
            let key = self.key.as_ref().map(|k| k.bind(py).clone());
            let lookup_holds = if self.renamed {
                // A renamed read: the name must still be renamed to exactly the key (the
                // renaming applies once, so the key's own entry does not matter).
                match (renames.get_item(name).ok(), &key) {
                    (Some(target), Some(key)) => {
                        target.is_exact_instance_of::<PyString>() && target.eq(key).unwrap_or(false)
                    }
                    _ => false,
                }
            } else {
                !renames.contains(name).ok()?
                    && match &key {
                        Some(key) => !renames.contains(key).ok()?,
                        None => true,
                    }
            };
            if !lookup_holds {
                return None;
            }
        }
        Some(dict)
    }
}

/// `object.__dict__[name]` when `object` still looks attributes up as `lookup` says and the
/// name is in the instance dict — what `getattr` would return — or None to take the general
/// path.
pub fn instance_dict_item<'py>(
    object: &Bound<'py, PyAny>,
    lookup: &KnownLookup,
    name: &OwnedRef,
    cache: &DictReadCache,
) -> Option<Bound<'py, PyAny>> {
    let py = object.py();
    let name = name.bind(py);
    let dict = lookup.instance_dict(object, &name)?;
    let key = lookup.key.as_ref().map_or(name, |k| k.bind(py));
    cache.get(&dict, &key).ok().flatten()
}

/// The instance dict of `object` (an exact dict), or None when it has none. Classes are
/// not instances here: their namespace is not an instance dict.
pub fn instance_dict_of<'py>(object: &Bound<'py, PyAny>) -> Option<Bound<'py, PyDict>> {
    let py = object.py();
    if object.is_instance_of::<pyo3::types::PyType>() {
        return None;
    }
    // SAFETY: `object` is live and the GIL is held; PyObject_GenericGetDict returns a new
    // reference to the instance dict (made if needed) or NULL with an exception set.
    let dict = unsafe { pyo3::ffi::PyObject_GenericGetDict(object.as_ptr(), std::ptr::null_mut()) };
    if dict.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // SAFETY: `dict` is the new reference just returned; Bound takes ownership of it.
    let dict = unsafe { Bound::from_owned_ptr(py, dict) };
    dict.cast_into_exact::<PyDict>().ok()
}

/// A check on a dict's contents (its keys, its length, a key's presence) that passed on the
/// dict at `dict` when its version tag was `tag`: while the same dict keeps that tag its
/// contents have not changed (see [`DictReadCache`]), and the check passes again without
/// being evaluated. Only used where the check's answer is a function of the dict's storage
/// (its `len` and `in` are dict's own, not a subclass's override).
#[derive(Debug, Default)]
pub struct DictTagMemo {
    dict: AtomicUsize,
    tag: AtomicU64,
}

impl DictTagMemo {
    /// The version tag of `value` if it is a dict (or subclass) whose `len` and `in` are
    /// dict's own, else None.
    pub fn tag_of(value: &Bound<'_, PyAny>) -> Option<u64> {
        let object = value.as_ptr();
        // SAFETY: a live object, GIL held; the type object lives as long as the object and
        // the slot tables of dict's type are static.
        unsafe {
            if pyo3::ffi::PyDict_Check(object) == 0 {
                return None;
            }
            let ty = pyo3::ffi::Py_TYPE(object);
            let dict_type = std::ptr::addr_of_mut!(pyo3::ffi::PyDict_Type);
            if ty != dict_type {
                let (mapping, sequence) = ((*ty).tp_as_mapping, (*ty).tp_as_sequence);
                let (dict_mapping, dict_sequence) =
                    ((*dict_type).tp_as_mapping, (*dict_type).tp_as_sequence);
                // The slots hold the C functions a subclass inherited from dict (copied from
                // dict's own table), so equal addresses mean dict's own implementation.
                let length =
                    |m: *mut pyo3::ffi::PyMappingMethods| (*m).mp_length.map(|f| f as usize);
                let contains =
                    |s: *mut pyo3::ffi::PySequenceMethods| (*s).sq_contains.map(|f| f as usize);
                if mapping.is_null()
                    || sequence.is_null()
                    || length(mapping) != length(dict_mapping)
                    || contains(sequence) != contains(dict_sequence)
                {
                    return None;
                }
            }
            // The object is a PyDictObject (PyDict_Check), so the field is there.
            Some((*(object as *mut pyo3::ffi::PyDictObject)).ma_version_tag)
        }
    }

    /// Whether the check passed on this very dict at its present version.
    pub fn holds(&self, value: &Bound<'_, PyAny>) -> bool {
        self.dict.load(Relaxed) == value.as_ptr() as usize
            && Self::tag_of(value).is_some_and(|tag| tag == self.tag.load(Relaxed))
    }

    /// Remembers that the check passed on `value` as it is now (if it is a dict).
    pub fn passed(&self, value: &Bound<'_, PyAny>) {
        if let Some(tag) = Self::tag_of(value) {
            self.dict.store(value.as_ptr() as usize, Relaxed);
            self.tag.store(tag, Relaxed);
        }
    }
}

/// The hook dicts `Module.__call__` consults; any of them non-empty runs hooks around
/// `forward`.
pub const MODULE_CALL_HOOKS: [&str; 4] = [
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
];

/// The check that a module called by the trace has no hooks and no `forward` of its own
/// (`GuardKind::ModuleCall`), remembered by version tags: while the module's instance dict
/// has the tag it had at the last pass, it holds the same hook dicts (so they are alive, and
/// their addresses are valid), and while each of those has its tag, it is still empty. A
/// module tree's calls then cost a few loads each instead of five attribute reads.
#[derive(Debug, Default)]
pub struct ModuleCallMemo {
    dict: AtomicUsize,
    tag: AtomicU64,
    hooks: [AtomicUsize; 4],
    hook_tags: [AtomicU64; 4],
    /// The module's type and its version tag: the call machinery found on it is torch's.
    ty: AtomicUsize,
    ty_tag: std::sync::atomic::AtomicU32,
}

/// The version tag of the dict (or dict subclass) at `address`.
///
/// # Safety
/// `address` must point to a live dict object (or subclass); the GIL must be held.
unsafe fn dict_tag_at(address: usize) -> u64 {
    // SAFETY: per the function's contract, a live object laid out as a PyDictObject.
    unsafe { (*(address as *mut pyo3::ffi::PyDictObject)).ma_version_tag }
}

impl ModuleCallMemo {
    pub fn check(&self, module: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = module.py();
        let Some(dict) = instance_dict_of(module) else {
            return Ok(false);
        };
        let address = dict.as_ptr() as usize;
        // SAFETY: `dict` is a live exact dict we hold.
        let tag = unsafe { dict_tag_at(address) };
        let ty = module.get_type();
        // SAFETY: a live type object (the module holds it); GIL held.
        let ty_tag = unsafe { (*ty.as_type_ptr()).tp_version_tag };
        if self.dict.load(Relaxed) == address
            && self.tag.load(Relaxed) == tag
            && self.ty.load(Relaxed) == ty.as_ptr() as usize
            && ty_tag != 0
            && self.ty_tag.load(Relaxed) == ty_tag
            && crate::eval_frame::module_call::torch_call_functions_unchanged(py)
        {
            // SAFETY: the instance dict is the one of the last pass, unchanged (tags are
            // never reused), so it still holds the hook dicts recorded then: alive dicts.
            let unchanged = (0..4).all(|i| unsafe {
                dict_tag_at(self.hooks[i].load(Relaxed)) == self.hook_tags[i].load(Relaxed)
            });
            if unchanged {
                return Ok(true);
            }
        }
        if dict.contains(pyo3::intern!(py, "forward"))? {
            return Ok(false);
        }
        // `module(...)` is `forward(...)` only with torch's own `__call__` machinery.
        if !crate::eval_frame::module_call::calls_like_torch(module) {
            return Ok(false);
        }
        let mut hooks = [(0usize, 0u64); 4];
        for (slot, name) in hooks.iter_mut().zip(module_call_hooks(py)) {
            let Some(table) = dict.get_item(name.bind(py))? else {
                return Ok(false);
            };
            let Ok(table) = table.cast::<PyDict>() else {
                return Ok(false);
            };
            if !table.is_empty() {
                return Ok(false);
            }
            let table_address = table.as_ptr() as usize;
            // SAFETY: a live dict (subclass) held by the instance dict.
            *slot = (table_address, unsafe { dict_tag_at(table_address) });
        }
        for (i, (table, table_tag)) in hooks.into_iter().enumerate() {
            self.hooks[i].store(table, Relaxed);
            self.hook_tags[i].store(table_tag, Relaxed);
        }
        self.dict.store(address, Relaxed);
        self.tag.store(tag, Relaxed);
        self.ty.store(ty.as_ptr() as usize, Relaxed);
        // SAFETY: as above; the lookups made by `calls_like_torch` gave the type a tag if it
        // can have one (0 never matches).
        self.ty_tag
            .store(unsafe { (*ty.as_type_ptr()).tp_version_tag }, Relaxed);
        Ok(true)
    }
}

/// `hasattr(object, name)` answered without calling Python code, for the two kinds of object
/// whose attribute lookup is known: types with CPython's generic lookup, and `nn.Module`s
/// (generic lookup, then `Module.__getattr__`, which only looks in `_parameters`, `_buffers`
/// and `_modules`). None when the answer needs code to run: a data descriptor or a
/// descriptor other than a function (its `__get__` may raise), a custom `__getattribute__`
/// or `__getattr__`. A failed `hasattr` through `Module.__getattr__` formats an error
/// message, which costs microseconds; this costs a few dict lookups.
/// `known` describes the object's lookup as traced when the guard can answer for a class
/// whose `__getattribute__` only renames (checked to still apply).
pub fn known_hasattr(
    object: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
    known: Option<&KnownLookup>,
) -> Option<bool> {
    let py = object.py();
    let ty = object.get_type();
    // SAFETY: a live type object (the object holds it); reading a slot with the GIL held.
    let getattro = unsafe { (*ty.as_type_ptr()).tp_getattro }.map(|f| f as usize);
    let generic = getattro == Some(pyo3::ffi::PyObject_GenericGetAttr as *const () as usize)
        || known.is_some_and(|k| k.instance_dict(object, name.as_any()).is_some());
    let module = !generic && is_module_lookup(&ty);
    if !generic && !module {
        return None;
    }
    if let Some(found) = class_lookup(ty.as_any(), name) {
        let found_type = found.get_type();
        // SAFETY: as above, for the type of the class attribute found.
        let get = unsafe { (*found_type.as_type_ptr()).tp_descr_get };
        // SAFETY: `found` is a live object.
        let function = unsafe { pyo3::ffi::PyFunction_Check(found.as_ptr()) } != 0;
        return (get.is_none() || function).then_some(true);
    }
    // SAFETY: `object` is live, GIL held; a new reference to the instance dict or NULL with
    // an exception set (objects without one).
    let dict = unsafe { pyo3::ffi::PyObject_GenericGetDict(object.as_ptr(), std::ptr::null_mut()) };
    let dict = if dict.is_null() {
        let _ = PyErr::take(py);
        None
    } else {
        // SAFETY: the new reference just returned.
        Some(unsafe { Bound::from_owned_ptr(py, dict) })
    };
    let dict = match dict {
        Some(d) => Some(d.cast_into::<PyDict>().ok()?),
        None => None,
    };
    if let Some(dict) = &dict {
        if dict.contains(name).ok()? {
            return Some(true);
        }
    }
    if !module {
        return Some(false);
    }
    // Module.__getattr__: `name in self.__dict__[table]` for each table present.
    let Some(dict) = dict else {
        return Some(false);
    };
    for table in module_tables(py) {
        if let Some(table) = dict.get_item(table.bind(py)).ok()? {
            if table.contains(name).ok()? {
                return Some(true);
            }
        }
    }
    Some(false)
}

/// `MODULE_TABLES` as interned strings, made once (a `&str` key is a new string on every
/// lookup).
pub(super) fn module_tables(py: Python<'_>) -> &[Py<PyString>; 3] {
    static NAMES: pyo3::sync::PyOnceLock<[Py<PyString>; 3]> = pyo3::sync::PyOnceLock::new();
    NAMES.get_or_init(py, || {
        super::helpers::MODULE_TABLES.map(|name| PyString::intern(py, name).unbind())
    })
}

/// `MODULE_CALL_HOOKS` as interned strings, made once.
pub(super) fn module_call_hooks(py: Python<'_>) -> &[Py<PyString>; 4] {
    static NAMES: pyo3::sync::PyOnceLock<[Py<PyString>; 4]> = pyo3::sync::PyOnceLock::new();
    NAMES.get_or_init(py, || {
        MODULE_CALL_HOOKS.map(|name| PyString::intern(py, name).unbind())
    })
}

/// Whether `ty` looks attributes up as `nn.Module` does: object's `__getattribute__`, then
/// torch's own `Module.__getattr__`.
pub(super) fn is_module_lookup(ty: &Bound<'_, pyo3::types::PyType>) -> bool {
    static EXPECTED: pyo3::sync::PyOnceLock<Option<(Py<PyAny>, Py<PyAny>)>> =
        pyo3::sync::PyOnceLock::new();
    let py = ty.py();
    let expected = EXPECTED.get_or_init(py, || {
        let object_getattribute = py
            .get_type::<pyo3::types::PyAny>()
            .getattr("__dict__")
            .and_then(|d| d.get_item("__getattribute__"))
            .ok()?;
        let module_getattr = py
            .import_module("torch.nn")
            .and_then(|nn| nn.getattr("Module"))
            .and_then(|m| m.getattr("__dict__"))
            .and_then(|d| d.get_item("__getattr__"))
            .ok()?;
        Some((object_getattribute.unbind(), module_getattr.unbind()))
    });
    let Some((object_getattribute, module_getattr)) = expected else {
        return false;
    };
    class_lookup(ty.as_any(), pyo3::intern!(py, "__getattribute__"))
        .is_some_and(|f| f.is(object_getattribute))
        && class_lookup(ty.as_any(), pyo3::intern!(py, "__getattr__"))
            .is_some_and(|f| f.is(module_getattr))
}

/// How a guard reads `getattr(parent, name)` when the parent's type makes the answer a plain
/// field or dict read: a function's code, defaults or closure, a module's global. Checked on
/// every read (the parent's exact type); anything else, and a name the fast read does not
/// find, goes through `getattr`. Reading `fn.__code__` through `getattr` costs an audit
/// event and an attribute lookup; `torch.nn.functional.relu` a lookup on `ModuleType` first.
#[derive(Debug, Clone, Copy)]
pub enum AttrRead {
    Generic,
    FunctionCode,
    FunctionDefaults,
    FunctionKwDefaults,
    FunctionGlobals,
    FunctionClosure,
    /// From the module's own dict: `ModuleType` defines nothing of this name, so the generic
    /// lookup finds the dict's entry (a missing one is left to the module's `__getattr__`).
    ModuleDict,
}

impl AttrRead {
    pub fn for_name(py: Python<'_>, name: &str) -> AttrRead {
        match name {
            "__code__" => AttrRead::FunctionCode,
            "__defaults__" => AttrRead::FunctionDefaults,
            "__kwdefaults__" => AttrRead::FunctionKwDefaults,
            "__globals__" => AttrRead::FunctionGlobals,
            "__closure__" => AttrRead::FunctionClosure,
            _ => {
                // SAFETY: the static module type object, GIL held.
                let module_type = unsafe {
                    Bound::from_borrowed_ptr(
                        py,
                        std::ptr::addr_of_mut!(pyo3::ffi::PyModule_Type).cast(),
                    )
                };
                match class_lookup(&module_type, &PyString::new(py, name)) {
                    None => AttrRead::ModuleDict,
                    Some(_) => AttrRead::Generic,
                }
            }
        }
    }

    /// The attribute, when `parent` is of the type this read is for and has it; None to
    /// read it through `getattr`.
    pub fn read<'py>(
        &self,
        parent: &Bound<'py, PyAny>,
        name: &Bound<'py, PyAny>,
        cache: &DictReadCache,
    ) -> Option<Bound<'py, PyAny>> {
        let py = parent.py();
        let object = parent.as_ptr();
        // SAFETY: `parent` is a live object and the GIL is held; its type is compared with
        // the static function and module types before any field of those types is read.
        unsafe {
            let ty = pyo3::ffi::Py_TYPE(object);
            let function = ty == std::ptr::addr_of_mut!(pyo3::ffi::PyFunction_Type);
            let field = match self {
                AttrRead::Generic => return None,
                AttrRead::ModuleDict => {
                    if ty != std::ptr::addr_of_mut!(pyo3::ffi::PyModule_Type) {
                        return None;
                    }
                    // Borrowed; a module's dict is an exact dict for its whole life.
                    let dict = pyo3::ffi::PyModule_GetDict(object);
                    if dict.is_null() {
                        pyo3::ffi::PyErr_Clear();
                        return None;
                    }
                    let dict = Bound::from_borrowed_ptr(py, dict);
                    let dict = dict.cast_exact::<PyDict>().ok()?;
                    return cache.get(dict, name).ok().flatten();
                }
                _ if !function => return None,
                AttrRead::FunctionCode => pyo3::ffi::PyFunction_GetCode(object),
                AttrRead::FunctionDefaults => pyo3::ffi::PyFunction_GetDefaults(object),
                AttrRead::FunctionKwDefaults => pyo3::ffi::PyFunction_GetKwDefaults(object),
                AttrRead::FunctionGlobals => pyo3::ffi::PyFunction_GetGlobals(object),
                AttrRead::FunctionClosure => pyo3::ffi::PyFunction_GetClosure(object),
            };
            // Borrowed references from the function; an unset field reads as None.
            Some(if field.is_null() {
                py.None().into_bound(py)
            } else {
                Bound::from_borrowed_ptr(py, field)
            })
        }
    }
}
