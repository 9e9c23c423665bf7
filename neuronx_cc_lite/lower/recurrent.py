"""LSTM, GRU and RNN reach lowering only when passes/expand_recurrent.py could not unroll them: the check says why."""

from __future__ import annotations

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.passes.expand_recurrent import RECURRENT, SINCE, why_not_expanded


def _why_left(node: Node, g: Graph) -> str:
    reason = why_not_expanded(node, g)
    return f"{reason} cannot be unrolled" if reason else f"{node.op} left unrolled (expand-recurrent did not run)"


@lowering(*RECURRENT, check=_why_left, since=SINCE)
def lower_recurrent(ctx: LowerCtx, node: Node) -> None:
    raise CompileError("NCC_UNSUPPORTED", f"{node.name!r} ({node.op}): {_why_left(node, ctx.graph)}")
