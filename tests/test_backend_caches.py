"""torch's compile caches hit under dynamo_rs as under torch.compile: the backend is called
inside a TracingContext whose fake mode has a ShapeEnv, so AOTAutograd's cache and Inductor's
FX-graph cache key the graph and find it again in a second process (issue 12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent(
    """
    import json, sys, torch, dynamo_rs
    from torch._dynamo.utils import counters

    def f(x, y):
        return (x.sin() + y.cos()).relu() * 2

    c = dynamo_rs.compile(f, backend="inductor", dynamic=DYNAMIC)
    out = None
    for n in (8, 12):
        x, y = torch.randn(n, 8), torch.randn(n, 8)
        torch.testing.assert_close(c(x, y), f(x, y))
    out = {k: dict(v) for k, v in counters.items()}
    out["inductor_keys"] = dict(dynamo_rs._inductor_keys.counters)
    print(json.dumps(out))
    """
)


def run(cache_dir: str, dynamic) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir,
               DYNAMO_RS_CACHE_DIR=os.path.join(cache_dir, "dynamo_rs"))
    code = PROGRAM.replace("DYNAMIC", repr(dynamic))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_second_process_hits_aot_and_fx_graph_caches(tmp_path, dynamic) -> None:
    cache = str(tmp_path / "cache")
    first = run(cache, dynamic)
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1, first
    second = run(cache, dynamic)
    assert second["aot_autograd"].get("autograd_cache_hit", 0) == first["aot_autograd"]["autograd_cache_miss"], second
    assert second["inductor"].get("fxgraph_cache_hit", 0) == first["inductor"]["fxgraph_cache_miss"], second
    assert "fxgraph_cache_bypass" not in second["inductor"], second
    # Inductor's installation keys were computed once, then remembered (and with
    # them, its caches still find what the first process stored).
    assert first["inductor_keys"] == {"miss": 1, "saved": 1}, first
    assert second["inductor_keys"] == {"hit": 1}, second
