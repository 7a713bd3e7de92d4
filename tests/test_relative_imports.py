"""`from .m import x` / `from .. import m` inside a compiled function: resolved against the
package of the function's module, as `__import__` does, and traced like an absolute import
(it ran the frame eagerly before; TorchDynamo traces it). A module not loaded yet is a graph
break, and the import raises as eagerly."""

from __future__ import annotations

import pytest
import torch

import dynamo_rs
from dynamo_rs.testing import CompileCounter
from language_harness import reset_all
from relative_import_pkg.inner import user


@pytest.fixture(autouse=True)
def _fresh():
    reset_all()
    yield
    reset_all()


@pytest.mark.parametrize("fn", [user.from_parent_module, user.the_parent_package,
                                user.from_own_package], ids=lambda f: f.__name__)
def test_relative_import_in_one_graph(fn):
    x = torch.randn(4)
    theirs = torch._dynamo.testing.CompileCounter()
    torch.compile(fn, backend=theirs)(x)
    ours = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=ours, fullgraph=True)
    torch.testing.assert_close(compiled(x), fn(x))
    torch.testing.assert_close(compiled(x), fn(x))
    assert (ours.frame_count, ours.op_count) == (theirs.frame_count, theirs.op_count) == (1, 2)


def test_relative_import_of_a_module_not_loaded_raises_as_eagerly():
    x = torch.randn(4)
    with pytest.raises(ModuleNotFoundError):
        user.not_loaded_yet(x)
    with pytest.raises(ModuleNotFoundError):
        dynamo_rs.compile(user.not_loaded_yet, backend=CompileCounter())(x)
