"""Ops that only change how data is viewed: no instruction is emitted unless the input is not contiguous (BitCast
copies the input's bytes as they are)."""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.ops.dtypes import device_dtype
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.tile.hbm import HbmView


@lowering("Identity", moves_data=True, kind=OpKind.ELEMENTWISE)
@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze", constant_inputs=(1,), moves_data=True, kind=OpKind.VIEW)
def lower_reshape(ctx: LowerCtx, node: Node) -> None:
    """The output has the input's elements in the same order; its shape is settled by shape inference."""
    source = ctx.view(node.inputs[0])
    shape = ctx.shape(node.outputs[0])
    view = source.unit_axes_changed(shape) or source.reshape(shape)
    if view is not None:
        ctx.alias(node.outputs[0], view)
        return
    out = ctx.output(node.outputs[0])  # a strided input: copy it into a contiguous tensor first
    ctx.program.dma(out.reshape(source.shape), source)


def _check_bitcast(node: Node, g: Graph) -> str | None:
    for name in (node.inputs[0], node.outputs[0]):
        t = np.dtype(g.tensors[name].dtype)
        held = device_dtype(t)
        if held is None or held.size != t.itemsize:
            return f"a BitCast of {t}, which the device holds as {held.name if held is not None else 'nothing'}: its bits differ"
    if np.dtype(g.tensors[node.inputs[0]].dtype).itemsize != np.dtype(g.tensors[node.outputs[0]].dtype).itemsize:
        return "a BitCast between types of different sizes"
    return None


@lowering("BitCast", check=_check_bitcast, since=26, moves_data=True)
def lower_bitcast(ctx: LowerCtx, node: Node) -> None:
    """The input's bytes read as the output's type: a DMA from the input viewed with the output's element type (of
    the same size, so the same strides), which moves bits without converting them."""
    source = ctx.view(node.inputs[0])
    out = ctx.output(node.outputs[0])
    ctx.program.dma(out, HbmView(source.tensor, out.dtype, source.shape, source.strides, source.offset))
