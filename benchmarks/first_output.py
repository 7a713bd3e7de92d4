"""Time to first output: from compiling a model in a new process to its first output — what a
user of `backend="inductor"` waits for. Each front end runs in fresh processes with cache
directories of its own (TORCHINDUCTOR_CACHE_DIR: Inductor's FX-graph cache and AOTAutograd's
cache), first empty, then warm (the best of two later processes). The clock starts before
`import dynamo_rs` / `torch.compile(...)` (TorchDynamo imports itself lazily on the first call;
both pay their own imports) and stops when the first call returns; outputs are checked against
eager afterwards. "dynamo_rs+capture cache" is dynamo_rs with its persistent capture cache on
(`DYNAMO_RS_CAPTURE_CACHE=1`, a directory of its own): warm processes bind the stored capture
instead of tracing. Both dynamo_rs columns remember Inductor's installation keys in their own
directory (see `dynamo_rs._inductor_keys`): the empty run computes them as torch.compile does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PROGRAM = textwrap.dedent(
    """
    import json, sys, time, warnings
    warnings.filterwarnings("ignore")
    sys.path.insert(0, {tests!r})
    import torch
    from models import build, tensors_of
    model, inputs = build({name!r})
    start = time.perf_counter()
    if {front!r}.startswith("dynamo_rs"):
        import dynamo_rs
        compiled = dynamo_rs.compile(model, backend={backend!r})
    else:
        compiled = torch.compile(model, backend={backend!r})
    with torch.no_grad():
        out = compiled(*inputs)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        expected = model(*inputs)
    correct = all(torch.allclose(a, e, rtol=1e-3, atol=1e-3)
                  for a, e in zip(tensors_of(out), tensors_of(expected)))
    print("FIRST_OUTPUT " + json.dumps({{"seconds": seconds, "correct": correct}}))
    """
)

FRONTS = ("dynamo_rs", "dynamo_rs+capture cache", "torch.compile")


def first_output(name: str, front: str, backend: str, cache_dir: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    # As a user's machine runs it: the imported modules' bytecode cached on disk.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # dynamo_rs's own cache directory (remembered Inductor keys; the capture cache if on).
    env.update(DYNAMO_RS_CACHE_DIR=os.path.join(cache_dir, "capture"))
    env.pop("DYNAMO_RS_CAPTURE_CACHE", None)
    if front == "dynamo_rs+capture cache":
        env.update(DYNAMO_RS_CAPTURE_CACHE="1")
    code = PROGRAM.format(tests=os.path.join(ROOT, "tests"), name=name, front=front, backend=backend)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)
    for line in done.stdout.splitlines():
        if line.startswith("FIRST_OUTPUT "):
            return json.loads(line[len("FIRST_OUTPUT "):])
    return {"error": f"exit {done.returncode}: {done.stderr[-300:]}"}


def bench_first_output(quick: bool) -> dict:
    names = ["resnet18"] if quick else ["resnet18", "mobilenet_v3_small", "vit_tiny_patch16_224",
                                         "convnext_atto", "gpt2", "bert", "llama"]
    # Quick (CI): `aot_eager`, whose empty-cache run is seconds, not Inductor's C++ builds;
    # tests/test_backend_caches.py checks Inductor's caches across processes.
    backends = ["aot_eager"] if quick else ["inductor", "aot_eager"]
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="dynamo_rs_first_output_") as root:
        for name in names:
            for backend in backends:
                row = {}
                for front in FRONTS:
                    # No spaces or '+' in the path: Inductor hands it to the C++ compiler.
                    cache = os.path.join(root, f"{name}-{backend}-{front}".replace(" ", "_").replace("+", "_"))
                    empty = first_output(name, front, backend, cache)
                    warm = [first_output(name, front, backend, cache) for _ in range(2)]
                    times = [w["seconds"] for w in warm if "seconds" in w]
                    row[front] = {"empty_s": empty.get("seconds"), "warm_s": min(times) if times else None,
                                  "correct": all(r.get("correct") for r in [empty, *warm]),
                                  "errors": [r["error"] for r in [empty, *warm] if "error" in r]}
                theirs = row["torch.compile"]
                for front in FRONTS[:2]:
                    ours = row[front]
                    for state in ("empty", "warm"):
                        a, b = ours[f"{state}_s"], theirs[f"{state}_s"]
                        ours[f"{state}_ratio"] = a / b if a and b else None

                    def fmt(state, ours=ours):
                        a, b, r = ours[f"{state}_s"], theirs[f"{state}_s"], ours[f"{state}_ratio"]
                        if r is None:
                            return f"{state} failed ({(ours['errors'] + theirs['errors'])[:1]})"
                        return f"{state} {a:6.2f} s vs {b:6.2f} s ({r:.2f} of torch.compile's)"

                    flag = "" if ours["correct"] and theirs["correct"] else "  WRONG OUTPUT"
                    print(f"  {name:22s} {backend:9s} {front:24s} {fmt('empty')}; {fmt('warm')}{flag}",
                          flush=True)
                out[f"{name} {backend}"] = row
    return {"what": "time to first output in a fresh process (compile call to first output), each "
                    "front end with its own cache directory, empty and warm",
            "figures": {}, "models": out}
