"""A tensor attribute that does not exist: the AttributeError eager code gets is raised in the
trace, so `try`/`except AttributeError` around it (duck typing: "a tensor, or something with
.foo") is one graph (as in TorchDynamo) instead of an eager frame — and only when the error is
certain on every call: an attribute set on a given tensor's `__dict__`, then or later, is read
(recompiling), and tensor subclasses keep their own lookup. Compared with eager."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


def compiled(fn):
    counter = CompileCounter()
    dynamo_rs.reset()
    return dynamo_rs.compile(fn, backend=counter), counter


def duck(x):
    try:
        scale = x.scale
    except AttributeError:
        scale = 2.0
    return x * scale + 1


def duck_on_new_tensor(x):
    y = x.sin()
    try:
        return y.missing_thing
    except AttributeError as err:
        return y + len(str(err))


def duck_return_in_try(x):
    try:
        return x.foo
    except AttributeError:
        return x - 1


class WithParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        try:
            bias = self.weight.bias_hint
        except AttributeError:
            bias = 0.5
        return x * self.weight + bias


@pytest.mark.parametrize("fn", [duck, duck_on_new_tensor, duck_return_in_try])
def test_caught_attribute_error_is_one_graph(fn) -> None:
    x = torch.randn(3)
    c, counter = compiled(fn)
    for _ in range(2):
        torch.testing.assert_close(c(x), fn(x))
    assert counter.frame_count == 1


def test_parameter_attribute() -> None:
    model = WithParameter()
    c, counter = compiled(model)
    x = torch.randn(3)
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x))
    assert counter.frame_count == 1


def test_message_and_name_are_eager_ones() -> None:
    x = torch.randn(3)
    c, _ = compiled(duck_on_new_tensor)
    torch.testing.assert_close(c(x), duck_on_new_tensor(x))  # the message's length is used

    def name_of_error(x):
        try:
            x.nope
        except AttributeError as err:
            return x + len(err.name)
    c, counter = compiled(name_of_error)
    torch.testing.assert_close(c(x), name_of_error(x))
    assert counter.frame_count == 1


def test_uncaught_raises_as_eager() -> None:
    def read(x):
        return x.foo + 1

    x = torch.randn(3)
    with pytest.raises(AttributeError) as want:
        read(x)
    c, _ = compiled(read)
    with pytest.raises(AttributeError) as got:
        c(x)
    assert str(got.value) == str(want.value)


def test_attribute_set_on_the_tensor_is_read() -> None:
    x = torch.randn(3)
    x.scale = 5.0
    c, _ = compiled(duck)
    torch.testing.assert_close(c(x), duck(x))


def test_attribute_set_after_the_first_call_recompiles() -> None:
    x = torch.randn(3)
    c, counter = compiled(duck)
    torch.testing.assert_close(c(x), duck(x))
    x.scale = 7.0  # the same tensor object, now with the attribute
    torch.testing.assert_close(c(x), duck(x))
    assert counter.frame_count == 2
    y = torch.randn(3)  # another tensor without it: the first entry holds again
    torch.testing.assert_close(c(y), duck(y))


def test_tensor_subclass_lookup_is_its_own() -> None:
    class Scaled(torch.Tensor):
        def __getattr__(self, name):
            if name == "scale":
                return 3.0
            raise AttributeError(name)

    x = torch.randn(3).as_subclass(Scaled)
    c, _ = compiled(duck)
    want = duck(x)
    torch.testing.assert_close(torch.as_tensor(c(x)), torch.as_tensor(want))


def test_class_attribute_is_not_hidden() -> None:
    def probe(x):
        try:
            return x * x.ndim
        except AttributeError:
            return x

    x = torch.randn(2, 3)
    c, _ = compiled(probe)
    torch.testing.assert_close(c(x), probe(x))
