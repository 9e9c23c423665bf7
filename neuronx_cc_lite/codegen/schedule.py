"""The schedule: the order of the tile program, the engine of each instruction whose row allows several, and the
DMA queue of each transfer, chosen by list scheduling against the cost model (isa/costs.py).

    preds[i]  instructions i must follow (deps.py), on virtual tiles and HBM tensors
    cost[i,e] its duration on engine e, alone
    rank[i]   cost + the longest path from i to the end of the program: how critical i is
    repeat until every instruction is placed:
        among the instructions whose predecessors are all placed, take the one that can start earliest
        (ties: the higher rank), on the engine, queue and shared ports that are free first;
        it starts when its predecessors' estimated finish times and its engine allow, and holds them until
        its estimated finish

The clocks are the scheduler's estimate; the runtime then enforces the real order with semaphores. Three choices
here decide what the hardware does well:
- DMA queues: transfers into SBUF (loads) and out of it (stores) take separate queues, in proportion to their
  bytes, so that a store waiting for its producer never holds up the loads queued behind it in the same queue;
  within its group a transfer takes the queue free first, so every queue is used.
- Memory: a tile lives from its first to its last access in the new order, and is placed (allocate.py) when
  its first access is scheduled. An instruction whose tiles find no room waits until others are freed, the
  earliest in lowering order first, so running ahead (the loads of the next tiles while this one computes:
  multiple buffering) stops where memory ends.
- Engines: a copy, a tensor_scalar or a memset on float data may run on any engine whose row allows it and that
  reaches its memories; it takes the one that would finish it first.

-O1 keeps the lowering order and only assigns queues (fast compiles); -O2 (the default) schedules.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from isa.costs import Port, duration_ns, ports
from isa.instructions import OPS
from isa.operand import READABLE, WRITABLE, Engine, Mem
from isa.target import Target
from neuronx_cc_lite.codegen.allocate import OnChipMemory, tile_uses
from neuronx_cc_lite.codegen.deps import dependencies
from neuronx_cc_lite.lower.program import HbmAccess, PendingInstr, Program, Tile, TileAccess

MOVABLE = frozenset({"tensor_copy", "tensor_scalar", "memset"})
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


def is_store(p: PendingInstr) -> bool:
    return isinstance(p.args.get("dst"), HbmAccess)


def split_queues(program: Program) -> tuple[list[int], list[int]]:
    """(load queues, store queues): the queues divided in proportion to the bytes each direction moves."""
    total = program.target.dma_queues
    moved = {True: 0, False: 0}
    for p in program.instrs:
        if p.engine is Engine.DMA:
            dst = p.args["dst"]
            moved[is_store(p)] += dst.partitions * _free(dst) * dst.dtype.size if isinstance(dst, HbmAccess) \
                else dst.partitions * _free(dst) * dst.tile.dtype.size
    if not moved[True] or not moved[False]:
        return list(range(total)), list(range(total))
    loads = min(total - 1, max(1, round(total * moved[False] / (moved[False] + moved[True]))))
    return list(range(loads)), list(range(loads, total))


def _free(access: TileAccess | HbmAccess) -> int:
    size = 1
    for n, _ in access.dims:
        size *= n
    return size


def assign_queues_in_order(program: Program) -> None:
    """-O1: lowering order, loads and stores on their own queues, each group taken in turn."""
    loads, stores = split_queues(program)
    turn = {True: 0, False: 0}
    for p in program.instrs:
        if p.engine is Engine.DMA:
            group = stores if is_store(p) else loads
            p.queue = group[turn[is_store(p)] % len(group)]
            turn[is_store(p)] += 1


def schedule(program: Program) -> list[list[int]]:
    """Reorder program.instrs, set every instruction's engine and queue and place every tile (see the module
    docstring). Returns the dependencies it kept, as positions in the order before scheduling (for the verifier).
    Raises NCC_SBUF_FULL / NCC_PSUM_FULL when every ready instruction waits for memory that nothing will free."""
    instrs, target = program.instrs, program.target
    n = len(instrs)
    preds = dependencies(instrs)
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for j in ps:
            succs[j].append(i)
    engines = [candidate_engines(p) for p in instrs]
    virtual = [p.instruction(placed=False) for p in instrs]
    cost = [{e: duration_ns(virtual[i], e, target) for e in engines[i]} for i in range(n)]
    held = [{e: ports(virtual[i], e) for e in engines[i]} for i in range(n)]
    rank = [0.0] * n
    for i in reversed(range(n)):
        rank[i] = min(cost[i].values()) + max((rank[s] for s in succs[i]), default=0.0)
    tiles_of = tile_uses(program)
    uses: dict[Tile, int] = {}
    for ts in tiles_of:
        for t in ts:
            uses[t] = uses.get(t, 0) + 1
    loads, stores = split_queues(program)
    group_of = [stores if is_store(p) else loads for p in instrs]
    queue_free = [0.0] * target.dma_queues
    engine_free = {e: 0.0 for e in Engine}
    port_free = {p: 0.0 for p in Port}
    memory = OnChipMemory(target)
    placed: set[Tile] = set()
    waiting = [len(ps) for ps in preds]
    ready_at = [0.0] * n

    def best(i: int) -> tuple[float, float, Engine]:
        """(start, finish, engine) of i on the engine that would finish it first."""
        found = None
        for e in engines[i]:
            if e is Engine.DMA:
                free = min(queue_free[q] for q in group_of[i])
            else:
                free = engine_free[e]
                for p in held[i][e]:
                    free = max(free, port_free[p])
            start = max(ready_at[i], free)
            option = (start, start + cost[i][e], e)
            if found is None or (option[1], option[2]) < (found[1], found[2]):
                found = option
        assert found is not None
        return found

    def place(i: int) -> bool:
        """Place the tiles i opens; on failure place none."""
        opening = [t for t in tiles_of[i] if t not in placed]
        done = []
        for t in opening:
            if not memory.place(t):
                for u in done:
                    memory.free(u)
                    placed.discard(u)
                return False
            placed.add(t)
            done.append(t)
        return True

    heap: list[tuple[float, float, int]] = [(0.0, -rank[i], i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    blocked: list[int] = []  # ready, waiting for memory, in lowering order (a heap)
    room: set[int] = set()  # ready instructions whose tiles are placed
    order: list[int] = []
    while heap:
        key, _, i = heapq.heappop(heap)
        start, end, e = best(i)
        if start > key + 1e-6:  # its engine got busier since it was queued
            heapq.heappush(heap, (start, -rank[i], i))
            continue
        if i not in room and not place(i):
            heapq.heappush(blocked, i)
            if not heap:
                raise memory.full(next(t for t in tiles_of[blocked[0]] if t not in placed), instrs[blocked[0]].node)
            continue
        room.discard(i)
        if e is Engine.DMA:
            q = min(group_of[i], key=lambda k: (queue_free[k], k))
            queue_free[q] = end
            instrs[i].queue = q
        else:
            engine_free[e] = end
            for p in held[i][e]:
                port_free[p] = end
            instrs[i].engine = e
        order.append(i)
        freed = False
        for t in tiles_of[i]:
            uses[t] -= 1
            if uses[t] == 0:
                memory.free(t)
                freed = True
        while freed and blocked and place(blocked[0]):  # the earliest waiting go first
            j = heapq.heappop(blocked)
            room.add(j)
            heapq.heappush(heap, (best(j)[0], -rank[j], j))
        for s in succs[i]:
            waiting[s] -= 1
            ready_at[s] = max(ready_at[s], end)
            if waiting[s] == 0:
                heapq.heappush(heap, (best(s)[0], -rank[s], s))
    if blocked:
        raise memory.full(next(t for t in tiles_of[blocked[0]] if t not in placed), instrs[blocked[0]].node)
    program.instrs = [instrs[i] for i in order]
    return preds
