"""Test helpers, mirroring torch._dynamo.testing."""

from __future__ import annotations

import torch


class CompileCounter:
    """A backend that counts the graphs it is given (`frame_count`) and their operations
    (`op_count`: call_function, call_method and call_module nodes), then runs them as is."""

    def __init__(self) -> None:
        self.frame_count = 0
        self.op_count = 0
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op.startswith("call"))
        self.graphs.append(gm)
        return gm.forward

    def clear(self) -> None:
        self.frame_count = 0
        self.op_count = 0
        self.graphs.clear()
