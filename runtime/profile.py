"""Where the simulated time goes: a Chrome/Perfetto trace of a run, and the summary neuron-profile's Summary tab
gives (latency against the roofline, MFU, MBU, engine shares, DMA traffic, reloads, the costliest ONNX nodes).

    model.run(inputs, trace=True)
    json.dump(chrome_trace(model.simulator, model.last_run), open("trace.json", "w"))   # chrome://tracing
    print(summary_text(summarize(model)))

The roofline is a lower bound on any program for the model on one core: the larger of
    compute: the model's FLOPs (recorded by the compiler) over TensorE's peak for the type the model's matmuls
             run in (fp32, or the auto-cast type), and
    memory:  the bytes that must cross HBM once (inputs, outputs, weights as the bundle stores them) over what one
             core's DMA engines can move (all queues at once, within HBM's bandwidth).
MBU is the bytes the run moved across HBM over the same DMA bandwidth and the elapsed time.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from isa.bundle import Bundle
from isa.costs import dma_cost
from isa.dtypes import DType
from isa.operand import Mem
from isa.target import Target
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


# ---- the summary --------------------------------------------------------------------------------------------------


@dataclass
class Roofline:
    compute_ns: float
    memory_ns: float
    peak_tflops: float  # of the fastest operand type the matmuls use
    matmul_dtype: str
    min_bytes: int

    @property
    def ns(self) -> float:
        return max(self.compute_ns, self.memory_ns)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ns >= self.memory_ns else "memory"


def roofline(bundle: Bundle, target: Target) -> Roofline:
    """The model's matmuls run in the type the compiler recorded (the auto-cast type, else fp32); a bundle
    without the record is judged by the fastest type its matmuls use."""
    recorded = bundle.stats.get("matmul_dtype")
    if recorded in DType.__members__:
        fastest = DType[recorded]
    else:
        dtypes = {i.args["moving"].dtype for core in bundle.cores for name, s in core.items() if name == "PE"
                  for i in s.instructions if i.op == "nc_matmul"}
        fastest = max(dtypes, key=lambda d: target.pe_tflops(d.name), default=DType.bf16)
    peak = target.pe_tflops(fastest.name)
    flops = int(bundle.stats.get("model_flops", 0))
    io = sum(int(np.prod(t.shape, dtype=np.int64)) * DType[t.device_dtype].size for t in (*bundle.inputs,
                                                                                          *bundle.outputs))
    min_bytes = io + sum(len(s.data) for s in bundle.weights)
    return Roofline(flops / (peak * 1000), min_bytes / target.core_dma_gbps, peak, fastest.name, min_bytes)


@dataclass
class Summary:
    latency_us: float
    roofline_us: float
    bound: str  # what the roofline is bound by
    ratio: float  # latency over roofline
    mfu: float
    mbu: float
    model_flops: int
    engines: dict[str, float]  # engine -> active share of the run (DMA: the mean over its queues)
    dma_queues_used: int
    dma_transfers: int
    dma_bytes: int  # what the engines moved
    dma_hbm_bytes: int  # what crossed HBM
    spill_bytes: int
    scratch_bytes: int  # stored to tensors between operators
    reloads: list[tuple[str, float]] = field(default_factory=list)  # (tensor, bytes loaded / size), highest first
    top_nodes: list[tuple[str, float]] = field(default_factory=list)  # (ONNX node, share of busy time)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(model: Any, top: int = 8) -> Summary:
    """The summary of the model's last run, which must have been traced (`model.run(..., trace=True)`)."""
    stats: RunStats = model.last_run
    bundle: Bundle = model.bundle
    target: Target = model.target
    elapsed = stats.elapsed_ns or 1.0
    line = roofline(bundle, target)
    flops = int(bundle.stats.get("model_flops", 0))
    ops = {(s.core, s.name): s.ops for s in model.simulator.streams}
    busy: dict[str, float] = {}
    by_node: dict[str, float] = {}
    queues = set()
    for e in stats.trace:
        kind = "DMA" if e.stream.startswith("DMA") else e.stream
        busy[kind] = busy.get(kind, 0.0) + e.end - e.start
        node = ops[e.core, e.stream][e.index].node or "(none)"
        by_node[node] = by_node.get(node, 0.0) + e.end - e.start
        if kind == "DMA":
            queues.add((e.core, e.stream))
    engines = {k: v / elapsed / (target.dma_queues * len(bundle.cores) if k == "DMA" else len(bundle.cores))
               for k, v in sorted(busy.items())}
    transfers, moved, hbm_moved, scratch, spill = 0, 0, 0, 0, 0
    loaded: dict[str, int] = {}
    tensors = sorted(bundle.hbm_tensors, key=lambda t: t.hbm_offset)
    starts = [t.hbm_offset for t in tensors]
    for core in bundle.cores:
        for name, s in core.items():
            for instr in s.instructions:
                if instr.spec.cycles is not None:
                    continue
                cost = dma_cost(instr, target)
                transfers += 1
                moved += cost.bytes
                hbm_moved += cost.hbm_bytes
                dst, src = instr.args["dst"], instr.args["src"]
                if dst.mem is Mem.HBM:
                    kind = _tensor_at(tensors, starts, dst.offset)
                    nbytes = dst.num_partitions * dst.free_size * dst.dtype.size
                    scratch += nbytes if kind is not None and kind.kind == "scratch" else 0
                    spill += nbytes if kind is not None and kind.kind == "spill" else 0
                if src.mem is Mem.HBM and dst.mem is Mem.SBUF:
                    t = _tensor_at(tensors, starts, src.offset)
                    if t is not None:
                        loaded[t.name] = loaded.get(t.name, 0) + src.num_partitions * src.free_size * src.dtype.size
    sizes = {t.name: t.size for t in tensors}
    reloads = sorted(((name, n / max(1, sizes[name])) for name, n in loaded.items()), key=lambda r: -r[1])[:top]
    total_busy = sum(by_node.values()) or 1.0
    top_nodes = sorted(((n, t / total_busy) for n, t in by_node.items()), key=lambda r: -r[1])[:top]
    return Summary(
        latency_us=elapsed / 1000, roofline_us=line.ns / 1000, bound=line.bound, ratio=elapsed / max(line.ns, 1e-9),
        mfu=flops / (elapsed * line.peak_tflops * 1000), mbu=hbm_moved / (elapsed * target.core_dma_gbps),
        model_flops=flops, engines=engines, dma_queues_used=len(queues), dma_transfers=transfers, dma_bytes=moved,
        dma_hbm_bytes=hbm_moved, spill_bytes=int(bundle.stats.get("spill_bytes", spill)), scratch_bytes=scratch,
        reloads=reloads, top_nodes=top_nodes)


def _tensor_at(tensors: list, starts: list[int], offset: int):  # type: ignore[no-untyped-def]
    k = bisect.bisect_right(starts, offset) - 1
    if k >= 0 and offset < tensors[k].hbm_offset + max(1, tensors[k].size):
        return tensors[k]
    return None


def summary_text(s: Summary) -> str:
    engines = "  ".join(f"{k} {v:.0%}" for k, v in s.engines.items())
    avg = s.dma_bytes / s.dma_transfers if s.dma_transfers else 0
    lines = [
        f"latency        {s.latency_us:.2f} us simulated; roofline {s.roofline_us:.2f} us ({s.bound}-bound), "
        f"{s.ratio:.2f}x the roofline",
        f"MFU            {s.mfu:.1%} of TensorE peak ({s.model_flops / 1e9:.3f} GFLOP in the model)",
        f"MBU            {s.mbu:.1%} of one core's DMA bandwidth ({s.dma_hbm_bytes / 1e6:.2f} MB across HBM)",
        f"engines        {engines}  (active share of the run; DMA: the mean over {s.dma_queues_used} queues used)",
        f"DMA            {s.dma_transfers} transfers, {s.dma_bytes / 1e6:.2f} MB, {avg / 1024:.1f} KiB on average",
        f"spilled        {s.spill_bytes / 1e6:.2f} MB; between operators through HBM {s.scratch_bytes / 1e6:.2f} MB",
    ]
    if s.reloads:
        lines.append("reloads        " + ", ".join(f"{name} {factor:.1f}x" for name, factor in s.reloads))
    lines.append("top nodes      " + "; ".join(f"{name} {share:.0%}" for name, share in s.top_nodes))
    return "\n".join(lines)
