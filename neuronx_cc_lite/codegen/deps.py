"""Dependencies of the tile program, before anything is placed: instruction j must follow instruction i when
they access overlapping parts of one virtual tile or one HBM tensor and one of them writes (read-after-write,
write-after-read, write-after-write). Program order is lowering order, which is always a valid order.

A write that covers an earlier access's region retires it: whatever conflicts with the earlier access later also
conflicts with the write, which follows it, so the edge is implied. Tensors nothing writes (the model's inputs and
weights) order nothing and are not tracked.
"""

from __future__ import annotations

from neuronx_cc_lite.codegen.regions import Box, Index, Record, box_of, inside
from neuronx_cc_lite.lower.program import HbmAccess, PendingInstr

_READ_ONLY = ("input", "weight")


def footprints(p: PendingInstr) -> list[tuple[object, Box, bool]]:
    """(space, box, writes) of every access that can order something."""
    found = []
    for access, writes in p.accesses():
        if isinstance(access, HbmAccess) and access.tensor.kind in _READ_ONLY:
            continue
        found.append((access.space, box_of(access.placed_at(0)), writes))
    return found


def dependencies(instrs: list[PendingInstr]) -> list[list[int]]:
    """For each instruction, the positions of the earlier instructions it must follow."""
    index = Index()
    preds: list[list[int]] = []
    for position, p in enumerate(instrs):
        accesses = footprints(p)
        overlapping = [index.find(space, box) for space, box, _ in accesses]
        mine: set[int] = set()
        for (_, _, writes), earlier in zip(accesses, overlapping):
            for r in earlier:
                if writes or r.writes:
                    mine.add(r.index)
        preds.append(sorted(mine))
        for (space, box, writes), earlier in zip(accesses, overlapping):
            if writes:
                for r in earlier:
                    if inside(r.box, box):
                        r.alive = False
            index.add(space, Record(box, -1, position, writes))
    return preds

