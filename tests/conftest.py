import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# The language harness's asserts report both sides' counts when they differ.
pytest.register_assert_rewrite("language_harness")

import dynamo_rs  # noqa: E402
from dynamo_rs import _rule_check  # noqa: E402

# Every fake result our shape rules compute during the tests is checked against
# FakeTensorMode's; any difference fails the test that met it.
dynamo_rs.config.verify_meta_rules = True
# Every new cache entry must pass its own guard on the frame it was compiled for (a guard
# that fails right away never holds, and every call would compile again).
dynamo_rs.config.guard_self_check = True
# Every guard check is also made by the slow reference evaluation; any disagreement raises.
dynamo_rs.config.guard_check_mode = "debug"


@pytest.fixture(autouse=True)
def _meta_rules_agree_with_fake_tensor_mode():
    _rule_check.mismatches.clear()
    yield
    assert not _rule_check.mismatches, "\n".join(_rule_check.mismatches)


@pytest.fixture
def reset_compilers():
    """Both front ends forgotten before and after the test (for tests that compare dynamo_rs
    with TorchDynamo on the same functions)."""
    import torch._dynamo

    import dynamo_rs

    dynamo_rs.reset()
    torch._dynamo.reset()
    yield
    dynamo_rs.reset()
    torch._dynamo.reset()
