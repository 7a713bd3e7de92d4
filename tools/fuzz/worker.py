"""What one fuzzing process runs: a range of seeds (spawned workers import this module)."""

from __future__ import annotations

import collections
import logging
import os
import signal
import sys
import warnings


def setup() -> None:
    logging.getLogger("dynamo_rs").setLevel(logging.ERROR)
    # FakeTensorMode logs the errors it raises for programs that fail on both sides.
    logging.getLogger("torch").setLevel(logging.CRITICAL)
    # Generated expressions such as `2[0]` are legal (they raise, on both sides).
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    import dynamo_rs

    dynamo_rs.config.guard_self_check = True
    dynamo_rs.config.guard_check_mode = "debug"


def _timeout(signum, frame):
    raise TimeoutError


def _marker():
    """A file this process writes the seed it is running to, if the parent asked for one
    (`DYNAMO_RS_FUZZ_MARKERS`: a directory; the file is named by the process id)."""
    global _MARKER
    directory = os.environ.get("DYNAMO_RS_FUZZ_MARKERS")
    if not directory:
        return None
    if _MARKER is None:  # opened once per process, kept for every range it runs
        _MARKER = os.open(os.path.join(directory, str(os.getpid())), os.O_WRONLY | os.O_CREAT, 0o644)
    return _MARKER


_MARKER = None


def run_range(task):
    start, count, verify = task
    setup()
    from dynamo_rs import _rule_check
    import dynamo_rs

    from fuzz.grammar import generate
    from fuzz.harness import run_source

    dynamo_rs.config.verify_meta_rules = verify
    signal.signal(signal.SIGALRM, _timeout)
    found, captured, fallbacks, errors = [], 0, collections.Counter(), collections.Counter()
    marker = _marker()
    for seed in range(start, start + count):
        if marker is not None:
            # Which seed this process is running, for when it crashes (see __main__).
            os.pwrite(marker, f"{seed:<12d}".encode(), 0)
        if os.environ.get("DYNAMO_RS_FUZZ_SELF_TEST_CRASH") == str(seed):
            os.kill(os.getpid(), signal.SIGSEGV)  # checks that a crash is reported
        program = generate(seed)
        _rule_check.mismatches.clear()
        signal.alarm(20)
        try:
            outcome = run_source(program.source())
        except TimeoutError:
            errors[f"seed {seed}: took over 20 s"] += 1
            continue
        except Exception as err:  # noqa: BLE001 - reported, the run goes on
            errors[f"seed {seed}: the harness failed: {err!r:.120}"] += 1
            continue
        finally:
            signal.alarm(0)
        if _rule_check.mismatches and outcome.mismatch is None:
            outcome.mismatch = "shape rule: " + _rule_check.mismatches[0]
        captured += outcome.graphs > 0
        fallbacks.update(reason.split(" at ", 1)[0] for reason in outcome.fallbacks)
        errors.update(error.splitlines()[0][:160] for error in outcome.internal_errors)
        if outcome.mismatch is not None:
            found.append((seed, outcome.mismatch))
            print(f"\nseed {seed}: {outcome.mismatch}", file=sys.stderr, flush=True)
    return found, captured, fallbacks, errors
