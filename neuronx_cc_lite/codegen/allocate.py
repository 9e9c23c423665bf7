"""Place every tile in SBUF or PSUM by liveness.

A tile lives from the first to the last instruction that names it. Walking the program in order, a tile gets its
place at its first use and gives it back after its last, so memory is reused. Every tile spans partitions
0..partitions-1 and a byte range of each; PSUM tiles get a whole bank each (a matmul writes within one bank).

Places are handed out next-fit from a cursor that keeps moving forward, so a freed range is reused as late as
possible: the engines that last read it have usually finished, and the write-after-read waits this reuse costs
seldom stall anyone. That gives double buffering without asking for it.
"""

from __future__ import annotations

from isa.operand import Mem
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.lower.program import Program, Tile, TileAccess


class _Arena:
    """Next-fit placement of byte ranges in [0, capacity), in units of `granule` bytes."""

    def __init__(self, capacity: int, granule: int) -> None:
        self.capacity = capacity
        self.granule = granule
        self.used: dict[int, int] = {}  # start -> end of each placed range
        self.cursor = 0

    def place(self, size: int) -> int | None:
        size = -(-size // self.granule) * self.granule
        for start in (self.cursor, 0):
            at = self._first_gap(start, size)
            if at is not None:
                self.used[at] = at + size
                self.cursor = at + size if at + size < self.capacity else 0
                return at
        return None

    def _first_gap(self, start: int, size: int) -> int | None:
        at = start
        for s, e in sorted(self.used.items()):
            if e <= at:
                continue
            if s >= at + size:
                break
            at = e
        return at if at + size <= self.capacity else None

    def free(self, start: int) -> None:
        del self.used[start]

    @property
    def live_bytes(self) -> int:
        return sum(e - s for s, e in self.used.items())


def allocate(program: Program) -> None:
    t = program.target
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    tiles: dict[int, Tile] = {}
    for i, instr in enumerate(program.instrs):
        for value in instr.args.values():
            if isinstance(value, TileAccess):
                key = id(value.tile)
                tiles[key] = value.tile
                first.setdefault(key, i)
                last[key] = i
    arenas = {Mem.SBUF: _Arena(t.sbuf_partition_bytes, 64), Mem.PSUM: _Arena(t.psum_partition_bytes,
                                                                            t.psum_bank_bytes)}
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for key in tiles:
        starts.setdefault(first[key], []).append(key)
        ends.setdefault(last[key], []).append(key)
    for i, instr in enumerate(program.instrs):
        for key in starts.get(i, ()):
            tile = tiles[key]
            arena = arenas[tile.mem]
            if tile.mem is Mem.PSUM and tile.bytes_per_partition > t.psum_bank_bytes:
                raise CompileError("NCC_INTERNAL", f"PSUM tile {tile.name} is larger than a bank", instr.node)
            at = arena.place(tile.bytes_per_partition)
            if at is None:
                raise CompileError(
                    f"NCC_{tile.mem.name}_FULL",
                    f"cannot place tile {tile.name} ({tile.bytes_per_partition} bytes per partition) in "
                    f"{tile.mem.name}: {arena.live_bytes} of {arena.capacity} bytes per partition are live in "
                    f"{len(arena.used)} tiles", instr.node)
            tile.offset = at
        for key in ends.get(i, ()):
            arenas[tiles[key].mem].free(tiles[key].offset)


def layout_hbm(program: Program) -> int:
    """Give every HBM tensor its offset: inputs, outputs, weights, then scratch. Returns the bytes used."""
    order = {"input": 0, "output": 1, "weight": 2, "scratch": 3}
    at = 0
    for tensor in sorted(program.hbm, key=lambda h: order[h.kind]):
        tensor.offset = at
        at += -(-max(tensor.nbytes, 1) // 64) * 64
    if at > program.target.hbm_bytes:
        raise CompileError("NCC_HBM_FULL", f"the model needs {at} bytes of HBM; a {program.target.name} chip has "
                           f"{program.target.hbm_bytes}")
    return at

