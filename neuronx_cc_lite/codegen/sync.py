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

from dataclasses import dataclass

from isa.instructions import Instruction
from isa.operand import Mem, Operand

_BUCKET = 4096  # bytes of address space per index bucket


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


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _inside(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return b[0] <= a[0] and a[1] <= b[1] and b[2] <= a[2] and a[3] <= b[3]


class _Index:
    """Live access records per memory, bucketed by byte address."""

    def __init__(self) -> None:
        self.buckets: dict[tuple[Mem, int], list[_Record]] = {}

    def _keys(self, mem: Mem, box: tuple[int, int, int, int]) -> range:
        return range(box[2] // _BUCKET, (box[3] - 1) // _BUCKET + 1)

    def find(self, mem: Mem, box: tuple[int, int, int, int]) -> list[_Record]:
        found: dict[int, _Record] = {}
        for key in self._keys(mem, box):
            bucket = self.buckets.get((mem, key))
            if not bucket:
                continue
            bucket[:] = [r for r in bucket if r.alive]
            for r in bucket:
                if _overlap(r.box, box):
                    found[id(r)] = r
        return list(found.values())

    def add(self, mem: Mem, r: _Record) -> None:
        for key in self._keys(mem, r.box):
            self.buckets.setdefault((mem, key), []).append(r)


def synchronize(program: list[tuple[int, Instruction]], num_streams: int) -> None:
    """Set `waits` and `signal` on every instruction. `program` lists (stream, instruction) in program order; the
    semaphore of stream s is s."""
    index = _Index()
    written_hbm = _Index()  # every HBM range the program writes: reads elsewhere (weights, inputs) order nothing
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
            if o.mem is Mem.HBM and not writes and not written_hbm.find(Mem.HBM, box):
                continue
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
