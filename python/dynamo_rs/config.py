"""dynamo_rs settings. Assign attributes to change them:

    import dynamo_rs
    dynamo_rs.config.cache_size_limit = 4

- cache_size_limit (8): compiled versions kept per code object; past it the code object
  stops being compiled (one warning) and only reuses what it has.
- suppress_errors (None): what a failure while compiling a frame does. None: a failure of
  dynamo_rs's own gives one warning and the frame runs uncompiled, while a backend that
  raises (or returns something not callable) raises `dynamo_rs.BackendCompilerFailed`, as
  under torch.compile; True: every failure is a warning and the frame runs uncompiled;
  False: every failure raises.
- skip_torch (True): never intercept frames of torch's own files but `torch.optim`'s (user
  code calling into torch is still captured; torch's modules are inlined from there). Applies to code objects
  first seen after the change, and to all after `dynamo_rs.reset()`.
- meta_rules (True): compute the fake results of common operations (elementwise, views,
  linear, conv2d, batch_norm, layer_norm) by our own shape rules instead of running them
  through FakeTensorMode, which costs up to milliseconds per operation in a fresh process.
- verify_meta_rules (False, or the environment variable DYNAMO_RS_VERIFY_META_RULES=1):
  also run FakeTensorMode for every operation a rule answered and fail the frame's compile
  on any difference. The test suite turns it on.
- guard_self_check (False, or the environment variable DYNAMO_RS_GUARD_SELF_CHECK=1): check
  every new cache entry's guard on the frame it was compiled for and raise
  `dynamo_rs.CompileError` if it fails (such a guard never holds: every call would compile
  again). The test suite turns it on.
- guard_check_mode ("fast", or the environment variable DYNAMO_RS_GUARD_CHECK_MODE):
  "debug" also evaluates every guard check by a slow reference that resolves each guarded
  source on its own with plain getattr/[] and compares tensors field by field, and raises
  `dynamo_rs.InternalCheckFailed` if the two disagree. The test suite turns it on.
- capture_cache (False, or the environment variable DYNAMO_RS_CAPTURE_CACHE=1): keep what
  is captured in a directory and, in a later process, bind it to the frame being called
  instead of tracing (see `dynamo_rs.cache`). Only for backends named by a string.
- capture_cache_dir (None: the environment variable DYNAMO_RS_CACHE_DIR, else
  `$XDG_CACHE_HOME/dynamo_rs/capture` or `~/.cache/dynamo_rs/capture`): where (also the
  remembered Inductor keys are kept there).
- remember_inductor_keys (True, or the environment variable
  DYNAMO_RS_REMEMBER_INDUCTOR_KEYS=0 to turn it off): remember Inductor's installation keys
  (hashes of torch's and triton's installed files, ~0.4 s to compute in every process)
  between processes, under a fingerprint of those files (see `dynamo_rs._inductor_keys`).
"""

from __future__ import annotations

import os
import sys
import types


# Directories of code torch generates and loads as modules (Inductor's compiled graphs, whose
# `Runner.call` the autograd engine runs in a backward pass): torch's own code, never
# intercepted while `skip_torch` holds. Filled as backends make them known.
_GENERATED_CODE_DIRS: list = []


def _standard_library_dirs() -> list:
    """The standard library's directories, never intercepted as frames of their own (as
    TorchDynamo skips them: `weakref`, `copy`, `threading` called from eager code — from a
    backward pass that compiles its graph lazily, say — are not model code), and, marked
    with `!`, the package directories that may sit inside them (a non-virtual install's
    site-packages), which are intercepted as usual. Traced code still inlines the standard
    library where it calls it."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    stdlib = {os.path.join(os.path.abspath(paths[k]), "") for k in ("stdlib", "platstdlib") if paths.get(k)}
    packages = {paths.get("purelib"), paths.get("platlib")}
    try:
        packages |= set(site.getsitepackages()) | {site.getusersitepackages()}
    except AttributeError:  # a virtualenv's old site module
        pass
    kept = {os.path.join(os.path.abspath(p), "") for p in packages if p}
    return sorted(stdlib) + ["!" + p for p in sorted(kept) if any(p.startswith(s) for s in stdlib)]


def _package_dir(name: str) -> str | None:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return os.path.dirname(spec.origin) + os.sep


class _Config(types.ModuleType):
    """A module whose attributes forward to the native hook when set."""

    def __init__(self) -> None:
        super().__init__(__name__, __doc__)
        object.__setattr__(self, "_values", {})
        self.cache_size_limit = 8
        self.suppress_errors = None
        self.skip_torch = True
        self.meta_rules = True
        self.verify_meta_rules = os.environ.get("DYNAMO_RS_VERIFY_META_RULES", "") not in ("", "0")
        self.guard_self_check = os.environ.get("DYNAMO_RS_GUARD_SELF_CHECK", "") not in ("", "0")
        self.guard_check_mode = os.environ.get("DYNAMO_RS_GUARD_CHECK_MODE", "") or "fast"
        self.capture_cache = os.environ.get("DYNAMO_RS_CAPTURE_CACHE", "") not in ("", "0")
        self.capture_cache_dir = os.environ.get("DYNAMO_RS_CACHE_DIR") or None
        self.remember_inductor_keys = os.environ.get("DYNAMO_RS_REMEMBER_INDUCTOR_KEYS", "") != "0"

    def __getattr__(self, name: str):
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"dynamo_rs.config has no setting {name!r}")

    def __setattr__(self, name: str, value) -> None:
        from dynamo_rs import _native

        values = object.__getattribute__(self, "_values")
        if name == "cache_size_limit":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"cache_size_limit must be a positive int, not {value!r}")
            _native.configure(cache_size_limit=value)
        elif name == "suppress_errors":
            if value is not None:
                value = bool(value)
            _native.configure(suppress_errors={None: 0, True: 1, False: 2}[value])
        elif name == "skip_torch":
            value = bool(value)
            prefixes = [p for p in (_package_dir("dynamo_rs"),) if p]
            if value:
                torch_dir = _package_dir("torch")
                prefixes += [p for p in (torch_dir,) if p] + _GENERATED_CODE_DIRS
                prefixes += _standard_library_dirs()
                if torch_dir:
                    # Optimizer steps are compiled, as under torch.compile: `torch.compile(
                    # opt.step)`, or the `step` a compiled training loop calls after its
                    # `backward()` graph break.
                    prefixes.append("!" + os.path.join(torch_dir, "optim", ""))
            _native.configure(skip_prefixes=prefixes)
        elif name == "guard_check_mode":
            if value not in ("fast", "debug"):
                raise ValueError(f"guard_check_mode must be 'fast' or 'debug', not {value!r}")
            _native.configure_capture(guard_check_debug=value == "debug")
        elif name in ("meta_rules", "verify_meta_rules", "guard_self_check", "capture_cache",
                      "remember_inductor_keys"):
            value = bool(value)
        elif name == "capture_cache_dir":
            value = None if value is None else os.fspath(value)
        else:
            raise AttributeError(f"dynamo_rs.config has no setting {name!r}")
        values[name] = value

    def skip_generated_code_in(self, directory: str) -> None:
        """Never intercept frames of files under `directory` (see `_GENERATED_CODE_DIRS`)."""
        prefix = os.path.join(os.path.abspath(directory), "")
        if prefix not in _GENERATED_CODE_DIRS:
            _GENERATED_CODE_DIRS.append(prefix)
            self.skip_torch = self.skip_torch

    def __dir__(self):
        return sorted(object.__getattribute__(self, "_values"))


sys.modules[__name__] = _Config()
