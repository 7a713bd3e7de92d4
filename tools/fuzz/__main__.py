"""`python tools/fuzz [--programs N] [--seed S] [--jobs J] [--save DIR]`: the differential
fuzzer. Generates N programs (seeds S, S+1, ...), runs each eagerly and compiled with every
mutation of its MUTATIONS list, and reports mismatches; each one is shrunk and saved as a
regression case. A program that crashes the interpreter kills its worker: the seeds the
workers were running are named, each run again alone to see whether it crashes by itself, and
the run goes on past them. Exits 1 if any program disagreed or a worker died."""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import concurrent.futures.process
import multiprocessing
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

from fuzz.worker import run_range, setup  # noqa: E402


def _crashed_seeds(markers: str) -> list[int]:
    """The seeds that workers which are no longer alive were running."""
    seeds = []
    for name in os.listdir(markers):
        path = os.path.join(markers, name)
        try:
            os.kill(int(name), 0)
            continue  # still alive
        except ProcessLookupError:
            pass
        with open(path) as f:
            text = f.read().strip()
        os.unlink(path)
        if text:
            seeds.append(int(text))
    return seeds


def _crashes_alone(seed: int) -> bool:
    """Whether running program `seed` alone in a fresh process kills the process."""
    import subprocess

    code = ("import sys; sys.path.insert(0, %r); from fuzz.worker import run_range; "
            "run_range((%d, 1, False))" % (os.path.dirname(HERE), seed))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    return result.returncode < 0


def _without(task, seeds):
    """`task` (start, count, verify) split into the ranges around `seeds`."""
    start, count, verify = task
    parts, at = [], start
    for seed in sorted(s for s in seeds if start <= s < start + count):
        if seed > at:
            parts.append((at, seed - at, verify))
        at = seed + 1
    if at < start + count:
        parts.append((at, start + count - at, verify))
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--programs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--save", default=os.path.join(ROOT, "tests", "fuzz_cases"),
                        help="where shrunk mismatches are written ('' to not save)")
    parser.add_argument("--verify-meta-rules", action="store_true",
                        help="also check every shape rule against FakeTensorMode (slower)")
    args = parser.parse_args()

    started = time.time()
    chunk = max(1, min(500, args.programs // (args.jobs * 4) or 1))
    tasks = [(s, min(chunk, args.seed + args.programs - s), args.verify_meta_rules)
             for s in range(args.seed, args.seed + args.programs, chunk)]
    found, captured = [], 0
    fallbacks, errors = collections.Counter(), collections.Counter()
    crashed: list[int] = []
    pool_crashes: list[list[int]] = []  # the suspects of each time a worker died
    # A worker that dies (a crash in the interpreter: the worst outcome a program can have)
    # breaks the pool instead of hanging it; each worker writes the seed it runs to a file
    # named by its pid, so the seeds it died on can be named.
    markers = tempfile.mkdtemp(prefix="dynamo-rs-fuzz-")
    os.environ["DYNAMO_RS_FUZZ_MARKERS"] = markers
    pending = list(tasks)
    done = 0
    while pending:
        with concurrent.futures.ProcessPoolExecutor(
                args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_range, task): task for task in pending}
            pending = []
            for future in concurrent.futures.as_completed(futures):
                try:
                    f, c, fb, er = future.result()
                except concurrent.futures.process.BrokenProcessPool:
                    pending.append(futures[future])
                    continue
                done += futures[future][1]
                found += f
                captured += c
                fallbacks.update(fb)
                errors.update(er)
                print(f"\r{done}/{args.programs} programs, "
                      f"{len(found)} mismatches, {len(crashed)} crashes", end="", flush=True)
        if pending:
            # Every worker of a broken pool is gone: the seeds they were running are suspects.
            # Each is run again alone in a fresh process; those that crash there are reported.
            suspects = _crashed_seeds(markers)
            if not suspects:
                print("\na worker died without naming a seed; giving up on the rest")
                break
            pool_crashes.append(sorted(suspects))
            crashed += [seed for seed in suspects if _crashes_alone(seed)]
            pending = [part for task in pending for part in _without(task, suspects)]
    print()
    elapsed = time.time() - started
    print(f"{args.programs} programs in {elapsed:.0f} s ({args.programs / elapsed:.0f}/s); "
          f"{captured} compiled at least one graph; {len(found)} mismatches; "
          f"{len(crashed)} crashed the process")
    for seeds in pool_crashes:
        print(f"a worker process died while the workers ran seeds {seeds}")
    for seed in crashed:
        print(f"seed {seed}: crashes the process when run alone (reproduce with "
              f"`python tools/fuzz --programs 1 --seed {seed} --jobs 1 --save ''`)")
    print("most common reasons a frame ran eagerly:")
    for reason, n in fallbacks.most_common(12):
        print(f"  {n:6d}  {reason}")
    if errors:
        print("internal errors (frame ran eagerly):")
        for error, n in errors.most_common(12):
            print(f"  {n:6d}  {error}")
    if found:
        setup()
        from fuzz.grammar import generate
        from fuzz.harness import run_source
        from fuzz.shrink import save, shrink

        for seed, mismatch in sorted(found)[:20]:
            print(f"seed {seed}: {mismatch}")
            if args.save:
                program = shrink(generate(seed),
                                 lambda p: run_source(p.source()).mismatch is not None)
                final = run_source(program.source()).mismatch or mismatch
                print("  saved", save(program, final, args.save))
    return 1 if found or pool_crashes else 0


if __name__ == "__main__":
    sys.exit(main())
