"""Semaphores for every cross-engine dependency.

Two instructions on different streams conflict when their operands overlap in memory and at least one of them
writes (read-after-write, write-after-read, write-after-write), HBM included. The later one must wait for the
earlier one to complete. Each stream owns one semaphore; an instruction that someone waits on increments its
stream's semaphore when it completes, so "instruction j of stream T is done" is "T's semaphore has reached the
number of signalling instructions of T up to j" (streams complete in order).

Waits already implied are left out: each stream carries a vector clock of what it knows to be complete, and a
dependency that the clock covers (directly, or through an earlier wait) needs no semaphore.

Footprints are bounding boxes (regions.py): never smaller than the truth, so no dependency is missed; a false one
only costs a wait. Accesses whose boxes meet are compared byte run by byte run, as the scheduler's were.

The index is asked only for the records the stream does not know complete (most of those that meet an access
are known: a thousand positions may pass before every stream knows a record complete and it dies). A write
retires the records it covers among those; one it covers that its stream knew complete stays alive, and makes no
difference: a later access that meets it meets the write too (or the write's own successor), which is ordered
after it, and waiting for the write (or knowing it complete) covers it.
"""

from __future__ import annotations

from isa.instructions import Instruction
from neuronx_cc_lite.codegen.regions import HBM, Conflicts, Index, Record, box_of


# How often (in instructions) the positions every stream knows complete are recomputed: their records are dropped
# from the index, whose queries otherwise visit every read no later write happened to cover (about a thousand per
# SBUF query in BERT-base).
KNOWN_EVERY = 256


def synchronize(program: list[tuple[int, Instruction]], num_streams: int,
                anchors: dict[int, int] | None = None) -> None:
    """Set `waits` and `signal` on every instruction. `program` lists (stream, instruction) in program order; the
    semaphore of stream s is s. `anchors`: position -> an earlier position it must also follow (emit.py)."""
    anchors = anchors or {}
    index = Conflicts()
    # every instruction's accesses, reads first (taken before the loop, which needs the HBM writes of all)
    accesses = [[Record(box_of(o), stream, position, False, operand=o) for o in instr.reads()] +
                [Record(box_of(o), stream, position, True, operand=o) for o in instr.writes()]
                for position, (stream, instr) in enumerate(program)]
    written_hbm = Index()  # every HBM write: a read that no later write overlaps need not be remembered
    for mine in accesses:
        for access in mine:
            if access.writes and access.operand.mem is HBM:
                written_hbm.add(HBM, Record(access.box, -1, access.index, True))
    clocks = [[-1] * num_streams for _ in range(num_streams)]  # what each stream knows is complete
    left = [0] * num_streams  # instructions each stream has still to run
    for stream, _ in program:
        left[stream] += 1
    settled = [-1] * num_streams  # per stream: the last position every stream still to run knows complete
    done_clock: list[list[int]] = []  # per instruction: what is known complete once it completes
    waits_on: list[list[int]] = []  # per instruction: program positions it waits for
    for position, (stream, instr) in enumerate(program):
        needs: dict[int, int] = {}
        own = accesses[position]
        if position % KNOWN_EVERY == 0:  # records every stream knows complete cannot make anyone wait: they die
            active = [s for s in range(num_streams) if left[s]]
            settled = [min(clocks[s][t] for s in active) for t in range(num_streams)]
        left[stream] -= 1
        clock = clocks[stream]  # (this stream's own records are known complete: they come before this one)
        overlapping = [index.find(access.operand.mem, access, clock, settled) for access in own]
        for access, earlier in zip(own, overlapping):
            for r in earlier:  # (the cheap test first: most candidates are already needed)
                if r.index > needs.get(r.stream, -1) and r.meets(access):
                    needs[r.stream] = r.index
        anchor = anchors.get(position)
        if anchor is not None and anchor > needs.get(program[anchor][0], -1):
            needs[program[anchor][0]] = anchor
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
        for access, earlier in zip(own, overlapping):
            mem = access.operand.mem
            if mem is HBM and not access.writes and not any(w.index > position
                                                            for w in written_hbm.find(HBM, access.box)):
                continue  # nothing writes there later: this read can order nothing (weights, inputs)
            # (the records found before this instruction's own were added: one of its own that another of its
            # accesses covers stays alive, which costs nothing but a record)
            if access.writes:
                for r in earlier:
                    if access.covers(r):
                        r.alive = False  # the new access is ordered after r and covers it
            index.add(mem, access)
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
