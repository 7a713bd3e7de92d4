"""Python properties of objects whose class has a `__getattribute__` that only renames
(transformers' configurations) are inlined like those of plain objects: the getter runs once
per call, in the trace's order, never on the real object while tracing nor by the guard on
every call; what the lookup relied on (the name not renamed by `attribute_map`, no
`attribute_map` or `_heterogeneity_spec` of the instance's own, each `__getattribute__` along
the MRO) is guarded."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import dynamo_rs  # noqa: E402
from dynamo_rs.testing import CompileCounter  # noqa: E402


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield


class CountingConfig(transformers.GPT2Config):
    reads = 0

    @property
    def scale(self):
        CountingConfig.reads += 1
        return self.n_embd / 8


def test_property_of_a_config_runs_once_per_call_as_in_eager():
    config = CountingConfig(n_embd=16)

    def f(x, config):
        return x * config.scale + config.is_heterogeneous

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    x = torch.ones(3)
    CountingConfig.reads = 0
    expected = [f(x, config) for _ in range(3)]
    eager_reads = CountingConfig.reads
    CountingConfig.reads = 0
    got = [compiled(x, config) for _ in range(3)]
    assert CountingConfig.reads == eager_reads == 3
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert counter.frame_count == 1


def test_a_value_the_property_reads_changes_and_the_result_follows():
    config = CountingConfig(n_embd=16)
    compiled = dynamo_rs.compile(lambda x, c: x * c.scale, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x, config), x * 2.0)
    config.n_embd = 40
    torch.testing.assert_close(compiled(x, config), x * 5.0)


def _recompiles_after(change):
    """Compiles `x * config.scale`, calls it, applies `change(config)`, and checks the next
    call recompiles and equals eager."""
    config = CountingConfig(n_embd=16, n_head=4)

    def f(x, config):
        return x * config.scale

    counter = CompileCounter()
    compiled = dynamo_rs.compile(f, backend=counter)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x, config), f(x, config))
    change(config)
    torch.testing.assert_close(compiled(x, config), f(x, config))
    assert counter.frame_count == 2


def test_renaming_the_property_name_recompiles(monkeypatch):
    def rename(config):
        # Now `config.scale` reads `n_head` through the renaming `__getattribute__`.
        monkeypatch.setitem(CountingConfig.attribute_map, "scale", "n_head")
        assert config.scale == 4

    _recompiles_after(rename)


def test_an_instance_attribute_map_recompiles():
    _recompiles_after(lambda config: object.__setattr__(config, "attribute_map", {"scale": "n_head"}))


def test_a_patched_getattribute_recompiles(monkeypatch):
    original = transformers.PretrainedConfig.__getattribute__

    def doubled(self, key):
        value = original(self, key)
        return value * 2 if key == "n_embd" else value

    _recompiles_after(
        lambda config: monkeypatch.setattr(transformers.PretrainedConfig, "__getattribute__", doubled))
