"""Transposes on the Tensor engine: the way to turn a tile whose rows are on partitions into one whose columns
are, without an element-strided DMA (which pays for every element as its own piece).

    nc_transpose: psum[F, P] = src[P, F]    (a matmul of src against the identity, F <= 128)

A transpose keeps its input's type (nki.isa.nc_transpose), so a bank holds 1024 bf16 columns. Pieces that land on
the same partitions share a PSUM bank, side by side, up to a bank's width; one copy per bank then moves them to
their SBUF tile, casting to its type on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

from isa.operand import Engine
from neuronx_cc_lite.lower.instr import copy
from neuronx_cc_lite.tile.program import Program, Tile, TileAccess


@dataclass(frozen=True)
class Piece:
    src: TileAccess  # [P, F]: becomes F partitions x P columns
    dst: Tile  # SBUF
    offset: int  # element where the piece's P columns start in each partition of dst


def transpose_pieces(prog: Program, pieces: list[Piece], name: str) -> None:
    """Transpose every piece into its place. Consecutive pieces with the same F that lie side by side in the same
    destination share a bank and one copy out of it."""
    group: list[Piece] = []

    def flush() -> None:
        if not group:
            return
        first = group[0]
        f = _free(first.src)
        width = sum(p.src.partitions for p in group)
        acc = prog.psum(f, width, f"{name}/T", first.src.tile.dtype)
        at = 0
        for p in group:
            prog.emit("nc_transpose", Engine.PE, dst=acc.region(at, p.src.partitions, 0, f), src=p.src)
            at += p.src.partitions
        copy(prog, first.dst.region(first.offset, width, 0, f), acc.ap())
        group.clear()

    for p in pieces:
        bank = prog.target.psum_bank_bytes // p.src.tile.dtype.size  # columns of the input's type in a bank
        if group:
            last = group[-1]
            joins = (p.dst is last.dst and _free(p.src) == _free(last.src) and
                     p.src.tile.dtype is last.src.tile.dtype and p.offset == last.offset + last.src.partitions and
                     sum(q.src.partitions for q in group) + p.src.partitions <= bank)
            if not joins:
                flush()
        group.append(p)
    flush()


def _free(a: TileAccess) -> int:
    size = 1
    for n, _ in a.dims:
        size *= n
    return size
