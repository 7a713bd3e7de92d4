"""dynamo-rs benchmarks, side by side with a reference measured in the same process.

    python benchmarks/run.py            # full run (make bench)
    python benchmarks/run.py --quick    # small samples, few repetitions (CI keeps it from rotting)

Each section measures our code and its reference alternately, several repetitions after a
warm-up, and records min/median/max of every figure plus the ratio of medians. Results go to
benchmarks/results.json (or --out); `benchmarks/report.py` turns them into the README table.
Timings are reported, never asserted.

Sections so far:
- hook: per-call cost of the frame hook on a cache hit (2-argument function, always-true
  guard), next to the plain call and to torch.compile's per-call cost (no-op backend).
- bytecode: decode + assemble round trip over the standard library's code objects, ours
  (through the Python API, and the Rust core alone) next to the PyPI `bytecode` library's
  `ConcreteBytecode.from_code(code).to_code()`.
- capture, per_call, dynamic, scaling: see each function's docstring.
- first_output (benchmarks/first_output.py): time to first output in fresh processes with
  inductor and aot_eager, empty and warm compile caches.
The model zoo is benchmarks/zoo.py (make bench runs it after these).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def stats(samples: list[float]) -> dict:
    return {"min": min(samples), "median": statistics.median(samples), "max": max(samples),
            "runs": len(samples)}


def alternate(repetitions: int, runs: dict[str, Callable[[], None]]) -> dict[str, dict]:
    """Times each callable `repetitions` times, interleaved so drift hits all alike."""
    for run in runs.values():  # warm-up
        run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repetitions):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: stats(s) for name, s in samples.items()}


def bench_bytecode(quick: bool) -> dict:
    import bytecode as pypi_bytecode

    from corpus import code_objects, stdlib_files
    from dynamo_rs import bytecode as ours

    codes = [code for _, code in code_objects(stdlib_files())]
    # The pure-Python reference needs about a minute for the whole corpus, so both sides run
    # on the same evenly spaced sample; the Rust sides also run on the whole corpus.
    step = 40 if quick else 8
    sample = codes[::step]
    repetitions = 3 if quick else 5

    def ours_api(corpus):
        return lambda: [ours.assemble(ours.decode(c), like=c) for c in corpus]

    def ours_core(corpus):
        return lambda: [ours.round_trip_tables(c) for c in corpus]

    def reference():
        for c in sample:
            pypi_bytecode.ConcreteBytecode.from_code(c).to_code()

    times = alternate(repetitions, {
        "dynamo_rs (Python API)": ours_api(sample),
        "dynamo_rs (Rust core)": ours_core(sample),
        "bytecode (PyPI)": reference,
    })
    full = alternate(repetitions, {
        "dynamo_rs (Python API)": ours_api(codes),
        "dynamo_rs (Rust core)": ours_core(codes),
    })
    ref = times["bytecode (PyPI)"]["median"]
    n_instructions = sum(len(c.co_code) // 2 for c in sample)
    figures = {}
    for name, t in times.items():
        figures[name] = {
            "seconds": t,
            "code_objects_per_second": len(sample) / t["median"],
            "code_units_per_second": n_instructions / t["median"],
            "speedup_vs_bytecode": ref / t["median"],
        }
    for name, t in full.items():
        figures[f"{name}, whole corpus"] = {
            "seconds": t, "code_objects_per_second": len(codes) / t["median"],
        }
    return {
        "what": "decode + assemble round trip of stdlib code objects",
        "sample_code_objects": len(sample),
        "corpus_code_objects": len(codes),
        "bytecode_version": pypi_bytecode.__version__,
        "figures": figures,
        "ratio": {"dynamo_rs (Python API) / bytecode": ref / times["dynamo_rs (Python API)"]["median"],
                  "dynamo_rs (Rust core) / bytecode": ref / times["dynamo_rs (Rust core)"]["median"]},
    }


def bench_hook(quick: bool) -> dict:
    """Per-call cost of the frame hook on a cache hit, next to the same call without the hook
    and next to torch.compile's per-call cost with a backend that returns the graph as is."""
    import torch
    import torch._dynamo

    from dynamo_rs import bytecode as ours
    from dynamo_rs import eval_frame

    calls = 20_000 if quick else 200_000
    repetitions = 3 if quick else 5

    def add(a, b):
        return a + b

    def loop(fn, a, b, n):
        for _ in range(n):
            fn(a, b)

    transformed = ours.assemble(ours.decode(add.__code__), like=add.__code__)

    def callback(frame, cache_size):
        if frame.f_code is add.__code__:
            return (None, transformed)
        return eval_frame.SKIP

    class Hooked:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def __call__(self):
            previous = eval_frame.set_eval_frame(callback)
            try:
                loop(add, self.a, self.b, calls)
            finally:
                eval_frame.set_eval_frame(previous)

    def no_op_backend(gm, example_inputs):
        return gm.forward

    x, y = torch.ones(4), torch.ones(4)
    torch._dynamo.reset()
    compiled = torch.compile(add, backend=no_op_backend)
    compiled(x, y)  # compile once; the loop then measures hits only

    times = alternate(repetitions, {
        "plain call (ints)": lambda: loop(add, 1, 2, calls),
        "dynamo_rs hit (ints)": Hooked(1, 2),
        "plain call (tensors)": lambda: loop(add, x, y, calls),
        "dynamo_rs hit (tensors)": Hooked(x, y),
        "torch.compile hit (tensors)": lambda: loop(compiled, x, y, calls),
    })
    per_call = {name: t["median"] / calls * 1e9 for name, t in times.items()}
    ours_int = per_call["dynamo_rs hit (ints)"] - per_call["plain call (ints)"]
    ours_tensor = per_call["dynamo_rs hit (tensors)"] - per_call["plain call (tensors)"]
    theirs = per_call["torch.compile hit (tensors)"] - per_call["plain call (tensors)"]
    figures = {
        name: {"seconds": t, "ns_per_call": per_call[name]} for name, t in times.items()
    }
    figures["dynamo_rs overhead per hit (ints)"] = {"ns": ours_int}
    figures["dynamo_rs overhead per hit (tensors)"] = {"ns": ours_tensor}
    figures["torch.compile overhead per hit (tensors)"] = {"ns": theirs}
    return {
        "what": "per-call cost of a cache hit on a 2-argument function, always-true guard",
        "calls_per_run": calls,
        "figures": figures,
        "ratio": {"torch.compile overhead / dynamo_rs overhead (tensors)": theirs / ours_tensor},
    }


def bench_capture(quick: bool) -> dict:
    """Capture time (first call with backend="eager" minus an eager call) per model, ours and
    TorchDynamo's, alternating, each after reset(); plus the floor: FakeTensorMode alone
    propagating the captured graph from fresh fake inputs.

    Most of a capture is torch's FakeTensorMode, whose dispatch cache (a class-level dict,
    shared by every fake mode in the process) makes the second propagation of the same ops
    4-7x cheaper than the first. `torch._dynamo.reset()` clears that cache and ours does not,
    so the cache state is set explicitly and identically for every side:
    - cold: the cache is cleared right before the run — what the first compile in a fresh
      process pays;
    - warm: the cache holds the entries of that side's own previous run of the same model
      (TorchDynamo's reset is kept from clearing it for these runs).
    """
    import contextlib

    import torch
    import torch._dynamo
    import torch._dynamo.testing
    from torch._subclasses.fake_tensor import FakeTensorMode

    import dynamo_rs
    from dynamo_rs.testing import CompileCounter
    from models import build

    from synthetic import detection_examples, graph_break_examples

    names = ["resnet18"] if quick else ["resnet18", "mobilenet_v3_small", "vit_tiny_patch16_224",
                                         "convnext_atto", "gpt2", "bert", "llama"]
    breaks = graph_break_examples()
    if not quick:
        breaks.update(detection_examples())
    only = os.environ.get("DYNAMO_RS_BENCH_ONLY")
    names += list(breaks)
    if only:
        # One row (or a few) while working on it: a comma-separated list of row names.
        names = [n for n in names if n in only.split(",")]
    repetitions = 3 if quick else 5
    clear_cache = FakeTensorMode.cache_clear

    @contextlib.contextmanager
    def cache(state: str):
        if state == "cold":
            clear_cache()
            yield
            return
        FakeTensorMode.cache_clear = classmethod(lambda cls: None)
        try:
            yield
        finally:
            FakeTensorMode.cache_clear = clear_cache

    out = {}
    for name in names:
        model, inputs = breaks[name] if name in breaks else build(name)
        captured = {}

        def eager():
            with torch.no_grad():
                model(*inputs)

        def front(side, reset, compile_, counter_type):
            def with_cache(state):
                def run():
                    with cache(state):
                        reset()
                        counter = counter_type()
                        with torch.no_grad():
                            compile_(model, backend=counter)(*inputs)
                    captured[side] = counter
                return run
            return with_cache

        ours = front("ours", dynamo_rs.reset, dynamo_rs.compile, CompileCounter)
        theirs = front("theirs", torch._dynamo.reset, torch.compile, torch._dynamo.testing.CompileCounter)

        def floor(state):
            def run():
                # Every graph we captured, propagated by a fresh FakeTensorMode from fake inputs.
                with cache(state):
                    for gm in captured["ours"].graphs:
                        mode = FakeTensorMode()
                        example = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
                        with mode:
                            # Symbolic sizes and int inputs (a graph made dynamic) by their hints.
                            fakes = [torch.empty_strided(_hints(e.shape), _hints(e.stride()), dtype=e.dtype)
                                     if isinstance(e, torch.Tensor) else _hints([e])[0] for e in example]
                            gm(*fakes)
            return run

        ours("cold")()  # warm-up (and the graphs for the floor)
        # Each warm run follows the same side's cold run, whose entries it finds in the cache.
        times = alternate(repetitions, {
            "eager": eager,
            "dynamo_rs cold": ours("cold"), "dynamo_rs warm": ours("warm"),
            "torch.compile cold": theirs("cold"), "torch.compile warm": theirs("warm"),
            "floor cold": floor("cold"), "floor warm": floor("warm"),
        })
        e = times["eager"]["median"]
        row = {"eager_s": e, "spread": times,
               "graphs": {"dynamo_rs": captured["ours"].frame_count, "torch.compile": captured["theirs"].frame_count},
               "ops": {"dynamo_rs": captured["ours"].op_count, "torch.compile": captured["theirs"].op_count}}
        row["graph_breaks"] = {"dynamo_rs": max(captured["ours"].frame_count - 1, 0),
                               "torch.compile": max(captured["theirs"].frame_count - 1, 0)}
        for state in ("cold", "warm"):
            c_ours = times[f"dynamo_rs {state}"]["median"] - e
            c_theirs = times[f"torch.compile {state}"]["median"] - e
            c_floor = times[f"floor {state}"]["median"]
            # Capture is a difference of two medians: on a busy machine a small capture can come
            # out at or below zero (below the noise of the eager call). No ratio is made then.
            measurable = c_ours > 0 and c_theirs > 0
            row[state] = {"capture_s": {"dynamo_rs": c_ours, "torch.compile": c_theirs, "floor": c_floor},
                          "speedup": c_theirs / c_ours if measurable else None,
                          "vs_floor": c_ours / c_floor if measurable else None,
                          # The best any front end could do with FakeTensorMode: no work but it.
                          "speedup_ceiling": c_theirs / c_floor if c_theirs > 0 else None}
        out[name] = row
        flag = "" if row["graphs"]["dynamo_rs"] == row["graphs"]["torch.compile"] else "  GRAPHS DIFFER"
        def ratio(state):
            speedup = row[state]["speedup"]
            return f"{speedup:.1f}x" if speedup is not None else "below the eager call's noise"

        print(f"  {name:22s} " + "; ".join(
            f"{state} {row[state]['capture_s']['dynamo_rs']*1e3:6.1f} ms vs "
            f"{row[state]['capture_s']['torch.compile']*1e3:7.1f} ms ({ratio(state)}, "
            f"floor {row[state]['capture_s']['floor']*1e3:5.1f} ms)" for state in ("cold", "warm"))
            + f", graphs {row['graphs']['dynamo_rs']}/{row['graphs']['torch.compile']}, "
            f"ops {row['ops']['dynamo_rs']}/{row['ops']['torch.compile']}{flag}", flush=True)
    return {"what": "capture time with backend='eager', first call minus eager call, with torch's "
                    "fake-tensor dispatch cache cold (cleared) and warm, identically for every side",
            "figures": {}, "models": out}


def _hints(values) -> list:
    """Sizes (or ints) with every SymInt replaced by the value it stood for when traced."""
    import torch

    return [v.node.hint if isinstance(v, torch.SymInt) else v for v in values]


def _no_op_backend(gm, example_inputs):
    """A backend whose compiled graph does no work: returns placeholders of the right arity
    and kind (an empty tensor for a tensor, the traced value for a size a dynamic graph
    returns: code after the graph may build a `torch.Size` of it)."""
    import torch

    def placeholder(out):
        value = out.meta.get("val", out.meta.get("example_value")) if isinstance(out, torch.fx.Node) else out
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return value.node.hint
        if isinstance(value, (int, float, bool)):
            return value
        return torch.empty(0)

    outputs = gm.graph.output_node().args[0]
    dummy = tuple(placeholder(out) for out in outputs)
    return lambda *args: dummy


def bench_per_call(quick: bool) -> dict:
    """Per-call overhead (guard check + dispatch) with a backend that does no work, with one
    cache entry and with eight (eight input shapes compiled), ours and TorchDynamo's."""
    import torch
    import torch._dynamo

    import dynamo_rs
    from models import build
    from synthetic import mlp

    calls = 200 if quick else 1000
    every = (1, 8, "alternating")
    cases = {"add(a, b)": (lambda a, b: a + b, (torch.ones(4), torch.ones(4)), every)}
    cases["Sequential, 256 layers"] = (mlp(128), (torch.randn(2, 64),), every)
    for name in ([] if quick else ["resnet18", "vit_tiny_patch16_224", "gpt2", "llama"]):
        model, inputs = build(name)
        cases[name] = (model, inputs, every)
    # How the overhead grows with the model: a `Sequential` of Linear/ReLU pairs with 10, 100
    # and 1,000 submodules, one entry (the ratio should stay flat).
    for submodules in ((10, 100) if quick else (10, 100, 1000)):
        cases[f"Sequential, {submodules} submodules"] = (mlp(submodules // 2), (torch.randn(2, 64),), (1,))
    out = {}
    for name, (model, inputs, entry_counts) in cases.items():
        row = {}
        for entries in entry_counts:
            # "alternating": two entries (two batch sizes) called in turn, so every other call
            # first meets the entry for the other shape.
            count = 2 if entries == "alternating" else entries
            variants = [inputs] + [tuple(torch.cat([t] * (k + 2)) if t.dim() else t for t in inputs) for k in range(count - 1)]
            timings = {}
            for front in ("dynamo_rs", "torch.compile"):
                dynamo_rs.reset()
                torch._dynamo.reset()
                # Static on both sides: n entries are n shapes (see the `dynamic` section).
                compiled = (dynamo_rs.compile(model, backend=_no_op_backend, dynamic=False) if front == "dynamo_rs"
                            else torch.compile(model, backend=_no_op_backend, dynamic=False))
                with torch.no_grad():
                    for v in reversed(variants):
                        compiled(*v)

                    def run(compiled=compiled, turns=variants if entries == "alternating" else [inputs]):
                        with torch.no_grad():
                            for i in range(calls):
                                compiled(*turns[i % len(turns)])

                    timings[front] = run
            times = alternate(3 if quick else 5, timings)
            ours = times["dynamo_rs"]["median"] / calls * 1e6
            theirs = times["torch.compile"]["median"] / calls * 1e6
            per_call = {front: {k: (v / calls * 1e6 if k != "runs" else v) for k, v in t.items()}
                        for front, t in times.items()}
            key = "2 entries, shapes alternating" if entries == "alternating" else f"{entries} entries"
            row[key] = {"dynamo_rs_us": ours, "torch.compile_us": theirs, "ratio": theirs / ours,
                        "spread_us": per_call}
            print(f"  {name:24s} {key:30s}: {ours:8.1f} us vs "
                  f"{theirs:8.1f} us per call ({theirs / ours:.1f}x)", flush=True)
        out[name] = row
    return {"what": "per-call overhead with a no-op backend", "figures": {}, "models": out}


def bench_dynamic(quick: bool) -> dict:
    """Dynamic shapes: capture time with `dynamic=True` (first call with backend="eager" minus
    an eager call, fake-tensor cache cleared before each run), and the per-call overhead of a
    symbolic entry (no-op backend) serving other sizes than the one it was compiled for — ours
    and TorchDynamo's, alternating."""
    import torch
    import torch._dynamo
    import torch._dynamo.testing
    from torch._subclasses.fake_tensor import FakeTensorMode

    import dynamo_rs
    from dynamo_rs.testing import CompileCounter
    from models import build

    names = ["resnet18"] if quick else ["resnet18", "gpt2", "llama"]
    repetitions = 3 if quick else 5
    calls = 200 if quick else 1000
    out = {}
    for name in names:
        model, (x,) = build(name)
        if x.dtype == torch.long:  # token ids: another sequence length
            other = torch.randint(0, 1000, (x.shape[0], x.shape[1] + 7))
        else:
            other = torch.randn(x.shape[0], x.shape[1], x.shape[2] + 32, x.shape[3] + 32)
        counted = {}

        def eager():
            with torch.no_grad():
                model(x)

        def capture(side):
            def run():
                FakeTensorMode.cache_clear()
                if side == "ours":
                    dynamo_rs.reset()
                    counter = CompileCounter()
                    compiled = dynamo_rs.compile(model, backend=counter, dynamic=True)
                else:
                    torch._dynamo.reset()
                    counter = torch._dynamo.testing.CompileCounter()
                    compiled = torch.compile(model, backend=counter, dynamic=True)
                with torch.no_grad():
                    compiled(x)
                counted[side] = counter
            return run

        times = alternate(repetitions, {"eager": eager, "dynamo_rs": capture("ours"),
                                        "torch.compile": capture("theirs")})
        e = times["eager"]["median"]
        ours, theirs = times["dynamo_rs"]["median"] - e, times["torch.compile"]["median"] - e
        per_call = {}
        for front in ("dynamo_rs", "torch.compile"):
            dynamo_rs.reset()
            torch._dynamo.reset()
            compile_ = dynamo_rs.compile if front == "dynamo_rs" else torch.compile
            compiled = compile_(model, backend=_no_op_backend, dynamic=True)
            with torch.no_grad():
                compiled(x)

            def run(compiled=compiled):
                with torch.no_grad():
                    for _ in range(calls):
                        compiled(other)

            per_call[front] = run
        call_times = alternate(repetitions, per_call)
        ours_us = call_times["dynamo_rs"]["median"] / calls * 1e6
        theirs_us = call_times["torch.compile"]["median"] / calls * 1e6
        graphs = (counted["ours"].frame_count, counted["theirs"].frame_count)
        out[name] = {"capture_s": {"dynamo_rs": ours, "torch.compile": theirs},
                     "speedup": theirs / ours if ours > 0 and theirs > 0 else None,
                     "per_call_us": {"dynamo_rs": ours_us, "torch.compile": theirs_us},
                     "per_call_ratio": theirs_us / ours_us, "graphs": graphs}
        speedup = out[name]["speedup"]
        print(f"  {name:22s} dynamic capture {ours*1e3:7.1f} ms vs {theirs*1e3:7.1f} ms "
              f"({f'{speedup:.1f}x' if speedup else 'below noise'}), graphs {graphs[0]}/{graphs[1]}; "
              f"per call on another size {ours_us:6.1f} us vs {theirs_us:6.1f} us "
              f"({theirs_us / ours_us:.1f}x)", flush=True)
    return {"what": "dynamic=True: capture time (cold fake-tensor cache) and per-call overhead of the "
                    "symbolic entry on another size", "figures": {}, "models": out}


# TorchDynamo is measured on the scaling runs up to this many captured ops.
TORCH_SCALING_MAX_OPS = 2500


def bench_scaling(quick: bool) -> dict:
    """Capture time and peak Python memory for synthetic MLPs and transformer stacks of
    10, 100 and 1,000 layers: the time per captured operation should stay flat."""
    import gc
    import tracemalloc

    import torch
    import torch._dynamo
    import torch._dynamo.testing

    import dynamo_rs
    from dynamo_rs.testing import CompileCounter
    from synthetic import mlp, transformer

    sizes = [10, 40] if quick else [10, 100, 1000]
    out = {}
    for kind, make, example in (("mlp", mlp, torch.randn(4, 64)), ("transformer", transformer, torch.randn(2, 8, 32))):
        rows = {}
        for layers in sizes:
            model = make(layers)
            times, ops = [], 0
            for _ in range(1 if quick else 3):
                dynamo_rs.reset()
                gc.collect()
                counter = CompileCounter()
                compiled = dynamo_rs.compile(model, backend=counter)
                start = time.perf_counter()
                with torch.no_grad():
                    compiled(example)
                times.append(time.perf_counter() - start)
                ops = counter.op_count
            # Peak Python memory in a separate run: tracemalloc slows allocation down.
            dynamo_rs.reset()
            gc.collect()
            tracemalloc.start()
            with torch.no_grad():
                dynamo_rs.compile(model, backend=CompileCounter())(example)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            t = statistics.median(times)
            rows[layers] = {"capture_s": t, "ops": ops, "us_per_op": t / max(ops, 1) * 1e6, "peak_mb": peak / 1e6,
                            "graphs": counter.frame_count, "spread_s": {"dynamo_rs": stats(times)}}
            theirs = ""
            if ops <= TORCH_SCALING_MAX_OPS:
                # TorchDynamo for comparison: three runs while cheap, one beyond (minutes each).
                theirs_times = []
                for _ in range(3 if ops <= 600 and not quick else 1):
                    torch._dynamo.reset()
                    gc.collect()
                    start = time.perf_counter()
                    with torch.no_grad():
                        torch.compile(model, backend=torch._dynamo.testing.CompileCounter())(example)
                    theirs_times.append(time.perf_counter() - start)
                rows[layers]["spread_s"]["torch.compile"] = stats(theirs_times)
                rows[layers]["torch.compile_s"] = statistics.median(theirs_times)
                rows[layers]["ratio"] = rows[layers]["torch.compile_s"] / t
                theirs = f", torch.compile {rows[layers]['torch.compile_s']*1e3:8.1f} ms ({rows[layers]['ratio']:.1f}x)"
            print(f"  {kind:12s} {layers:5d} layers: {ops:6d} ops, {t*1e3:8.1f} ms, "
                  f"{rows[layers]['us_per_op']:6.1f} us/op, peak {peak/1e6:7.1f} MB{theirs}", flush=True)
        first, last = rows[sizes[0]]["us_per_op"], rows[sizes[-1]]["us_per_op"]
        rows["per_op_growth"] = last / first
        print(f"  {kind:12s} time per op, {sizes[-1]} vs {sizes[0]} layers: {last / first:.2f}x", flush=True)
        out[kind] = rows
    return {"what": "capture time and peak Python memory by depth", "figures": {}, "scaling": out}


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    capture = results["sections"].get("capture", {}).get("models", {})
    if capture:
        names = list(capture)
        width = 0.4
        xs = range(len(names))
        axes[0].bar([x - width / 2 for x in xs], [capture[n]["cold"]["speedup"] or 0 for n in names], width,
                    color="#4477aa", label="cold fake-tensor cache (fresh process)")
        axes[0].bar([x + width / 2 for x in xs], [capture[n]["warm"]["speedup"] or 0 for n in names], width,
                    color="#88bbdd", label="warm fake-tensor cache")
        axes[0].set_xticks(list(xs), names)
        axes[0].axhline(10, color="#cc3311", linestyle="--", label="target 10x")
        axes[0].set_ylabel("TorchDynamo capture time / dynamo-rs capture time")
        axes[0].set_title("Capture speed-up (backend='eager')")
        axes[0].tick_params(axis="x", rotation=30)
        axes[0].legend()
    scaling = results["sections"].get("scaling", {}).get("scaling", {})
    for kind, rows in scaling.items():
        layers = [k for k in rows if isinstance(k, int) or str(k).isdigit()]
        axes[1].plot([int(k) for k in layers], [rows[k]["us_per_op"] for k in layers], marker="o", label=kind)
    if scaling:
        axes[1].set_xscale("log")
        axes[1].set_xlabel("layers")
        axes[1].set_ylabel("capture time per op (us)")
        axes[1].set_title("Scaling: capture cost per operation")
        axes[1].set_ylim(bottom=0)
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


SECTIONS: dict[str, Callable[[bool], dict]] = {
    "bytecode": bench_bytecode,
    "hook": bench_hook,
    "capture": bench_capture,
    "per_call": bench_per_call,
    "dynamic": bench_dynamic,
    "scaling": bench_scaling,
    "first_output": lambda quick: __import__("first_output").bench_first_output(quick),
}


def describe(values: dict) -> str:
    parts = []
    if "seconds" in values:
        t = values["seconds"]
        parts.append(f"median {t['median']*1e3:9.1f} ms [{t['min']*1e3:.1f}-{t['max']*1e3:.1f}]")
    if "code_objects_per_second" in values:
        parts.append(f"{values['code_objects_per_second']:10.0f} code objects/s")
    if "speedup_vs_bytecode" in values:
        parts.append(f"{values['speedup_vs_bytecode']:.1f}x bytecode")
    if "ns_per_call" in values:
        parts.append(f"{values['ns_per_call']:8.1f} ns/call")
    if "ns" in values:
        parts.append(f"{values['ns']:8.1f} ns")
    return "  ".join(parts)


def machine() -> dict:
    import torch

    def version(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return "unknown"

    return {
        "platform": platform.platform(), "processor": platform.processor(),
        "cpus": os.cpu_count(), "python": sys.version.split()[0], "torch": torch.__version__,
        "rustc": version(["rustc", "--version"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small samples, 3 repetitions")
    parser.add_argument("--only", help="comma-separated sections: " + ", ".join(SECTIONS))
    parser.add_argument("--merge", action="store_true",
                        help="with --only: replace those sections of benchmarks/results.json (each "
                        "marked with its date) and regenerate the README's table")
    parser.add_argument("--out", help="default: benchmarks/results.json, or "
                        "benchmarks/out/quick.json with --quick (not committed)")
    args = parser.parse_args()
    if args.out is None:
        # A partial run (--only) never overwrites the full results; --merge folds it in.
        args.out = os.path.join(ROOT, "benchmarks", *(("out", "quick.json") if args.quick
                                                      else ("out", "only.json") if args.only
                                                      else ("results.json",)))
    names = args.only.split(",") if args.only else list(SECTIONS)
    results = {"machine": machine(), "quick": args.quick,
               "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "sections": {}}
    for name in names:
        print(f"== {name}", flush=True)
        section = SECTIONS[name](args.quick)
        results["sections"][name] = section
        for figure, values in section["figures"].items():
            print(f"  {figure:42s} {describe(values)}")
        for ratio, value in section.get("ratio", {}).items():
            print(f"  ratio {ratio}: {value:.1f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"wrote {args.out}")
    plot(results, os.path.splitext(args.out)[0] + ".png")
    if not args.quick and not args.only:
        from report import update_readme

        update_readme(results)
    elif args.merge and args.only and not args.quick:
        from report import update_readme

        path = os.path.join(ROOT, "benchmarks", "results.json")
        with open(path) as f:
            merged = json.load(f)
        rows_only = bool(os.environ.get("DYNAMO_RS_BENCH_ONLY"))
        for name, section in results["sections"].items():
            old = merged["sections"].get(name)
            if rows_only and old is not None and "models" in section and "models" in old:
                # Some rows re-measured (DYNAMO_RS_BENCH_ONLY): fold them in, each dated;
                # the section's other rows and its own date stay as they were.
                for row, values in section["models"].items():
                    old["models"][row] = {**values, "date": results["date"]}
            else:
                merged["sections"][name] = {**section, "date": results["date"]}
        with open(path, "w") as f:
            json.dump(merged, f, indent=2, default=str)
        update_readme(merged)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
