"""Place every tile in SBUF or PSUM by liveness: the memory planner's placement, used by the scheduler as it
orders the program (schedule.py) and, for -O1, here in lowering order.

A tile lives from the first to the last instruction that names it. Walking the program in order, a tile gets its
place at its first use and gives it back after its last, so memory is reused. Every tile spans partitions
0..partitions-1 and a byte range of each; PSUM tiles get a whole bank each (a matmul writes within one bank).

Places are handed out next-fit from a cursor that keeps moving forward, so a freed range is reused as late as
possible: the engines that last read it have usually finished, and the write-after-read waits this reuse costs
seldom stall anyone. That gives double buffering without asking for it. Small tiles scattered by the cursor could
leave a memory mostly free with no gap for a large tile (a resident block of weights, an eighth of the memory or
more): a large tile that finds no gap after the cursor takes the smallest gap that holds it, and when the
program's largest tile takes a quarter of the memory or more, small tiles keep below the top `reserve` bytes
(that tile's size), which they take only when nothing else is free.
"""

from __future__ import annotations

from isa.operand import Mem
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.lower.program import Program, Tile, TileAccess


class _Arena:
    """Placement of byte ranges in [0, capacity), in units of `granule` bytes (module docstring)."""

    def __init__(self, capacity: int, granule: int, reserve: int = 0) -> None:
        self.capacity = capacity
        self.granule = granule
        self.used: dict[int, int] = {}  # start -> end of each placed range
        self.cursor = 0
        self.small_limit = capacity - min(reserve, capacity // 2)  # where the small tiles' cursor wraps

    def is_large(self, size: int) -> bool:
        return size * 8 >= self.capacity

    def place(self, size: int) -> int | None:
        size = -(-size // self.granule) * self.granule
        large = self.is_large(size)
        limit = self.capacity if large else self.small_limit
        for start, end in ((self.cursor, limit), (0, limit), (0, self.capacity)):
            at = self._first_gap(start, size, end)
            if at is not None:
                return self._take(at, size)
        at = self._best_gap(size) if large else None
        return None if at is None else self._take(at, size)

    def _take(self, at: int, size: int) -> int:
        self.used[at] = at + size
        self.cursor = at + size if at + size < self.capacity else 0
        return at

    def _best_gap(self, size: int) -> int | None:
        """The start of the smallest gap that holds `size`."""
        best, at = None, 0
        for s, e in [*sorted(self.used.items()), (self.capacity, self.capacity)]:
            if s - at >= size and (best is None or s - at < best[1]):
                best = (at, s - at)
            at = max(at, e)
        return None if best is None else best[0]

    def _first_gap(self, start: int, size: int, limit: int) -> int | None:
        at = start
        for s, e in sorted(self.used.items()):
            if e <= at:
                continue
            if s >= at + size:
                break
            at = e
        return at if at + size <= limit else None

    def free(self, start: int) -> None:
        del self.used[start]

    @property
    def live_bytes(self) -> int:
        return sum(e - s for s, e in self.used.items())


class OnChipMemory:
    """SBUF and PSUM of one core: tiles placed and freed one at a time. `reserve`: the largest SBUF tile of the
    program, kept free of small tiles at the top of SBUF (module docstring)."""

    def __init__(self, target, reserve: int = 0) -> None:  # type: ignore[no-untyped-def]
        self.target = target
        self.arenas = {Mem.SBUF: _Arena(target.sbuf_partition_bytes, 64, reserve),
                       Mem.PSUM: _Arena(target.psum_partition_bytes, target.psum_bank_bytes)}

    def place(self, tile: Tile) -> bool:
        """Give the tile a place; False (and nothing placed) when none is free."""
        if tile.mem is Mem.PSUM and tile.bytes_per_partition > self.target.psum_bank_bytes:
            raise CompileError("NCC_INTERNAL", f"PSUM tile {tile.name} is larger than a bank")
        at = self.arenas[tile.mem].place(tile.bytes_per_partition)
        if at is None:
            return False
        tile.offset = at
        return True

    def free(self, tile: Tile) -> None:
        assert tile.offset is not None
        self.arenas[tile.mem].free(tile.offset)

    def full(self, tile: Tile, node: str) -> CompileError:
        arena = self.arenas[tile.mem]
        return CompileError(
            f"NCC_{tile.mem.name}_FULL",
            f"cannot place tile {tile.name} ({tile.bytes_per_partition} bytes per partition) in {tile.mem.name}: "
            f"{arena.live_bytes} of {arena.capacity} bytes per partition are live in {len(arena.used)} tiles", node)


def tile_uses(program: Program) -> list[list[Tile]]:
    """The tiles each instruction names, in first-access order."""
    return [list(dict.fromkeys(a.tile for a, _ in p.accesses() if isinstance(a, TileAccess)))
            for p in program.instrs]


def large_tile_reserve(program: Program, uses: list[list[Tile]]) -> int:
    """The bytes per partition the small tiles leave free at the top of SBUF: the program's largest tile when it
    takes a quarter of SBUF or more, else none (module docstring)."""
    capacity = program.target.sbuf_partition_bytes
    largest = max((t.bytes_per_partition for ts in uses for t in ts if t.mem is Mem.SBUF), default=0)
    return largest if largest * 4 >= capacity else 0


def allocate(program: Program) -> None:
    """Place the tiles walking the program in its order."""
    uses = tile_uses(program)
    last: dict[Tile, int] = {}
    for i, tiles in enumerate(uses):
        for tile in tiles:
            last[tile] = i
    memory = OnChipMemory(program.target, large_tile_reserve(program, uses))
    placed: set[Tile] = set()
    for i, tiles in enumerate(uses):
        for tile in tiles:
            if tile not in placed:
                if not memory.place(tile):
                    raise memory.full(tile, program.instrs[i].node)
                placed.add(tile)
        for tile in tiles:
            if last[tile] == i:
                memory.free(tile)


def layout_hbm(program: Program) -> int:
    """Give every HBM tensor its offset: inputs, device state, outputs, weights, then scratch. Returns the bytes used."""
    order = {"input": 0, "state": 1, "output": 2, "weight": 3, "scratch": 4}
    at = 0
    for tensor in sorted(program.hbm, key=lambda h: order[h.kind]):
        tensor.offset = at
        at += -(-max(tensor.nbytes, 1) // 64) * 64
    if at > program.target.hbm_bytes:
        raise CompileError("NCC_HBM_FULL", f"the model needs {at} bytes of HBM; a {program.target.name} chip has "
                           f"{program.target.hbm_bytes}")
    return at

