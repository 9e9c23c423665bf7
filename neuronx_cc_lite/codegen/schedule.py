"""The schedule: the order of the tile program, the engine of each instruction whose row allows several, and the
DMA queue of each transfer, chosen by list scheduling against the cost model (isa/costs.py).

    preds[i]  instructions i must follow (deps.py), on virtual tiles and HBM tensors
    cost[i,e] its duration on engine e, alone
    rank[i]   cost + the longest path from i to the end of the program, counting the work lowering queued behind
              i on its engine (of its node, and of the others that do not wait for it): how critical i is
    simulate the engines; repeatedly, the engine (or DMA queue) that is free first takes, among the
    instructions it can run whose predecessors have finished by then, the one of highest rank (when none has,
    it waits for the first to become ready); that instruction holds the engine and the shared ports it needs
    until its estimated finish (its cost after what the engine ran before it: a result it waits for, ScalarE's
    table), and its successors become ready when their last predecessor finishes (a semaphore hand-off later
    on another engine). A transfer's data starts its latency after it is ready, or when its queue is free; a
    queue holds dma_queue_depth transfers, so it takes the next only once the one that many places before has
    ended, and short transfers one after another each wait most of a latency (runtime/simulator.py).

Each engine runs its stream in order, so what matters is which instruction an engine takes next: taking the most
critical ready one (rather than whichever was ready first) keeps work that is needed late from standing in front
of work that is needed now. A DMA queue, and an engine offered a fill (an instruction that waits for nothing but
the program's constant fills, such as the zeroing of a ring of depthwise diagonals), does not start one when a
more critical instruction becomes ready before half of it would be done: it waits for that one. The clocks are
the scheduler's estimate; the runtime then enforces the real order with semaphores. Three more choices decide
what the hardware does well:
- DMA queues: transfers into SBUF (loads) and out of it (stores) take separate queues, in proportion to their
  bytes, so that stores always have queues of their own; a store queue takes loads until the first store, then
  only short ones while no store is ready; a load queue takes a store when it is the most critical transfer ready
  (its producer done in the estimate), which spreads a burst of stores on the critical path over every queue.
- Memory: a tile lives from its first to its last access in the new order. It is placed (allocate.py) when
  its first access is scheduled; an instruction whose tiles find no room waits until others are freed, the
  earliest in lowering order first, so running ahead (the loads of the next tiles while this one computes:
  multiple buffering) stops where memory ends. When that deadlocks, schedule_within_memory tries again holding
  back what ran ahead, then counting bytes and planning the places after.
- Engines: a copy, a tensor_scalar or a memset on float data may run on any engine whose row allows it and that
  reaches its memories; the first of them to be free for it takes it.
- Collectives: the CC engine is one more server. A rank's program knows its replica groups and where the ranks
  sit (compiler.compile_graph), and a collective is priced as the runtime prices it (isa/collectives.py
  instruction_cost: the fastest algorithm on the whole group; a 24-rank all-reduce of 4 MB on inf2 takes 429
  us, where the two-rank estimate said 122); a program compiled without them (a test's) takes a two-rank
  collective's fixed cost and the bytes at one rank's collective rate. Being long and on the path to the next
  layer, a collective ranks high, so the work that does not depend on it (the other branch, the next weights'
  loads) fills the wait.

-O1 keeps the lowering order and only assigns queues (fast compiles); -O2 (the default) schedules.
"""

from __future__ import annotations

import heapq
import logging

import numpy as np

from isa.collectives import instruction_cost
from isa.costs import Port, dma_cost, duration_ns, ports, table_of
from isa.instructions import OPS, Instruction
from isa.operand import READABLE, WRITABLE, Engine, Mem
from isa.target import Target
from isa.tensor_kind import TensorKind
from neuronx_cc_lite import progress
from neuronx_cc_lite.codegen.allocate import (LiveBytes, OnChipMemory, footprint, free_positions, large_tile_reserve,
                                              plan, tile_uses)
from neuronx_cc_lite.codegen.deps import dependencies
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr, Program, Tile, TileAccess
from neuronx_cc_lite.tile.verify import verify_order

log = logging.getLogger(__name__)

MOVABLE = frozenset({"tensor_copy", "tensor_scalar", "memset"})
# How far ahead of the first unscheduled instruction (in lowering order) the schedule may reach: far enough to
# prefetch the next layer's weights and overlap neighbouring operators, near enough that what it opens early does
# not take the memory the earlier work needs.
LOOKAHEAD = 768
# A weight load beyond the lookahead may still start, up to PREFETCH_REACH lookaheads ahead, while the tiles live
# (and those of such loads released but not yet placed) take at most PREFETCH_FRACTION of SBUF: a network's later
# weights stream in while its early layers, small and latency-bound, leave the DMA queues idle; the other half of
# SBUF stays for the work in between.
PREFETCH_REACH = 8
PREFETCH_FRACTION = 0.5
# The reach of the tries made when none fitted at LOOKAHEAD: loads opened far ahead (a head's weights, layers on)
# hold less of the memory the work before them needs. Llama-3-8B's decode step over 32 trn1 ranks (2 layers): no
# try fitted at 768, its LM head's column groups (32 KB a partition each) running ahead, and the program ran in
# lowering order, every weight loaded just before its matmul (1,581 us); the first try at 256 fits (1,179 us; 96
# and 128 gave 1,153 and 1,197).
FALLBACK_LOOKAHEAD = 256
# programs this long are scheduled a second time on the short road (a test's few hundred instructions are not)
SECOND_OPINION_MIN = 1000
# how far the schedule's estimate of a program's end may be from the simulator's (schedule_within_memory)
ESTIMATE_ERROR = 0.02
SHORT_LOAD_NS = 2000.0  # a load a store queue may take while no store is ready
LOOK_PENDING = 8  # pending transfers a free queue looks at before taking a less critical one
_ON_ENGINES = (Engine.ACT, Engine.DVE, Engine.POOL)


def candidate_engines(p: PendingInstr) -> tuple[Engine, ...]:
    """The engines the instruction may run on: its own, or for a movable one every engine that can."""
    if p.op not in MOVABLE or p.engine not in _ON_ENGINES:
        return (p.engine,)
    accesses = list(p.accesses())
    if not all(isinstance(a, TileAccess) and a.tile.dtype.is_float for a, _ in accesses):
        return (p.engine,)
    found = [e for e in _ON_ENGINES if e in OPS[p.op].engines and
             all(a.tile.mem in (WRITABLE if w else READABLE)[e] for a, w in accesses)]
    return tuple(found) or (p.engine,)


_SERVERS = (Engine.PE, Engine.ACT, Engine.DVE, Engine.POOL, Engine.SP, Engine.CC)


def _duration(instr: Instruction, engine: Engine, program: Program) -> float:
    """The cost model's duration; a collective's on its replica group as the runtime prices it, or, where the
    program does not know its groups, a two-rank collective's (see the module docstring)."""
    target = program.target
    if engine is Engine.CC:
        if program.topology is not None:
            return instruction_cost(instr, program.groups, program.topology).ns
        nbytes = max(o.dtype.size * o.num_partitions * o.free_size for _, o in instr.operands())
        return target.cc_setup_ns + target.cc_sync_round_ns + nbytes / target.cc_rank_gbps
    return duration_ns(instr, engine, target)


def is_store(p: PendingInstr) -> bool:
    return isinstance(p.args.get("dst"), HbmAccess)


def split_queues(program: Program, transfer_bytes: dict[int, int] | None = None) -> tuple[list[int], list[int]]:
    """(load queues, store queues): the queues divided in proportion to the bytes each direction moves.
    `transfer_bytes`: the bytes of each transfer by position, when the caller has them (else computed)."""
    total = program.target.dma_queues
    moved = {True: 0, False: 0}
    for i, p in enumerate(program.instrs):
        if p.engine is Engine.DMA:
            moved[is_store(p)] += (transfer_bytes[i] if transfer_bytes is not None else
                                   dma_cost(p.instruction(placed=False), program.target).bytes)
    if not moved[True] or not moved[False]:
        return list(range(total)), list(range(total))
    loads = min(total - 1, max(1, round(total * moved[False] / (moved[False] + moved[True]))))
    return list(range(loads)), list(range(loads, total))


def assign_queues_in_order(program: Program) -> None:
    """-O1: lowering order, loads and stores on their own queues, each group taken in turn."""
    loads, stores = split_queues(program)
    turn = {True: 0, False: 0}
    for p in program.instrs:
        if p.engine is Engine.DMA:
            group = stores if is_store(p) else loads
            p.queue = group[turn[is_store(p)] % len(group)]
            turn[is_store(p)] += 1


class _FreedAt:
    """When the last access to each byte (of a partition) of SBUF and PSUM ends, among the tiles freed there, as
    estimated: a tile placed over them cannot be written before, since on the chip a semaphore holds its first
    writer until those accesses are done (write after read). Without it a load placed where a tile was freed by
    an instruction scheduled earlier but estimated to end later looks free to start at once, and its queue, which
    runs in order, holds what is queued behind it on the chip (Llama-3-8B's decode over 24 inf2 ranks: a layer's
    MLP weights queued ahead of its attention's transfers, 42 us a layer)."""

    def __init__(self, target: Target) -> None:
        self.until = {Mem.SBUF: np.zeros(target.sbuf_partition_bytes), Mem.PSUM: np.zeros(target.psum_partition_bytes)}

    def free(self, tile: Tile, last_end: float) -> None:
        assert tile.offset is not None
        span = self.until[tile.mem][tile.offset:tile.offset + tile.bytes_per_partition]
        np.maximum(span, last_end, out=span)

    def ends(self, tile: Tile) -> float:
        """When the place the tile was given is free of every earlier access."""
        assert tile.offset is not None
        return float(self.until[tile.mem][tile.offset:tile.offset + tile.bytes_per_partition].max(initial=0.0))


class _Pool:
    """The instructions one engine (or one group of DMA queues) may take: not yet ready, by ready time; ready,
    by rank."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, int]] = []
        self.ready: list[tuple[float, int]] = []

    def add(self, ready_at: float, rank: float, i: int) -> None:
        heapq.heappush(self.pending, (ready_at, i))

    def promote(self, now: float, rank: list[float]) -> None:
        while self.pending and self.pending[0][0] <= now:
            _, i = heapq.heappop(self.pending)
            heapq.heappush(self.ready, (-rank[i], i))

    def next_ready_at(self) -> float:
        return self.pending[0][0] if self.pending else float("inf")


def _server_groups(pools_of_server: list[list[object]]) -> list[tuple[list[object], list[int]]]:
    """The servers grouped by the pools they take from, in order: (pools, servers)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for k, keys in enumerate(pools_of_server):
        groups.setdefault(tuple(keys), []).append(k)
    return [(list(keys), members) for keys, members in groups.items()]


def _critical_soon(pool: _Pool, rank: list[float], now: int, before: float, taken: list[bool]) -> float | None:
    """When a transfer more critical than the one (`now`) a queue would take becomes ready before half of that one
    would be done: the queue waits for it (a gather of embedding rows queued behind a weight a layer ahead would
    hold up everything). The first few pending transfers are looked at."""
    for ready_at, j in heapq.nsmallest(LOOK_PENDING, pool.pending):
        if ready_at >= before:
            break
        if not taken[j] and rank[j] > rank[now]:
            return ready_at
    return None


class OutOfMemory(CompileError):
    """Every ready instruction waits for memory that nothing will free. `ahead`: the instructions that opened
    live tiles while running ahead of the earliest waiting one, `waiting` (in lowering order); in lowering
    order none of those tiles would be live yet."""

    def __init__(self, error: CompileError, waiting: int, ahead: list[int]) -> None:
        super().__init__(error.code, error.message, error.node, error.op)
        self.waiting, self.ahead = waiting, ahead


PLACING_TRIES = 4  # schedules that place tiles as they go, each holding back more of what ran ahead
# then as many again with the weights' tiles placed from the top of SBUF down, away from the working tiles that
# come and go at the bottom (allocate._Arena.place): the next weights' loads, long-lived, otherwise scatter among
# them until a large tile finds no gap (Llama-3-70B's prefill on 24 inf2 ranks: ranks 2-23 found none, fell to
# counting bytes and planning the places after, and there the next layer's key and value weights took the place
# of the layer norm's input, to load after it, one queue for all of them). Placing the weights on top from the
# start lost elsewhere (ResNet-50 in bf16 321.4 -> 357.5 us), so it comes second, and as a second opinion on the
# road a fit took with the weights among the working tiles (schedule_within_memory)
PLANNED_TRIES = 4  # then schedules that count live bytes, planned after, each with fewer bytes live
BUDGET_STEP = 0.85  # after a plan that found no room, the next schedule keeps this much of the bytes live before


def whole_accumulations(instrs: list[PendingInstr], preds: list[list[int]]) -> list[list[int]]:
    """The dependencies with one more rule: the instruction that opens a PSUM tile waits for everything the
    tile's later writers wait for (that comes before it in lowering order). A matmul accumulating over several
    inputs could otherwise open its bank as soon as its first input is ready and hold it while the rest wait for
    a bank of their own: eight attention heads' score banks, each waiting for the rest of K, whose projection
    waits for a bank, deadlocked BERT-large. Used after such a deadlock: early starts help where none occurs."""
    writers: dict[Tile, list[int]] = {}
    for i, p in enumerate(instrs):
        for a, writes in p.accesses():
            if writes and isinstance(a, TileAccess) and a.tile.mem is Mem.PSUM:
                writers.setdefault(a.tile, []).append(i)
    gated = [list(ps) for ps in preds]
    for group in writers.values():
        first, members = group[0], set(group)
        extra = {j for w in group[1:] for j in preds[w] if j < first and j not in members}
        gated[first] = sorted(set(gated[first]) | extra)
    return gated


def schedule_within_memory(program: Program) -> bool:
    """List-schedule the program and place its tiles; False (the program as lowered) when no try fitted.

    The first tries place each tile when the schedule reaches its first use (allocate.OnChipMemory): an
    instruction whose tiles find no gap waits until memory frees. That can deadlock: the loads of later layers'
    weights take the room the current operator needs, and they wait for its results. Then the instructions that
    opened live tiles ahead of the earliest waiting one (in lowering order, none of those tiles would be live yet)
    are held back, in the next try, until everything up to that one is scheduled. When none of those fits, the
    same tries again with the weights' tiles placed on top of SBUF (PLACING_TRIES). A memory deadlocked by its gaps
    (a large tile finds none with a third of SBUF free) is left to the next tries: the schedule only counts the
    bytes live at once, within a budget, and the planner places the tiles knowing every lifetime (allocate.plan);
    when it finds no room, the next try keeps fewer bytes live. Then the same tries again reaching only
    FALLBACK_LOOKAHEAD instructions ahead. The lowering order, which always fits, is the end of that road. Before
    all of them, the placing tries run loading weights early (PREFETCH_REACH); when none of those fits, the road
    above starts afresh without it.

    A program of at least SECOND_OPINION_MIN instructions is then scheduled once more on the short road alone
    (FALLBACK_LOOKAHEAD, no prefetching), when the fitting try loaded weights early once more reaching far without
    that, and when it placed the weights among the other tiles in tight memory once more on its road with them on
    top; the schedule whose estimated end comes first is kept: which reach suits a model depends on it
    (BERT-base in fp32 ran 1,504 us reaching far, 1,368 on the short road; BERT-large 4,934 against 5,885,
    ResNet-18 160 against 169; BERT-large from TorchScript 5,711.7 loading weights early, 5,446.2 without), and
    the estimate ranks them as the simulator does (within 2% on those)."""
    lowered = list(program.instrs)
    engines = [p.engine for p in lowered]
    plain, lowered_uses = dependencies(lowered), tile_uses(program)
    reserve = large_tile_reserve(program, lowered_uses)

    def fit(roads: tuple[tuple[int, bool], ...], on_top: tuple[bool, ...] = (False, True)
            ) -> tuple[float, tuple[int, bool], bool | None] | None:
        return _fit(program, lowered, engines, plain, lowered_uses, reserve, roads, on_top)

    # the roads, in order: (reach, loads of weights started early)
    roads = ((LOOKAHEAD, True), (LOOKAHEAD, False), (FALLBACK_LOOKAHEAD, False))
    fitted = fit(roads)
    if fitted is None:
        return False
    found, first_road, top = fitted
    if len(lowered) >= SECOND_OPINION_MIN:
        # the other opinions: the short road, and the long one without the early weight loads when the first fit
        # had them (BERT-large in fp32 from TorchScript: 5,711.7 us prefetching, 5,446.2 without); and when the
        # first fit placed the weights among the working tiles in tight memory (_tight), its road with them on top
        # (Llama-3-70B's prefill over 24 inf2 ranks, two layers: 3,309.8 us with the weights on top only where
        # placing among the others found no fit, 3,149.4 with this opinion too)
        farther = roads[-1:] if first_road != roads[0] else (roads[-1], roads[1])
        others = [(road, (False, True)) for road in farther]
        if top is False and _tight(program.schedule_tries):
            others.append((first_road, (True,)))
        best, tries = _Kept(program), program.schedule_tries
        for road, on_top in others:
            program.instrs = list(lowered)
            for p, engine in zip(lowered, engines):
                p.engine = engine
            fitted = fit((road,), on_top)
            other = fitted[0] if fitted is not None else None
            tries += program.schedule_tries
            log.debug("schedule: estimated %.1f us, %s reaching %d ahead%s%s", found / 1000,
                      "no fit" if other is None else f"{other / 1000:.1f} us", road[0],
                      " with early weight loads" if road[1] else "", " weights on top" if on_top == (True,) else "")
            # another road, or the weights on top, displaces a fitting schedule only by more than the estimate's
            # error: GPT-2 from TorchScript in fp32, 1,357.3 us estimated against 1,374.8 on the short road, ran
            # 1,420.0 against 1,379.8
            margin = 1.0 if road == roads[-1] and on_top != (True,) else 1.0 - ESTIMATE_ERROR
            if other is not None and other < margin * found:
                found, best = other, _Kept(program)
        best.restore(program)
        program.schedule_tries = tries
    return True


def _tight(tries: int) -> bool:
    """Whether the first fit found memory tight: it took more than one try (falling past the first road takes
    several). Only then is the opinion with the weights on top worth its time: a program that fitted at once
    places its weights anywhere (BERT-base compiles in 4.2 s asking it only where tight, in 5.3 s asking it
    everywhere, to the same schedule)."""
    return tries > 1


class _Kept:
    """A schedule kept aside while another is tried: the order, each instruction's engine and queue, each tile's
    place, the tries it took."""

    def __init__(self, program: Program) -> None:
        self.instrs = list(program.instrs)
        self.assigned = [(p.engine, p.queue) for p in self.instrs]
        self.offsets = [(t, t.offset) for t in program.tiles]
        self.tries = program.schedule_tries

    def restore(self, program: Program) -> None:
        program.instrs = self.instrs
        for p, (engine, queue) in zip(self.instrs, self.assigned):
            p.engine, p.queue = engine, queue
        for t, offset in self.offsets:
            t.offset = offset


def _fit(program: Program, lowered: list[PendingInstr], engines: list[Engine], plain: list[list[int]],
         lowered_uses: list[list[Tile]], reserve: int, roads: tuple[tuple[int, bool], ...],
         on_top: tuple[bool, ...] = (False, True)) -> tuple[float, tuple[int, bool], bool | None] | None:
    """The first try along `roads` whose schedule fits memory (see schedule_within_memory), given the program as
    lowered (its instructions, their engines, dependencies and tiles, the large-tile reserve): the program is left
    scheduled and placed, and the schedule's estimated end returned with the road it took and whether its placing
    put the weights on top (`on_top`: the placements tried, PLACING_TRIES each; None: planned after); None (the
    program as lowered) when none did."""
    tries = 0
    placings = [top for top in on_top for _ in range(PLACING_TRIES)]
    # the first road prefetches weights and only places as it goes; the others start afresh without prefetching
    for lookahead, prefetch in roads:
        preds, budget = plain, 1.0
        # what each placement held back (what runs ahead depends on where the tiles go); the planned tries keep
        # what the first placement's tries held back
        holds: dict[bool, dict[int, int]] = {top: {} for top in on_top}
        for attempt in range(len(placings) + (0 if prefetch else PLANNED_TRIES)):
            tries += 1
            placing = attempt < len(placings)
            top = placings[attempt] if placing else None
            hold = holds[on_top[0] if top is None else top]
            try:
                memory = OnChipMemory(program.target, reserve) if placing else LiveBytes(program.target, budget)
                starts, ends = schedule(program, lookahead, preds, hold, memory, prefetch=prefetch,
                                        tiles_of=lowered_uses, weights_on_top=bool(top))
                if not placing:
                    uses = tile_uses(program)
                    try:  # no range reused before the schedule expects its last reader done; else on bare lifetimes
                        plan(program, uses, free_positions(starts, ends))
                    except CompileError as e:
                        if e.code not in ("NCC_SBUF_FULL", "NCC_PSUM_FULL"):
                            raise
                        plan(program, uses)
            except OutOfMemory as e:
                log.debug("schedule try %d ran out of memory at instruction %d (%d ran ahead): %s", tries, e.waiting,
                          len(e.ahead), e)
                for i in e.ahead:
                    hold[i] = max(hold.get(i, 0), e.waiting + 1)
                if e.code == "NCC_PSUM_FULL" and preds is plain:
                    preds = whole_accumulations(lowered, plain)
            except CompileError as e:
                if e.code not in ("NCC_SBUF_FULL", "NCC_PSUM_FULL"):
                    raise
                log.debug("schedule try %d with %.0f%% of SBUF live found no plan: %s", tries, 100 * budget, e)
                budget *= BUDGET_STEP
            else:
                verify_order(lowered, program.instrs, preds, "schedule")
                program.schedule_tries = tries
                return max(ends, default=0.0), (lookahead, prefetch), top
            program.instrs = list(lowered)
            for p, engine in zip(lowered, engines):
                p.engine = engine
    program.schedule_tries = tries
    return None


def _nodes_reached(instrs: list[PendingInstr], preds: list[list[int]]) -> tuple[list[int], dict[str, int]]:
    """(per instruction, a bit for each node whose instructions it follows, directly or not; each node's bit)."""
    bit: dict[str, int] = {}
    for p in instrs:
        bit.setdefault(p.node, 1 << len(bit))
    own = [bit[p.node] for p in instrs]
    reached = [0] * len(instrs)
    for i, ps in enumerate(preds):  # a predecessor comes first in lowering order
        found = 0
        for j in ps:
            found |= reached[j] | own[j]
        reached[i] = found
    return reached, bit


def schedule(program: Program, lookahead: int = LOOKAHEAD, preds: list[list[int]] | None = None,
             hold: dict[int, int] | None = None, memory: OnChipMemory | LiveBytes | None = None,
             prefetch: bool = True, tiles_of: list[list[Tile]] | None = None, weights_on_top: bool = False
             ) -> tuple[list[float], list[float]]:
    """Reorder program.instrs and set every instruction's engine and queue (see the module docstring), keeping
    the tiles live at once within `memory` (by default placing each as it goes), reaching at most `lookahead`
    instructions past the first unscheduled one; an instruction in `hold` waits until everything before position
    hold[i] (in lowering order) is scheduled. `preds`: the dependencies, `tiles_of`: each instruction's tiles
    (allocate.tile_uses), both in lowering order (computed when not given). `weights_on_top`: the tiles weight
    loads open are placed as high in SBUF as they fit (see PLACING_TRIES). Returns the estimated start and end of
    every instruction, in the new order. Raises OutOfMemory (NCC_SBUF_FULL / NCC_PSUM_FULL) when every ready
    instruction waits for memory that nothing will free (see schedule_within_memory)."""
    instrs, target = program.instrs, program.target
    n = len(instrs)
    preds = preds if preds is not None else dependencies(instrs)
    hold = hold or {}
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for j in ps:
            succs[j].append(i)
    engines = [candidate_engines(p) for p in instrs]
    lowered_engine = [p.engine for p in instrs]
    virtual = [p.instruction(placed=False) for p in instrs]
    transfers = {i: dma_cost(virtual[i], target) for i, p in enumerate(instrs) if p.engine is Engine.DMA}
    cost = [{e: transfers[i].engine_ns(target) if e is Engine.DMA else _duration(virtual[i], e, program)
             for e in engines[i]} for i in range(n)]
    held = [{e: ports(virtual[i], e) for e in engines[i]} for i in range(n)]
    # rank: the longest path to the end, where a compute instruction is also followed by the next one lowering gave
    # its engine: an engine works through its share one at a time, so the work queued behind an instruction counts
    # (else every block of a long matmul looks equally urgent, and the loads for the last go first). The next one of
    # its own node always; the next one of another node only when that one does not wait for this node's results:
    # a node that reads them (a scan layer's scan after its gated projection, its output projection after the scan)
    # runs block by block as they come, interleaved with this one, not queued behind all of it
    reached, node_bit = _nodes_reached(instrs, preds)
    rank = [0.0] * n
    next_on: dict[tuple[Engine, str], float] = {}  # the rank of the next instruction of each engine and node
    next_any: dict[Engine, tuple[float, int]] = {}  # the next instruction of each engine that waits for another
    for i in reversed(range(n)):
        own, node = instrs[i].engine, instrs[i].node
        after = max(map(rank.__getitem__, succs[i]), default=0.0)
        queued = own in _ON_ENGINES or own is Engine.PE
        if queued:
            after = max(after, next_on.get((own, node), 0.0))
            following = next_any.get(own)
            if following is not None and not reached[following[1]] & node_bit[node]:
                after = max(after, following[0])
        rank[i] = min(cost[i].values()) + after
        if queued:
            next_on[own, node] = rank[i]
            if preds[i]:
                next_any[own] = (rank[i], i)
    # a compute instruction that waits for nothing but the program's fills (a ring of diagonals zeroed from a zero
    # column) can run at any time: like a transfer, it waits for a more critical instruction about to be ready
    # (MobileNetV3 102.2 -> 101.3 us in bf16, 186.0 -> 184.5 in fp32; for every instruction, not fills alone, BERT-large
    # and ViT in fp32 ran 8-12% slower)
    floating = [all(not instrs[j].node for j in preds[i]) for i in range(n)]
    tiles_of = tiles_of if tiles_of is not None else tile_uses(program)
    uses: dict[Tile, int] = {}
    for ts in tiles_of:
        for t in ts:
            uses[t] = uses.get(t, 0) + 1
    loads, stores = split_queues(program, {i: c.bytes for i, c in transfers.items()})
    # the servers: each compute engine, and each DMA queue; a queue serves its group's pool
    servers: list[tuple[Engine, int]] = [(e, 0) for e in _SERVERS]
    servers += [(Engine.DMA, q) for q in range(target.dma_queues)]
    free_at = [0.0] * len(servers)
    # a DMA queue holds dma_queue_depth transfers, the one moving and those being prepared: a transfer is taken
    # when the one depth places before it has ended, and its data moves a DMA latency after (runtime/simulator.py),
    # so short transfers one after another pay most of a latency each. (end of each of a queue's last transfers)
    depth = target.dma_queue_depth
    recent: list[list[float]] = [[0.0] * depth for _ in servers]
    pools: dict[object, _Pool] = {e: _Pool() for e in _SERVERS}
    pools["loads"], pools["short loads"], pools["stores"] = _Pool(), _Pool(), _Pool()
    # a store queue takes loads until the first store is scheduled, then only short ones when no store is ready
    # (a long load could hold up the stores that become ready meanwhile); a load queue takes a store when it is
    # the most critical ready transfer: with stores a small share of the bytes, one store queue of sixteen held
    # ViT's patch embedding, class-token concatenation and position add, 63 transfers one after another on the
    # critical path (bf16 1068.2 -> 967.3 us; Llama layer 458.2 -> 405.7, BERT-base fp32 1556.6 -> 1497.3)
    pools_of_server: list[list[object]] = [
        [e] if e is not Engine.DMA else ["loads", "short loads", "stores"] if q in loads and q not in stores else
        ["stores", "loads", "short loads"] for e, q in servers]
    loads_left = sum(1 for p in instrs if p.engine is Engine.DMA and not is_store(p))
    port_free = {p: 0.0 for p in Port}
    memory = memory or OnChipMemory(target, large_tile_reserve(program, tiles_of))
    placed: set[Tile] = set()
    waiting = [len(ps) for ps in preds]
    ready_at = [0.0] * n
    taken = [False] * n  # out of every pool: scheduled, or waiting for memory
    scheduled = [False] * n
    blocked: list[int] = []  # ready, waiting for memory, in lowering order (a heap)
    deferred: list[int] = []  # ready, but too far ahead of the first unscheduled instruction (a heap)
    far: list[int] = []  # weight loads ready beyond the lookahead (a heap): they may start early (PREFETCH_REACH)
    far_bytes: dict[int, int] = {}  # those released early, not yet placed: their SBUF bytes per partition
    far_pending = 0  # the sum of far_bytes
    is_weight_load = [p.engine is Engine.DMA and not preds[i] and isinstance(src := p.args.get("src"), HbmAccess)
                      and src.tensor.kind is TensorKind.WEIGHT for i, p in enumerate(instrs)]
    held_back: list[tuple[int, int]] = []  # ready, held until the frontier passes a position: (position, i), a heap
    opener: dict[Tile, int] = {}  # the instruction that placed each live tile
    # places known as they go (OnChipMemory): when each place frees, and what each instruction's tiles wait for
    freed_at = _FreedAt(target) if isinstance(memory, OnChipMemory) else None
    last_end: dict[Tile, float] = {}  # the latest estimated end of each live tile's accesses
    room_at: dict[Tile, float] = {}  # when the place each live tile was given is free of earlier accesses
    frontier = 0  # the first instruction in lowering order not yet scheduled
    order: list[int] = []
    started, ended = [0.0] * n, [0.0] * n  # estimated
    last_on: dict[Engine, int] = {}  # the instruction each compute engine ran last
    act_table = None  # the function table ScalarE holds

    def pools_of(i: int) -> list[object]:
        if instrs[i].engine is Engine.DMA:
            return ["stores" if is_store(instrs[i]) else
                    "short loads" if cost[i][Engine.DMA] <= SHORT_LOAD_NS else "loads"]
        return list(engines[i])

    def release(i: int, early: bool = False) -> None:
        if i >= frontier + lookahead and not early:
            heapq.heappush(far if is_weight_load[i] else deferred, i)
            return
        if hold.get(i, 0) > frontier:
            heapq.heappush(held_back, (hold[i], i))
            return
        for key in pools_of(i):
            pools[key].add(ready_at[i], rank[i], i)

    def sbuf_bytes(i: int) -> int:
        return sum(footprint(t, target) for t in tiles_of[i] if t.mem is Mem.SBUF and t not in placed)

    def place(i: int) -> bool:
        """Place the tiles i opens; on failure place none."""
        opened = []
        for t in tiles_of[i]:
            if t in placed:
                continue
            if not memory.place(t, weights_on_top and is_weight_load[i]):
                for u in opened:
                    memory.free(u)
                    placed.discard(u)
                return False
            placed.add(t)
            opened.append(t)
            opener[t] = i
        if freed_at is not None:
            for t in opened:
                room_at[t] = freed_at.ends(t)
        return True

    for i in range(n):
        if waiting[i] == 0:
            release(i)
    groups = _server_groups(pools_of_server)
    while len(order) < n:
        # the server that can start something first; of the servers that can start as soon, the one idle longest
        # (queues share the work, rather than the first taking every transfer it will be free for), then the first.
        # Servers of one group take from the same pools, so the group's first free one is the group's best (for
        # speed: the DMA queues form at most two groups, the load queues and the store queues)
        best: tuple[float, float, int] = (float("inf"), float("inf"), -1)  # (when, free at, server)
        for keys, members in groups:
            soonest = float("inf")  # when the group's pools have something ready
            for key in keys:
                pool = pools[key]
                if pool.ready:
                    soonest = float("-inf")
                    break
                if pool.pending and pool.pending[0][0] < soonest:
                    soonest = pool.pending[0][0]
            if soonest == float("inf"):
                continue
            k = members[0] if len(members) == 1 else min(members, key=free_at.__getitem__)
            offer = (max(free_at[k], soonest), free_at[k], k)
            if offer < best:
                best = offer
        best_time, _, best_server = best
        if best_server < 0:
            i = blocked[0] if blocked else 0
            ahead = sorted({opener[t] for t in placed if opener[t] > i and uses[t] > 0})
            raise OutOfMemory(memory.full(next(t for t in tiles_of[i] if t not in placed), instrs[i].node), i, ahead)
        k = best_server
        engine, queue = servers[k]
        for key in pools_of_server[k]:
            pools[key].promote(best_time, rank)
        candidates = [pools[key] for key in pools_of_server[k] if pools[key].ready]
        if not candidates:
            first = min((pools[key] for key in pools_of_server[k]), key=lambda p: p.next_ready_at())
            first.promote(first.next_ready_at(), rank)
            candidates = [first]
        # stores first on a store queue; otherwise the most critical ready instruction
        pool = candidates[0] if candidates[0] is pools["stores"] else min(candidates, key=lambda p: p.ready[0])
        _, i = heapq.heappop(pool.ready)
        if taken[i]:
            continue  # a movable instruction another engine took
        if engine is Engine.DMA or (engine in _ON_ENGINES and floating[i]):
            # (a compute engine waits for one ready before the floating instruction would end, a queue for one
            # ready before half the transfer is done: MobileNetV3 fp32 165.9 -> 165.2 us with the whole, bf16 the same)
            within = cost[i][engine] / (2 if engine is Engine.DMA else 1)
            soon = _critical_soon(pool, rank, i, best_time + within, taken)
            if soon is not None and soon > best_time:  # keep the queue for what the chain needs next
                heapq.heappush(pool.ready, (-rank[i], i))
                free_at[k] = soon
                continue
        taken[i] = True
        far_pending -= far_bytes.pop(i, 0)
        if not place(i):
            heapq.heappush(blocked, i)  # out of every pool until memory frees
            continue
        room = max((room_at.get(t, 0.0) for t in tiles_of[i]), default=0.0)
        if room > ready_at[i]:  # a tile's place frees later (each of a tile's loads waits): back to the pools
            ready_at[i] = room
            taken[i] = False
            for key in pools_of(i):
                pools[key].add(ready_at[i], rank[i], i)
            continue
        e = engine
        if e is Engine.DMA:
            start = max(free_at[k], max(ready_at[i], recent[k][0]) + target.dma_latency_ns)
            end = start + cost[i][e]
            recent[k] = recent[k][1:] + [end]
        else:
            start = max(free_at[k], ready_at[i])
            for p in held[i][e]:
                start = max(start, port_free[p])
            needs = table_of(virtual[i]) if e is Engine.ACT else None
            end = start + (duration_ns(virtual[i], e, target, last_on.get(e) in preds[i],
                                       needs is not None and needs != act_table)
                           if e in _ON_ENGINES else cost[i][e])
            last_on[e] = i
            act_table = needs or act_table
        free_at[k] = end
        started[i], ended[i] = start, end
        if e is Engine.DMA:
            instrs[i].queue = queue
            serving = pools_of_server
            if is_store(instrs[i]) and loads != stores:  # the stores have begun: store queues keep to them
                pools_of_server = [["stores", "short loads"] if keys[0] == "stores" else keys
                                   for keys in pools_of_server]
            loads_left -= not is_store(instrs[i])
            if loads_left == 0:
                pools_of_server = [["stores"] if keys[0] == "loads" else keys for keys in pools_of_server]
            if pools_of_server != serving:
                groups = _server_groups(pools_of_server)

        else:
            for p in held[i][e]:
                port_free[p] = end
            instrs[i].engine = e
        order.append(i)
        progress.step("scheduling", len(order), n, "instructions")
        scheduled[i] = True
        while frontier < n and scheduled[frontier]:
            frontier += 1
        while held_back and held_back[0][0] <= frontier:
            release(heapq.heappop(held_back)[1])
        while deferred and deferred[0] < frontier + lookahead:
            release(heapq.heappop(deferred))
        while far and far[0] < frontier + lookahead:
            release(heapq.heappop(far))
        while prefetch and far and far[0] < frontier + PREFETCH_REACH * lookahead:
            need = sbuf_bytes(far[0])
            live, capacity = memory.room(Mem.SBUF)
            if live + far_pending + need > PREFETCH_FRACTION * capacity:
                break
            j = heapq.heappop(far)
            far_bytes[j] = need
            far_pending += need
            release(j, early=True)
        freed = False
        for t in tiles_of[i]:
            uses[t] -= 1
            last_end[t] = max(last_end.get(t, 0.0), end)
            if uses[t] == 0:
                if freed_at is not None:
                    freed_at.free(t, last_end.pop(t))
                    room_at.pop(t, None)
                memory.free(t)
                freed = True
        while freed and blocked and place(blocked[0]):  # the earliest waiting go first
            j = heapq.heappop(blocked)
            taken[j] = False
            ready_at[j] = max(ready_at[j], end)
            release(j)
        handed_off = end + target.semaphore_handoff_ns
        for s in succs[i]:
            waiting[s] -= 1
            # (a successor is not scheduled yet: its engine is the one lowering gave it)
            at = handed_off if lowered_engine[s] is not e else end
            if at > ready_at[s]:
                ready_at[s] = at
            if waiting[s] == 0:
                release(s)
    program.instrs = [instrs[i] for i in order]
    return [started[i] for i in order], [ended[i] for i in order]


def dependency_chain_ns(program: Program) -> float:
    """The longest chain of dependent instructions of the program: each at its duration on its fastest engine (a
    transfer with its DMA latency), and a semaphore hand-off where the next runs on another engine. No schedule
    of this program can end sooner, however free the engines: where a latency goal lies below it, only a lowering
    with a shorter chain reaches it (benchmarks/pe_floor.py)."""
    instrs, target = program.instrs, program.target
    end: list[float] = []
    for p, ps in zip(instrs, dependencies(instrs)):
        virtual = p.instruction(placed=False)
        cost = dma_cost(virtual, target).engine_ns(target) + target.dma_latency_ns if p.engine is Engine.DMA else \
            min(_duration(virtual, e, program) for e in candidate_engines(p))
        start = max((end[j] + (target.semaphore_handoff_ns if instrs[j].engine is not p.engine else 0.0)
                     for j in ps), default=0.0)
        end.append(start + cost)
    return max(end, default=0.0)
