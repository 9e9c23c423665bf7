"""Cut large DMA transfers (copies and gathers) by partitions, so that several queues move one tile at once.

A queue moves one transfer's data at a time at 17 GB/s (isa/target.py); a 2 MiB tile on one queue takes 123 us
while fifteen queues idle. Each piece waits a transfer's latency (1.3 us), hidden behind the one before it on its
queue (queues keep two transfers in flight), so pieces need not be large: a transfer is cut into pieces of about
PIECE_BYTES (two at least), each a band of partitions, the DMA guide's floor of 32 KiB per transfer, at which a
piece moves for 1.9 us, longer than the latency it hides. Larger pieces left a tile's last store on one or two
queues for up to 7.7 us after its producer (ResNet-50 bf16 on inf2: 494.6 -> 448.8 us). The transfers around a collective sit on the chain
store -> collective -> load between ranks, on which nothing else runs, so their latency is all that counts: a
load of what a collective wrote is cut into pieces of EXCHANGE_PIECE_BYTES over many queues, a store of what it
reads into one piece per store queue (BERT-12 at --tp 2: 20% less latency).
"""

from __future__ import annotations

import math
from dataclasses import replace

from isa.operand import Engine
from neuronx_cc_lite.codegen.schedule import split_queues
from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr, Program, TileAccess

PIECE_BYTES = 32 * 1024
EXCHANGE_PIECE_BYTES = 16 * 1024
# A gather starts a chain of dependent work (an embedding lookup feeds everything after it): its bands are
# smaller, so that it finishes soon after its indices arrive; so are the bands of a small transfer over many
# partitions (its indices, a column of constants), whose cost is mostly one piece per partition.
GATHER_PARTITIONS = 32


def _bytes(p: PendingInstr) -> int:
    dst, src = p.args["dst"], p.args["src"]
    return dst.partitions * _free(dst) * max(_dtype_size(dst), _dtype_size(src))


def _dtype_size(a: TileAccess | HbmAccess) -> int:
    return a.tile.dtype.size if isinstance(a, TileAccess) else a.dtype.size


def _band(a: TileAccess | HbmAccess, first: int, count: int) -> TileAccess | HbmAccess:
    if isinstance(a, TileAccess):
        return replace(a, first=a.first + first, partitions=count, offset=a.offset + first * a.skew)
    return replace(a, offset=a.offset + first * a.partition_stride, partitions=count)


def _fan(p: PendingInstr) -> tuple[int, int] | None:
    """(dst, src) partitions for each partition of the side with fewer: (1, 1) for a copy between like shapes;
    (H, 1) for one that fans each source partition's runs out over H destination partitions (a depthwise layer's
    rows, lower/row_depthwise.py), (1, H) for one that gathers them in; None when the sides' rows do not
    correspond."""
    dst, src = p.args["dst"], p.args["src"]
    if dst.partitions == src.partitions:
        return 1, 1
    small, big = sorted((dst, src), key=lambda a: a.partitions)
    if big.partitions % small.partitions or _free(small) * small.partitions != _free(big) * big.partitions:
        return None
    ratio = big.partitions // small.partitions
    return (ratio, 1) if big is dst else (1, ratio)


def _free(a: TileAccess | HbmAccess) -> int:
    """Elements per partition of the access."""
    return math.prod(size for size, _ in a.dims)


def _exchanged(program: Program, field: str) -> set[int]:
    """The HBM tensors collectives write (field "dst") or read ("src"), by id."""
    return {id(p.args[field].tensor) for p in program.instrs
            if p.engine is Engine.CC and isinstance(p.args[field], HbmAccess)}


def split_transfers(program: Program) -> None:
    out: list[PendingInstr] = []
    received, sent = _exchanged(program, "dst"), _exchanged(program, "src")
    store_queues = len(split_queues(program)[1])
    for p in program.instrs:
        partitions = p.args["dst"].partitions if p.op in ("dma_copy", "dma_gather") else 0
        src, dst = p.args.get("src"), p.args.get("dst")
        fan = _fan(p) if p.op == "dma_copy" else (1, 1)
        if fan is None:  # sides whose partitions do not correspond: whole
            out.append(p)
            continue
        partitions //= fan[0]  # (cut along the side of fewer partitions, each row of it a band of the other's)
        if p.op == "dma_copy" and _bytes(p) > EXCHANGE_PIECE_BYTES and isinstance(src, HbmAccess) and \
                id(src.tensor) in received:
            band = -(-partitions // min(partitions, -(-_bytes(p) // EXCHANGE_PIECE_BYTES)))
        elif p.op == "dma_copy" and _bytes(p) > EXCHANGE_PIECE_BYTES and isinstance(dst, HbmAccess) and \
                id(dst.tensor) in sent:
            band = -(-partitions // min(partitions, store_queues))  # one piece per store queue
        elif p.op == "dma_gather" and partitions > GATHER_PARTITIONS:
            band = GATHER_PARTITIONS
        elif p.op == "dma_copy" and _bytes(p) > PIECE_BYTES // 2:
            # at least two pieces above 64 KiB: a transfer alone on the critical path halves its latency
            band = -(-partitions // min(partitions, max(2, -(-_bytes(p) // PIECE_BYTES))))
        elif p.op == "dma_copy" and partitions > 2 * GATHER_PARTITIONS:
            band = GATHER_PARTITIONS  # a small transfer over many partitions pays mostly for its rows: in bands
        else:
            out.append(p)
            continue
        for first in range(0, partitions, band):
            count = min(band, partitions - first)
            args = {**p.args, "dst": _band(p.args["dst"], first * fan[0], count * fan[0])}
            if p.op == "dma_copy":
                args["src"] = _band(p.args["src"], first * fan[1], count * fan[1])
            else:  # a gather: each partition's row comes from its own index; the table is read whole
                args["index"] = _band(p.args["index"], first, count)
            out.append(PendingInstr(p.op, p.engine, p.queue, args, p.node))
    program.instrs = out
