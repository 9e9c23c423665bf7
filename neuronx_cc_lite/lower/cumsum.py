"""CumSum and CumProd: a scan along the free axis.

The scan axis goes in the free dimension and every other index on partitions (one row per partition). Forward,
one VectorE tensor_tensor_scan per tile: dst[i] = (x[i] op dst[i-1]) + 0, in order, as onnxruntime accumulates
(the zeros are its second operand), its initial value the identity or the running total the tile before ended
with. Reversed (access patterns never walk backwards), Hillis-Steele within a tile: for k = 1, 2, 4, ... below the
width, t[:, :-k] op= t[:, k:], each step one tensor_tensor that reads before it writes, then the running total of
the tile after it combined in. `exclusive` scans the input shifted by one place, with the identity where nothing
precedes.

A sum along another axis than the last: when the input's producer laid it out feature-major and the result's
readers want that too (lower/layout.py: a scan layer between its projections), the features are the rows and the
summed axis the free one as it is, on chip; chunk by chunk, every row block in each, so that a matmul reading the
result starts on the first chunk while the scan goes on. Otherwise a forward sum of floats runs on the Tensor
engine by rows (cumsum_pe.py).
"""

from __future__ import annotations

import numpy as np

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.cumsum_pe import cumsum_on_pe
from neuronx_cc_lite.lower.elementwise import small_integers_ok, tile_free_max
from neuronx_cc_lite.lower.instr import fill, ts, tt
from neuronx_cc_lite.lower.rows import move_to_end, row_boxes
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.program import TileAccess


def _doubling_scan(ctx: LowerCtx, t: TileAccess, width: int, op: AluOp) -> None:
    """The reversed inclusive scan of a tile in place, Hillis-Steele."""
    k = 1
    while k < width:
        later, earlier = t.tile.region(k, width - k), t.tile.region(0, width - k)
        tt(ctx.program, earlier, earlier, later, op)
        k *= 2


def _feature_major(ctx: LowerCtx, node: Node, axis: int) -> bool:
    """Whether to scan in the feature-major layout (lower/layout.py): the input's producer put its last axis on
    partitions and the result's readers want it there too. The summed axis is then in the free dimension of both,
    where the scan runs, and the tensors stay on chip as they are."""
    rank = len(ctx.shape(node.inputs[0]))
    return axis != rank - 1 and not node.attrs.get("reverse", 0) and \
        ctx.partition_axes(node.inputs[0]) == (rank - 1, rank) and ctx.feature_major(node.outputs[0])


# Steps per scan instruction in the feature-major layout: short enough that the matmul after it starts early, long
# enough that a scan's fixed cost stays small. The scan family (1,024 steps of 256 features, bf16): 128 steps a
# chunk 18.6 us, 256 17.9, 384 18.9, 512 18.1.
FEATURE_MAJOR_CHUNK = 256


@lowering("CumSum", check=small_integers_ok, since=11, constant_inputs=(1,))
def lower_cumsum(ctx: LowerCtx, node: Node) -> None:
    _cumulative(ctx, node, AluOp.add, 0.0)


@lowering("CumProd", check=small_integers_ok, since=26, constant_inputs=(1,))
def lower_cumprod(ctx: LowerCtx, node: Node) -> None:
    _cumulative(ctx, node, AluOp.multiply, 1.0)


def _cumulative(ctx: LowerCtx, node: Node, op: AluOp, identity: float) -> None:
    prog = ctx.program
    x = ctx.view(node.inputs[0])
    rank = len(x.shape)
    axis = int(np.asarray(ctx.graph.tensors[node.inputs[1]].value).reshape(-1)[0]) % max(rank, 1)
    exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))
    features = _feature_major(ctx, node, axis)
    if op is AluOp.add and rank > 0 and x.size > 0 and not features and cumsum_on_pe(ctx, node, axis):
        return  # sums along rows on PE
    out = ctx.output(node.outputs[0], (rank - 1, rank) if features else None)
    if rank == 0 or x.size == 0:
        return
    n = x.shape[axis]
    budget = tile_free_max(ctx)
    if features:  # in chunks: the matmul reading the result starts on a chunk as soon as it is scanned
        budget = min(budget, FEATURE_MAJOR_CHUNK)
    chunks = [(c, min(n, c + budget)) for c in range(0, n, budget)]
    if reverse:
        chunks.reverse()
    boxes = list(row_boxes([move_to_end(x, (axis,)), move_to_end(out, (axis,))], rank - 1, prog.target.partitions))
    carries: list[TileAccess | float] = [identity] * len(boxes)
    # chunk by chunk, every box of rows in each: a feature-major result's readers take a chunk of all its features
    for c0, c1 in chunks:
        width = c1 - c0
        for b, (row, dst) in enumerate(boxes):
            rows = row.shape[0]
            # forward, the scan reads the loaded chunk and writes a tile of its own: a tile both loaded and stored
            # would be one tensor's home for its load and another's for its store once they stay on chip
            # (in the input's type: a result narrowed for the matmul reading it is rounded once, when written)
            src = prog.sbuf(rows, width, out.dtype if reverse else x.dtype, f"{node.name}/x")
            t = src if reverse else prog.sbuf(rows, width, out.dtype, node.outputs[0])
            # the input elements this chunk scans: shifted one place back (forward) or on (reverse) if exclusive
            shift = (1 if reverse else -1) if exclusive else 0
            lo, hi = max(0, c0 + shift), min(n, c1 + shift)
            if hi - lo < width:
                fill(prog, src.ap(), identity)
            if hi > lo:
                prog.dma(src.region(lo - (c0 + shift), hi - lo), row.slice(1, lo, hi))
            carry = carries[b]
            if reverse:
                _doubling_scan(ctx, t.ap(), width, op)
                if not isinstance(carry, float):
                    ts(prog, t.ap(), t.ap(), op, carry)
            else:
                zeros = prog.scalar(0.0, DType.fp32).ap(((width, 0),), partitions=rows)  # read with stride 0
                prog.emit("tensor_tensor_scan", Engine.DVE, dst=t.ap(), data0=src.ap(), data1=zeros, initial=carry,
                          op0=op, op1=AluOp.add, reverse0=False, reverse1=False)
            carries[b] = t.region(0 if reverse else width - 1, 1)
            prog.dma(dst.slice(1, c0, c1), t.ap())
