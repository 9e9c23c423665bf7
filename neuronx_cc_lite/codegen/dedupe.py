"""Identical loads made once.

Operators load what they read into tiles of their own; once tensors live on chip (on_chip.py) many of those loads
become copies of the same home region (the Q, K and V projections each cast the same LayerNorm output to bf16).
A copy or DMA whose destination is a whole tile nothing else writes, reading the same source as an earlier one
(the same region, the same pattern, unwritten since, into the same type and shape), is dropped and its tile
becomes the earlier one's.
"""

from __future__ import annotations

from dataclasses import replace

from neuronx_cc_lite.lower.program import HbmAccess, PendingInstr, Program, Tile, TileAccess

_LOADS = ("tensor_copy", "dma_copy")


def _writers(program: Program) -> dict[Tile, int]:
    count: dict[Tile, int] = {}
    for p in program.instrs:
        for a, writes in p.accesses():
            if writes and isinstance(a, TileAccess):
                count[a.tile] = count.get(a.tile, 0) + 1
    return count


def dedupe_loads(program: Program) -> None:
    writers = _writers(program)
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
                if key in seen:
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
        return ("tile", a.first, a.partitions, a.offset, a.dims)
    return ("hbm", a.dtype, a.partitions, a.partition_stride, a.offset, a.dims)
