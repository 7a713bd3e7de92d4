"""Inductor's installation keys, remembered between processes.

Inductor files every cache entry (FX graphs, AOTAutograd results, kernels) under two keys
computed from the installed packages: `torch_key`, a hash of the contents of every torch
source file, and `triton_key`, a hash of triton's sources and of its several-hundred-
megabyte library. Each process computes them again the first time it compiles a graph —
~0.4 s of a warm start (all caches hit) that takes ~1.4 s in all.

The keys depend only on those files, so they are remembered in a small file next to the
capture cache under a fingerprint of the two installations: the path, size, modification
and change times and inode of every file under torch's and triton's package directories
(`_native.file_tree_fingerprint`; `stat` only, ~30 ms without the GIL, started in the
background when `dynamo_rs.compile` is called). Any file added,
removed, replaced or written since changes the fingerprint, so a remembered key is handed
to Inductor (through the `set` its key functions offer for exactly that) only while the
installation is the one it was computed from; otherwise Inductor computes the keys as
usual, and they are remembered afterwards. A missing, damaged or unwritable file is a miss.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import threading

log = logging.getLogger("dynamo_rs.cache")

FORMAT = 1
FILE_NAME = "inductor-keys.json"

# What happened in this process: "hit" (remembered keys handed to Inductor), "miss" (none
# that held; Inductor computed them), "saved".
counters: dict = {}

_lock = threading.Lock()
_primed = False
# The fingerprint of a miss, written with the keys Inductor computed, once it has.
_pending: str | None = None


def _count(what: str) -> None:
    counters[what] = counters.get(what, 0) + 1


def enabled() -> bool:
    from dynamo_rs import config

    if not config.remember_inductor_keys:
        return False
    from torch._inductor import config as inductor_config

    # Without Inductor's caches the keys are never asked for.
    if getattr(inductor_config, "force_disable_caches", False):
        return False
    return bool(inductor_config.fx_graph_cache or inductor_config.autograd_cache)


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def fingerprint() -> str:
    """What the keys are remembered under: the installations of torch and triton (whose
    files the keys hash), and the versions that decide how they are hashed."""
    from dynamo_rs import _native

    roots = [d for d in (_package_dir("torch"), _package_dir("triton")) if d is not None]
    import torch

    return json.dumps([FORMAT, sys.version, torch.__version__, roots,
                       _native.file_tree_fingerprint(roots)])


class _Early:
    """The fingerprint, computed by a thread started when `dynamo_rs.compile` is called with
    Inductor: the `stat` calls run without the GIL, beside the imports and the capture
    that come before the first graph reaches Inductor."""

    def __init__(self) -> None:
        self.value: str | None = None
        # Not a daemon: the interpreter waits for it (~30 ms at most) before finalizing. A
        # daemon thread would be unwound by force when it takes the GIL back during
        # finalization, which aborts the process ("exception not rethrown") as the unwinding
        # crosses the Rust frames of the fingerprint.
        self.thread = threading.Thread(target=self._run, name="dynamo_rs-inductor-keys", daemon=False)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.value = fingerprint()
        except Exception as err:  # noqa: BLE001 - prime() computes it again
            log.debug("fingerprint not computed early: %s: %s", type(err).__name__, err)

    def result(self) -> str:
        self.thread.join()
        return self.value if self.value is not None else fingerprint()


_early: _Early | None = None


def start() -> None:
    """Starts computing the fingerprint in the background (once per process)."""
    global _early
    from dynamo_rs import config

    with _lock:
        if _early is None and not _primed and config.remember_inductor_keys:
            _early = _Early()


def _path() -> str:
    from dynamo_rs import _persist

    return os.path.join(_persist.directory(), FILE_NAME)


def _read() -> dict | None:
    try:
        with open(_path(), encoding="utf-8") as f:
            memo = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as why:
        log.debug("ignored remembered Inductor keys: %s", why)
        return None
    return memo if isinstance(memo, dict) else None


def _decoded(memo: dict) -> tuple[bytes, str | None] | None:
    """The keys of a memo, checked to be of the kinds Inductor computes."""
    torch_key, triton_key = memo.get("torch_key"), memo.get("triton_key")
    if not isinstance(torch_key, str) or not (triton_key is None or isinstance(triton_key, str)):
        return None
    try:
        key = bytes.fromhex(torch_key)
    except ValueError:
        return None
    return (key, triton_key) if len(key) == 32 else None


def prime() -> None:
    """Before the first graph of the process goes to Inductor: hands it the remembered keys
    if they were computed from the files installed now. Never raises."""
    global _primed, _pending
    with _lock:
        if _primed:
            return
        _primed = True
        try:
            if not enabled():
                return
            from torch._inductor import codecache

            now = _early.result() if _early is not None else fingerprint()
            memo = _read()
            keys = _decoded(memo) if memo is not None and memo.get("fingerprint") == now else None
            if keys is None:
                _count("miss")
                _pending = now
                return
            try:
                codecache.torch_key.set(keys[0])
                codecache.triton_key.set(keys[1])
            except RuntimeError:
                # Already computed in this process (torch.compile ran before): nothing to do.
                return
            _count("hit")
        except Exception as err:  # noqa: BLE001 - never fail a compile over this
            log.debug("remembered Inductor keys not used: %s: %s", type(err).__name__, err)


def remember() -> None:
    """After a graph went to Inductor: writes the keys it computed, after a miss. Never
    raises; a directory that cannot be written is left alone."""
    global _pending
    with _lock:
        now, _pending = _pending, None
        if now is None:
            return
        try:
            from torch._inductor import codecache

            torch_key, triton_key = codecache.torch_key(), codecache.triton_key()
            if not isinstance(torch_key, bytes):
                return
            from dynamo_rs import _persist

            payload = {"fingerprint": now, "torch_key": torch_key.hex(), "triton_key": triton_key}
            _persist.write_replacing(_path(), json.dumps(payload).encode())
            _count("saved")
        except Exception as err:  # noqa: BLE001
            log.debug("Inductor keys not remembered: %s: %s", type(err).__name__, err)


def reset() -> None:
    """Forgets what this process did (for tests): the next graph primes again."""
    global _primed, _pending, _early
    with _lock:
        _primed, _pending, _early = False, None, None
        counters.clear()
