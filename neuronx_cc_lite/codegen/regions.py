"""Memory regions and an index that finds the earlier accesses a new one overlaps.

A region is a box in one address space: (first partition, end partition, first byte, end byte). The space is a
memory (SBUF, PSUM or HBM, once operands are physical) or one virtual tile or HBM tensor (before allocation), so
the same index serves the scheduler's dependencies on the tile program and the semaphores on physical streams.

Boxes are bounding boxes of access patterns: never smaller than the truth, so no dependency is missed; a false
one only costs an edge or a wait, but those can add up: the stores of a channel-major output (one run of bytes
per channel, row block after row block) have interleaved bounding boxes, and a write-after-write edge between
each pair serializes them; the memsets of a padded tile's border would hold back the load of its interior. So two
accesses whose boxes meet are compared run by run (`runs`, `disjoint`), up to `MAX_RUNS` runs each; beyond that
the box stands.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from isa.operand import Mem, Operand

Box = tuple[int, int, int, int]  # first partition, end partition, first byte, end byte

HBM = Mem.HBM  # (looked up once: an enum member costs ten times a global to look up on its class, per access)


def box_of(o: Operand) -> Box:
    # (Operand.partition_span and byte_span summed by hand, in half the time: the semaphores and the
    # dependencies ask it of every access)
    size = o.dtype.size
    end = o.offset + size  # one past the last byte the pattern reaches inside a partition (SBUF, PSUM) or in HBM
    for n, stride in o.dims:
        end += (n - 1) * stride * size
    if o.mem is HBM:
        return 0, 1, o.offset, end + (o.num_partitions - 1) * o.partition_stride * size
    # (a DMA's skewed rows: the box of every row, each from its own start)
    return o.start_partition, o.start_partition + o.num_partitions, o.offset, \
        end + (o.num_partitions - 1) * o.partition_stride * size


def inside(a: Box, b: Box) -> bool:
    return b[0] <= a[0] and a[1] <= b[1] and b[2] <= a[2] and a[3] <= b[3]


MAX_RUNS = 4096  # runs compared exactly per HBM access; a pattern with more is taken as its box


Runs = tuple[list[int], list[int]]  # sorted, merged [start, end) byte runs: (starts, ends)


def runs(o: Operand) -> Runs | None:
    """The byte runs an operand touches: over the whole of HBM (the partition axis is one more stride there),
    inside each of its partitions in SBUF and PSUM (every partition has the same pattern; a DMA's skewed rows are
    taken together, the runs of any of them). None when there would be more than MAX_RUNS."""
    size = o.dtype.size
    # (HBM: the partition axis is one more stride; a DMA's skewed SBUF rows: every row's runs, in each of them)
    dims = ((o.num_partitions, o.partition_stride), *o.dims) if o.mem is HBM or o.partition_stride else o.dims
    # the innermost dimensions that are dense (or of one) make one run: almost every pattern is that one run, so
    # it is found in the elements' strides, before anything else is made
    run, inner = size, len(dims)
    while inner and (dims[inner - 1][0] == 1 or dims[inner - 1][1] * size == run):
        inner -= 1
        run *= dims[inner][0]
    if not inner:
        return [o.offset], [o.offset + run]
    dims = [(n, stride * size) for n, stride in dims[:inner] if n > 1]  # byte strides; a dimension of one adds nothing
    if any(stride < 0 for _, stride in dims) or math.prod(n for n, _ in dims) > MAX_RUNS:
        return None
    starts = np.zeros(1, np.int64) + o.offset
    for n, stride in dims:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * stride).ravel()
    starts = np.unique(starts)
    # merge runs that touch or overlap: a run starts a new piece unless it begins before the furthest end so far
    furthest = np.maximum.accumulate(starts + run)
    new = np.ones(len(starts), bool)
    new[1:] = starts[1:] > furthest[:-1]
    heads = np.flatnonzero(new)
    tails = np.append(heads[1:], len(starts)) - 1
    return starts[heads].tolist(), furthest[tails].tolist()


def disjoint(a: Runs, b: Runs) -> bool:
    """Whether two run lists share no byte."""
    if len(a[0]) > len(b[0]):
        a, b = b, a
    b_starts, b_ends = b
    for start, end in zip(*a):  # the last run of b that starts before this one ends must end by its start
        j = bisect.bisect_left(b_starts, end) - 1
        if j >= 0 and b_ends[j] > start:
            return False
    return True


def covers(a: Runs, b: Runs) -> bool:
    """Whether the runs `a` contain every byte of the runs `b`."""
    a_starts, a_ends = a
    for start, end in zip(*b):  # inside the last run of a that starts at or before it
        j = bisect.bisect_right(a_starts, start) - 1
        if j < 0 or a_ends[j] < end:
            return False
    return True


@dataclass(eq=False, slots=True)
class Record:
    """One access: where, by whom (a stream, or -1 when streams are not yet known), at which program position."""

    box: Box
    stream: int
    index: int
    writes: bool
    alive: bool = True
    operand: Operand | None = None  # compared run by run with another access whose box meets this one
    _runs: object = False  # runs(operand), once asked for (False: not yet)

    def runs(self) -> Runs | None:
        if self._runs is False:
            self._runs = runs(self.operand) if self.operand is not None else None
        return self._runs  # type: ignore[return-value]

    def meets(self, other: Record) -> bool:
        """Whether the two accesses, whose boxes meet, share a byte (True when either is not exact)."""
        a, b = self.runs(), other.runs()
        if a is None or b is None or (len(a[0]) == 1 and len(b[0]) == 1):
            return True  # two single runs whose boxes meet overlap
        return not disjoint(a, b)

    def meeting(self, records: list[Record]) -> list[Record]:
        """Those of `records` (whose boxes meet this one's) that share a byte with this access: `meets` for each,
        this access's runs taken once (the dependencies ask it of every record they find)."""
        mine = self.runs()
        if mine is None:
            return records
        single = len(mine[0]) == 1
        found = []
        for r in records:
            theirs = r.runs()
            if theirs is None or (single and len(theirs[0]) == 1) or not disjoint(mine, theirs):
                found.append(r)
        return found

    def covers(self, other: Record) -> bool:
        """Whether this access (a write, ordered after the other) may stand for the other from now on: it touches
        every byte the other does. A write taken as its box (no runs) stands for whatever its box holds, since
        anything that meets that box also meets it."""
        if not inside(other.box, self.box):
            return False
        a = self.runs()
        if a is None or len(a[0]) == 1:
            return True
        b = other.runs()
        return b is not None and covers(a, b)


# `known` and `settled` for records of no stream (-1, before streams are assigned): nothing is known complete
NO_STREAMS = (-1,)


class _Grid:
    """The cells of one level in one space: each occupied cell's live records, in program order."""

    __slots__ = ("level", "size", "cells", "occupied", "reach")

    def __init__(self, level: int, size: int) -> None:
        self.level, self.size = level, size
        self.cells: dict[int, list[Record]] = {}
        self.occupied: list[int] = []  # the keys of `cells`, sorted
        self.reach = 0  # the most cells after its first that any record filed here spans


class Index:
    """Live access records per space, found by address through a grid of several granularities. A record is
    filed once, in the first cell it spans at the finest level whose cells it spans at most CELLS of; a query
    visits, level by level, the occupied cells from its own first cell less the widest record's reach at that
    level to its last cell. So a 4 KiB tile and a 100 MiB strided weight read are each filed in one cell, each
    record is met at most once per query (no set to drop repeats), and a query visits only occupied cells: a cell
    whose records all died is dropped, and a space has a grid only for the levels it has records at (so a query
    costs little beyond the records in the cells it visits: the compile of BERT-base asks a hundred thousand)."""

    LEVELS = (1 << 9, *(1 << shift for shift in range(12, 40, 4)))  # 512 B, 4 KiB, 64 KiB, ... cell sizes
    CELLS = 4

    def __init__(self) -> None:
        self.grids: dict[Hashable, list[_Grid]] = {}  # space -> a grid per level it has records at

    def _level(self, box: Box) -> int:
        for level, size in enumerate(self.LEVELS):
            if (box[3] - 1) // size - box[2] // size < self.CELLS:
                return level
        return len(self.LEVELS) - 1

    def find(self, space: Hashable, box: Box, known: Sequence[int] = NO_STREAMS,
             settled: Sequence[int] = NO_STREAMS) -> list[Record]:
        """The live records whose boxes meet `box` and that the asker does not know complete: per stream, `known`
        is the last position the asker knows complete, `settled` the last position every stream still to run
        knows complete (settled <= known); records at or before `settled` can order nothing more, and die here."""
        found: list[Record] = []
        p0, p1, b0, b1 = box
        for grid in self.grids.get(space, ()):
            keys, size = grid.occupied, grid.size
            first = bisect.bisect_left(keys, b0 // size - grid.reach)
            last = bisect.bisect_right(keys, (b1 - 1) // size)
            if first == last:
                continue
            cells = grid.cells
            for key in keys[first:last]:
                bucket = cells[key]
                dead = False
                for r in bucket:  # the hot loop: the tests inlined
                    if r.index <= known[r.stream]:
                        if not r.alive or r.index <= settled[r.stream]:
                            r.alive = False
                            dead = True
                        continue
                    if not r.alive:
                        dead = True
                        continue
                    b = r.box
                    if b[0] < p1 and p0 < b[1] and b[2] < b1 and b0 < b[3]:
                        found.append(r)
                if dead:
                    bucket[:] = [r for r in bucket if r.alive]
                    if not bucket:
                        del cells[key]
                        del keys[bisect.bisect_left(keys, key)]
        return found

    def add(self, space: Hashable, r: Record) -> None:
        level = self._level(r.box)
        grids = self.grids.get(space)
        if grids is None:
            grids = self.grids[space] = []
        for grid in grids:
            if grid.level == level:
                break
        else:
            grid = _Grid(level, self.LEVELS[level])
            grids.append(grid)
        first = r.box[2] // grid.size
        bucket = grid.cells.get(first)
        if bucket is None:
            bucket = grid.cells[first] = []
            bisect.insort(grid.occupied, first)
        bucket.append(r)
        reach = (r.box[3] - 1) // grid.size - first
        if reach > grid.reach:
            grid.reach = reach


class Conflicts:
    """The records of the accesses so far, reads and writes filed apart: an access conflicts with the writes it
    meets and, if it writes, with the reads too; so a read never visits the reads (the reads of a tile that a
    hundred matmuls read would otherwise be visited by every read after them)."""

    def __init__(self) -> None:
        self.reads, self.writes = Index(), Index()

    def find(self, space: Hashable, r: Record, known: Sequence[int] = NO_STREAMS,
             settled: Sequence[int] = NO_STREAMS) -> list[Record]:
        """The live records (Index.find) whose boxes meet r's and of which r or they write."""
        found = self.writes.find(space, r.box, known, settled)
        if r.writes:
            found += self.reads.find(space, r.box, known, settled)
        return found

    def add(self, space: Hashable, r: Record) -> None:
        (self.writes if r.writes else self.reads).add(space, r)
