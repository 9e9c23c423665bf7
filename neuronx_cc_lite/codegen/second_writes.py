"""A copy that narrows a result's type becomes a second write of the result by the instructions that produce it.

Once tensors live on chip (on_chip.py), a tensor read in two types keeps its home in its own type and each reader
of the narrower one copies it: under auto-cast a residual block's output stays fp32 for the residual addition, and
the next convolution's matmuls cast it to bf16 first. That copy is one more dependent instruction between the two
layers (MobileNetV3: six of its blocks each waited 0.2-0.3 us for one on the critical path). The producer computes
in fp32 and rounds as it writes (on_chip.ROUNDING_WRITERS), so writing the same result a second time, straight
into the copy's tile in the copy's type, gives the reader the same values one instruction sooner; the home's own
write stays for its other readers.

    writer W: home[region] = f(inputs)            twin W':   tile[region'] = f(inputs)
    ...                                    ->     writer W:  home[region] = f(inputs)
    copy C:   tile = home[run]                    (C gone)

The twin goes before its writer (it reads the same inputs, and W writes none of them): the list schedule ranks an
engine's earlier instruction of a node above its later ones, and the twin is the one a chain waits for.

Where the copy is the only reader of the source tile, no twin is needed: the writers write the copy's place
themselves, in its type (the pooled means of MobileNetV3's and the ResNets' classifiers, each channel tile's row
sums copied into its column of a bf16 home, 0.2 us on the chain before the classifier).

Taken when the copy narrows the type and writes a run that nothing else writes, from a run of another tile whose
elements before it were each written by exactly one of that tile's writers: compute instructions on ScalarE,
VectorE or GpSimdE that round as they write, read nothing of that tile and (for a twin) write nothing else; and,
for twins, when nothing but other copies reads that tile between its writers and the copy. A tensor read first by
an fp32 reader (a squeeze-and-excitation block's mean of the depthwise output its projection reads later) keeps
its copy: there the twin lengthened that reader's chain (MobileNetV3 bf16 84.5 -> 87.1 us with those twinned too).
A twin costs about what the copy did, on its writer's engine, but beside the chain rather than on it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from isa.instructions import OPS
from isa.operand import Engine, Mem
from neuronx_cc_lite.codegen.on_chip import ROUNDING_WRITERS, bounds, overlap
from neuronx_cc_lite.codegen.regions import inside
from neuronx_cc_lite.tile.program import PendingInstr, Program, Tile, TileAccess

_COMPUTE = frozenset({Engine.ACT, Engine.DVE, Engine.POOL})


def second_writes(program: Program) -> int:
    """Replace the copies that qualify (module docstring) by twins of their source's writers, or by those writers
    writing the copy's tile themselves. Returns how many copies went."""
    instrs = program.instrs
    readers: dict[Tile, list[int]] = {}
    writers: dict[Tile, list[int]] = {}
    for i, p in enumerate(instrs):
        for a, writes in p.accesses():
            if isinstance(a, TileAccess):
                (writers if writes else readers).setdefault(a.tile, []).append(i)
    before: dict[int, list[PendingInstr]] = {}
    moved: dict[int, PendingInstr] = {}
    dropped: set[int] = set()
    for c, p in enumerate(instrs):
        found = _rewrite(instrs, c, writers, readers) if p.op == "tensor_copy" else None
        if found is None or any(w in dropped for w, _ in found[1]):
            continue  # (a copy that is gone writes nothing to twin)
        twins, writes = found
        dropped.add(c)
        for w, instr in writes:
            if twins:
                before.setdefault(w, []).append(instr)
            else:
                moved[w] = instr
    kept: list[PendingInstr] = []
    for i, p in enumerate(instrs):
        kept += before.get(i, [])
        if i not in dropped:
            kept.append(moved.get(i, p))
    program.instrs = kept
    return len(dropped)


def _run(a: TileAccess) -> int | None:
    """The elements of each partition an access covers as one contiguous run, or None."""
    dims = [d for d in a.dims if d[0] > 1]
    if a.skew or len(dims) > 1 or dims and dims[0][1] != 1:
        return None
    return dims[0][0] if dims else 1


def _rewrite(instrs: list[PendingInstr], c: int, writers: dict[Tile, list[int]],
             readers: dict[Tile, list[int]]) -> tuple[bool, list[tuple[int, PendingInstr]]] | None:
    """For copy c: (twins, [(writer, its twin or itself writing the copy's tile)]), or None where it stays. The
    writers themselves write the copy's tile (twins False) when the copy is the only reader of their tile: a
    squeeze's mean, its column of a home in the narrower type."""
    dst, src = instrs[c].args["dst"], instrs[c].args["src"]
    if not (isinstance(dst, TileAccess) and isinstance(src, TileAccess)) or dst.tile is src.tile or \
            dst.tile.mem is not Mem.SBUF or src.tile.mem is not Mem.SBUF or not dst.tile.dtype.is_float or \
            dst.tile.dtype.size >= src.tile.dtype.size:
        return None  # (a copy in one type may run on any engine; the writers may not: Llama's layer in fp32 ran 2%
        # slower with its RMSNorm's copies of the residual sum twinned on VectorE)
    n = _run(src)
    if n is None or _run(dst) != n or dst.first != src.first or dst.partitions != src.partitions:
        return None
    target = bounds(dst)
    for w in writers.get(dst.tile, []):  # the copy alone writes its run of its tile
        if w != c and any(a.tile is dst.tile and (a.skew or overlap(bounds(a), target))
                          for _, a in _written(instrs[w])):
            return None
    run = (src.first, src.first + src.partitions, src.offset, src.offset + n)
    alone = readers.get(src.tile) == [c]
    found: list[tuple[int, PendingInstr]] = []
    covered = 0
    boxes: list[tuple[int, int, int, int]] = []
    for w in writers.get(src.tile, []):
        if w >= c:
            break
        p = instrs[w]
        written = _written(p)
        into = [(name, a) for name, a in written if a.tile is src.tile]
        if len(into) != 1 or not alone and len(written) != 1 or into[0][1].skew:
            return None  # (a twin writes one thing: not a reduction's second output as well; nor a DMA's rows)
        name, out = into[0]
        box = bounds(out)
        if not overlap(box, run):
            continue  # another part of the tile
        if not inside(box, run) or any(overlap(b, box) for b in boxes) or p.op not in ROUNDING_WRITERS or \
                p.engine not in _COMPUTE or \
                any(isinstance(a, TileAccess) and a.tile is src.tile for a, writes in p.accesses() if not writes):
            return None
        boxes.append(box)
        covered += out.partitions * math.prod(size for size, _ in out.dims)
        retarget = replace(out, tile=dst.tile, offset=out.offset - src.offset + dst.offset)
        found.append((w, PendingInstr(p.op, p.engine, p.queue, {**p.args, name: retarget}, p.node)))
    if not found or covered != src.partitions * n:
        return None
    last = found[-1][0]
    if not alone and any(last < r < c and not _a_copy(instrs, r, writers) for r in readers.get(src.tile, [])):
        return None  # read first by others, whose chain the twins would lengthen
    return not alone, found


def _a_copy(instrs: list[PendingInstr], r: int, writers: dict[Tile, list[int]]) -> bool:
    """Whether instruction r is a copy into a tile of its own (another reader's, twinned or not)."""
    dst = instrs[r].args.get("dst")
    return instrs[r].op == "tensor_copy" and isinstance(dst, TileAccess) and writers.get(dst.tile) == [r]


def _written(p: PendingInstr) -> list[tuple[str, TileAccess]]:
    """The tile operands an instruction writes, by field name (dst; an activation's reduce too)."""
    return [(f.name, p.args[f.name]) for f in OPS[p.op].operand_fields
            if f.writes and isinstance(p.args[f.name], TileAccess)]
