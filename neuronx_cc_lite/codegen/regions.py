"""Memory regions and an index that finds the earlier accesses a new one overlaps.

A region is a box in one address space: (first partition, end partition, first byte, end byte). The space is a
memory (SBUF, PSUM or HBM, once operands are physical) or one virtual tile or HBM tensor (before allocation), so
the same index serves the scheduler's dependencies on the tile program and the semaphores on physical streams.

Boxes are bounding boxes of access patterns: never smaller than the truth, so no dependency is missed; a false
one only costs an edge or a wait.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Hashable

from isa.operand import Mem, Operand

Box = tuple[int, int, int, int]  # first partition, end partition, first byte, end byte


def box_of(o: Operand) -> Box:
    if o.mem is Mem.HBM:
        first, end = o.byte_span()
        return 0, 1, first, end
    first, last = o.partition_span
    return o.start_partition, o.start_partition + o.num_partitions, first, last + 1


def inside(a: Box, b: Box) -> bool:
    return b[0] <= a[0] and a[1] <= b[1] and b[2] <= a[2] and a[3] <= b[3]


@dataclass(eq=False, slots=True)
class Record:
    """One access: where, by whom (a stream, or -1 when streams are not yet known), at which program position."""

    box: Box
    stream: int
    index: int
    writes: bool
    alive: bool = True


class Index:
    """Live access records per space, found by address through a grid of several granularities: a record sits
    in at most four cells of the finest level whose cells it spans that few of, so a 4 KiB tile and a 100 MiB
    strided weight read are each found in a handful of cells, and a query visits only occupied cells."""

    LEVELS = (1 << 9, *(1 << shift for shift in range(12, 40, 4)))  # 512 B, 4 KiB, 64 KiB, ... cell sizes
    CELLS = 4

    def __init__(self) -> None:
        self.cells: dict[tuple[Hashable, int, int], list[Record]] = {}  # (space, level, cell) -> records
        self.occupied: dict[tuple[Hashable, int], list[int]] = {}  # (space, level) -> sorted occupied cells

    def _level(self, box: Box) -> int:
        for level, size in enumerate(self.LEVELS):
            if (box[3] - 1) // size - box[2] // size < self.CELLS:
                return level
        return len(self.LEVELS) - 1

    def find(self, space: Hashable, box: Box) -> list[Record]:
        found: dict[int, Record] = {}
        p0, p1, b0, b1 = box
        cells, occupied = self.cells, self.occupied
        for level, size in enumerate(self.LEVELS):
            keys = occupied.get((space, level))
            if not keys:
                continue
            first = bisect.bisect_left(keys, b0 // size)
            last = bisect.bisect_right(keys, (b1 - 1) // size)
            for key in keys[first:last]:
                bucket = cells[space, level, key]
                dead = False
                for r in bucket:  # the hot loop: the overlap test inlined
                    if not r.alive:
                        dead = True
                        continue
                    b = r.box
                    if b[0] < p1 and p0 < b[1] and b[2] < b1 and b0 < b[3]:
                        found[id(r)] = r
                if dead:
                    bucket[:] = [r for r in bucket if r.alive]
        return list(found.values())

    def add(self, space: Hashable, r: Record) -> None:
        level = self._level(r.box)
        size = self.LEVELS[level]
        keys = self.occupied.setdefault((space, level), [])
        for key in range(r.box[2] // size, (r.box[3] - 1) // size + 1):
            bucket = self.cells.setdefault((space, level, key), [])
            if not bucket:
                bisect.insort(keys, key)
            bucket.append(r)
