"""Cut large DMA transfers by partitions, so that several queues move one tile at once.

A queue runs one transfer at a time at one engine's rate; a 2 MiB tile on one queue takes 80 us while fifteen
queues idle. Each piece costs a launch (1.3 us), so pieces stay large: a transfer of more than two pieces' worth
is cut into pieces of about PIECE_BYTES, each a band of partitions (the DMA guide's advice: >= 32 KiB per transfer,
>= 4 KiB per partition row, which a band of a large tile keeps).
"""

from __future__ import annotations

from dataclasses import replace

from neuronx_cc_lite.lower.program import HbmAccess, PendingInstr, Program, TileAccess

PIECE_BYTES = 128 * 1024


def _bytes(p: PendingInstr) -> int:
    dst, src = p.args["dst"], p.args["src"]
    elements = dst.partitions
    for size, _ in dst.dims:
        elements *= size
    return elements * max(_dtype_size(dst), _dtype_size(src))


def _dtype_size(a: TileAccess | HbmAccess) -> int:
    return a.tile.dtype.size if isinstance(a, TileAccess) else a.dtype.size


def _band(a: TileAccess | HbmAccess, first: int, count: int) -> TileAccess | HbmAccess:
    if isinstance(a, TileAccess):
        return replace(a, first=a.first + first, partitions=count)
    return replace(a, offset=a.offset + first * a.partition_stride, partitions=count)


def split_transfers(program: Program) -> None:
    out: list[PendingInstr] = []
    for p in program.instrs:
        if p.op != "dma_copy" or _bytes(p) <= 2 * PIECE_BYTES:
            out.append(p)
            continue
        partitions = p.args["dst"].partitions
        pieces = min(partitions, -(-_bytes(p) // PIECE_BYTES))
        band = -(-partitions // pieces)
        for first in range(0, partitions, band):
            count = min(band, partitions - first)
            args = {**p.args, "dst": _band(p.args["dst"], first, count), "src": _band(p.args["src"], first, count)}
            out.append(PendingInstr(p.op, p.engine, p.queue, args, p.node))
    program.instrs = out
