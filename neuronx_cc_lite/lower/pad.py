"""Pad (constant, reflect, edge, wrap): on-chip copies between whole rows, or HBM-to-HBM DMA.

Along each axis, the output position o reads input element i(o): o - pad_begin inside, a fill outside (constant
mode), the nearest edge element (edge), a mirrored one (reflect) or a wrapped one (wrap). That index map is cut
into pieces an access pattern can walk (patterns.pieces): the inside is one piece, an edge run a piece whose
source stride is 0, a reflection one piece per element. Every combination of one piece per axis is one box of
the output and one copy: from the input, or, when any of its axes is a fill, from the pad value broadcast with
zero strides. When leading axes (batch, channels) are left alone and a row fits, the rows are loaded whole, the
boxes are on-chip copies, and the padded rows are stored whole (patterns.copy_pieces_on_chip): a reflection's
boxes as DMAs would be pieces of one element; otherwise each box is a DMA from HBM to HBM.
"""

from __future__ import annotations

import numpy as np

from isa.tensor_kind import TensorKind
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import tile_free_max
from neuronx_cc_lite.lower.patterns import copy_pieces, copy_pieces_on_chip, pieces
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView

MODES = ("constant", "reflect", "edge", "wrap")


def _constant_input(node: Node, g: Graph, index: int) -> np.ndarray | None:
    """Input `index` (a compile-time constant: the registry sees to it), None when absent."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    return g.tensors[node.inputs[index]].value


def _pads(node: Node, g: Graph) -> tuple[list[int], list[int]] | str:
    """(begin, end) pads per axis."""
    rank = len(g.tensors[node.inputs[0]].shape)
    if g.opset < 11:
        pads, axes = node.attrs.get("pads"), None
    else:
        pads, axes = _constant_input(node, g, 1), _constant_input(node, g, 3)
    if pads is None:
        return "Pad needs pads"
    axes_list = [int(a) % rank for a in (range(rank) if axes is None else axes)] if rank else []
    pads = [int(p) for p in np.asarray(pads).ravel()]
    if len(pads) != 2 * len(axes_list):
        return f"{len(pads)} pads for {len(axes_list)} axes"
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes_list):
        begin[a], end[a] = pads[k], pads[k + len(axes_list)]
    return begin, end


def _check(node: Node, g: Graph) -> str | None:
    mode = node.attrs.get("mode", "constant")
    if mode not in MODES:
        return f"mode {mode!r} is not supported (only {', '.join(MODES)})"
    pads = _pads(node, g)
    if isinstance(pads, str):
        return pads
    shape = g.tensors[node.inputs[0]].shape
    if mode != "constant":
        if min(pads[0] + pads[1], default=0) < 0:
            return f"negative pads (a crop) with mode {mode!r} are not supported"
        if any(n == 0 and b + e > 0 for n, b, e in zip(shape, *pads)):
            return f"mode {mode!r} cannot pad an empty axis"
    return None


def index_map(size: int, begin: int, end: int, mode: str) -> list[int]:
    """Output position -> input index along one axis (-1: the pad value), as numpy.pad would place them."""
    if mode == "constant":
        return [o - begin if 0 <= o - begin < size else -1 for o in range(size + begin + end)]
    return [int(i) for i in np.pad(np.arange(size), (begin, end), mode=mode)]  # ONNX's modes are numpy's


def _value(ctx: LowerCtx, node: Node) -> HbmView:
    """The pad value as a one-element view: the constant_value input, the opset-2 attribute, or zero."""
    if ctx.graph.opset >= 11 and len(node.inputs) > 2 and node.inputs[2]:
        view = ctx.view(node.inputs[2])
        return HbmView(view.tensor, view.dtype, (), (), view.offset)
    out_dtype = ctx.dtype(node.outputs[0])
    data = np.asarray(node.attrs.get("value", 0.0)).astype(out_dtype.np).tobytes()
    tensor = ctx.program.hbm_tensor(f"{node.name}/value", len(data), TensorKind.WEIGHT, out_dtype, data)
    return HbmView(tensor, out_dtype, (), ())


@lowering("Pad", check=_check, since=2, constant_inputs=(1, 3))  # pads, axes
def lower_pad(ctx: LowerCtx, node: Node) -> None:
    pads = _pads(node, ctx.graph)
    if isinstance(pads, str):
        raise CompileError("NCC_UNSUPPORTED", pads, node.name, node.op)
    mode = node.attrs.get("mode", "constant")
    if not any(pads[0]) and not any(pads[1]):  # nothing to pad (Swin pads its windows by a computed 0): a view
        ctx.alias(node.outputs[0], ctx.view(node.inputs[0]))
        return
    x, out = ctx.view(node.inputs[0]), ctx.output(node.outputs[0])
    value = _value(ctx, node) if mode == "constant" else None
    per_axis = [pieces(index_map(n, b, e, mode)) for n, b, e in zip(x.shape, *pads)]
    if not copy_pieces_on_chip(ctx.program, out, x, per_axis, value, 2 * tile_free_max(ctx)):
        copy_pieces(ctx.program, out, x, per_axis, value)
