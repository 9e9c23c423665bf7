"""Lowering: graph IR -> tile program. Importing this package registers every op lowering."""

from __future__ import annotations

from isa.target import Target
from neuronx_cc_lite.ir import Graph
from neuronx_cc_lite.lower import (  # noqa: F401  (each module registers its lowerings)
    activations, cast, elementwise, gather, logic, matmul, movement, normalize, reduce, views)
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.program import Program
from neuronx_cc_lite.lower.registry import LOWERINGS, unsupported_nodes, why_unsupported

__all__ = ["lower_graph", "LOWERINGS", "unsupported_nodes", "why_unsupported"]


def lower_graph(g: Graph, target: Target) -> tuple[Program, LowerCtx]:
    program = Program(target)
    ctx = LowerCtx(g, program)
    for node in g.nodes:
        program.node = node.name
        LOWERINGS[node.op].lower(ctx, node)
    ctx.materialize_outputs()
    return program, ctx
