"""Where the simulated time goes: a Chrome/Perfetto trace of a run, and how busy each engine was.

    model.run(inputs, trace=True)
    json.dump(chrome_trace(model.simulator, model.last_run), open("trace.json", "w"))   # chrome://tracing
    print(utilization_table(model.last_run))
"""

from __future__ import annotations

from typing import Any

from runtime.simulator import RunStats, Simulator


def chrome_trace(simulator: Simulator, stats: RunStats) -> dict[str, Any]:
    """The trace event format: one complete event per instruction, a process per core, a thread per stream,
    times in microseconds."""
    streams = {(s.core, s.name): s for s in simulator.streams}
    events = []
    for e in stats.trace:
        op = streams[e.core, e.stream].ops[e.index]
        events.append({"name": op.mnemonic, "cat": e.stream, "ph": "X", "pid": e.core, "tid": e.stream,
                       "ts": e.start / 1000, "dur": (e.end - e.start) / 1000,
                       "args": {"index": e.index, "node": op.node}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"elapsed_us": stats.elapsed_ns / 1000, "instructions": stats.instructions}}


def utilization(stats: RunStats) -> list[tuple[int, str, int, float]]:
    """(core, stream, instructions, fraction of the run it was busy), busiest first."""
    busy: dict[tuple[int, str], list[float]] = {}
    for e in stats.trace:
        entry = busy.setdefault((e.core, e.stream), [0, 0.0])
        entry[0] += 1
        entry[1] += e.end - e.start
    total = stats.elapsed_ns or 1.0
    rows = [(core, stream, int(count), time / total) for (core, stream), (count, time) in busy.items()]
    return sorted(rows, key=lambda r: -r[3])


def utilization_table(stats: RunStats) -> str:
    lines = [f"{'core':>4} {'stream':<7} {'instructions':>12} {'busy':>6}"]
    lines += [f"{core:>4} {stream:<7} {count:>12} {fraction:>6.1%}" for core, stream, count, fraction in
              utilization(stats)]
    return "\n".join(lines)
