"""Runs modules of CPython's own test suite, optionally with the frame hook installed and an
identity callback (every intercepted frame runs `assemble(decode(code))` instead of its own
code). Used by test_eval_frame_workloads.py in a subprocess:

    python tests/cpython_suite.py hooked test_json test_list ...
    python tests/cpython_suite.py plain  test_json test_list ...

Prints one JSON line: {"exit": code, "frames": ..., "hits": ..., "callbacks": ...}.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def main() -> int:
    mode, tests = sys.argv[1], sys.argv[2:]
    from dynamo_rs import bytecode, eval_frame

    # A process started in the background by a shell without job control inherits SIGINT
    # ignored, and Python then installs no handler for it; test_generators raises SIGINT
    # and expects KeyboardInterrupt. Python's own default, whoever started us.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def identity(frame, cache_size):
        code = frame.f_code
        return (None, bytecode.assemble(bytecode.decode(code), like=code))

    sys.argv = ["regrtest", "-q", *tests]
    from test.libregrtest.main import main as regrtest_main

    if mode == "hooked":
        eval_frame.set_eval_frame(identity)
    try:
        regrtest_main()
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    finally:
        eval_frame.set_eval_frame(None)
    stats = eval_frame.stats()
    print(json.dumps({"exit": code, **{k: stats[k] for k in ("frames", "hits", "callbacks")}}))
    sys.stdout.flush()
    os._exit(0)  # the suite's own exit code is in the JSON; skip slow interpreter teardown


if __name__ == "__main__":
    raise SystemExit(main())
