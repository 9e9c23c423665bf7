"""The quantization ops reach lowering only when passes/expand_quantization.py could not rewrite them into the
float arithmetic that defines them: the check says why."""

from __future__ import annotations

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.passes.expand_quantization import SINCE, why_not_expanded


def _why_left(node: Node, g: Graph) -> str:
    reason = why_not_expanded(node, g)
    return f"{reason}: it cannot be rewritten" if reason else f"{node.op} left as it is (expand-quantization did " \
        "not run)"


def lower_quantization(ctx: LowerCtx, node: Node) -> None:
    raise CompileError("NCC_UNSUPPORTED", f"{node.name!r} ({node.op}): {_why_left(node, ctx.graph)}")


for _op, _since in SINCE.items():
    lowering(_op, check=_why_left, since=_since)(lower_quantization)
