"""Semaphores for every cross-engine dependency.

Two instructions on different streams conflict when their operands overlap in memory and at least one of them
writes (read-after-write, write-after-read, write-after-write), HBM included. The later one must wait for the
earlier one to complete. Each stream owns one semaphore; an instruction that someone waits on increments its
stream's semaphore when it completes, so "instruction j of stream T is done" is "T's semaphore has reached the
number of signalling instructions of T up to j" (streams complete in order).

Waits already implied are left out: each stream carries a vector clock of what it knows to be complete, and a
dependency that the clock covers (directly, or through an earlier wait) needs no semaphore.

Footprints are bounding boxes (regions.py): never smaller than the truth, so no dependency is missed; a false one
only costs a wait.
"""

from __future__ import annotations

from isa.instructions import Instruction
from isa.operand import Mem
from neuronx_cc_lite.codegen.regions import Index, Record, box_of, inside


def synchronize(program: list[tuple[int, Instruction]], num_streams: int) -> None:
    """Set `waits` and `signal` on every instruction. `program` lists (stream, instruction) in program order; the
    semaphore of stream s is s."""
    index = Index()
    written_hbm = Index()  # every HBM write: a read that no later write overlaps need not be remembered
    for position, (stream, instr) in enumerate(program):
        for o in instr.writes():
            if o.mem is Mem.HBM:
                written_hbm.add(Mem.HBM, Record(box_of(o), stream, position, True))
    clocks = [[-1] * num_streams for _ in range(num_streams)]  # what each stream knows is complete
    done_clock: list[list[int]] = []  # per instruction: what is known complete once it completes
    waits_on: list[list[int]] = []  # per instruction: program positions it waits for
    for position, (stream, instr) in enumerate(program):
        needs: dict[int, int] = {}
        accesses = [(o, False) for o in instr.reads()] + [(o, True) for o in instr.writes()]
        boxes = [box_of(o) for o, _ in accesses]
        overlapping = [index.find(o.mem, box) for (o, _), box in zip(accesses, boxes)]
        for (o, writes), earlier in zip(accesses, overlapping):
            for r in earlier:
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
        for (o, writes), box, earlier in zip(accesses, boxes, overlapping):
            if o.mem is Mem.HBM and not writes and not any(w.index > position
                                                           for w in written_hbm.find(Mem.HBM, box)):
                continue  # nothing writes there later: this read can order nothing (weights, inputs)
            # (the records found before this instruction's own were added: one of its own that another of its
            # accesses covers stays alive, which costs nothing but a record)
            for r in earlier:
                if inside(r.box, box) and (writes or (r.stream == stream and not r.writes)):
                    r.alive = False  # the new access is ordered after r and covers it
            index.add(o.mem, Record(box, stream, position, writes))
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
