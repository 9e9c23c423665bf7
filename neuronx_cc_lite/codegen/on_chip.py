"""Keep the tensors between operators on chip: each scratch tensor that fits gets a home in SBUF, and the DMAs
that would store it to HBM and load it back become on-chip copies, or nothing at all.

Lowerings still speak of HBM views (a consumer reads "rows 128..255 of tensor X"); this pass decides where the
tensor lives. A home is one SBUF tile holding the tensor in a layout cut from its shape as [A, B, D] (outer axes,
partition axes, inner axes; tile/homes.py). The layout is the one its producer wrote it in (a matmul's rows, a
convolution's channels: the lowering records it on the tensor), else the one its first store implies. Then every
DMA that touches the tensor is mapped through the layout (home_access): a transfer whose rows land on consecutive
partitions, or all in one partition's row, and whose free pattern stays inside them becomes an access to the home.
A transfer that cannot be mapped (a transposing read, a gather) keeps the tensor in HBM.

    tile <-> home, tile used whole, same type             the tile becomes that region of the home: no instruction
                                                         (on other partitions when every access stays legal)
    home -> a run of a tile, the home's only reader       the home becomes that run (a depthwise window between its
                                                         padding): its producer writes there, nothing moves
    home stored and loaded in like parts, each into a    each part's source tile becomes its run: the home holds
    run of another tile                                  nothing
    tile <-> home, same partitions, otherwise            a copy on a compute engine (the scheduler picks which)
    tile <-> home, rows on other partitions              an SBUF-to-SBUF DMA: no HBM traffic
    home <-> HBM (a graph output, a weight)              the DMA reads or writes the home
    collective, src and dst both homed                   the collective runs on the homes, SBUF to SBUF
                                                         (nki.collectives takes SBUF operands, but not a mix:
                                                         when only one of them has a home, neither keeps it)

A graph output the program also reads (a pooler reading the last hidden state) gets a home too, and is stored to
HBM from it besides. SBUF is shared with the operators' own tiles: homes are admitted in program order while their
bytes fit a budget;
when a new one would not fit, the live home whose last use is farthest away is spilled (left in HBM, as before
this pass). The bytes of spilled tensors are reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from isa.dtypes import DType
from isa.operand import Engine, Mem
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.tile.hbm import HbmTensor
from neuronx_cc_lite.tile.homes import Layout, home_access
from neuronx_cc_lite.tile.program import ALIGN, HbmAccess, PendingInstr, Program, Tile, TileAccess

# Bytes per partition the homes together may take; the rest of SBUF is the operators' working space.
HOME_FRACTION = 0.5


@dataclass
class Report:
    kept: list[str] = field(default_factory=list)
    spilled: list[str] = field(default_factory=list)
    spill_bytes: int = 0  # bytes of the tensors spilled for lack of room (stored once, loaded back)
    through_hbm: list[str] = field(default_factory=list)  # tensors some access cannot read on chip
    # feature-major tensors left in HBM: there their element-strided accesses cost a piece per element, so the
    # compiler lays them out by rows instead and tries again
    stranded: list[str] = field(default_factory=list)
    narrowed: list[str] = field(default_factory=list)  # homes kept in the narrower type all their readers load


def _inferred_layout(tensor: HbmTensor, size: int, access: HbmAccess) -> Layout | None:
    """The layout a store implies: its partition stride is D; B covers its rows (whole 128-row blocks of them)."""
    d = access.partition_stride
    if d <= 0 or size % d:
        return None
    b_and_a = size // d
    rows = b_and_a
    # the smallest B (a divisor of B*A) that keeps the store's rows inside one block of 128
    first_row = (access.offset // d)
    for candidate in range(access.partitions, b_and_a + 1):
        if b_and_a % candidate == 0 and (first_row % candidate) + access.partitions <= candidate:
            rows = candidate
            break
    return Layout(b_and_a // rows, rows, d)


def _dense_whole(a: TileAccess) -> bool:
    return a.first == 0 and a.partitions == a.tile.partitions and a.offset == 0 and \
        a.dims in (((a.tile.free, 1),),)


def _contiguous_region(a: TileAccess, size: int) -> bool:
    """Whether the access walks `size` consecutive elements of each partition."""
    live = [(n, s) for n, s in a.dims if n > 1]
    return not live or (len(live) == 1 and live[0][1] == 1 and live[0][0] == size)


def keep_on_chip(program: Program) -> Report:
    report = Report()
    pmax = program.target.partitions
    instrs = program.instrs
    touching: dict[HbmTensor, list[int]] = {}
    read_outputs: set[HbmTensor] = set()  # graph outputs the program also reads: a home saves the round trip
    for i, p in enumerate(instrs):
        for access, writes in p.accesses():
            if isinstance(access, HbmAccess) and access.tensor.kind in (TensorKind.SCRATCH, TensorKind.OUTPUT):
                touching.setdefault(access.tensor, []).append(i)
                if access.tensor.kind is TensorKind.OUTPUT and not writes:
                    read_outputs.add(access.tensor)
    touching = {t: where for t, where in touching.items() if t.kind is TensorKind.SCRATCH or t in read_outputs}
    layouts: dict[HbmTensor, Layout] = {}
    for tensor, where in touching.items():
        layout = _layout_for(tensor, instrs, where)
        if layout is None or not _all_map(tensor, layout, instrs, where, pmax):
            report.through_hbm.append(tensor.name)
            if tensor.layout is not None and tensor.layout[2] == 1:
                report.stranded.append(tensor.name)
            continue
        layouts[tensor] = layout
    admitted = _admit(program, layouts, touching, report)
    _pair_collectives(instrs, admitted, report)
    written_late = {t for t in admitted if _read_before_written(t, instrs, touching[t])}
    readers, writers = _tile_accesses(instrs)
    narrowed = _narrowed(instrs, [t for t in admitted if t not in written_late], touching, readers, writers)
    report.narrowed += [t.name for t in narrowed]
    homes = {t: program.sbuf(min(pmax, layouts[t].rows), layouts[t].home_free(pmax), narrowed.get(t, t.dtype),
                             f"{t.name}@home") for t in admitted}
    homed = set(admitted)  # membership tests against the list were quadratic in the node count
    report.stranded += [t.name for t in layouts if t not in homed and t.layout is not None and t.layout[2] == 1]
    program.hbm = [t for t in program.hbm if not (t in homed and t.kind is TensorKind.SCRATCH)]
    report.kept += [t.name for t in admitted]
    _rewrite(program, homes, layouts, written_late, writers)
    return report


# Instructions whose result may be written in any float type: the engine computes in fp32 and rounds as it writes.
ROUNDING_WRITERS = frozenset({"activation", "tensor_scalar", "tensor_tensor", "scalar_tensor_tensor", "tensor_copy",
                               "tensor_reduce"})


def _narrowed(instrs: list[PendingInstr], candidates: list[HbmTensor], touching: dict[HbmTensor, list[int]],
              readers: dict[Tile, list[int]], writers: dict[Tile, list[int]]) -> dict[HbmTensor, DType]:
    """The homes that can hold the narrower type their readers load (auto-cast: a matmul's operands in bf16), and
    so skip the copy that converts each load: every read of the tensor loads it into a tile of one narrower float
    type, and every write stores a tile that nothing else reads, written by engines that round as they write
    (those tiles take the narrow type too). The values the readers see are the same: one rounding of the same
    fp32 result, at the producer instead of at each load."""
    plan: dict[HbmTensor, tuple[DType, set[Tile]]] = {}
    for t in candidates:
        if t.kind is not TensorKind.SCRATCH or not t.dtype.is_float:
            continue
        loads: set[DType] = set()
        sources: set[Tile] = set()
        for i in dict.fromkeys(touching[t]):
            p = instrs[i]
            dst, src = p.args.get("dst"), p.args.get("src")
            if p.op != "dma_copy":
                break
            if isinstance(src, HbmAccess) and src.tensor is t and isinstance(dst, TileAccess):
                loads.add(dst.tile.dtype)
            elif isinstance(dst, HbmAccess) and dst.tensor is t and isinstance(src, TileAccess):
                sources.add(src.tile)
            else:
                break
        else:
            narrow = loads.pop() if len(loads) == 1 else None
            if narrow is not None and narrow.is_float and narrow.size < t.dtype.size and sources:
                plan[t] = (narrow, sources)
    changed = True
    while changed:  # a source tile stored elsewhere too must go to homes narrowed alike
        changed = False
        for t, (narrow, sources) in list(plan.items()):
            for tile in sources:
                ok = tile.mem is Mem.SBUF and tile.dtype is t.dtype and all(
                    instrs[i].op in ROUNDING_WRITERS for i in writers.get(tile, [])) and all(
                    _stores_into(instrs[i], tile, plan, narrow) for i in readers.get(tile, []))
                if not ok:
                    del plan[t]
                    changed = True
                    break
    for narrow, sources in plan.values():
        for tile in sources:
            tile.dtype = narrow
    return {t: narrow for t, (narrow, _) in plan.items()}


def _stores_into(p: PendingInstr, tile: Tile, plan: dict[HbmTensor, tuple[DType, set[Tile]]], narrow: DType) -> bool:
    """Whether `p` only stores `tile` into a home narrowed to `narrow`."""
    dst, src = p.args.get("dst"), p.args.get("src")
    return p.op == "dma_copy" and isinstance(src, TileAccess) and src.tile is tile and isinstance(dst, HbmAccess) \
        and dst.tensor in plan and plan[dst.tensor][0] is narrow


def _read_before_written(tensor: HbmTensor, instrs: list[PendingInstr], where: list[int]) -> bool:
    """Whether some load of the tensor comes before some store to it: then a load must copy what the home holds
    at its time, not read the home later."""
    seen_read = False
    for i in where:
        for access, writes in instrs[i].accesses():
            if isinstance(access, HbmAccess) and access.tensor is tensor:
                if writes and seen_read:
                    return True
                seen_read |= not writes
    return False


def _tile_accesses(instrs: list[PendingInstr]) -> tuple[dict[Tile, list[int]], dict[Tile, list[int]]]:
    """(readers, writers): the instructions that read and that write each tile, in program order."""
    found: tuple[dict[Tile, list[int]], dict[Tile, list[int]]] = ({}, {})
    for i, p in enumerate(instrs):
        for access, writes in p.accesses():
            if isinstance(access, TileAccess):
                found[writes].setdefault(access.tile, []).append(i)
    return found


def _layout_for(tensor: HbmTensor, instrs: list[PendingInstr], where: list[int]) -> Layout | None:
    size = tensor.nbytes // tensor.dtype.size
    if tensor.layout is not None:
        return Layout(*tensor.layout)
    for i in where:
        dst = instrs[i].args.get("dst")
        if instrs[i].op == "dma_copy" and isinstance(dst, HbmAccess) and dst.tensor is tensor:
            return _inferred_layout(tensor, size, dst)
    return None


def _all_map(tensor: HbmTensor, layout: Layout, instrs: list[PendingInstr], where: list[int], pmax: int) -> bool:
    probe = Tile(Mem.SBUF, pmax, layout.home_free(pmax), tensor.dtype, "probe")
    for i in dict.fromkeys(where):
        p = instrs[i]
        if p.op != "dma_copy" and p.engine is not Engine.CC:
            return False  # read by an indirect DMA: the table must be in HBM
        for name in ("dst", "src"):
            a = p.args[name]
            if isinstance(a, HbmAccess) and a.tensor is tensor and home_access(layout, a, probe, pmax) is None:
                return False
            if isinstance(a, HbmAccess) and a.tensor is tensor and a.dtype is not tensor.dtype:
                return False  # its bytes read as another type (BitCast): a copy on chip would convert them
    return True


def _admit(program: Program, layouts: dict[HbmTensor, Layout], touching: dict[HbmTensor, list[int]],
           report: Report) -> list[HbmTensor]:
    """The tensors that get a home: in order of first use, within the budget, spilling the live home used
    last when a new one does not fit."""
    pmax = program.target.partitions
    budget = int(program.target.sbuf_partition_bytes * HOME_FRACTION)

    def size(t: HbmTensor) -> int:
        return -(-layouts[t].home_free(pmax) * t.dtype.size // ALIGN) * ALIGN

    spans = {t: (min(touching[t]), max(touching[t])) for t in layouts}
    live: list[HbmTensor] = []
    admitted: list[HbmTensor] = []
    for t in sorted(layouts, key=lambda x: spans[x][0]):
        start = spans[t][0]
        live = [x for x in live if spans[x][1] >= start]
        live.append(t)
        admitted.append(t)
        while sum(size(x) for x in live) > budget:
            victim = max(live, key=lambda x: (spans[x][1], spans[x][0]))
            live.remove(victim)
            admitted.remove(victim)
            report.spilled.append(victim.name)
            report.spill_bytes += 2 * victim.nbytes
    return admitted


def _pair_collectives(instrs: list[PendingInstr], admitted: list[HbmTensor], report: Report) -> None:
    """Take the home away from a collective's src or dst when the other has none: both in SBUF or both in HBM.
    A graph output it writes stays in HBM (a home would need a store of its own, which a collective has not)."""
    pairs = [(p.args["src"].tensor, p.args["dst"].tensor) for p in instrs if p.engine is Engine.CC]
    changed = True
    while changed:
        changed = False
        for src, dst in pairs:
            homed = [t for t in (src, dst) if t in admitted]
            if len(homed) == 1 or homed and dst.kind is TensorKind.OUTPUT:
                admitted.remove(homed[0])
                report.through_hbm.append(homed[0].name)
                changed = True


def _rewrite(program: Program, homes: dict[HbmTensor, Tile], layouts: dict[HbmTensor, Layout],
             written_late: set[HbmTensor], writers: dict[Tile, list[int]]) -> None:
    pmax, target = program.target.partitions, program.target
    home_tiles = set(homes.values())
    rewritten = {homes[t] for t in written_late}
    mapped: list[tuple[object, object] | None] = []  # per instruction: a DMA's (dst, src) with homes mapped
    renamed: dict[Tile, TileAccess] = {}  # a tile that becomes a region of a home
    for i, p in enumerate(program.instrs):
        if p.engine is Engine.CC:
            p.args = {**p.args, **{n: _on_chip(p.args[n], homes, layouts, pmax) for n in ("dst", "src")}}
        if p.op != "dma_copy":
            mapped.append(None)
            continue
        dst, src = (_on_chip(p.args[n], homes, layouts, pmax) for n in ("dst", "src"))
        mapped.append((dst, src))
        if isinstance(dst, TileAccess) and isinstance(src, TileAccess):
            if dst.tile in home_tiles and src.tile not in home_tiles:  # a store: the producer may write home
                region = _region(src, dst, renamed)
                if region is not None and max(writers[src.tile]) < i:
                    renamed[src.tile] = region
            elif src.tile in home_tiles and dst.tile not in home_tiles and src.tile not in rewritten:
                region = _region(dst, src, renamed)  # a load: the consumer may read the home itself
                if region is not None and writers[dst.tile] == [i]:
                    renamed[dst.tile] = region
    _rename_parts(mapped, home_tiles, rewritten, writers, renamed)
    # (a home a collective reads or writes stays as it is: its operands point at the home itself)
    fixed = rewritten | _collective_homes(program.instrs, home_tiles)
    _homes_into_windows(program.instrs, mapped, home_tiles, fixed, writers, renamed)
    bypassed = _parts_into_windows(program.instrs, mapped, home_tiles, fixed, writers, renamed)
    _keep_partitions_legal(program.instrs, renamed, target)
    # (a bypass whose tile could not move there keeps its transfers)
    skipped = {i for tile, window, moves in bypassed if _renamed(_whole(tile), renamed) == window for i in moves}
    kept: list[PendingInstr] = []
    for i, (p, pair) in enumerate(zip(program.instrs, mapped)):
        if pair is None:
            kept.append(p)
            continue
        if i in skipped:
            continue
        dst, src = pair
        if isinstance(p.args["dst"], HbmAccess) and p.args["dst"].tensor.kind is TensorKind.OUTPUT:
            # a graph output is stored all the same: from its tile, or from the home it becomes; a copy into it
            # from a tensor now homed (a Reshape of a result) reads the home
            kept.append(p if src is p.args["src"] else
                        PendingInstr(p.op, p.engine, p.queue, {**p.args, "src": src}, p.node))
            if dst is p.args["dst"]:
                continue  # not homed
        if isinstance(dst, TileAccess) and isinstance(src, TileAccess):
            if _same_elements(_renamed(dst, renamed), _renamed(src, renamed)):
                continue  # the tile is the home's region: nothing moves
            if dst.first == src.first and dst.partitions == src.partitions and all(
                    a.first in target.allowed_start_partitions(a.partitions) for a in (dst, src)):
                kept.append(PendingInstr("tensor_copy", Engine.DVE, 0, {"dst": dst, "src": src}, p.node))
                continue
        moved = PendingInstr(p.op, p.engine, p.queue, {**p.args, "dst": dst, "src": src}, p.node)
        kept.append(moved if moved.args["dst"] is not p.args["dst"] or moved.args["src"] is not p.args["src"]
                    else p)
    for p in kept:
        p.args = {k: _renamed(v, renamed) for k, v in p.args.items()}
    program.instrs = kept


def _rename_parts(mapped: list[tuple[object, object] | None], home_tiles: set[Tile], rewritten: set[Tile],
                  writers: dict[Tile, list[int]], renamed: dict[Tile, TileAccess]) -> None:
    """A tile moved to or from a home in several transfers (a tensor over more channels than partitions: a block
    of columns for each 128 of them, as the home lays them out too) becomes the region of the home they imply,
    when each moves its part with the same pattern on both sides and all imply the same place:
    - stored by them: when the tile's writers all come before its stores, and no other store writes inside the
      region (the tile's unstored elements, rows past the tensor's last, land there);
    - loaded by them: when they are its only writers, and nothing writes the home after it is first read.
    The transfers then move nothing: MobileNetV3's squeeze-and-excitation gates and pooled vectors over 240 to
    576 channels took an instruction each on the chain between two convolutions."""
    parts: dict[tuple[Tile, bool], list[tuple[int, TileAccess, TileAccess]]] = {}  # (tile, stored) -> transfers
    into: dict[Tile, list[tuple[Tile, TileAccess]]] = {}  # home -> (source tile, where its store writes)
    for i, pair in enumerate(mapped):
        if pair is None:
            continue
        dst, src = pair
        if not (isinstance(dst, TileAccess) and isinstance(src, TileAccess)) or \
                (dst.tile in home_tiles) == (src.tile in home_tiles):
            continue
        stored = dst.tile in home_tiles
        tile_side, home_side = (src, dst) if stored else (dst, src)
        parts.setdefault((tile_side.tile, stored), []).append((i, tile_side, home_side))
        if stored:
            into.setdefault(dst.tile, []).append((src.tile, dst))
    for (tile, stored), found in parts.items():
        homes = {home_side.tile for _, _, home_side in found}
        places = {_placement(tile_side, home_side) for _, tile_side, home_side in found}
        if tile in renamed or tile.mem is not Mem.SBUF or len(homes) != 1 or len(places) != 1:
            continue
        home, place = homes.pop(), places.pop()
        if place is None or home in rewritten or home.dtype is not tile.dtype:
            continue
        if stored and max(writers[tile]) > found[0][0] or \
                not stored and writers[tile] != [i for i, _, _ in found]:
            continue
        first, offset = place
        if first < 0 or offset < 0 or first + tile.partitions > home.partitions or offset + tile.free > home.free:
            continue
        region = TileAccess(home, first, tile.partitions, offset, ((tile.free, 1),))
        if stored and any(other is not tile and overlap(bounds(a), bounds(region)) for other, a in into[home]):
            continue
        renamed[tile] = region


def _homes_into_windows(instrs: list[PendingInstr], mapped: list[tuple[object, object] | None],
                        home_tiles: set[Tile], fixed: set[Tile], writers: dict[Tile, list[int]],
                        renamed: dict[Tile, TileAccess]) -> None:
    """A home loaded whole by one transfer into a run of each partition of a larger tile (a depthwise
    convolution's window over rows short enough to lie whole: lower/windows.py flat_window) becomes that run: its
    producer then writes inside the window, and the copy between them goes. Taken when nothing else reads the home
    and nothing else writes that run of the window (its fills write the padding around it). MobileNetV3: every
    5x5 layer over 14 x 14 or 7 x 7 copied its expansion's output into its window on the chain."""
    loads: dict[Tile, list[int]] = {}
    for i, pair in enumerate(mapped):
        if pair is not None:
            dst, src = pair
            if isinstance(src, TileAccess) and src.tile in home_tiles:
                loads.setdefault(src.tile, []).append(i)
            if isinstance(dst, TileAccess) and dst.tile in home_tiles and isinstance(src, HbmAccess):
                loads.setdefault(dst.tile, []).append(-1)  # written from HBM too: keep it
    for home, found in loads.items():
        if len(found) != 1 or found[0] < 0 or home in renamed or home in fixed:
            continue
        i = found[0]
        dst, src = mapped[i]  # type: ignore[misc]
        if not isinstance(dst, TileAccess) or not isinstance(src, TileAccess):
            continue  # (stored to a graph output)
        window = dst.tile
        if window in home_tiles or window in renamed or window.mem is not Mem.SBUF or window.dtype is not home.dtype \
                or not _dense_whole(src) or not _contiguous_region(dst, home.free) or dst.partitions != home.partitions:
            continue
        region = TileAccess(window, dst.first, home.partitions, dst.offset, ((home.free, 1),))
        if not _written_elsewhere(instrs, writers, region, i):
            renamed[home] = region


def _parts_into_windows(instrs: list[PendingInstr], mapped: list[tuple[object, object] | None],
                        home_tiles: set[Tile], fixed: set[Tile], writers: dict[Tile, list[int]],
                        renamed: dict[Tile, TileAccess]) -> list[tuple[Tile, TileAccess, tuple[int, int]]]:
    """A home stored in parts and loaded in the same parts, each into a run of a larger tile (a tensor over more
    channels than partitions, a depthwise window a channel tile: _homes_into_windows takes a home loaded whole):
    each part's source tile becomes its window's run, and both transfers move nothing, the home none of its
    elements. Taken when those transfers are all the home's, each source tile written whole before its store and
    each run written by nothing else. Returns (tile, the run, the two transfers) per part."""
    found: dict[Tile, list[tuple[int, bool, TileAccess, object]]] = {}  # home -> (i, stored, home side, other)
    for i, pair in enumerate(mapped):
        if pair is not None:
            for side, other, stored in ((pair[0], pair[1], True), (pair[1], pair[0], False)):
                if isinstance(side, TileAccess) and side.tile in home_tiles:
                    found.setdefault(side.tile, []).append((i, stored, side, other))
    bypassed: list[tuple[Tile, TileAccess, tuple[int, int]]] = []
    for home, moves in found.items():
        stores = [m for m in moves if m[1]]
        loads = [m for m in moves if not m[1]]
        if home in renamed or home in fixed or len(loads) < 2 or len(stores) != len(loads):
            continue
        parts = []
        for j, _, home_side, source in stores:
            match = [m for m in loads if _same_elements(m[2], home_side)]
            if len(match) != 1 or not isinstance(source, TileAccess):
                break
            i, _, _, dst = match[0]
            tile = source.tile
            if not isinstance(dst, TileAccess) or tile in home_tiles or dst.tile in home_tiles or \
                    tile not in writers or max(writers[tile]) > j or dst.tile.dtype is not tile.dtype or \
                    tile.mem is not Mem.SBUF or dst.tile.mem is not Mem.SBUF or not _dense_whole(source) or \
                    not _contiguous_region(dst, tile.free) or dst.partitions != tile.partitions:
                break  # (a home copied into another home, a tile written after its store: left as they are)
            run = TileAccess(dst.tile, dst.first, tile.partitions, dst.offset, ((tile.free, 1),))
            if _written_elsewhere(instrs, writers, run, i):
                break
            parts.append((tile, run, (j, i)))
        else:
            if len({i for _, _, (_, i) in parts}) == len(loads):
                for tile, run, _ in parts:
                    renamed[tile] = run
                bypassed += parts
    return bypassed


def _written_elsewhere(instrs: list[PendingInstr], writers: dict[Tile, list[int]], run: TileAccess,
                       load: int) -> bool:
    """Whether an instruction other than `load` may write inside the run of its tile (not the fills of the
    padding around it)."""
    inside = bounds(run)
    return any(a.tile is run.tile and overlap(bounds(a), inside)
               for k in writers.get(run.tile, []) if k != load
               for a, writes in instrs[k].accesses() if writes and isinstance(a, TileAccess))


def _collective_homes(instrs: list[PendingInstr], home_tiles: set[Tile]) -> set[Tile]:
    """The homes a collective reads or writes (its operands were mapped onto them)."""
    return {a.tile for p in instrs if p.engine is Engine.CC for a in (p.args["src"], p.args["dst"])
            if isinstance(a, TileAccess) and a.tile in home_tiles}


def _whole(tile: Tile) -> TileAccess:
    return TileAccess(tile, 0, tile.partitions, 0, ((tile.free, 1),))


def _live(a: TileAccess) -> tuple[tuple[int, int], ...]:
    return tuple((n, s) for n, s in a.dims if n > 1)


def _placement(tile_side: TileAccess, home_side: TileAccess) -> tuple[int, int] | None:
    """(first partition, element offset) of the home at which the whole tile would make this transfer move
    nothing, or None when its two sides walk different patterns."""
    if _live(tile_side) != _live(home_side) or tile_side.partitions != home_side.partitions:
        return None
    return home_side.first - tile_side.first, home_side.offset - tile_side.offset


def _same_elements(a: object, b: object) -> bool:
    return isinstance(a, TileAccess) and isinstance(b, TileAccess) and a.tile is b.tile and a.first == b.first \
        and a.partitions == b.partitions and a.offset == b.offset and _live(a) == _live(b)


def bounds(a: TileAccess) -> tuple[int, int, int, int]:
    """The partitions [p0, p1) and elements [e0, e1) of each partition the access may touch."""
    low = sum(min(0, (n - 1) * s) for n, s in a.dims)
    high = sum(max(0, (n - 1) * s) for n, s in a.dims)
    return a.first, a.first + a.partitions, a.offset + low, a.offset + high + 1


def overlap(x: tuple[int, int, int, int], y: tuple[int, int, int, int]) -> bool:
    return x[0] < y[1] and y[0] < x[1] and x[2] < y[3] and y[2] < x[3]


def _keep_partitions_legal(instrs: list[PendingInstr], renamed: dict[Tile, TileAccess], target) -> None:  # type: ignore[no-untyped-def]
    """Drop the renames that would move an access where the engines cannot start it, or put a matmul's two
    operands on different partitions (the contraction runs along the same PE rows); repeat until none does."""
    def shift(t: Tile) -> int:
        moved = _renamed(_whole(t), renamed)
        assert isinstance(moved, TileAccess)
        return moved.first

    while True:
        bad: set[Tile] = set()
        for p in instrs:
            if p.engine is Engine.DMA:
                continue
            for a, _ in p.accesses():
                if isinstance(a, TileAccess) and shift(a.tile) and \
                        a.first + shift(a.tile) not in target.allowed_start_partitions(a.partitions):
                    bad.add(a.tile)
            if p.op == "nc_matmul":
                s, m = p.args["stationary"], p.args["moving"]
                if s.first + shift(s.tile) != m.first + shift(m.tile):
                    bad.update(t for t in (s.tile, m.tile) if shift(t))
        if not bad:
            return
        for t in bad:
            renamed.pop(t, None)


def _on_chip(a: object, homes: dict[HbmTensor, Tile], layouts: dict[HbmTensor, Layout], pmax: int) -> object:
    if isinstance(a, HbmAccess) and a.tensor in homes:
        mapped = home_access(layouts[a.tensor], a, homes[a.tensor], pmax)
        assert mapped is not None, f"{a.tensor.name} was admitted but an access does not map"
        return mapped
    return a


def _region(tile_side: TileAccess, home_side: TileAccess, renamed: dict[Tile, TileAccess]) -> TileAccess | None:
    """The region of the home the tile can simply be: the tile is used whole by the transfer, has the home's type,
    and the region is contiguous in each partition (maybe on other partitions: its accesses move with it, when
    they may; see _keep_partitions_legal)."""
    t = tile_side.tile
    if t in renamed or t.mem is not Mem.SBUF or t.dtype is not home_side.tile.dtype or not _dense_whole(tile_side) \
            or home_side.partitions != t.partitions:
        return None
    if not _contiguous_region(home_side, t.free):
        return None
    return TileAccess(home_side.tile, home_side.first, t.partitions, home_side.offset, ((t.free, 1),))


def _renamed(v: object, renamed: dict[Tile, TileAccess]) -> object:
    """The access on the tile its tile became (through a home that became a window's run: _homes_into_windows)."""
    while isinstance(v, TileAccess) and v.tile in renamed:
        region = renamed[v.tile]
        v = TileAccess(region.tile, region.first + v.first, v.partitions, region.offset + v.offset, v.dims, v.skew)
    return v


