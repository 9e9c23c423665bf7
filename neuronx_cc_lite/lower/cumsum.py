"""CumSum: a scan on VectorE along the free axis.

The scan axis goes in the free dimension and every other index on partitions (one row per partition). Within a
tile the inclusive scan is Hillis-Steele: for k = 1, 2, 4, ... below the width, t[:, k:] += t[:, :-k] (reversed:
t[:, :-k] += t[:, k:]), each step one tensor_tensor that reads before it writes. An axis longer than one tile is
cut into chunks; each chunk then adds the running total its predecessor ended with (a per-partition scalar).
`exclusive` scans the input shifted by one place, with a zero where nothing precedes.
"""

from __future__ import annotations

import itertools

import numpy as np

from isa.functions import AluOp
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import small_integers_ok, tile_free_max
from neuronx_cc_lite.lower.hbm import HbmView, coalesce
from neuronx_cc_lite.lower.instr import fill, ts, tt
from neuronx_cc_lite.lower.program import TileAccess
from neuronx_cc_lite.lower.registry import lowering


def _rows(ctx: LowerCtx, x: HbmView, out: HbmView, axis: int) -> list[tuple[int, int, int, int, int]]:
    """(x offset, x row stride, out offset, out row stride, rows) per group of rows: the indices
    other than `axis`, merged where both views allow, the last merged axis on partitions in blocks."""
    keep = [a for a in range(len(x.shape)) if a != axis]
    lead = [HbmView(v.tensor, v.dtype, tuple(v.shape[a] for a in keep), tuple(v.strides[a] for a in keep),
                    v.offset) for v in (x, out)]
    shape, (sx, so) = coalesce(lead)
    if not shape:
        shape, sx, so = (1,), (0,), (0,)
    pmax = ctx.program.target.partitions
    groups = []
    for index in itertools.product(*(range(n) for n in shape[:-1])):
        ox = x.offset + sum(i * s for i, s in zip(index, sx))
        oo = out.offset + sum(i * s for i, s in zip(index, so))
        for first in range(0, shape[-1], pmax):
            groups.append((ox + first * sx[-1], sx[-1], oo + first * so[-1], so[-1], min(pmax, shape[-1] - first)))
    return groups


def _scan(ctx: LowerCtx, t: TileAccess, width: int, reverse: bool) -> None:
    k = 1
    while k < width:
        later, earlier = t.tile.region(k, width - k), t.tile.region(0, width - k)
        if reverse:
            tt(ctx.program, earlier, earlier, later, AluOp.add)
        else:
            tt(ctx.program, later, later, earlier, AluOp.add)
        k *= 2


@lowering("CumSum", check=small_integers_ok, since=11, constant_inputs=(1,))
def lower_cumsum(ctx: LowerCtx, node: Node) -> None:
    prog = ctx.program
    x = ctx.view(node.inputs[0])
    rank = len(x.shape)
    axis = int(np.asarray(ctx.graph.tensors[node.inputs[1]].value).reshape(-1)[0]) % max(rank, 1)
    exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))
    out = ctx.output(node.outputs[0])
    if rank == 0 or x.size == 0:
        return
    n = x.shape[axis]
    budget = tile_free_max(ctx)
    chunks = [(c, min(n, c + budget)) for c in range(0, n, budget)]
    if reverse:
        chunks.reverse()
    for ox, rx, oo, ro, rows in _rows(ctx, x, out, axis):
        carry: TileAccess | None = None
        for c0, c1 in chunks:
            width = c1 - c0
            t = prog.sbuf(rows, width, out.dtype, node.outputs[0])
            # the input elements this chunk scans: shifted one place back (forward) or on (reverse) if exclusive
            shift = (1 if reverse else -1) if exclusive else 0
            lo, hi = max(0, c0 + shift), min(n, c1 + shift)
            if hi - lo < width:
                fill(prog, t.ap(), 0.0)
            if hi > lo:
                src = HbmView(x.tensor, x.dtype, (rows, hi - lo), (rx, x.strides[axis]),
                              ox + lo * x.strides[axis])
                prog.dma(t.region(lo - (c0 + shift), hi - lo), src)
            _scan(ctx, t.ap(), width, reverse)
            if carry is not None:
                ts(prog, t.ap(), t.ap(), AluOp.add, carry)
            carry = t.region(0 if reverse else width - 1, 1)
            prog.dma(HbmView(out.tensor, out.dtype, (rows, width), (ro, out.strides[axis]),
                             oo + c0 * out.strides[axis]), t.ap())
