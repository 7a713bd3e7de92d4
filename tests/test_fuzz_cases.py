"""Programs the differential fuzzer (`make fuzz`, tools/fuzz) found eager and compiled to
disagree on, shrunk and kept: each is run eagerly and compiled again, through every mutation
of its MUTATIONS list, and must agree now. A few seeds of the generator also run here, so
the harness itself is tested on every change."""

from __future__ import annotations

import glob
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from fuzz.grammar import generate  # noqa: E402
from fuzz.harness import run_source  # noqa: E402

CASES = sorted(glob.glob(os.path.join(ROOT, "tests", "fuzz_cases", "case_*.py")))


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(p)[:-3] for p in CASES])
def test_saved_case_agrees_with_eager(path):
    with open(path) as f:
        source = f.read()
    outcome = run_source(source)
    assert outcome.mismatch is None, outcome.mismatch
    assert not outcome.internal_errors, outcome.internal_errors


@pytest.mark.parametrize("seed", range(0, 400, 40))
def test_generated_program_agrees_with_eager(seed):
    outcome = run_source(generate(seed).source())
    assert outcome.mismatch is None, outcome.mismatch


def test_harness_sees_a_wrong_result():
    """The comparison is not vacuous: a program whose compiled side is made to differ (its
    world's argument changed behind its back) is reported."""
    source = generate(3).source()
    outcome = run_source(source, mutations=[])
    assert outcome.mismatch is None
    from fuzz import harness

    original = harness.World.__init__

    def skewed(self, src):
        original(self, src)
        if skewed.calls == 1:
            self.args[0] = self.args[0] + 1
        skewed.calls += 1

    skewed.calls = 0
    harness.World.__init__ = skewed
    try:
        assert run_source(source, mutations=[]).mismatch is not None
    finally:
        harness.World.__init__ = original
