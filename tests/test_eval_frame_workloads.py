"""The identity transform on real workloads: with a callback that substitutes
`assemble(decode(code))` for every frame, real programs give the same results as without
the hook. Any difference is a bug in the hook, the runner or the bytecode layer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import dynamo_rs
from dynamo_rs import bytecode, eval_frame

HERE = os.path.dirname(os.path.abspath(__file__))

# test_descr's test_slots counts every GC-tracked object around `g == g`: the first call of
# `__eq__` compiles it, and the cache must add no tracked object (the runner is untracked, the
# new code's names tuple too).
CPYTHON_TESTS = [
    "test_descr",
    "test_json", "test_list", "test_dict", "test_tuple", "test_set", "test_string",
    "test_textwrap", "test_difflib", "test_fractions", "test_heapq", "test_bisect",
    "test_collections", "test_itertools", "test_functools", "test_enum", "test_dataclasses",
    "test_re", "test_math", "test_operator", "test_unicode", "test_bytes", "test_int",
    "test_float", "test_deque", "test_shlex", "test_argparse", "test_csv", "test_base64",
    "test_calendar", "test_copy", "test_pprint", "test_contextlib", "test_scope",
    "test_keywordonlyarg", "test_positional_only_arg", "test_unpack", "test_grammar",
    "test_class", "test_with", "test_raise", "test_augassign", "test_exceptions",
    "test_generators", "test_statistics",
]


def run_suite(mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "cpython_suite.py"), mode, *CPYTHON_TESTS],
        capture_output=True, text=True, timeout=900,
    )
    lines = proc.stdout.strip().splitlines()
    # No JSON line: the runner died before printing it; say how (once seen, not reproduced).
    assert lines, f"cpython_suite.py {mode} exited {proc.returncode} without output:\n{proc.stderr[-3000:]}"
    last = lines[-1]
    result = json.loads(last)
    result["output"] = proc.stdout[-3000:] + proc.stderr[-3000:]
    return result


def test_cpython_test_suite_passes_under_the_identity_hook() -> None:
    plain = run_suite("plain")
    hooked = run_suite("hooked")
    print(f"\nCPython suite, {len(CPYTHON_TESTS)} modules: intercepted {hooked['frames']:,} frames, "
          f"{hooked['hits']:,} cache hits, {hooked['callbacks']:,} compiled code objects")
    assert plain["exit"] == 0, plain["output"]
    assert hooked["exit"] == 0, hooked["output"]
    assert hooked["callbacks"] > 1000 and hooked["hits"] > 100_000


class Identity:
    def __init__(self):
        self.codes = set()

    def __call__(self, frame, cache_size):
        self.codes.add(frame.f_code)
        return (None, bytecode.assemble(bytecode.decode(frame.f_code), like=frame.f_code))


def run_model(model, inputs, skip_torch: bool):
    dynamo_rs.config.skip_torch = skip_torch
    dynamo_rs.reset()  # applies the setting to code objects seen before
    eval_frame.reset_stats()
    with torch.no_grad():
        expected = model(**inputs)
        callback = Identity()
        eval_frame.set_eval_frame(callback)
        try:
            first = model(**inputs)
            second = model(**inputs)  # all cache hits
        finally:
            eval_frame.set_eval_frame(None)
            dynamo_rs.config.skip_torch = True
    return expected, first, second, callback.codes, eval_frame.stats()


def outputs(result):
    if isinstance(result, torch.Tensor):
        return [result]
    return [v for v in result.values() if isinstance(v, torch.Tensor)] if hasattr(result, "values") \
        else [v for v in result if isinstance(v, torch.Tensor)]


@pytest.fixture(scope="module")
def resnet():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    return model, {"x": torch.randn(2, 3, 64, 64)}


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(config).eval()
    return model, {"input_ids": torch.randint(0, 1000, (2, 16))}


@pytest.mark.parametrize("skip_torch", [True, False], ids=["torch-skipped", "torch-intercepted"])
@pytest.mark.parametrize("model_name", ["resnet", "gpt2"])
def test_real_models_under_the_identity_hook(model_name, skip_torch, request) -> None:
    model, inputs = request.getfixturevalue(model_name)
    expected, first, second, codes, stats = run_model(model, inputs, skip_torch)
    for e, a, b in zip(outputs(expected), outputs(first), outputs(second)):
        assert torch.equal(e, a) and torch.equal(e, b)
    torch_codes = [c for c in codes if os.sep + "torch" + os.sep in c.co_filename]
    print(f"\n{model_name} ({'torch skipped' if skip_torch else 'torch intercepted'}): "
          f"{stats['frames']:,} frames intercepted, {stats['hits']:,} hits, {len(codes)} code objects")
    assert stats["hits"] > 0
    if skip_torch:
        assert not torch_codes
    else:
        assert len(torch_codes) > 10
