"""Semaphores for every cross-engine dependency.

Two instructions on different streams conflict when their operands overlap in memory and at least one of them
writes (read-after-write, write-after-read, write-after-write), HBM included. The later one must wait for the
earlier one to complete. Each stream owns one semaphore; an instruction that someone waits on increments its
stream's semaphore when it completes, so "instruction j of stream T is done" is "T's semaphore has reached the
number of signalling instructions of T up to j" (streams complete in order).

Waits already implied are left out: each stream carries a vector clock of what it knows to be complete, and a
dependency that the clock covers (directly, or through an earlier wait) needs no semaphore.

Footprints are bounding boxes (partitions x bytes, or a byte range of HBM): never smaller than the truth, so no
dependency is missed; a false one only costs a wait.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from isa.instructions import Instruction
from isa.operand import Mem, Operand

@dataclass(eq=False)
class _Record:
    box: tuple[int, int, int, int]  # first partition, end partition, first byte, end byte
    stream: int
    index: int  # position in program order
    writes: bool
    alive: bool = True


def _box(o: Operand) -> tuple[int, int, int, int]:
    if o.mem is Mem.HBM:
        first, end = o.byte_span()
        return 0, 1, first, end
    first, last = o.partition_span
    return o.start_partition, o.start_partition + o.num_partitions, first, last + 1


def _inside(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return b[0] <= a[0] and a[1] <= b[1] and b[2] <= a[2] and a[3] <= b[3]


class _Index:
    """Live access records per memory, found by address through a grid of several granularities: a record sits
    in at most four cells of the finest level whose cells it spans that few of, so a 4 KiB tile and a 100 MiB
    strided weight read are each found in a handful of cells, and a query visits only occupied cells."""

    LEVELS = tuple(1 << shift for shift in range(12, 40, 4))  # 4 KiB, 64 KiB, ... cell sizes
    CELLS = 4

    def __init__(self) -> None:
        self.cells: dict[tuple[Mem, int, int], list[_Record]] = {}  # (memory, level, cell) -> records
        self.occupied: dict[tuple[Mem, int], list[int]] = {}  # (memory, level) -> sorted occupied cells

    def _level(self, box: tuple[int, int, int, int]) -> int:
        for level, size in enumerate(self.LEVELS):
            if (box[3] - 1) // size - box[2] // size < self.CELLS:
                return level
        return len(self.LEVELS) - 1

    def find(self, mem: Mem, box: tuple[int, int, int, int]) -> list[_Record]:
        found: dict[int, _Record] = {}
        for level, size in enumerate(self.LEVELS):
            keys = self.occupied.get((mem, level))
            if not keys:
                continue
            first = bisect.bisect_left(keys, box[2] // size)
            last = bisect.bisect_right(keys, (box[3] - 1) // size)
            for key in keys[first:last]:
                bucket = self.cells[mem, level, key]
                bucket[:] = [r for r in bucket if r.alive]
                for r in bucket:
                    b = r.box
                    if b[0] < box[1] and box[0] < b[1] and b[2] < box[3] and box[2] < b[3]:  # the boxes overlap (inlined: the hot loop)
                        found[id(r)] = r
        return list(found.values())

    def add(self, mem: Mem, r: _Record) -> None:
        level = self._level(r.box)
        size = self.LEVELS[level]
        keys = self.occupied.setdefault((mem, level), [])
        for key in range(r.box[2] // size, (r.box[3] - 1) // size + 1):
            bucket = self.cells.setdefault((mem, level, key), [])
            if not bucket:
                bisect.insort(keys, key)
            bucket.append(r)


def synchronize(program: list[tuple[int, Instruction]], num_streams: int) -> None:
    """Set `waits` and `signal` on every instruction. `program` lists (stream, instruction) in program order; the
    semaphore of stream s is s."""
    index = _Index()
    written_hbm = _Index()  # every HBM write: a read that no later write overlaps need not be remembered
    for position, (stream, instr) in enumerate(program):
        for o in instr.writes():
            if o.mem is Mem.HBM:
                written_hbm.add(Mem.HBM, _Record(_box(o), stream, position, True))
    clocks = [[-1] * num_streams for _ in range(num_streams)]  # what each stream knows is complete
    done_clock: list[list[int]] = []  # per instruction: what is known complete once it completes
    waits_on: list[list[int]] = []  # per instruction: program positions it waits for
    for position, (stream, instr) in enumerate(program):
        needs: dict[int, int] = {}
        accesses = [(o, False) for o in instr.reads()] + [(o, True) for o in instr.writes()]
        for o, writes in accesses:
            box = _box(o)
            for r in index.find(o.mem, box):
                if r.stream != stream and (writes or r.writes):
                    needs[r.stream] = max(needs.get(r.stream, -1), r.index)
        clock = clocks[stream]
        mine = []
        for other, at in sorted(needs.items(), key=lambda kv: -kv[1]):
            if clock[other] >= at:
                continue
            mine.append(at)
            for s, known in enumerate(done_clock[at]):
                if known > clock[s]:
                    clock[s] = known
        clock[stream] = position
        waits_on.append(mine)
        done_clock.append(list(clock))
        for o, writes in accesses:
            box = _box(o)
            if o.mem is Mem.HBM and not writes and not any(w.index > position
                                                           for w in written_hbm.find(Mem.HBM, box)):
                continue  # nothing writes there later: this read can order nothing (weights, inputs)
            for r in index.find(o.mem, box):
                if _inside(r.box, box) and (writes or (r.stream == stream and not r.writes)):
                    r.alive = False  # the new access is ordered after r and covers it
            index.add(o.mem, _Record(box, stream, position, writes))
    signalled = {at for mine in waits_on for at in mine}
    count = [0] * num_streams
    ordinal: dict[int, int] = {}
    for position, (stream, instr) in enumerate(program):
        if position in signalled:
            count[stream] += 1
            ordinal[position] = count[stream]
            instr.signal = stream
        else:
            instr.signal = None
    for position, (stream, instr) in enumerate(program):
        instr.waits = tuple(sorted((program[at][0], ordinal[at]) for at in waits_on[position]))
