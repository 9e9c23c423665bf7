"""Einsum reaches lowering only when passes/expand_einsum.py could not rewrite it: the check says why."""

from __future__ import annotations

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.passes.expand_einsum import parse


def _why_left(node: Node, g: Graph) -> str:
    reason = parse(node, g)
    return reason if isinstance(reason, str) else "Einsum left unexpanded (the expand-einsum pass did not run)"


@lowering("Einsum", check=_why_left, since=12)
def lower_einsum(ctx: LowerCtx, node: Node) -> None:
    raise CompileError("NCC_UNSUPPORTED", f"{node.name!r} (Einsum): {_why_left(node, ctx.graph)}")
