"""The engines of every core, running their instruction streams concurrently.

Each stream (an engine, or a DMA queue) is an in-order sequencer: it starts its next instruction when it is idle,
every semaphore the instruction waits on has reached its value and the shared ports it needs are free; the
instruction reads its inputs when it starts and writes its results, then increments its semaphore, when it
completes. Nothing else orders the streams.

A core here is a rank (a logical NeuronCore): its streams, its semaphores, its memories. A collective on a CC stream
is a rendezvous (runtime/collectives.py): the stream posts it when its waits are met and stays busy; when every
rank of its group has posted it, it starts (reading every member's src), lasts the collective cost model's time
while it holds the links that model names (two collectives sharing a link run one after the other), and completes
on every member at once (writing each member's dst, each member's stream signalling its own semaphore).

Two policies pick what happens next:
- "clock" (default): simulated time, by the cost model of isa/costs.py (and its figures, isa/target.py).
  A compute instruction occupies its engine (and its shared ports) for its cost; it starts no earlier than
  semaphore_handoff_ns after the increment from another stream that released its last wait.
  A DMA queue is a pipeline of dma_queue_depth transfers: the next one is triggered (its waits met, the hand-off
  past) while the one before still moves; the core's descriptor generator prepares triggered transfers one at a
  time (dma_descriptor_ns each); a prepared transfer's data starts dma_latency_ns after its preparation began, or
  when the queue's previous transfer is done, whichever is later; it reads when its data starts, pays its pieces,
  then moves its bytes at its engine's rate. While the transfers of one core together ask for more than its DMA
  engines move, or those of one chip for more than its HBM gives, each of them slows down in proportion. Events
  happen in time order, so the elapsed time is the simulated latency of the program.
- "random": a seeded random choice among every stream that may start and every instruction (or collective) that
  may complete. Programs that are correctly synchronised give the same answer under every choice; a missing
  semaphore shows.
When every unfinished stream is blocked and nothing is in flight, the run stops with a deadlock error naming each
waiting instruction and the semaphores it waits on, and each collective some ranks posted and others never did
(then a collective error). An instruction that fails stops the run with its error, naming it.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field

from isa.costs import DmaCost, Port
from isa.target import Target
from runtime.collectives import Collective, CollectiveOp, Rendezvous, start_collective
from runtime.errors import CollectiveError, DeadlockError, NeuronRuntimeError
from runtime.races import RaceChecker
from runtime.semantics import Commit, Issue


@dataclass(slots=True)
class Op:
    """A loaded instruction, ready to run."""

    issue: Issue | None  # None for a collective, which its group starts (runtime/collectives.py)
    waits: tuple[tuple[int, int], ...]
    signal: int | None
    duration: float  # ns: a compute instruction's cost; a DMA's engine time when HBM has bandwidth to spare
    mnemonic: str
    node: str  # the ONNX node it came from, "" when unknown
    dma: DmaCost | None = None
    ports: tuple[Port, ...] = ()
    collective: CollectiveOp | None = None


@dataclass(slots=True)
class StreamState:
    core: int  # the rank
    name: str
    ops: list[Op]
    chip: int = 0  # the chip whose HBM bandwidth its transfers share
    pc: int = 0  # the next instruction to start (a DMA queue: to trigger)
    busy: bool = False
    port_keys: list[tuple[tuple[int, str], ...]] = field(init=False)  # per op: (core, name) of each port it holds
    # A DMA queue under the clock policy: the transfers triggered and not complete (index, when its data may
    # start), whether the first of them moves its data, and when a timer will look at the stream again.
    queued: deque = field(default_factory=deque)
    moving: bool = False
    wake_at: float = -1.0

    def __post_init__(self) -> None:
        self.port_keys = [tuple((self.core, p.name) for p in op.ports) for op in self.ops]  # names hash faster

    @property
    def is_queue(self) -> bool:
        """A stream of transfers (a DMA queue, or SP triggering them)."""
        return bool(self.ops) and self.ops[0].dma is not None


@dataclass
class TraceEvent:
    core: int
    stream: str
    index: int
    start: float  # a transfer: when its data started moving
    end: float


@dataclass
class RunStats:
    elapsed_ns: float = 0.0
    instructions: int = 0
    trace: list[TraceEvent] = field(default_factory=list)


@dataclass(slots=True, eq=False)  # compared by identity: list.remove takes the one that ended
class _Transfer:
    """A DMA moving its data under the clock policy: its fixed cost left, then its bytes left."""

    stream: StreamState
    index: int
    commit: Commit
    start: float
    fixed_left: float
    bytes_left: float
    hbm_per_byte: float  # HBM bytes drawn per byte the engine moves
    rate: float = 0.0  # bytes per ns while moving bytes


_INF = float("inf")
_LINK = -1  # the "core" of a link's key among the held ports: links belong to no rank


@dataclass(slots=True, eq=False)
class _Running:
    """A collective under the clock policy: the links it holds until its last member completes."""

    links: tuple[tuple[int, str], ...]
    members_left: int


def _failed(s: StreamState, e: NeuronRuntimeError, index: int | None = None) -> NeuronRuntimeError:
    """The error of an instruction that failed, naming it: it stops the run, every rank's."""
    k = s.pc if index is None else index
    op = s.ops[k]
    node = f" (node {op.node})" if op.node else ""
    return type(e)(f"core {s.core} {s.name} #{k} {op.mnemonic}{node}: {e.args[0] if e.args else e}")


def _first_unmet(row: list[int], waits: tuple[tuple[int, int], ...]) -> int | None:
    """The first semaphore of `waits` below its value in `row`, or None when the instruction may start."""
    for sem, value in waits:
        if row[sem] < value:
            return sem
    return None


class Simulator:
    def __init__(self, streams: list[StreamState], target: Target, cores: int, chips: int = 1,
                 groups: list[tuple[int, ...]] | None = None) -> None:
        self.streams = streams
        self.target = target
        self.num_sems = target.semaphores
        self.cores = cores
        self.queue_gbps = target.dma_queue_gbps  # bytes per ns of one DMA engine
        self.core_gbps = target.dma_queues * target.dma_queue_gbps  # all of a core's DMA engines together
        self.hbm_gbps = target.hbm_gbps  # bytes per ns of one chip's HBM, shared by every transfer of its ranks
        self.chips = chips
        self.rendezvous = Rendezvous(groups or [])

    def run(self, policy: str = "clock", seed: int = 0, trace: bool = False,
            checker: RaceChecker | None = None) -> RunStats:
        """Run every stream to its end. A `checker` sees every instruction start and complete."""
        for s in self.streams:
            s.pc, s.busy, s.moving, s.wake_at = 0, False, False, -1.0
            s.queued.clear()
        self.rendezvous.reset()
        sems = [[0] * self.num_sems for _ in range(self.cores)]
        if policy == "clock":
            return self._run_clock(sems, trace, checker)
        if policy == "random":
            return self._run_random(sems, random.Random(seed), checker)
        raise ValueError(f"unknown scheduling policy {policy!r}")

    def _run_clock(self, sems: list[list[int]], trace: bool, checker: RaceChecker | None) -> RunStats:
        t = self.target
        stats = RunStats()
        # the event heap: (time, seq, stream, commit, start); commit None: a timer that looks at the stream again
        events: list[tuple[float, int, StreamState, Commit | None, float]] = []
        transfers: list[_Transfer] = []
        held: set[tuple[int, str]] = set()  # the ports in use
        blocked: dict[tuple[int, int], list[StreamState]] = {}
        waiting_port: dict[tuple[int, str], list[StreamState]] = {}
        ready: list[Collective] = []  # collectives every member has posted, waiting for their links
        # per core and semaphore, each increment's (time, stream): when a wait was met, and by whom
        increments: list[list[list[tuple[float, int]]]] = [[[] for _ in range(self.num_sems)]
                                                             for _ in range(self.cores)]
        uid = {id(s): k for k, s in enumerate(self.streams)}
        preparing = [0.0] * self.cores  # when each core's descriptor generator is free
        candidates = [s for s in self.streams if s.ops]
        now, seq = 0.0, 0
        reshare = False  # the transfers moving bytes changed since their rates were set

        def released_at(s: StreamState, op: Op) -> float:
            """When the increments that met the op's waits reach it: a hand-off from another stream costs."""
            at, me = 0.0, uid[id(s)]
            for sem, value in op.waits:
                if value > 0:
                    when, by = increments[s.core][sem][value - 1]
                    at = max(at, when + t.semaphore_handoff_ns if by != me else when)
            return at

        def wake(s: StreamState, at: float) -> None:
            nonlocal seq
            if s.wake_at != at:
                s.wake_at = at
                heapq.heappush(events, (at, seq, s, None, now))
                seq += 1

        def start_data(s: StreamState) -> bool:
            """Start the data of the queue's first transfer if it may; whether it did."""
            nonlocal reshare
            index, at = s.queued[0]
            if at > now:
                wake(s, at)
                return False
            op = s.ops[index]
            if checker is not None:
                checker.issue(s, index)
            try:
                commit = op.issue()
            except NeuronRuntimeError as e:
                raise _failed(s, e, index) from None
            cost = op.dma
            transfers.append(_Transfer(s, index, commit, now, cost.fixed_ns, float(cost.bytes),
                                       cost.hbm_bytes / cost.bytes if cost.bytes else 0.0))
            s.moving = True
            reshare = reshare or cost.fixed_ns <= 0  # it moves bytes at once
            return True

        while True:
            for s in candidates:
                if s.is_queue:
                    # trigger what the queue has room for, then start the first one's data
                    while s.pc < len(s.ops) and len(s.queued) < t.dma_queue_depth:
                        op = s.ops[s.pc]
                        unmet = _first_unmet(sems[s.core], op.waits)
                        if unmet is not None:
                            blocked.setdefault((s.core, unmet), []).append(s)
                            break
                        at = released_at(s, op)
                        if at > now:
                            wake(s, at)
                            break
                        begin = max(now, preparing[s.core])
                        preparing[s.core] = begin + t.dma_descriptor_ns
                        s.queued.append((s.pc, begin + t.dma_latency_ns))
                        s.pc += 1
                    if s.queued and not s.moving:
                        start_data(s)
                    continue
                if s.busy or s.pc >= len(s.ops):
                    continue
                op = s.ops[s.pc]
                unmet = _first_unmet(sems[s.core], op.waits)
                if unmet is not None:
                    blocked.setdefault((s.core, unmet), []).append(s)
                    continue
                at = released_at(s, op)
                if at > now:
                    wake(s, at)
                    continue
                ports = s.port_keys[s.pc]
                taken = next((key for key in ports if key in held), None)
                if taken is not None:
                    waiting_port.setdefault(taken, []).append(s)
                    continue
                if checker is not None:
                    checker.issue(s, s.pc)
                s.busy = True
                if op.collective is not None:
                    posted = self.rendezvous.post(s)
                    if posted is not None:
                        ready.append(posted)
                    continue
                try:
                    commit = op.issue()
                except NeuronRuntimeError as e:
                    raise _failed(s, e) from None
                held.update(ports)
                heapq.heappush(events, (now + op.duration, seq, s, commit, now))
                seq += 1
            if ready:
                seq = self._start_collectives(ready, held, events, now, seq, checker)
            if not events and not transfers:
                break
            if reshare:
                self._share(transfers)
            now, done, reshare = self._next_event(now, events, transfers)
            if done is None:  # a transfer ended its fixed part: the shares change, nothing completes
                candidates = []
                continue
            s, index, commit, start = done
            if commit is None:  # a timer
                s.wake_at = -1.0
                candidates = [s]
                continue
            commit()
            op, released = s.ops[index], s.port_keys[index]
            if checker is not None:
                checker.complete(s, index)
            if trace:
                stats.trace.append(TraceEvent(s.core, s.name, index, start, now))
            stats.instructions += 1
            candidates = [s]
            if s.is_queue:
                s.queued.popleft()
                s.moving = False
            else:
                s.pc += 1
                s.busy = False
                for key in released:
                    held.remove(key)
                    candidates.extend(waiting_port.pop(key, ()))
            if op.signal is not None:
                sems[s.core][op.signal] += 1
                increments[s.core][op.signal].append((now, uid[id(s)]))
                candidates.extend(blocked.pop((s.core, op.signal), ()))
        self._check_finished(sems)
        stats.elapsed_ns = now
        return stats

    @staticmethod
    def _next_event(now: float, events: list, transfers: list[_Transfer]
                    ) -> tuple[float, tuple[StreamState, int, Commit | None, float] | None, bool]:
        """Advance the clock to the next event: an instruction that completes or a timer, returned as (stream,
        instruction, commit or None for a timer, start) and taken off its list, or a transfer that ends its
        fixed part (None); and whether the transfers moving bytes changed, so that their shares must be worked
        out again."""
        step, first, done = _INF, None, None
        for tr in transfers:
            left = tr.fixed_left if tr.fixed_left > 0 else tr.bytes_left / tr.rate
            if left < step:
                step, first = left, tr
        if events and events[0][0] - now <= step:
            end, _, s, commit, start = heapq.heappop(events)
            step, first = end - now, None
            done = (s, s.pc if commit is not None else -1, commit, start)
        moving = first is not None and first.fixed_left <= 0
        reshare = False
        for tr in transfers:
            if tr.fixed_left > 0:
                tr.fixed_left = tr.fixed_left - step if tr.fixed_left > step else 0.0
                reshare = reshare or tr.fixed_left == 0.0
            else:
                tr.bytes_left -= tr.rate * step
        if first is None:
            return now + step, done, reshare
        if not moving:
            return now + step, None, True
        transfers.remove(first)
        return now + step, (first.stream, first.index, first.commit, first.start), True

    def _share(self, transfers: list[_Transfer]) -> None:
        """Every transfer moving bytes runs at its engine's rate, unless those of one core together ask for more
        than its DMA engines move, or those touching one chip's HBM for more than it gives: then they share it
        in proportion."""
        core_demand = [0.0] * self.cores
        hbm_demand = [0.0] * self.chips
        for tr in transfers:
            if tr.fixed_left <= 0:
                core_demand[tr.stream.core] += self.queue_gbps
                hbm_demand[tr.stream.chip] += self.queue_gbps * tr.hbm_per_byte
        core_scale = [min(1.0, self.core_gbps / d) if d > 0 else 1.0 for d in core_demand]
        hbm_scale = [min(1.0, self.hbm_gbps / d) if d > 0 else 1.0 for d in hbm_demand]
        for tr in transfers:
            scale = core_scale[tr.stream.core]
            if tr.hbm_per_byte > 0:
                scale = min(scale, hbm_scale[tr.stream.chip])
            tr.rate = self.queue_gbps * scale

    def _start_collectives(self, ready: list[Collective], held: set[tuple[int, str]], events: list,
                           now: float, seq: int, checker: RaceChecker | None) -> int:
        """Start every ready collective whose links are all free, in the order they became ready: it reads every
        member's src now and ends on every member at once; its links stay held until then. Returns the next
        sequence number of the event heap."""
        for c in list(ready):
            op = c.op()
            links = tuple((_LINK, name) for name in op.links)
            if any(key in held for key in links):
                continue
            ready.remove(c)
            held.update(links)
            if checker is not None:
                checker.join(c.members)
            running = _Running(links, len(c.members))
            for s, commit in zip(c.members, start_collective(c)):
                heapq.heappush(events, (now + op.ns, seq, s, self._member_done(commit, running, held), now))
                seq += 1
        return seq

    @staticmethod
    def _member_done(commit: Commit, running: _Running, held: set[tuple[int, str]]) -> Commit:
        """A member's commit that frees the collective's links once every member has completed."""
        def done() -> None:
            commit()
            running.members_left -= 1
            if not running.members_left:
                held.difference_update(running.links)
        return done

    def _run_random(self, sems: list[list[int]], rng: random.Random, checker: RaceChecker | None) -> RunStats:
        stats = RunStats()
        # each entry completes at once: one instruction, or every member of a collective
        in_flight: list[tuple[list[StreamState], list[Commit]]] = []
        while True:
            ready = [s for s in self.streams if not s.busy and s.pc < len(s.ops)
                     and _first_unmet(sems[s.core], s.ops[s.pc].waits) is None]
            choices = len(ready) + len(in_flight)
            if choices == 0:
                break
            pick = rng.randrange(choices)
            if pick < len(ready):
                s = ready[pick]
                s.busy = True
                if checker is not None:
                    checker.issue(s, s.pc)
                op = s.ops[s.pc]
                if op.collective is None:
                    try:
                        in_flight.append(([s], [op.issue()]))
                    except NeuronRuntimeError as e:
                        raise _failed(s, e) from None
                    continue
                posted = self.rendezvous.post(s)
                if posted is not None:
                    if checker is not None:
                        checker.join(posted.members)
                    in_flight.append((posted.members, start_collective(posted)))
                continue
            members, commits = in_flight.pop(pick - len(ready))
            for s, commit in zip(members, commits):
                commit()
                op = s.ops[s.pc]
                if checker is not None:
                    checker.complete(s, s.pc)
                s.pc += 1
                s.busy = False
                stats.instructions += 1
                if op.signal is not None:
                    sems[s.core][op.signal] += 1
        self._check_finished(sems)
        return stats

    def _check_finished(self, sems: list[list[int]]) -> None:
        """A deadlock error when some stream did not finish: the ones blocked on semaphores, and the collectives
        some ranks posted and others never did (a stream that posted one is busy with it); a CollectiveError when
        there are such collectives (the runtime's NRT_COLL_PENDING)."""
        stuck = [s for s in self.streams if s.pc < len(s.ops) and not s.busy]
        pending = self.rendezvous.describe_pending()
        if not stuck and not pending:
            return
        lines = []
        for s in stuck:
            op = s.ops[s.pc]
            waits = ", ".join(f"s{sem}>={value} (is {sems[s.core][sem]})" for sem, value in op.waits
                              if sems[s.core][sem] < value)
            node = f" (node {op.node})" if op.node else ""
            lines.append(f"core {s.core} {s.name} #{s.pc} {op.mnemonic}{node} waits for {waits}")
        error = CollectiveError if pending else DeadlockError
        raise error("every engine is blocked: " + "; ".join(pending + lines))
