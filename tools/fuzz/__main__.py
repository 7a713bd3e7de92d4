"""`python tools/fuzz [--programs N] [--seed S] [--jobs J] [--save DIR]`: the differential
fuzzer. Generates N programs (seeds S, S+1, ...), runs each eagerly and compiled with every
mutation of its MUTATIONS list, and reports mismatches; each one is shrunk and saved as a
regression case. Exits 1 if any program disagreed."""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

from fuzz.worker import run_range, setup  # noqa: E402


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
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for done, (f, c, fb, er) in enumerate(pool.imap_unordered(run_range, tasks), 1):
            found += f
            captured += c
            fallbacks.update(fb)
            errors.update(er)
            print(f"\r{min(done * chunk, args.programs)}/{args.programs} programs, "
                  f"{len(found)} mismatches", end="", flush=True)
    print()
    elapsed = time.time() - started
    print(f"{args.programs} programs in {elapsed:.0f} s ({args.programs / elapsed:.0f}/s); "
          f"{captured} compiled at least one graph; {len(found)} mismatches")
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
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
