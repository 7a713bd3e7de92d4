"""`dynamo_rs.explain(fn)(*args, **kwargs)`: what capture made of one call, as
`torch._dynamo.explain` reports it — the graphs, how many, the graph breaks and why, the
operations of each graph."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch


@dataclasses.dataclass
class BreakReason:
    """One graph break: where (the frame, and the frames it was inlined from) and why."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.reason} at {self.where}"


@dataclasses.dataclass
class ExplainOutput:
    graphs: list = dataclasses.field(default_factory=list)
    graph_count: int = 0
    graph_break_count: int = 0
    break_reasons: list = dataclasses.field(default_factory=list)
    op_count: int = 0
    ops_per_graph: list = dataclasses.field(default_factory=list)
    #: Frames that ran eagerly as a whole, with why: (where, reason).
    eager_frames: list = dataclasses.field(default_factory=list)
    compile_time_s: float = 0.0

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}",
                 f"Graph break count: {self.graph_break_count}",
                 f"Op count: {self.op_count}"]
        if self.break_reasons:
            lines.append("Break reasons:")
            for i, reason in enumerate(self.break_reasons, 1):
                lines.append(f"  {i}. {reason.reason}")
                lines.append(f"     at {reason.where}")
        if self.eager_frames:
            lines.append("Frames run eagerly:")
            for where, reason in self.eager_frames:
                lines.append(f"  {reason}")
        if self.ops_per_graph:
            lines.append("Ops per graph:")
            for i, ops in enumerate(self.ops_per_graph, 1):
                lines.append(f"  Graph {i}: {len(ops)} ops")
                lines.extend(f"    {op}" for op in ops)
        return "\n".join(lines)


def explain(fn: Callable, *extra_args: Any, **extra_kwargs: Any) -> Callable[..., ExplainOutput]:
    """`explain(fn)(*args, **kwargs)` compiles `fn` afresh (after a reset) for one call and
    returns an `ExplainOutput`; `explain(fn, *args)` is the same, called at once."""
    from dynamo_rs import compile, reset

    def inner(*args: Any, **kwargs: Any) -> ExplainOutput:
        reset()
        graphs: list = []

        def record(gm: torch.fx.GraphModule, example_inputs):
            graphs.append(gm)
            return gm.forward

        compiled = compile(fn, backend=record)
        converter = compiled._dynamo_rs_converter
        start = time.perf_counter()
        compiled(*args, **kwargs)
        elapsed = time.perf_counter() - start
        ops_per_graph = [[node.target for node in gm.graph.nodes
                          if node.op in ("call_function", "call_method", "call_module")]
                         for gm in graphs]
        reset()
        return ExplainOutput(
            graphs=graphs,
            graph_count=len(graphs),
            graph_break_count=len(converter.breaks),
            break_reasons=[BreakReason(where, reason) for where, reason in converter.breaks],
            op_count=sum(len(ops) for ops in ops_per_graph),
            ops_per_graph=ops_per_graph,
            eager_frames=list(converter.failures),
            compile_time_s=elapsed,
        )

    if extra_args or extra_kwargs:
        return inner(*extra_args, **extra_kwargs)
    return inner
