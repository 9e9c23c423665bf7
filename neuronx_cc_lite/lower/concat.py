"""Concat and Split: pure data movement along one axis.

Concat copies each input into its slice of the output with HBM-to-HBM DMA (no engine touches the data). Split
emits nothing: each output is a view of its slice of the input, which its consumers' DMAs read through. The split
sizes are the outputs' shapes along the axis, so the `split` input (opset 13), attribute (before) and
`num_outputs` (opset 18) all come to the same thing once shape inference has run.
"""

from __future__ import annotations

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.ops.registry import lowering


def _axis(node: Node, g: Graph, default: int | None) -> int | str:
    rank = len(g.tensors[node.inputs[0]].shape)
    axis = node.attrs.get("axis", default)
    if axis is None:
        return "Concat needs an axis attribute"
    if not -rank <= axis < max(rank, 1):
        return f"axis {axis} is out of range for rank {rank}"
    return axis % max(rank, 1)


def _check_concat(node: Node, g: Graph) -> str | None:
    axis = _axis(node, g, None)
    if isinstance(axis, str):
        return axis
    if len(g.tensors[node.inputs[0]].shape) == 0:
        return "Concat of scalars is not defined"
    return None


@lowering("Concat", check=_check_concat, since=4, moves_data=True)
def lower_concat(ctx: LowerCtx, node: Node) -> None:
    axis = _axis(node, ctx.graph, None)
    assert isinstance(axis, int)
    # the first input's rows stay on partitions when the concatenation runs along other axes: its slices are
    # then copies within the partitions of an on-chip home (codegen/on_chip.py)
    rows = ctx.partition_axes(node.inputs[0])
    # (stored in the order of a Transpose that alone reads it, which then moves nothing: attention's heads,
    # concatenated after split_attention, on their way to [tokens, heads x head size])
    out = ctx.output(node.outputs[0], rows if rows is not None and not rows[0] <= axis < rows[1] else None,
                     follow_transpose=True)
    at = 0
    for name in node.inputs:
        source = ctx.view(name)
        n = source.shape[axis]
        ctx.program.dma(out.slice(axis, at, at + n), source)
        at += n


def _check_split(node: Node, g: Graph) -> str | None:
    axis = _axis(node, g, 0)
    if isinstance(axis, str):
        return axis
    shape = g.tensors[node.inputs[0]].shape
    sizes = [g.tensors[o].shape[axis] for o in node.outputs]
    if sum(sizes) != shape[axis]:
        return f"the outputs' sizes {sizes} along axis {axis} do not add up to the input's {shape[axis]}"
    return None


@lowering("Split", check=_check_split, since=2, moves_data=True)
def lower_split(ctx: LowerCtx, node: Node) -> None:
    axis = _axis(node, ctx.graph, 0)
    assert isinstance(axis, int)
    source = ctx.view(node.inputs[0])
    at = 0
    for name in node.outputs:
        n = ctx.shape(name)[axis]
        ctx.alias(name, source.slice(axis, at, at + n))
        at += n
