"""Several threads calling and compiling one compiled model at once: results equal eager,
and nothing is logged or warned (no compile fails because another thread is compiling)."""

from __future__ import annotations

import logging
import threading
import warnings

import torch

import dynamo_rs


def test_four_threads_call_and_compile_one_model(caplog) -> None:
    dynamo_rs.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    cmodel = dynamo_rs.compile(model, backend="eager")
    problems: list = []

    def work(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        for i in range(25):
            # Six batch sizes between the threads: compiles happen while others call.
            x = torch.randn(1 + (i + seed) % 6, 8, generator=generator)
            try:
                with torch.no_grad():
                    out, expected = cmodel(x), model(x)
                if not torch.allclose(out, expected):
                    problems.append(f"thread {seed} call {i}: differs from eager")
            except Exception as err:  # noqa: BLE001 - any failure is the finding
                problems.append(f"thread {seed} call {i}: {err!r}")

    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="dynamo_rs"):
        warnings.simplefilter("always")
        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert problems == []
    assert [str(w.message) for w in caught if "dynamo_rs" in str(w.message)] == []
    assert caplog.records == []
    dynamo_rs.reset()
