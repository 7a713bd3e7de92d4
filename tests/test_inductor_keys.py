"""Inductor's installation keys remembered between processes (`dynamo_rs._inductor_keys`):
a remembered key is handed to Inductor only while the files it hashes are the ones it was
computed from, and it is the key Inductor computes itself. The second-process path
(Inductor's caches still hit with remembered keys) is in `test_backend_caches.py`."""

from __future__ import annotations

import json
import os
import time

import pytest
from torch._inductor import codecache

import dynamo_rs
from dynamo_rs import _inductor_keys


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """A cache directory of its own, and a fake "torch" installation (a tree whose files
    can be edited) in place of the real ones, which the keys are remembered under."""
    # (Settings are restored by hand: they live outside the config module's __dict__,
    # which monkeypatch would restore.)
    saved = {name: getattr(dynamo_rs.config, name) for name in ("capture_cache_dir", "remember_inductor_keys")}
    dynamo_rs.config.capture_cache_dir = str(tmp_path / "cache")
    dynamo_rs.config.remember_inductor_keys = True
    tree = tmp_path / "torch"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.py").write_text("a = 1\n")
    (tree / "sub" / "b.py").write_text("b = 2\n")
    monkeypatch.setattr(_inductor_keys, "_package_dir", lambda name: str(tree) if name == "torch" else None)
    real = (codecache.torch_key(), codecache.triton_key())
    yield tree, real
    # Leave torch with its own keys, as computed.
    fresh()
    codecache.torch_key.set(real[0])
    codecache.triton_key.set(real[1])
    _inductor_keys.reset()
    for name, value in saved.items():
        setattr(dynamo_rs.config, name, value)


def fresh() -> None:
    """As in a new process: nothing primed, Inductor's keys not computed."""
    _inductor_keys.reset()
    codecache.torch_key.clear()
    codecache.triton_key.clear()


def memo_path() -> str:
    return os.path.join(dynamo_rs.config.capture_cache_dir, _inductor_keys.FILE_NAME)


def first_then_second(real) -> None:
    fresh()
    _inductor_keys.prime()
    _inductor_keys.remember()
    assert _inductor_keys.counters == {"miss": 1, "saved": 1}
    fresh()
    _inductor_keys.prime()
    assert _inductor_keys.counters == {"hit": 1}
    assert (codecache.torch_key(), codecache.triton_key()) == real


def test_remembered_keys_are_the_ones_inductor_computes(keys) -> None:
    tree, real = keys
    first_then_second(real)
    # Computed again from scratch, the keys are the remembered ones.
    fresh()
    assert (codecache.torch_key(), codecache.triton_key()) == real


def rewrite_after_clock_tick(path, text: str) -> None:
    before = os.stat(path).st_mtime_ns
    for _ in range(300):
        time.sleep(0.01)
        path.write_text(text)
        if os.stat(path).st_mtime_ns != before:
            return
    raise AssertionError("the file system's clock did not move in 3 s")


@pytest.mark.parametrize("change", ["rewritten", "added", "removed", "renamed"])
def test_a_changed_installation_is_a_miss(keys, change) -> None:
    tree, real = keys
    first_then_second(real)
    if change == "rewritten":  # same size, other contents
        rewrite_after_clock_tick(tree / "sub" / "b.py", "b = 3\n")
    elif change == "added":
        (tree / "sub" / "c.py").write_text("")
    elif change == "removed":
        (tree / "a.py").unlink()
    else:
        (tree / "a.py").rename(tree / "z.py")
    fresh()
    _inductor_keys.prime()
    assert _inductor_keys.counters == {"miss": 1}
    _inductor_keys.remember()
    assert _inductor_keys.counters == {"miss": 1, "saved": 1}
    fresh()
    _inductor_keys.prime()
    assert _inductor_keys.counters == {"hit": 1}


@pytest.mark.parametrize("damage", ["truncated", "not json", "a list", "wrong key kinds", "short key",
                                    "other fingerprint"])
def test_a_damaged_memo_is_a_miss(keys, damage) -> None:
    tree, real = keys
    first_then_second(real)
    path = memo_path()
    with open(path) as f:
        text = f.read()
    memo = json.loads(text)
    if damage == "truncated":
        text = text[: len(text) // 2]
    elif damage == "not json":
        text = "\x00\xff garbage"
    elif damage == "a list":
        text = "[1, 2]"
    elif damage == "wrong key kinds":
        text = json.dumps(dict(memo, torch_key=12, triton_key=["x"]))
    elif damage == "short key":
        text = json.dumps(dict(memo, torch_key="abcd"))
    else:
        text = json.dumps(dict(memo, fingerprint=memo["fingerprint"] + " "))
    with open(path, "w", errors="surrogateescape") as f:
        f.write(text)
    fresh()
    _inductor_keys.prime()
    assert _inductor_keys.counters == {"miss": 1}
    # Inductor computes its keys as usual.
    assert (codecache.torch_key(), codecache.triton_key()) == real


def test_keys_already_computed_in_the_process_are_left_alone(keys) -> None:
    tree, real = keys
    first_then_second(real)
    fresh()
    codecache.torch_key()  # torch.compile ran first in this process, say
    _inductor_keys.prime()
    assert codecache.torch_key() == real[0]
    assert "hit" not in _inductor_keys.counters


def test_turned_off_nothing_is_read_or_written(keys) -> None:
    tree, real = keys
    dynamo_rs.config.remember_inductor_keys = False
    fresh()
    _inductor_keys.prime()
    _inductor_keys.remember()
    assert _inductor_keys.counters == {}
    assert not os.path.exists(memo_path())


def test_with_inductor_caches_off_nothing_is_read_or_written(keys) -> None:
    from torch._inductor import config as inductor_config

    tree, real = keys
    fresh()
    with inductor_config.patch(force_disable_caches=True):
        _inductor_keys.prime()
        _inductor_keys.remember()
    assert _inductor_keys.counters == {}
    assert not os.path.exists(memo_path())


def test_an_unwritable_directory_is_left_alone(keys, tmp_path) -> None:
    tree, real = keys
    blocker = tmp_path / "file"
    blocker.write_text("")
    dynamo_rs.config.capture_cache_dir = str(blocker / "cache")
    fresh()
    _inductor_keys.prime()
    _inductor_keys.remember()  # cannot make the directory: no error
    assert _inductor_keys.counters == {"miss": 1}


@pytest.mark.parametrize("how", ["compile(fn)", "compile(module, mode=...)", "compile then exit()",
                                 "compile then os.fork()"])
def test_a_program_that_exits_at_once_exits_cleanly(how) -> None:
    """`dynamo_rs.compile` with Inductor starts computing the fingerprint in a thread; a
    program that ends (or forks) right after must neither abort nor hang (a daemon thread
    taking the GIL back during finalization aborted the process)."""
    import subprocess
    import sys

    body = {
        "compile(fn)": "dynamo_rs.compile(lambda x: x + 1)",
        "compile(module, mode=...)": "dynamo_rs.compile(torch.nn.Linear(2, 2), mode='reduce-overhead')",
        "compile then exit()": "dynamo_rs.compile(lambda x: x + 1); sys.exit(0)",
        "compile then os.fork()": (
            "dynamo_rs.compile(lambda x: x + 1)\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    from dynamo_rs import _inductor_keys\n"
            "    assert _inductor_keys._early.result()\n"
            "    os._exit(0)\n"
            "assert os.waitpid(pid, 0)[1] == 0"),
    }[how]
    program = "import os, sys, torch, dynamo_rs\n" + body + "\n"
    for _ in range(2):  # the thread runs for ~30 ms: exit while it does
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "FATAL" not in done.stderr, done.stderr[-2000:]
