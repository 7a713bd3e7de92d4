"""Plain attributes read from one object's instance dict are checked together by that dict's
version tag (`crates/dynamo_python/src/capture/guard_groups.rs`): while the dict and the
object's type are unchanged since the last pass, the attribute checks are skipped. Every way
of changing what such an attribute reads must still recompile and give eager's result; a
change to something else in the same dict must not recompile; and instances sharing one
compiled frame must each be checked against their own dict."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2
        self.shift = 0.5
        self.pad = (1, 1)
        self.mode = "add"
        self.dtype_out = torch.float32
        self.extra = None
        self.unused = 0

    def forward(self, x):
        y = torch.nn.functional.pad(x, self.pad) * self.scale
        y = y + self.shift if self.mode == "add" else y - self.shift
        if self.extra is not None:
            y = y + self.extra
        return y.to(self.dtype_out)


def _set_scale(m):
    m.scale = 3


def _write_dict(m):
    m.__dict__["shift"] = -1.5


def _new_tuple(m):
    m.pad = (0, 2)


def _equal_new_tuple(m):
    m.pad = tuple([1, 1])  # equal value, another object: holds, no recompile needed


def _mode(m):
    m.mode = "sub"


def _dtype(m):
    m.dtype_out = torch.float64


def _extra(m):
    m.extra = 1.0


def _replace_dict(m):
    m.__dict__ = dict(m.__dict__, scale=5)


def _class_property(m):
    type(m).scale = property(lambda self: 7)


def _delete_and_set_class_attribute(m):
    type(m).shift = 4.0
    del m.shift


def _change_class(m):
    class Other(Block):
        pass

    Other.scale = 9
    m.__class__ = Other
    del m.scale  # now read from the class


CHANGES = [_set_scale, _write_dict, _new_tuple, _mode, _dtype, _extra, _replace_dict, _class_property,
           _delete_and_set_class_attribute, _change_class]


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_attribute_recompiles_and_matches_eager(change):
    class Local(Block):  # a class of its own: changes to the class stay in this test
        pass

    m = Local()
    x = torch.randn(2, 3)
    counter = CompileCounter()
    dynamo_rs.reset()
    compiled = dynamo_rs.compile(m, backend=counter)
    for _ in range(3):  # the last passes are the ones the groups remember
        torch.testing.assert_close(compiled(x), m(x))
    assert counter.frame_count == 1
    change(m)
    expected = m(x)
    got = compiled(x)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled(x), expected)


def test_equal_values_and_unrelated_changes_do_not_recompile():
    m = Block()
    x = torch.randn(2, 3)
    counter = CompileCounter()
    dynamo_rs.reset()
    compiled = dynamo_rs.compile(m, backend=counter)
    for change in (lambda: None, lambda: setattr(m, "unused", 1), lambda: _equal_new_tuple(m),
                   lambda: setattr(m, "scale", 2), lambda: setattr(m, "new_attribute", [1])):
        change()
        for _ in range(2):
            torch.testing.assert_close(compiled(x), m(x))
    assert counter.frame_count == 1
    _set_scale(m)  # after those passes were remembered, a real change still recompiles
    torch.testing.assert_close(compiled(x), m(x))
    assert counter.frame_count == 2


def test_instances_sharing_a_frame_are_checked_against_their_own_dicts():
    blocks = [Block() for _ in range(3)]
    blocks[2].scale = 4
    x = torch.randn(2, 3)
    counter = CompileCounter()
    dynamo_rs.reset()
    compiled = [dynamo_rs.compile(b, backend=counter) for b in blocks]
    for _ in range(3):
        for b, c in zip(blocks, compiled):
            torch.testing.assert_close(c(x), b(x))
    blocks[0].shift = 10.0
    blocks[1].mode = "sub"
    for _ in range(2):
        for b, c in zip(blocks, compiled):
            torch.testing.assert_close(c(x), b(x))


def test_a_renamed_configuration_attribute_follows_its_rename_table():
    """transformers configurations read renamed attributes (`hidden_size` -> `n_embd`)
    through their class's `attribute_map`: a change to that table in place (the type's
    version tag does not see it) must be seen too."""
    transformers = pytest.importorskip("transformers")

    class Config(transformers.GPT2Config):
        attribute_map = dict(transformers.GPT2Config.attribute_map)

    config = Config(n_embd=4, n_head=2, n_layer=1, n_positions=8, vocab_size=8)

    def fn(x, config):
        return x * config.hidden_size + config.num_attention_heads

    x = torch.randn(3)
    counter = CompileCounter()
    dynamo_rs.reset()
    compiled = dynamo_rs.compile(fn, backend=counter)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, config), fn(x, config))
    config.n_embd = 6
    torch.testing.assert_close(compiled(x, config), fn(x, config))
    Config.attribute_map["hidden_size"] = "n_layer"
    torch.testing.assert_close(compiled(x, config), fn(x, config))
    torch.testing.assert_close(compiled(x, config), fn(x, config))
