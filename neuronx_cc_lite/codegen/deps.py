"""Dependencies of the tile program, before anything is placed: instruction j must follow instruction i when
they access overlapping parts of one virtual tile or one HBM tensor and one of them writes (read-after-write,
write-after-read, write-after-write). Program order is lowering order, which is always a valid order.

Accesses whose boxes meet are compared byte run by byte run (regions.py): a channel-major output's row blocks
interleave and would otherwise order every store after the last.

A write that covers an earlier access's region retires it: whatever conflicts with the earlier access later also
conflicts with the write, which follows it, so the edge is implied. Tensors nothing writes (the model's inputs and
weights) order nothing and are not tracked.
"""

from __future__ import annotations

from isa.tensor_kind import TensorKind
from neuronx_cc_lite.codegen.regions import Conflicts, Record, box_of
from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr

_READ_ONLY = (TensorKind.INPUT, TensorKind.WEIGHT)


def footprints(p: PendingInstr, position: int) -> list[tuple[object, Record]]:
    """(space, record) of every access that can order something."""
    found = []
    for access, writes in p.accesses():
        if isinstance(access, HbmAccess) and access.tensor.kind in _READ_ONLY:
            continue
        operand = access.placed_at(0)
        found.append((access.space, Record(box_of(operand), -1, position, writes,
                                           operand=operand)))
    return found


def dependencies(instrs: list[PendingInstr]) -> list[list[int]]:
    """For each instruction, the positions of the earlier instructions it must follow."""
    index = Conflicts()
    preds: list[list[int]] = []
    for position, p in enumerate(instrs):
        accesses = footprints(p, position)
        overlapping = [mine.meeting(index.find(space, mine)) for space, mine in accesses]
        preds.append(sorted({r.index for earlier in overlapping for r in earlier}))
        for (space, mine), earlier in zip(accesses, overlapping):
            if mine.writes:
                for r in earlier:
                    if mine.covers(r):
                        r.alive = False
            index.add(space, mine)
    return preds

