"""Regenerates the README's performance table from benchmarks/results.json, so no figure in
the README is ever copied by hand.

    python benchmarks/report.py     # rewrite the table from the committed results
"""

from __future__ import annotations

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def table(results: dict) -> str:
    m = results["machine"]
    lines = [
        f"Measured {results['date']} on {m['cpus']} CPUs ({m['platform']}), Python {m['python']}, "
        f"torch {m['torch']}; medians of {_runs(results)} alternating runs, [min–max].",
        "",
        "| benchmark | dynamo-rs | reference | ratio |",
        "|---|---|---|---|",
    ]
    bc = results["sections"].get("bytecode")
    if bc:
        f = bc["figures"]
        ref = f["bytecode (PyPI)"]
        for name in ("dynamo_rs (Python API)", "dynamo_rs (Rust core)"):
            ours = f[name]
            lines.append(
                f"| decode + assemble, {bc['sample_code_objects']:,} stdlib code objects "
                f"({name.split('(')[1][:-1]}) | {_rate(ours)} | {_rate(ref)} "
                f"(`bytecode` {bc['bytecode_version']}) | **{ours['speedup_vs_bytecode']:.0f}×** |"
            )
    hook = results["sections"].get("hook")
    if hook:
        f = hook["figures"]
        for kind in ("ints", "tensors"):
            ours = f[f"dynamo_rs overhead per hit ({kind})"]["ns"]
            if kind == "tensors":
                theirs = f["torch.compile overhead per hit (tensors)"]["ns"]
                ref = (f"{theirs:,.0f} ns (torch.compile, no-op backend; "
                       f"{_per_call(f['torch.compile hit (tensors)'])})")
                ratio = f"**{theirs / ours:.0f}×** less"
            else:
                ref, ratio = "—", "—"
            lines.append(
                f"| frame hook: added cost of a cache hit, `add(a, b)` on {kind} "
                f"(plain call {_per_call(f[f'plain call ({kind})'])}) | {ours:.0f} ns "
                f"({_per_call(f[f'dynamo_rs hit ({kind})'])}) | {ref} | {ratio} |"
            )
    capture = results["sections"].get("capture")
    if capture:
        lines += [
            "",
            "Capture time, `backend=\"eager\"` (first call minus an eager call), next to TorchDynamo and to the",
            "floor (torch's FakeTensorMode alone propagating the captured graph, which any front end that",
            "runs every op through FakeTensorMode pays). *ceiling* is TorchDynamo / floor: the most such a",
            "front end could gain. dynamo-rs computes most fake results by its own shape rules (checked",
            "against FakeTensorMode by the tests), so it can be below the floor. FakeTensorMode's",
            "process-wide dispatch cache makes repeated ops several times cheaper, so both cache states",
            "are measured for every side: *cold* (cache cleared before the run, as in the first compile",
            "of a fresh process) and *warm* (the side's own previous entries kept)."
            + (f" Measured {capture['date']}, apart from the rest of this table (a machine's speed drifts "
               "between runs: compare ratios, not times across sections)." if capture.get("date") else ""),
            "",
            "| model | cache | dynamo-rs | TorchDynamo | speed-up | floor | ceiling | graphs (ours/theirs) | ops (ours/theirs) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, m in capture["models"].items():
            flag = " ⚠" if m["graphs"]["dynamo_rs"] != m["graphs"]["torch.compile"] else ""
            if m.get("date"):
                name = f"{name} ({m['date'][:10]})"
            for state in ("cold", "warm"):
                r = m[state]
                c = r["capture_s"]
                measurable = r["speedup"] is not None
                below = "" if measurable and r["speedup"] >= 10 else " ⚠"
                speedup = f"**{r['speedup']:.1f}×**" if measurable else "below noise"
                ceiling = f"{r['speedup_ceiling']:.1f}×" if r["speedup_ceiling"] is not None else "—"
                if m["graphs"]["dynamo_rs"] == 0:
                    # Nothing captured: the frame ran eagerly, so there is no capture to compare.
                    lines.append(
                        f"| {name} | {state} | no graph (runs eagerly) | {c['torch.compile']*1e3:.0f} ms | — | — | — | "
                        f"{m['graphs']['dynamo_rs']}/{m['graphs']['torch.compile']}{flag} | "
                        f"{m['ops']['dynamo_rs']}/{m['ops']['torch.compile']} |")
                    continue

                def spread(side, state=state):
                    # Capture = run minus the eager median, so the run's spread shifts the same way.
                    t, e = m["spread"][f"{side} {state}"], m["eager_s"]
                    return f"{(t['median'] - e)*1e3:.0f} ms [{(t['min'] - e)*1e3:.0f}–{(t['max'] - e)*1e3:.0f}]"

                lines.append(
                    f"| {name} | {state} | {spread('dynamo_rs')} | {spread('torch.compile')} | "
                    f"{speedup}{below} | {c['floor']*1e3:.0f} ms | {ceiling} | "
                    f"{m['graphs']['dynamo_rs']}/{m['graphs']['torch.compile']}{flag} | "
                    f"{m['ops']['dynamo_rs']}/{m['ops']['torch.compile']} |"
                )
        lines.append("")
        lines.append("⚠ on a speed-up = below the 10× target; on graphs = dynamo-rs captures a different number "
                     "of graphs than TorchDynamo (`break:` rows are functions and models that need graph "
                     "breaks). Capture times are medians [min–max]; a row's date is given when it was "
                     "measured apart from the rest.")
    per_call = results["sections"].get("per_call")
    if per_call:
        when = f" — measured {per_call['date']}, with the capture rows" if per_call.get("date") else ""
        lines += ["", f"Per-call overhead with a backend that does no work (guards + dispatch){when}:", "",
                  "| model | cache entries | dynamo-rs | TorchDynamo | ratio |", "|---|---|---|---|---|"]
        for name, rows in per_call["models"].items():
            for entries, r in rows.items():
                flag = "" if r["ratio"] >= 1 else " ⚠"

                def us(front, r=r, key=None):
                    t = r.get("spread_us", {}).get(front)
                    median = r[key]
                    return f"{median:.1f} µs" + (f" [{t['min']:.1f}–{t['max']:.1f}]" if t else "")

                lines.append(f"| {name} | {entries.replace(' entries', '')} | {us('dynamo_rs', key='dynamo_rs_us')} | "
                             f"{us('torch.compile', key='torch.compile_us')} | {r['ratio']:.1f}×{flag} |")
        lines.append("")
        lines.append("⚠ = dynamo-rs is slower than TorchDynamo here.")
    dynamic = results["sections"].get("dynamic")
    if dynamic:
        when = f" — measured {dynamic['date']}" if dynamic.get("date") else ""
        lines += ["", f"Dynamic shapes (`dynamic=True`): capture with a cold fake-tensor cache, and per call on "
                  f"another size than the one compiled (no-op backend){when}:", "",
                  "| model | dynamo-rs capture | TorchDynamo capture | speed-up | graphs | dynamo-rs per call | "
                  "TorchDynamo per call | ratio |", "|---|---|---|---|---|---|---|---|"]
        for name, r in dynamic["models"].items():
            speedup = r["speedup"]
            flag = " ⚠" if not speedup or speedup < 10 else ""
            graphs = "/".join(str(g) for g in r["graphs"])
            lines.append(
                f"| {name} | {r['capture_s']['dynamo_rs']*1e3:.0f} ms | {r['capture_s']['torch.compile']*1e3:.0f} ms | "
                f"{f'**{speedup:.1f}×**' if speedup else 'below noise'}{flag} | {graphs} | "
                f"{r['per_call_us']['dynamo_rs']:.1f} µs | {r['per_call_us']['torch.compile']:.1f} µs | "
                f"{r['per_call_ratio']:.1f}× |")
        lines.append("")
        lines.append("⚠ = below the 10× target (capture time is the first call minus an eager call).")
    scaling = results["sections"].get("scaling")
    if scaling:
        lines += ["", "Scaling (first call with `backend=CompileCounter`, medians [min–max] of 3 runs; "
                  "TorchDynamo up to a few thousand ops, 3 runs up to 600 ops, 1 beyond):", "",
                  "| model | layers | ops | dynamo-rs capture | per op | peak Python memory | torch.compile | ratio |",
                  "|---|---|---|---|---|---|---|---|"]
        for kind, rows in scaling["scaling"].items():
            for layers, r in rows.items():
                if layers == "per_op_growth":
                    continue
                spread = r.get("spread_s", {})

                def ms(front, median, spread=spread):
                    t = spread.get(front)
                    if not t or t["runs"] < 2:
                        return f"{median*1e3:.0f} ms" + (" (1 run)" if t else "")
                    return f"{median*1e3:.0f} ms [{t['min']*1e3:.0f}–{t['max']*1e3:.0f}]"

                theirs = (f"{ms('torch.compile', r['torch.compile_s'])} | {r['ratio']:.1f}×" if "ratio" in r
                          else "— | —")
                lines.append(f"| {kind} | {layers} | {r['ops']} | {ms('dynamo_rs', r['capture_s'])} | "
                             f"{r['us_per_op']:.0f} µs | {r['peak_mb']:.1f} MB | {theirs} |")
            lines.append(f"| {kind} | per-op cost, deepest vs shallowest | | | **{rows['per_op_growth']:.2f}×**{' ⚠ over 1.5×' if rows['per_op_growth'] > 1.5 else ''} | | | |")
    return "\n".join(lines)


def _per_call(figure: dict) -> str:
    """A per-call time as median [min–max] ns per call."""
    t = figure["seconds"]
    calls = t["median"] / figure["ns_per_call"] * 1e9
    return (f"{figure['ns_per_call']:,.0f} ns/call "
            f"[{t['min'] / calls * 1e9:,.0f}–{t['max'] / calls * 1e9:,.0f}]")


def _rate(figure: dict) -> str:
    t = figure["seconds"]
    return (f"{figure['code_objects_per_second']:,.0f} code objects/s "
            f"({t['median']*1e3:.0f} ms [{t['min']*1e3:.0f}–{t['max']*1e3:.0f}])")


def _runs(results: dict) -> int:
    for section in results["sections"].values():
        for figure in section["figures"].values():
            return figure["seconds"]["runs"]
    return 0


def update_readme(results: dict) -> None:
    with open(README) as f:
        text = f.read()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {START} ... {END} block")
    text = pattern.sub(lambda _: f"{START}\n{table(results)}\n{END}", text)
    with open(README, "w") as f:
        f.write(text)
    print("updated the README's performance table")


if __name__ == "__main__":
    with open(os.path.join(ROOT, "benchmarks", "results.json")) as f:
        update_readme(json.load(f))
