"""The engines of every core, running their instruction streams concurrently.

Each stream (an engine, or a DMA queue) is an in-order sequencer: it starts its next instruction when it is idle
and every semaphore the instruction waits on has reached its value; the instruction reads its inputs when it
starts and writes its results, then increments its semaphore, when it completes. Nothing else orders the streams.

Two policies pick what happens next:
- "clock" (default): simulated time. An instruction occupies its engine for its cost (runtime/costs.py); events
  happen in time order, so the elapsed time is the simulated latency of the program.
- "random": a seeded random choice among every stream that may start and every instruction that may complete.
  Programs that are correctly synchronised give the same answer under every choice; a missing semaphore shows.
When every unfinished stream is blocked and nothing is in flight, the run stops with a deadlock error naming each
waiting instruction and the semaphores it waits on.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from runtime.errors import DeadlockError
from runtime.races import RaceChecker
from runtime.semantics import Commit, Issue


@dataclass(slots=True)
class Op:
    """A loaded instruction, ready to run."""

    issue: Issue
    waits: tuple[tuple[int, int], ...]
    signal: int | None
    duration: float  # ns
    mnemonic: str
    node: str  # the ONNX node it came from, "" when unknown


@dataclass(slots=True)
class StreamState:
    core: int
    name: str
    ops: list[Op]
    pc: int = 0
    busy: bool = False


@dataclass
class TraceEvent:
    core: int
    stream: str
    index: int
    start: float
    end: float


@dataclass
class RunStats:
    elapsed_ns: float = 0.0
    instructions: int = 0
    trace: list[TraceEvent] = field(default_factory=list)


class Simulator:
    def __init__(self, streams: list[StreamState], semaphores_per_core: int, cores: int) -> None:
        self.streams = streams
        self.num_sems = semaphores_per_core
        self.cores = cores

    def _blocking_wait(self, sems: list[list[int]], s: StreamState) -> tuple[int, int] | None:
        """The first unmet wait of the stream's next instruction, or None when it may start."""
        row = sems[s.core]
        for sem, value in s.ops[s.pc].waits:
            if row[sem] < value:
                return sem, value
        return None

    def run(self, policy: str = "clock", seed: int = 0, trace: bool = False,
            checker: RaceChecker | None = None) -> RunStats:
        """Run every stream to its end. A `checker` sees every instruction start and complete."""
        for s in self.streams:
            s.pc, s.busy = 0, False
        sems = [[0] * self.num_sems for _ in range(self.cores)]
        if policy == "clock":
            return self._run_clock(sems, trace, checker)
        if policy == "random":
            return self._run_random(sems, random.Random(seed), checker)
        raise ValueError(f"unknown scheduling policy {policy!r}")

    def _run_clock(self, sems: list[list[int]], trace: bool, checker: RaceChecker | None) -> RunStats:
        stats = RunStats()
        in_flight: list[tuple[float, int, StreamState, Commit, float]] = []
        blocked: dict[tuple[int, int], list[StreamState]] = {}
        candidates = [s for s in self.streams if s.ops]
        now, seq = 0.0, 0
        while True:
            for s in candidates:
                if s.busy or s.pc >= len(s.ops):
                    continue
                unmet = self._blocking_wait(sems, s)
                if unmet is not None:
                    blocked.setdefault((s.core, unmet[0]), []).append(s)
                    continue
                op = s.ops[s.pc]
                if checker is not None:
                    checker.issue(s, s.pc)
                commit = op.issue()
                s.busy = True
                heapq.heappush(in_flight, (now + op.duration, seq, s, commit, now))
                seq += 1
            if not in_flight:
                break
            now, _, s, commit, start = heapq.heappop(in_flight)
            commit()
            op = s.ops[s.pc]
            if checker is not None:
                checker.complete(s, s.pc)
            if trace:
                stats.trace.append(TraceEvent(s.core, s.name, s.pc, start, now))
            s.pc += 1
            s.busy = False
            stats.instructions += 1
            candidates = [s]
            if op.signal is not None:
                sems[s.core][op.signal] += 1
                candidates.extend(blocked.pop((s.core, op.signal), ()))
        self._check_finished(sems)
        stats.elapsed_ns = now
        return stats

    def _run_random(self, sems: list[list[int]], rng: random.Random, checker: RaceChecker | None) -> RunStats:
        stats = RunStats()
        in_flight: list[tuple[StreamState, Commit]] = []
        while True:
            ready = [s for s in self.streams
                     if not s.busy and s.pc < len(s.ops) and self._blocking_wait(sems, s) is None]
            choices = len(ready) + len(in_flight)
            if choices == 0:
                break
            pick = rng.randrange(choices)
            if pick < len(ready):
                s = ready[pick]
                s.busy = True
                if checker is not None:
                    checker.issue(s, s.pc)
                in_flight.append((s, s.ops[s.pc].issue()))
                continue
            s, commit = in_flight.pop(pick - len(ready))
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
        stuck = [s for s in self.streams if s.pc < len(s.ops)]
        if not stuck:
            return
        lines = []
        for s in stuck:
            op = s.ops[s.pc]
            waits = ", ".join(f"s{sem}>={value} (is {sems[s.core][sem]})" for sem, value in op.waits
                              if sems[s.core][sem] < value)
            node = f" (node {op.node})" if op.node else ""
            lines.append(f"core {s.core} {s.name} #{s.pc} {op.mnemonic}{node} waits for {waits}")
        raise DeadlockError("every engine is blocked: " + "; ".join(lines))
