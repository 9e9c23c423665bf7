"""Ops that only change how data is viewed: no instruction is emitted unless the input is not contiguous."""

from __future__ import annotations

from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.registry import lowering


@lowering("Identity", moves_data=True, elementwise=True)
@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze", constant_inputs=(1,), moves_data=True)
def lower_reshape(ctx: LowerCtx, node: Node) -> None:
    """The output has the input's elements in the same order; its shape is settled by shape inference."""
    source = ctx.view(node.inputs[0])
    view = source.reshape(ctx.shape(node.outputs[0]))
    if view is not None:
        ctx.alias(node.outputs[0], view)
        return
    out = ctx.output(node.outputs[0])  # a strided input: copy it into a contiguous tensor first
    ctx.program.dma(out.reshape(source.shape), source)
