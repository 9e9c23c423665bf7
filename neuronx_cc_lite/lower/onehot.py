"""OneHot: out[..., d, ...] = on where the index (wrapped once if negative) equals d, else off.

The indices are read with a size-1 axis where the depth axis goes, so they broadcast against a constant ramp
0 .. depth-1 laid along that axis; the comparison selects `on` over a fill of `off`.
"""

from __future__ import annotations

import numpy as np

from isa.functions import AluOp
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import Operand, elementwise
from neuronx_cc_lite.lower.instr import fill, scratch, select, ts, tt
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.program import Program, TileAccess


def _params(node: Node, g: Graph) -> tuple[int, int, float, float]:
    """(axis in the output, depth, off value, on value); the registry has made depth and values constants."""
    rank = len(g.tensors[node.inputs[0]].shape) + 1
    axis = int(node.attrs.get("axis", -1))
    depth = int(np.asarray(g.tensors[node.inputs[1]].value).reshape(-1)[0])
    off, on = (float(v) for v in np.asarray(g.tensors[node.inputs[2]].value).reshape(-1)[:2])
    return axis + rank if axis < 0 else axis, depth, off, on


def _check_onehot(node: Node, g: Graph) -> str | None:
    _, depth, _, _ = _params(node, g)
    if depth < 1:
        return f"OneHot with depth {depth}"
    if abs(depth) >= 2**24:
        return f"OneHot with depth {depth} beyond the exact fp32 range"
    return None


@lowering("OneHot", check=_check_onehot, since=9, constant_inputs=(1, 2))
def lower_onehot(ctx: LowerCtx, node: Node) -> None:
    axis, depth, off, on = _params(node, ctx.graph)
    shape = ctx.shape(node.outputs[0])
    indices = ctx.reshaped(node.inputs[0], shape[:axis] + (1,) + shape[axis + 1:])
    ramp = ctx.constant(f"{node.name}/ramp", np.arange(depth, dtype=np.int32).reshape(
        (depth,) + (1,) * (len(shape) - axis - 1)))

    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        index, positions = s
        assert isinstance(index, TileAccess) and isinstance(positions, TileAccess)
        wrapped, hit, on_tile = (scratch(prog, dst, n) for n in ("wrapped", "hit", "on"))
        ts(prog, wrapped, index, AluOp.less, 0.0, AluOp.multiply, float(depth))
        tt(prog, wrapped, wrapped, index, AluOp.add)
        tt(prog, hit, wrapped, positions, AluOp.equal)
        fill(prog, dst, off)
        fill(prog, on_tile, on)
        select(prog, dst, on_tile, hit)

    elementwise(ctx, node, compute, inputs=[indices, ramp], immediates=False)
