"""Stream names: bundles, listings and traces name each instruction stream of a core by a string ("PE", "DMA3").
`StreamId` is the one place that builds such a name and reads one back, so that no caller takes "DMA3" apart by
hand; the names themselves are the bundle format's and do not change."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from isa.operand import Engine

_DMA_QUEUE = re.compile(r"DMA(0|[1-9][0-9]*)")  # a queue's number, written as str(int) writes it


@dataclass(frozen=True)
class StreamId:
    """One instruction stream of a core: an engine's own, or, for DMA (the one engine with several), one queue's,
    `queue` its number."""

    engine: Engine
    queue: int | None = None

    def __post_init__(self) -> None:
        if (self.engine is Engine.DMA) != (self.queue is not None) or (self.queue or 0) < 0:
            raise ValueError(f"no stream of engine {self.engine.name} with queue {self.queue}")

    @classmethod
    def of(cls, engine: Engine, queue: int) -> StreamId:
        """The stream an instruction placed on `engine` and `queue` runs in: the queue counts only for DMA."""
        return cls(engine, queue if engine is Engine.DMA else None)

    @staticmethod
    @functools.lru_cache(maxsize=256)  # asked for every event of a trace, of a handful of names
    def parse(name: str) -> StreamId:
        """The stream `name` names, exactly as `name` writes it; ValueError naming `name` when it names none."""
        queue = _DMA_QUEUE.fullmatch(name)
        if queue:
            return StreamId(Engine.DMA, int(queue.group(1)))
        engine = Engine.__members__.get(name)
        if engine is None or engine is Engine.DMA:
            engines = ", ".join(e.name for e in Engine if e is not Engine.DMA)
            raise ValueError(f"unknown stream {name!r}: a stream is an engine ({engines}) or a DMA queue, DMA<n>")
        return StreamId(engine)

    @property
    def name(self) -> str:
        return self.engine.name if self.queue is None else f"DMA{self.queue}"

    def __str__(self) -> str:
        return self.name


def stream_names(dma_queues: int) -> tuple[str, ...]:
    """The instruction streams of one core: one per engine, and one per DMA queue (CC last: only a rank that
    takes part in collectives has it)."""
    fixed = [StreamId(e) for e in Engine if e not in (Engine.DMA, Engine.CC)]
    queues = [StreamId(Engine.DMA, q) for q in range(dma_queues)]
    return tuple(s.name for s in [*fixed, *queues, StreamId(Engine.CC)])
