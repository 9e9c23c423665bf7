"""Identical loads made once, where memory allows.

Operators load what they read into tiles of their own; once tensors live on chip (on_chip.py) many of those loads
become copies of the same home region (the Q, K and V projections each cast the same LayerNorm output to bf16).
A copy or DMA whose destination is a whole tile nothing else writes, reading the same source as an earlier one
(the same region, the same pattern, unwritten since, into the same type and shape), is dropped and its tile
becomes the earlier one's.

Merging keeps the earlier tile alive from its last use to the later load: free when the two are close, but a
chain of elementwise operators over a large tensor that each read `x` would keep every tile of `x` alive from the
first operator to the last and fill SBUF. So a merge is taken only when the bytes live in lowering order over
that gap, plus the tile, stay within MERGE_BUDGET of the memory; otherwise the load stays and later loads merge
with it instead.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from neuronx_cc_lite.codegen.allocate import footprint, lifetimes, tile_uses
from neuronx_cc_lite.tile.program import HbmAccess, Mem, PendingInstr, Program, Tile, TileAccess

_LOADS = ("tensor_copy", "dma_copy")

# The share of SBUF or PSUM a merge may bring live bytes up to in lowering order. The scheduler reorders and
# overlaps, so the lowering order's peak understates the schedule's: leave it a quarter.
MERGE_BUDGET = 0.75


def _writers(program: Program) -> dict[Tile, int]:
    count: dict[Tile, int] = {}
    for p in program.instrs:
        for a, writes in p.accesses():
            if writes and isinstance(a, TileAccess):
                count[a.tile] = count.get(a.tile, 0) + 1
    return count


class _LiveBytes:
    """Bytes per partition live at each position of the lowering order, per memory, as merges extend lifetimes."""

    def __init__(self, program: Program) -> None:
        target = program.target
        self.target = target
        positions = len(program.instrs) + 1
        self.live = {Mem.SBUF: np.zeros(positions, np.int64), Mem.PSUM: np.zeros(positions, np.int64)}
        self.budget = {Mem.SBUF: int(target.sbuf_partition_bytes * MERGE_BUDGET),
                       Mem.PSUM: int(target.psum_partition_bytes * MERGE_BUDGET)}
        self.span: dict[Tile, list[int]] = {}
        for life in lifetimes(tile_uses(program)):
            self.span[life.tile] = [life.first, life.end]
            self.live[life.tile.mem][life.first:life.end] += footprint(life.tile, target)

    def merge(self, kept: Tile, dropped: Tile) -> bool:
        """Let `kept` stand for `dropped` from here on, if the extended lifetime fits; False changes nothing."""
        size, live = footprint(kept, self.target), self.live[kept.mem]
        start, end = self.span[kept]
        d_start, d_end = self.span[dropped]
        if d_end <= end:  # the dropped tile lives within the kept one's lifetime: only bytes freed
            live[d_start:d_end] -= size
            return True
        live[d_start:d_end] -= size
        if end < d_start and live[end:d_start].max() + size > self.budget[kept.mem]:
            live[d_start:d_end] += size
            return False
        live[end:d_end] += size
        self.span[kept] = [start, d_end]
        return True


def dedupe_loads(program: Program) -> None:
    writers = _writers(program)
    memory = _LiveBytes(program)
    version: dict[int, int] = {}  # id of a tile or HBM tensor -> writes to it so far
    seen: dict[tuple, Tile] = {}
    renamed: dict[Tile, Tile] = {}
    kept: list[PendingInstr] = []
    for p in program.instrs:
        if p.op in _LOADS:
            dst, src = p.args["dst"], p.args["src"]
            src = replace(src, tile=renamed.get(src.tile, src.tile)) if isinstance(src, TileAccess) else src
            whole = (isinstance(dst, TileAccess) and dst.first == 0 and dst.offset == 0 and
                     dst.partitions == dst.tile.partitions and dst.dims == ((dst.tile.free, 1),) and
                     writers.get(dst.tile) == 1)
            if whole:
                space = src.tile if isinstance(src, TileAccess) else src.tensor
                key = (p.op, id(space), version.get(id(space), 0), _pattern(src), dst.tile.dtype,
                       dst.tile.mem, dst.tile.partitions, dst.tile.free)
                if key in seen and memory.merge(seen[key], dst.tile):
                    renamed[dst.tile] = seen[key]
                    continue
                seen[key] = dst.tile
        for a, writes in p.accesses():
            if writes:
                version[id(a.space)] = version.get(id(a.space), 0) + 1
        kept.append(p)
    for p in kept:
        p.args = {k: replace(v, tile=renamed[v.tile]) if isinstance(v, TileAccess) and v.tile in renamed else v
                  for k, v in p.args.items()}
    program.instrs = kept


def _pattern(a: TileAccess | HbmAccess) -> tuple:
    if isinstance(a, TileAccess):
        return ("tile", a.first, a.partitions, a.offset, a.dims, a.skew)
    return ("hbm", a.dtype, a.partitions, a.partition_stride, a.offset, a.dims)
