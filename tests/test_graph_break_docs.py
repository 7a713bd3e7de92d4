"""docs/graph-breaks.md is what the built extension reports about graph-break kinds, and the
logs name those kinds."""

from __future__ import annotations

import importlib.util
import logging
import pathlib

import torch

import dynamo_rs
from dynamo_rs import _native
from dynamo_rs.testing import CompileCounter

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _docs_tool():
    spec = importlib.util.spec_from_file_location("graph_break_docs", ROOT / "tools/graph_break_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doc_lists_every_kind_the_extension_reports() -> None:
    tool = _docs_tool()
    from_source = [(code, title, explanation, hint) for _, code, title, explanation, hint in tool.kinds()]
    assert from_source == [tuple(k) for k in _native.graph_break_kinds()]
    assert (ROOT / "docs/graph-breaks.md").read_text() == tool.render()


def test_break_log_names_code_source_line_and_hint(caplog) -> None:
    def prints(x):
        y = x.sin()
        print("between")  # the line the log quotes
        return y.cos()

    dynamo_rs.reset()
    compiled = dynamo_rs.compile(prints, backend=CompileCounter())
    with caplog.at_level(logging.INFO, logger="dynamo_rs.graph_breaks"):
        compiled(torch.randn(3))
    (message,) = [r.getMessage() for r in caplog.records if r.name == "dynamo_rs.graph_breaks"]
    code = next(k[0] for k in _native.graph_break_kinds() if k[1] == "A call the translator cannot follow")
    assert code in message
    assert 'print("between")  # the line the log quotes' in message
    assert "hint:" in message
    assert f"test_graph_break_docs.py:{prints.__code__.co_firstlineno + 2}" in message
