"""The critical path of a traced run: the chain of instructions that ends with the run's last event, each link
the instruction whose end let the next one start.

An instruction starts when the one before it on its stream (an engine runs in order; a DMA queue moves its
transfers in order) has ended and every semaphore it waits on has reached its value: the value-th increment of a
semaphore is the end of the instruction that made it. Walking back from the last event to whichever of those ended
last gives a chain whose instructions never overlap, so the run's latency is their time plus the time between them:
semaphore hand-offs between engines, the DMA latency before a transfer's data moves, a shared port held by
another engine, a rendezvous of a collective waiting for its other members (this walk stays on one core).

Engine shares say how busy each engine was; the chain says why the run took as long as it did. A memory-bound
model's chain is mostly transfers; a latency-bound one (a batch-1 convolution network) is hundreds of short
dependent instructions on ScalarE, VectorE and GpSimdE, each paying its fixed cost, and the time between them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from isa.streams import StreamId
from runtime.simulator import TraceEvent

# Ends and starts are sums of float costs: an end this close after a start still came first.
_SLACK_NS = 1e-6


@dataclass
class CriticalPath:
    latency_ns: float  # the run's: the chain's instructions plus the time between them
    busy_ns: dict[str, float]  # engine (DMA: any queue) -> the time of the chain's instructions on it
    waiting_ns: float  # between the chain's instructions (and before its first)
    events: list[TraceEvent] = field(default_factory=list)  # the chain, first to last
    nodes: list[tuple[str, float]] = field(default_factory=list)  # (ONNX node, ns of its instructions on it)

    @property
    def instructions(self) -> int:
        return len(self.events)


def critical_path(trace: list[TraceEvent], ops: dict[tuple[int, str], list[Any]]) -> CriticalPath:
    """The chain ending with the last event of `trace`; `ops[(core, stream)]` are the stream's loaded instructions
    (runtime.simulator.Op: their waits, signal and node)."""
    if not trace:
        return CriticalPath(0.0, {}, 0.0)
    by_slot = {(e.core, e.stream, e.index): e for e in trace}
    increments: dict[tuple[int, int], list[TraceEvent]] = {}  # (core, semaphore) -> signalling events, in order
    for e in trace:
        signal = ops[e.core, e.stream][e.index].signal
        if signal is not None:
            increments.setdefault((e.core, signal), []).append(e)
    for found in increments.values():
        found.sort(key=lambda e: e.end)
    last = max(trace, key=lambda e: e.end)
    chain = [last]
    while True:
        e = chain[-1]
        before = [by_slot.get((e.core, e.stream, e.index - 1))]
        for sem, value in ops[e.core, e.stream][e.index].waits:
            signals = increments.get((e.core, sem), [])
            if 0 < value <= len(signals):
                before.append(signals[value - 1])
        ready = [b for b in before if b is not None and b.end <= e.start + _SLACK_NS]
        if not ready:
            break
        chain.append(max(ready, key=lambda b: b.end))
    chain.reverse()
    busy: Counter[str] = Counter()
    per_node: Counter[str] = Counter()
    for e in chain:
        busy[StreamId.parse(e.stream).engine.name] += e.end - e.start
        per_node[ops[e.core, e.stream][e.index].node or "(none)"] += e.end - e.start
    return CriticalPath(last.end, dict(busy.most_common()), last.end - sum(busy.values()), chain,
                        per_node.most_common())
