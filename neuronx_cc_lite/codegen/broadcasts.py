"""Rows repeated on every partition, made by the Tensor engine instead of by DMA.

A load whose source row repeats on every partition (a bias, LayerNorm's gamma and beta, an attention mask: an HBM
access with partition stride 0) costs a DMA launch plus a piece per partition: 8 us of a queue for a [128, 256]
fp32 tile. Instead the row is loaded once into one partition (a single piece) and PE repeats it,

    psum[p, f] = ones[0, p] * row[0, f]       (nc_matmul, contracting over one partition: exact)

512 columns at a time, and one copy per bank moves it to the tile. A row read by several broadcasts is loaded once,
and a broadcast made whole into a tile nothing else writes serves every identical one after it (the attention mask
of every head and layer).
"""

from __future__ import annotations

from dataclasses import replace

from isa.dtypes import DType
from isa.operand import Engine
from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr, Program, Tile, TileAccess

_MATMUL_TYPES = (DType.fp32, DType.bf16, DType.fp16)


def _qualifies(p: PendingInstr) -> bool:
    if p.op != "dma_copy":
        return False
    dst, src = p.args["dst"], p.args["src"]
    return (isinstance(src, HbmAccess) and isinstance(dst, TileAccess) and src.partitions > 1 and
            src.partition_stride == 0 and src.dtype in _MATMUL_TYPES and len(dst.dims) == 1 and
            dst.dims[0][1] == 1)


def broadcast_on_pe(program: Program) -> None:
    bank = program.target.psum_bank_fmax
    ones = {p.args["src"].dtype: program.ones(p.args["src"].dtype) for p in program.instrs if _qualifies(p)}
    writers: dict[Tile, int] = {}
    for p in program.instrs:
        for access, writes in p.accesses():
            if writes and isinstance(access, TileAccess):
                writers[access.tile] = writers.get(access.tile, 0) + 1
    rows: dict[tuple, Tile] = {}
    made: dict[tuple, Tile] = {}  # broadcasts whose tile nothing else writes: reused by identical ones
    renamed: dict[Tile, Tile] = {}
    out: list[PendingInstr] = []
    for p in list(program.instrs):
        if not _qualifies(p):
            out.append(p)
            continue
        dst, src = p.args["dst"], p.args["src"]
        width = dst.dims[0][0]
        key = (id(src.tensor), src.offset, src.dims, src.dtype)
        whole = dst.first == 0 and dst.offset == 0 and dst.partitions == dst.tile.partitions and \
            width == dst.tile.free and writers[dst.tile] == 1
        made_key = (key, dst.partitions, width, dst.tile.dtype)
        if whole and made_key in made:
            renamed[dst.tile] = made[made_key]
            continue
        if whole:
            made[made_key] = dst.tile
        if key not in rows:
            rows[key] = program.sbuf(1, width, src.dtype, f"{src.tensor.name}/row")
            out.append(PendingInstr("dma_copy", Engine.DMA, 0, {
                "dst": rows[key].ap(), "src": HbmAccess(src.tensor, src.dtype, 1, 0, src.offset, src.dims)}, p.node))
        row = rows[key]
        for c0 in range(0, width, bank):
            cn = min(bank, width - c0)
            acc = program.psum(dst.partitions, cn, f"{p.node}/broadcast")
            out.append(PendingInstr("nc_matmul", Engine.PE, 0, {
                "dst": acc.ap(), "stationary": ones[src.dtype].region(0, dst.partitions, 0, 1),
                "moving": row.region(c0, cn), "accumulate": False}, p.node))
            region = TileAccess(dst.tile, dst.first, dst.partitions, dst.offset + c0, ((cn, 1),))
            out.append(PendingInstr("tensor_copy", Engine.ACT, 0, {"dst": region, "src": acc.ap()}, p.node))
    for p in out:
        p.args = {k: replace(v, tile=renamed[v.tile]) if isinstance(v, TileAccess) and v.tile in renamed else v
                  for k, v in p.args.items()}
    program.instrs = out
