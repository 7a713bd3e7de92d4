"""torch.distributions objects made inside the compiled function, with argument validation on
(`validate_args=True`, torch's default outside TorchDynamo, which turns it off globally): the
validity checks run in the graph (`_is_all_true` + `_assert_async`, as torch does under
export), so valid data gives eager's results in one graph and invalid data still raises —
a RuntimeError with torch's message where eager raises a ValueError."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    dynamo_rs.reset()
    yield
    dynamo_rs.reset()


def several(x, scale):
    normal = torch.distributions.Normal(x, scale, validate_args=True)
    bern = torch.distributions.Bernoulli(logits=x, validate_args=True)
    cat = torch.distributions.Categorical(logits=x.unsqueeze(0), validate_args=True)
    return normal.log_prob(x * 0.5) + bern.probs + bern.mean + cat.entropy()


def test_validated_distributions_in_one_graph() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(several, backend=counter)
    x, scale = torch.randn(4), torch.rand(4) + 0.5
    torch.testing.assert_close(compiled(x, scale), several(x, scale))
    assert counter.frame_count == 1
    x2, scale2 = torch.randn(4), torch.rand(4) + 0.5
    torch.testing.assert_close(compiled(x2, scale2), several(x2, scale2))
    assert counter.frame_count == 1


def test_invalid_arguments_still_raise() -> None:
    compiled = dynamo_rs.compile(several, backend=CompileCounter())
    x = torch.randn(4)
    compiled(x, torch.ones(4))
    with pytest.raises(ValueError):
        several(x, -torch.ones(4))
    with pytest.raises(RuntimeError, match="distribution constraint"):
        compiled(x, -torch.ones(4))


def sample_checked(x, value):
    return torch.distributions.Normal(x, torch.ones_like(x), validate_args=True).log_prob(value)


def test_sample_validation_runs_in_the_graph() -> None:
    counter = CompileCounter()
    compiled = dynamo_rs.compile(sample_checked, backend=counter)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, x + 1), sample_checked(x, x + 1))
    assert counter.frame_count == 1
    with pytest.raises(RuntimeError):
        compiled(x, torch.tensor([0.0, float("nan"), 1.0]))
