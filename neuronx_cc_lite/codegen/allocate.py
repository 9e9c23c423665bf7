"""The memory planner: where every tile lives in SBUF and PSUM. It is the one owner of on-chip memory; the
scheduler asks it only how many bytes are live (LiveBytes), and once the order is known it places every tile
(plan).

A tile lives from the first to the last instruction that names it. Every tile spans partitions 0..partitions-1
and a byte range of each; PSUM tiles get a whole bank each (a matmul writes within one bank).

Planned once the whole order is known, a tile's place is chosen knowing every lifetime: the tiles are taken
largest first, each into the smallest gap that the tiles living at the same time leave (best fit), so small tiles
cannot scatter over the memory and leave a large one no gap. Placing tiles as the schedule opened them, next-fit
from a cursor, had done that: 78 KiB of 192 live and no 48 KiB gap for a Gemm's weights (GPT-2 in fp32), and the
schedule fell back to the lowering order.

Reusing a range costs a write-after-read wait: the first writer of the new tile waits for the last reader of the
old one. So a tile's range is kept until the schedule expects its last reader to have finished (`free_after`):
given the schedule's estimates, no reuse makes an engine wait. When that leaves no room the plan is made on bare
lifetimes, and failing that, the schedule is made again with fewer bytes live (schedule.py).

Placing tile by tile (OnChipMemory, the scheduler's first tries), a tile may be asked for on top: as high in
SBUF as it fits, the cursor of the other tiles left where it was. The scheduler asks so for the weights' tiles
in its second round of such tries: long-lived, they then gather at the top while the working tiles come and go at
the bottom, and do not scatter gaps among them.

-O1 plans the lowering order on bare lifetimes, and when even that finds no room (the plan is a heuristic), places
the tiles walking the program as it runs, next-fit (`_Arena`), as the scheduler once did.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from isa.operand import Mem
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.tile.program import Program, Tile, TileAccess

SBUF_GRANULE = 64  # bytes: where an SBUF tile may start


class _Arena:
    """Placement of byte ranges in [0, capacity), in units of `granule` bytes (module docstring)."""

    def __init__(self, capacity: int, granule: int, reserve: int = 0) -> None:
        self.capacity = capacity
        self.granule = granule
        self.used: dict[int, int] = {}  # start -> end of each placed range
        self.cursor = 0
        self.small_limit = capacity - min(reserve, capacity // 2)  # where the small tiles' cursor wraps
        self.live = 0  # bytes placed

    def is_large(self, size: int) -> bool:
        return size * 8 >= self.capacity

    def place(self, size: int, top: bool = False) -> int | None:
        size = -(-size // self.granule) * self.granule
        if top:
            at = self._top_gap(size)
            return None if at is None else self._take(at, size, move_cursor=False)
        large = self.is_large(size)
        limit = self.capacity if large else self.small_limit
        for start, end in ((self.cursor, limit), (0, limit), (0, self.capacity)):
            at = self._first_gap(start, size, end)
            if at is not None:
                return self._take(at, size)
        at = self._best_gap(size) if large else None
        return None if at is None else self._take(at, size)

    def _take(self, at: int, size: int, move_cursor: bool = True) -> int:
        self.used[at] = at + size
        self.live += size
        if move_cursor:
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

    def _top_gap(self, size: int) -> int | None:
        """The highest start at which `size` fits (the top of the highest gap that holds it)."""
        end = self.capacity
        for s, e in sorted(self.used.items(), reverse=True):
            if end - e >= size:
                return end - size
            end = min(end, s)
        return end - size if end >= size else None

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
        self.live -= self.used.pop(start) - start

    @property
    def live_bytes(self) -> int:
        return self.live


class OnChipMemory:
    """SBUF and PSUM of one core: tiles placed and freed one at a time. `reserve`: the largest SBUF tile of the
    program, kept free of small tiles at the top of SBUF (module docstring)."""

    def __init__(self, target, reserve: int = 0) -> None:  # type: ignore[no-untyped-def]
        self.target = target
        self.arenas = {Mem.SBUF: _Arena(target.sbuf_partition_bytes, 64, reserve),
                       Mem.PSUM: _Arena(target.psum_partition_bytes, target.psum_bank_bytes)}

    def place(self, tile: Tile, top: bool = False) -> bool:
        """Give the tile a place; False (and nothing placed) when none is free. `top`: as high in SBUF as it fits."""
        if tile.mem is Mem.PSUM and tile.bytes_per_partition > self.target.psum_bank_bytes:
            raise CompileError("NCC_INTERNAL", f"PSUM tile {tile.name} is larger than a bank")
        at = self.arenas[tile.mem].place(tile.bytes_per_partition, top and tile.mem is Mem.SBUF)
        if at is None:
            return False
        tile.offset = at
        return True

    def free(self, tile: Tile) -> None:
        assert tile.offset is not None
        self.arenas[tile.mem].free(tile.offset)

    def room(self, mem: Mem) -> tuple[int, int]:
        """(bytes per partition live, capacity)."""
        return self.arenas[mem].live, self.arenas[mem].capacity

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


class LiveBytes:
    """The scheduler's view of SBUF and PSUM: whether a tile fits beside the live ones, counting bytes per
    partition against a budget (a fraction of SBUF; all of PSUM's banks). Places come later (plan)."""

    def __init__(self, target, fraction: float = 1.0) -> None:  # type: ignore[no-untyped-def]
        self.target = target
        self.capacity = {Mem.SBUF: int(target.sbuf_partition_bytes * fraction) // SBUF_GRANULE * SBUF_GRANULE,
                         Mem.PSUM: target.psum_partition_bytes}
        self.live = {Mem.SBUF: 0, Mem.PSUM: 0}
        self.count = {Mem.SBUF: 0, Mem.PSUM: 0}

    def size(self, tile: Tile) -> int:
        return footprint(tile, self.target)

    def place(self, tile: Tile, top: bool = False) -> bool:
        """Count the tile as live; False (and nothing counted) when it would not fit. (`top`: no places here.)"""
        size = self.size(tile)
        if self.live[tile.mem] + size > self.capacity[tile.mem]:
            return False
        self.live[tile.mem] += size
        self.count[tile.mem] += 1
        return True

    def free(self, tile: Tile) -> None:
        self.live[tile.mem] -= self.size(tile)
        self.count[tile.mem] -= 1

    def room(self, mem: Mem) -> tuple[int, int]:
        """(bytes per partition live, capacity)."""
        return self.live[mem], self.capacity[mem]

    def full(self, tile: Tile, node: str) -> CompileError:
        return CompileError(
            f"NCC_{tile.mem.name}_FULL",
            f"cannot place tile {tile.name} ({tile.bytes_per_partition} bytes per partition) in {tile.mem.name}: "
            f"{self.live[tile.mem]} of {self.capacity[tile.mem]} bytes per partition are live in "
            f"{self.count[tile.mem]} tiles", node)


def footprint(tile: Tile, target) -> int:  # type: ignore[no-untyped-def]
    """The bytes per partition a tile takes: whole granules of SBUF, a whole bank of PSUM."""
    if tile.mem is Mem.PSUM:
        if tile.bytes_per_partition > target.psum_bank_bytes:
            raise CompileError("NCC_INTERNAL", f"PSUM tile {tile.name} is larger than a bank")
        return target.psum_bank_bytes
    return -(-tile.bytes_per_partition // SBUF_GRANULE) * SBUF_GRANULE


@dataclass
class Lifetime:
    tile: Tile
    first: int  # position of the first instruction naming it
    end: int  # one past the position until which its range is kept


def lifetimes(uses: list[list[Tile]], free_after: list[int] | None = None) -> list[Lifetime]:
    """Each tile's lifetime in program order; with `free_after` (per position, the first position from which
    the instruction at that position is expected to be done), kept until its last reader is done too."""
    found: dict[Tile, Lifetime] = {}
    for i, tiles in enumerate(uses):
        for t in tiles:
            life = found.get(t)
            end = max(i + 1, free_after[i]) if free_after is not None else i + 1
            if life is None:
                found[t] = Lifetime(t, i, end)
            else:
                life.end = max(life.end, end)
    return list(found.values())


class _Timeline:
    """The placed lifetimes, found by position: each sits in the buckets of the positions it spans."""

    def __init__(self, positions: int) -> None:
        self.width = max(64, -(-positions // 1024))
        self.buckets: dict[int, list[tuple[Lifetime, int, int]]] = {}

    def add(self, life: Lifetime, at: int, size: int) -> None:
        for b in range(life.first // self.width, (life.end - 1) // self.width + 1):
            self.buckets.setdefault(b, []).append((life, at, size))

    def ranges_beside(self, life: Lifetime) -> list[tuple[int, int]]:
        """The [start, end) byte ranges of the placed tiles living at the same time as `life`, sorted."""
        found = {}
        for b in range(life.first // self.width, (life.end - 1) // self.width + 1):
            for other, at, size in self.buckets.get(b, ()):
                if other.first < life.end and life.first < other.end:
                    found[id(other)] = (at, at + size)
        return sorted(found.values())


def _gaps(taken: list[tuple[int, int]], size: int, capacity: int) -> list[tuple[int, int]]:
    """(start, length) of every gap between the sorted ranges `taken` that holds `size`, lowest first."""
    found, at = [], 0
    for start, end in [*taken, (capacity, capacity)]:
        if start - at >= size:
            found.append((at, start - at))
        at = max(at, end)
    return found


# The orders the tiles are placed in and how each picks among the gaps: none is best for every program (largest
# first into the smallest gap packs most transformers; largest first, lowest gap, most of the rest; in order of
# first use, a few CNNs whose tiles are a tenth of SBUF each), so each is tried in turn.
STRATEGIES: tuple[tuple[str, str], ...] = (("size", "best"), ("size", "lowest"), ("first use", "best"),
                                           ("area", "lowest"))


def _order(lives: list[Lifetime], by: str, target) -> list[Lifetime]:  # type: ignore[no-untyped-def]
    if by == "size":
        return sorted(lives, key=lambda life: (-footprint(life.tile, target), life.first))
    if by == "area":
        return sorted(lives, key=lambda life: (-footprint(life.tile, target) * (life.end - life.first), life.first))
    return sorted(lives, key=lambda life: (life.first, -footprint(life.tile, target)))


def _place_all(lives: list[Lifetime], positions: int, capacity: int, by: str, pick: str,
               target) -> dict[Tile, int] | Lifetime:  # type: ignore[no-untyped-def]
    """Each tile's place, or the lifetime that found no gap."""
    timeline, where = _Timeline(positions), {}
    for life in _order(lives, by, target):
        size = footprint(life.tile, target)
        gaps = _gaps(timeline.ranges_beside(life), size, capacity)
        if not gaps:
            return life
        at = min(gaps, key=lambda g: (g[1], g[0]))[0] if pick == "best" else gaps[0][0]
        where[life.tile] = at
        timeline.add(life, at, size)
    return where


def plan(program: Program, uses: list[list[Tile]], free_after: list[int] | None = None,
         strategies: tuple[tuple[str, str], ...] = STRATEGIES) -> None:
    """Give every tile its place, knowing every lifetime in program order (module docstring), by the first of
    `strategies` that finds room. Raises NCC_SBUF_FULL / NCC_PSUM_FULL, placing nothing, when none does."""
    target = program.target
    lives = lifetimes(uses, free_after)
    where: dict[Tile, int] = {}
    for mem, capacity in ((Mem.SBUF, target.sbuf_partition_bytes), (Mem.PSUM, target.psum_partition_bytes)):
        mine = [life for life in lives if life.tile.mem is mem]
        for by, pick in strategies:
            found = _place_all(mine, len(uses), capacity, by, pick, target)
            if isinstance(found, dict):
                where.update(found)
                break
        else:
            raise CompileError(
                f"NCC_{mem.name}_FULL",
                f"cannot place tile {found.tile.name} ({found.tile.bytes_per_partition} bytes per partition) in "
                f"{mem.name}: no gap of that size beside the tiles living at the same time (at most "
                f"{_peak(mine, target)} of {capacity} bytes per partition are live at once)",
                program.instrs[found.first].node)
    for tile, at in where.items():
        tile.offset = at


def _peak(lives: list[Lifetime], target) -> int:  # type: ignore[no-untyped-def]
    """The most bytes per partition the lifetimes hold at once."""
    events = sorted([(life.first, footprint(life.tile, target)) for life in lives] +
                    [(life.end, -footprint(life.tile, target)) for life in lives])
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


def free_positions(starts: list[float], ends: list[float]) -> list[int]:
    """Per position of a schedule, the first position from which every instruction starts after this one is
    expected to end (`starts`, `ends`: the schedule's estimates, in its order)."""
    earliest_from = []  # per position p: the earliest start of the instructions from p on (never decreasing)
    low = float("inf")
    for start in reversed(starts):
        low = min(low, start)
        earliest_from.append(low)
    earliest_from.reverse()
    return [bisect.bisect_left(earliest_from, end) for end in ends]


def allocate(program: Program) -> None:
    """-O1: plan the tiles on their lifetimes in lowering order; when that finds no room, place them walking the
    program, next-fit."""
    uses = tile_uses(program)
    try:
        plan(program, uses)
        return
    except CompileError as e:
        if e.code not in ("NCC_SBUF_FULL", "NCC_PSUM_FULL"):
            raise
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
    """Give every HBM tensor its offset: inputs, device state, outputs, weights, then scratch. Returns the bytes
    used."""
    order = {TensorKind.INPUT: 0, TensorKind.STATE: 1, TensorKind.OUTPUT: 2, TensorKind.WEIGHT: 3,
             TensorKind.SCRATCH: 4}
    at = 0
    for tensor in sorted(program.hbm, key=lambda h: order[h.kind]):
        tensor.offset = at
        at += -(-max(tensor.nbytes, 1) // 64) * 64
    if at > program.target.hbm_bytes:
        raise CompileError("NCC_HBM_FULL", f"the model needs {at} bytes of HBM; a {program.target.name} chip has "
                           f"{program.target.hbm_bytes}")
    return at

