"""The persistent capture cache (issue 12): a second process binds what the first captured
instead of tracing, and anything that could make a stored entry wrong — a damaged, foreign
or stale file, an edited source, a module with another layer, a changed global — makes it
trace again and give eager's result. Cache contents are never unpickled.

Each scenario runs the same program in fresh processes (code objects must come from the
same files to be found again), sharing one cache directory."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

# The user's code, in a file of its own. `SCALE` and `LAYERS` are edited between processes
# by some scenarios; `helper` lives in a second module so that editing it changes a
# function the trace inlined, not the compiled one.
USER_MODULE = textwrap.dedent(
    """
    import torch
    from torch import nn
    import helpers

    SCALE = 2.0
    LAYERS = 2

    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.linear = nn.Linear(width, width)
            self.norm = nn.LayerNorm(width)

        def forward(self, x):
            return self.norm(torch.relu(self.linear(x))) + x

    class Net(nn.Module):
        def __init__(self, layers=LAYERS, width=8):
            super().__init__()
            self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
            self.head = nn.Linear(width, 3)

        def forward(self, x, scale=1.0):
            for block in self.blocks:
                x = block(x)
            return helpers.helper(self.head(x)) * SCALE * scale

    def closure_of(k):
        def fn(x, y):
            return (x * k).sin() + helpers.helper(y)
        return fn

    def plain(x, y):
        return torch.cos(x) @ y.T + SCALE

    def branchy(x, y):
        a = x.sin() * SCALE
        if a.sum() > 0:  # a graph break: the rest runs in resume functions
            return a * y
        return a - y
    """
)

HELPERS = textwrap.dedent(
    """
    import torch

    def helper(t):
        return torch.tanh(t) * 2
    """
)

# Runs every compiled callable once (twice for `repeat`), compares with eager, and prints
# what the converter and the cache did as JSON.
PROGRAM = textwrap.dedent(
    """
    import json, sys, torch, dynamo_rs
    sys.path.insert(0, sys.argv[1])
    dynamo_rs.config.capture_cache = True
    dynamo_rs.config.capture_cache_dir = sys.argv[2]
    import user
    BACKEND = sys.argv[3]
    PLANT = sys.argv[4] if len(sys.argv) > 4 else None

    if PLANT:
        # Any unpickling during the run is recorded (and the planted payload would leave
        # a file behind if it ever ran).
        import pickle
        calls = []
        real = (pickle.loads, pickle.load)
        pickle.loads = lambda *a, **k: (calls.append("loads"), real[0](*a, **k))[1]
        pickle.load = lambda *a, **k: (calls.append("load"), real[1](*a, **k))[1]

    torch.manual_seed(0)
    net = user.Net().eval()
    x = torch.randn(4, 8)
    results = {}
    converters = []

    def run(name, fn, compiled, *args, **kwargs):
        converters.append(compiled._dynamo_rs_converter)
        with torch.no_grad():
            got = compiled(*args, **kwargs)
            want = fn(*args, **kwargs)
        results[name] = bool(torch.allclose(got, want, atol=1e-6))

    run("net", net, dynamo_rs.compile(net, backend=BACKEND), x, scale=0.5)
    fn = user.closure_of(3.0)
    run("closure", fn, dynamo_rs.compile(fn, backend=BACKEND), x, torch.randn(4, 8))
    run("plain", user.plain, dynamo_rs.compile(user.plain, backend=BACKEND), x, torch.randn(5, 8))
    after = {}
    if "mutate" in sys.argv:
        # A loaded entry is guarded like a traced one: changing the module recompiles.
        compiled = dynamo_rs.compile(net, backend=BACKEND)
        with torch.no_grad():
            net.head.bias.zero_()
            net.blocks[0].norm.eps = 1e-3
            got, want = compiled(x), net(x)
        after = {"ok": bool(torch.allclose(got, want, atol=1e-6)),
                 "traces": compiled._dynamo_rs_converter.traces}
    if "sizes" in sys.argv:
        # Automatic dynamic shapes after a bound entry: the sizes it was bound with count
        # as seen, so a new size makes one symbolic graph that also serves the next.
        compiled = dynamo_rs.compile(user.plain, backend=BACKEND)
        before = compiled._dynamo_rs_converter.traces
        for n in (6, 7):
            a, b = torch.randn(n, 8), torch.randn(5, 8)
            after.setdefault("ok", []).append(bool(torch.allclose(compiled(a, b), user.plain(a, b), atol=1e-6)))
        after["traces"] = compiled._dynamo_rs_converter.traces - before
    if "breaks" in sys.argv:
        # A frame split at a graph break: the part before it and the resume functions
        # are each stored and bound.
        compiled = dynamo_rs.compile(user.branchy, backend=BACKEND)
        ok = []
        for sign in (1, -1, 1):
            a, b = torch.full((4, 8), 0.5 * sign), torch.randn(4, 8)
            ok.append(bool(torch.allclose(compiled(a, b), user.branchy(a, b), atol=1e-6)))
        converter = compiled._dynamo_rs_converter
        after = {"ok": ok, "traces": converter.traces, "loaded": converter.loaded}
    out = {
        "results": results,
        "traces": sum(c.traces for c in converters),
        "loaded": sum(c.loaded for c in converters),
        "cache": dynamo_rs.cache.stats(),
        "after": after,
    }
    if PLANT:
        out["unpickled"] = calls
    from torch._dynamo.utils import counters
    out["torch"] = {k: dict(v) for k, v in counters.items()}
    print(json.dumps(out))
    """
)

N_FUNCTIONS = 3  # compiled callables in PROGRAM

# The model suite, each model compiled and called once, compared with eager.
MODELS_PROGRAM = textwrap.dedent(
    """
    import json, sys, torch, dynamo_rs
    sys.path.insert(0, sys.argv[1])
    dynamo_rs.config.capture_cache = True
    dynamo_rs.config.capture_cache_dir = sys.argv[2]
    from models import build, tensors_of
    out = {}
    for name in sys.argv[3:]:
        model, inputs = build(name)
        compiled = dynamo_rs.compile(model, backend="eager")
        with torch.no_grad():
            got, want = compiled(*inputs), model(*inputs)
        converter = compiled._dynamo_rs_converter
        out[name] = {"ok": all(torch.allclose(a, b, atol=1e-5) for a, b in zip(tensors_of(got), tensors_of(want))),
                     "traces": converter.traces, "loaded": converter.loaded}
    print(json.dumps(out))
    """
)
SUITE = ["resnet18", "mobilenet_v3_small", "vit_tiny_patch16_224", "convnext_atto", "gpt2", "bert", "llama"]


@pytest.fixture
def workspace(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "user.py").write_text(USER_MODULE)
    (code / "helpers.py").write_text(HELPERS)
    return code, tmp_path / "cache"


def environment(cache) -> dict:
    """The test suite's checks (shape rules against FakeTensorMode, which also checks the
    stored graph code against FX's; guard self-check; reference guard evaluation) in the
    child processes too, and a private Inductor cache."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache.parent / "inductor"),
               DYNAMO_RS_VERIFY_META_RULES="1", DYNAMO_RS_GUARD_SELF_CHECK="1",
               DYNAMO_RS_GUARD_CHECK_MODE="debug")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(workspace, *extra, backend: str = "eager") -> dict:
    code, cache = workspace
    env = environment(cache)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(code), str(cache), backend, *extra],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = done.stderr
    assert all(out["results"].values()), out
    return out


def cache_files(workspace) -> list[str]:
    return sorted(glob.glob(os.path.join(str(workspace[1]), "*", "*.json")))


def edit(workspace, name: str, old: str, new: str) -> None:
    path = workspace[0] / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    # Python would otherwise reuse the cached bytecode of a file edited within a second.
    for pyc in glob.glob(str(workspace[0] / "__pycache__" / "*.pyc")):
        os.unlink(pyc)


def test_second_process_binds_instead_of_tracing(workspace) -> None:
    first = run(workspace)
    assert first["traces"] == N_FUNCTIONS and first["loaded"] == 0, first
    assert first["cache"].get("saved") == N_FUNCTIONS, first
    second = run(workspace)
    assert second["traces"] == 0, second
    assert second["loaded"] == N_FUNCTIONS, second
    assert second["cache"].get("hits") == N_FUNCTIONS, second


def test_model_suite_binds_in_a_second_process(tmp_path) -> None:
    cache = tmp_path / "cache"
    tests = os.path.dirname(os.path.abspath(__file__))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", MODELS_PROGRAM, tests, str(cache), *SUITE],
                              env=environment(cache), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-4000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    for name in SUITE:
        assert first[name]["ok"] and second[name]["ok"], (name, first, second)
        assert first[name]["traces"] >= 1, (name, first)
        assert second[name]["traces"] == 0 and second[name]["loaded"] >= 1, (name, second)


def test_inductor_in_a_second_process_binds_and_hits_torch_caches(workspace) -> None:
    first = run(workspace, backend="inductor")
    assert first["traces"] == N_FUNCTIONS, first
    second = run(workspace, backend="inductor")
    assert second["traces"] == 0 and second["loaded"] == N_FUNCTIONS, second
    aot, inductor = second["torch"].get("aot_autograd", {}), second["torch"].get("inductor", {})
    assert aot.get("autograd_cache_hit") == N_FUNCTIONS, second["torch"]
    assert inductor.get("fxgraph_cache_hit") == N_FUNCTIONS, second["torch"]
    assert "fxgraph_cache_bypass" not in inductor, second["torch"]


def test_loaded_entries_are_guarded_like_traced_ones(workspace) -> None:
    run(workspace)
    second = run(workspace, "mutate")
    assert second["traces"] == 0, second
    assert second["after"]["ok"], second
    assert second["after"]["traces"] == 1, second  # the changed module was traced again


def test_automatic_dynamic_shapes_after_a_bound_entry(workspace) -> None:
    first = run(workspace, "sizes")
    second = run(workspace, "sizes")
    assert second["traces"] == 0, second
    for out in (first, second):
        assert all(out["after"]["ok"]), out
        assert out["after"]["traces"] == 1, out


def test_frames_split_at_a_graph_break_are_bound_too(workspace) -> None:
    first = run(workspace, "breaks")
    assert all(first["after"]["ok"]) and first["after"]["traces"] >= 3, first
    second = run(workspace, "breaks")
    assert all(second["after"]["ok"]), second
    # The split frame and both resume functions (one per branch) bound, none traced.
    assert second["after"]["traces"] == 0 and second["after"]["loaded"] == 3, second


def _rewrite(path: str, change) -> None:
    """Rewrites a cache file's payload with `change` applied, with a valid checksum (so
    only the content can make it be refused)."""
    with open(path, "rb") as f:
        data = f.read()
    magic, _, rest = data.partition(b"\n")
    _, _, body = rest.partition(b"\n")
    payload = json.loads(body)
    change(payload)
    body = json.dumps(payload).encode()
    with open(path, "wb") as f:
        f.write(magic + b"\n" + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def _damage(path: str, damage: str) -> None:
    if damage == "flipped":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x55]))
    elif damage == "truncated":
        os.truncate(path, os.path.getsize(path) // 3)
    elif damage == "empty":
        os.truncate(path, 0)
    elif damage == "other_version":
        _rewrite(path, lambda p: p["environment"].update(torch="0.0.1"))
    elif damage == "foreign":
        _rewrite(path, lambda p: p.update(format=99))
    elif damage == "bad_entry":
        # Well-formed JSON, a valid checksum, nonsense inside an entry.
        _rewrite(path, lambda p: [e["guards"].update(sources=[["nonsense", None, 1]]) for e in p["entries"]])
    else:
        raise ValueError(damage)


# One kind of damage per file (there is one file per compiled function).
@pytest.mark.parametrize("damages", [("flipped", "truncated", "other_version"),
                                     ("empty", "foreign", "bad_entry")])
def test_damaged_or_foreign_files_are_ignored(workspace, damages) -> None:
    run(workspace)
    files = cache_files(workspace)
    assert len(files) == N_FUNCTIONS == len(damages)
    for path, damage in zip(files, damages):
        _damage(path, damage)
    second = run(workspace)
    assert second["traces"] == N_FUNCTIONS and second["loaded"] == 0, second
    assert second["cache"].get("rejected", 0) == N_FUNCTIONS, second
    # The files were written again, whole: a third process binds them.
    third = run(workspace)
    assert third["traces"] == 0, third


# (file, text, replacement, frames traced again): what each edit between two processes
# must make the second one trace again, the other frames being bound from the cache.
EDITS = {
    # `plain` itself changed (its result is checked against the edited eager one).
    "compiled function": ("user.py", "return torch.cos(x) @ y.T + SCALE", "return torch.sin(x) @ y.T + SCALE", 1),
    # `helper` is inlined into `net` and `closure`, not `plain`.
    "inlined function": ("helpers.py", "return torch.tanh(t) * 2", "return torch.tanh(t) * 5", 2),
    # `Net` built with another layer.
    "module structure": ("user.py", "LAYERS = 2", "LAYERS = 3", 1),
    # `net` and `plain` read SCALE; `closure` does not.
    "global": ("user.py", "SCALE = 2.0", "SCALE = 4.0", 2),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_edits_between_processes_recapture(workspace, what) -> None:
    name, old, new, retraced = EDITS[what]
    run(workspace)
    edit(workspace, name, old, new)
    second = run(workspace)
    assert second["traces"] == retraced and second["loaded"] == N_FUNCTIONS - retraced, second


def test_planted_pickle_is_never_unpickled(workspace) -> None:
    import pickle

    marker = workspace[1].parent / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    run(workspace)
    planted = pickle.dumps(Payload())
    # In place of every entry, and beside them under other names.
    for path in cache_files(workspace):
        with open(path, "wb") as f:
            f.write(planted)
        with open(path[: -len(".json")] + ".pkl", "wb") as f:
            f.write(planted)
    second = run(workspace, "plant")
    assert second["unpickled"] == [], second
    assert not marker.exists()
    assert second["traces"] == N_FUNCTIONS, second


def test_concurrent_writers_leave_whole_files(workspace) -> None:
    code, cache = workspace
    env = environment(cache)
    procs = [
        subprocess.Popen([sys.executable, "-c", PROGRAM, str(code), str(cache), "eager"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert all(json.loads(out.strip().splitlines()[-1])["results"].values())
    assert not glob.glob(os.path.join(str(cache), "*", ".tmp-*")), "temporary files left"
    after = run(workspace)
    assert after["traces"] == 0 and after["cache"].get("rejected", 0) == 0, after


def test_clear_removes_every_entry(workspace, tmp_path) -> None:
    import dynamo_rs

    run(workspace)
    assert cache_files(workspace)
    previous = dynamo_rs.config.capture_cache_dir
    dynamo_rs.config.capture_cache_dir = str(workspace[1])
    try:
        assert dynamo_rs.cache.directory() == str(workspace[1])
        dynamo_rs.cache.clear()
    finally:
        dynamo_rs.config.capture_cache_dir = previous
    assert not cache_files(workspace)
    again = run(workspace)
    assert again["traces"] == N_FUNCTIONS, again


# One decorator's `wrapper` code runs every decorated model's forward (as transformers'
# `can_return_tuple` does): its file holds an entry per model class, in modules of their own.
SHARED_WRAPPER = {
    "decorate.py": """
import functools

def decorated(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs) * 2
    return wrapper
""",
    "model_a.py": """
import torch
from decorate import decorated

class ModelA(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    @decorated
    def forward(self, x):
        return self.linear(x).relu()
""",
    "model_b.py": """
import torch
from decorate import decorated

class ModelB(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    @decorated
    def forward(self, x):
        return self.linear(x).sigmoid()
""",
}

SHARED_WRAPPER_PROGRAM = textwrap.dedent(
    """
    import importlib, json, sys, torch, dynamo_rs
    sys.path.insert(0, sys.argv[1])
    dynamo_rs.config.capture_cache = True
    dynamo_rs.config.capture_cache_dir = sys.argv[2]
    ok, converters = [], []
    for name in sys.argv[3:]:
        module = importlib.import_module("model_" + name)
        torch.manual_seed(0)
        model = getattr(module, "Model" + name.upper())()
        compiled = dynamo_rs.compile(model, backend="eager")
        x = torch.randn(3, 4)
        with torch.no_grad():
            ok.append(bool(torch.allclose(compiled(x), model(x))))
        converters.append(compiled._dynamo_rs_converter)
    print(json.dumps({"ok": ok, "traces": sum(c.traces for c in converters),
                      "loaded": sum(c.loaded for c in converters),
                      "imported_a": "model_a" in sys.modules}))
    """
)


def test_entries_of_other_callers_are_passed_over_without_their_modules(tmp_path) -> None:
    code, cache = tmp_path / "code", tmp_path / "cache"
    code.mkdir()
    for name, text in SHARED_WRAPPER.items():
        (code / name).write_text(text)

    def run_models(*names) -> dict:
        done = subprocess.run([sys.executable, "-c", SHARED_WRAPPER_PROGRAM, str(code), str(cache), *names],
                              env=environment(cache), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert all(out["ok"]), out
        return out

    # B first, A last: A's entry is the most recent, tried first.
    first = run_models("b", "a")
    assert first["traces"] >= 2, first
    second = run_models("b")
    assert second["traces"] == 0 and second["loaded"] >= 1, second
    # A's entry was passed over on the argument's class, without importing A's module.
    assert not second["imported_a"], second
