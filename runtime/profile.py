"""Where the simulated time goes: a Chrome/Perfetto trace of a run, and the summary neuron-profile's Summary tab
gives (latency against the roofline, MFU, MBU, engine shares, DMA traffic, reloads, the costliest ONNX nodes),
and the critical path (runtime/critical_path.py): what on the chain of instructions that set the latency took it.

    model.run(inputs, trace=True)
    json.dump(chrome_trace(model), open("trace.json", "w"))                             # Perfetto
    print(summary_text(summarize(model)))                                               # `neuronx-cc-lite profile`

The roofline is a lower bound on any program for the model on one core: the largest of
    compute: the model's FLOPs (recorded by the compiler) over TensorE's peak for the type the model's matmuls
             run in (fp32, or the auto-cast type),
    DMA:     what must pass through the core's DMA engines over what they move together (all queues at once):
             R, the bytes that must be read from HBM (the inputs and weights as the bundle stores them, up to
             what the program reads of each: an embedding's gathered rows), and W, the bytes that must be
             written (the outputs). A copy from HBM to HBM reads and writes in one pass, which only outputs that
             are copies of inputs and weights (C bytes, recorded by the compiler: views, concats, transposes,
             gathers of them) can use; every other byte passes through SBUF on its own: max(R, W, R + W - C),
    HBM:     R + W over the chip's HBM bandwidth.
MFU is the model's FLOPs over the elapsed time and that peak; MBU the bytes the DMA engines moved to or from HBM
(once per pass, as the DMA bound counts them) over the elapsed time and the core's DMA bandwidth.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from isa.bundle import Bundle, HbmTensorInfo
from isa.costs import DmaCost, dma_cost, dma_elements, ports, small_pieces, stream_durations
from isa.dtypes import DType
from isa.instructions import Instruction
from isa.listing import format_operand
from isa.operand import Engine, Mem
from isa.streams import StreamId, stream_names
from isa.target import Target
from isa.tensor_kind import TensorKind
from runtime.critical_path import critical_path
from runtime.layout import check_ranks
from runtime.model import Model, collective_op, stream_engine
from runtime.semantics import Commit
from runtime.simulator import Op, RunStats, Simulator, StreamState, TraceEvent


def chrome_trace(model: Model) -> dict[str, Any]:
    """The model's last (traced) run in the trace event format that chrome://tracing and Perfetto read, times in
    microseconds:
    - a process per core, pid core + 1 (Perfetto takes pid 0 for the kernel's swapper), named "core N";
    - a thread per stream, tid its place + 1 in PE, ACT, DVE, POOL, SP, DMA0, DMA1, ..., named after the stream
      and given that place as its sort index, so the rows appear in the order of the engines;
    - a complete event ("X") per instruction; its args give the ONNX node, the operands as the listing prints
      them, the bytes read and written, the semaphores it waits on and the instruction whose signal released it
      (a collective: on the CC row of every member, from its start to its end, with its group, algorithm and the
      links it held);
    - a flow ("s" -> "f") per semaphore hand-off between two streams. Semaphores only count up, so the k-th
      increment of semaphore s on a core (in completion order, which the trace keeps) is what satisfies a wait
      s>=k there: the arrow goes from that increment's instruction to the waiting one.
    """
    stats = model.last_run
    if stats is None or (stats.instructions and not stats.trace):
        raise ValueError("chrome_trace needs a traced run: model.run(inputs, trace=True)")
    bundle = model.bundle
    order = {name: k for k, name in enumerate(stream_names(model.target.dma_queues))}
    ops = {(s.core, s.name): s.ops for s in model.simulator.streams}
    events: list[dict[str, Any]] = []
    for core, streams in enumerate(bundle.cores):
        events.append({"name": "process_name", "ph": "M", "pid": core + 1, "args": {"name": f"core {core}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": core + 1, "args": {"sort_index": core}})
        for name in sorted(streams, key=order.__getitem__):
            tid = order[name] + 1
            events.append({"name": "thread_name", "ph": "M", "pid": core + 1, "tid": tid, "args": {"name": name}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": core + 1, "tid": tid,
                           "args": {"sort_index": order[name]}})
    increments: dict[tuple[int, int], list[TraceEvent]] = {}
    for e in stats.trace:
        signal = ops[e.core, e.stream][e.index].signal
        if signal is not None:
            increments.setdefault((e.core, signal), []).append(e)
    flows: list[dict[str, Any]] = []
    for e in stats.trace:
        op = ops[e.core, e.stream][e.index]
        instr = bundle.cores[e.core][e.stream].instructions[e.index]
        pid, tid = e.core + 1, order[e.stream] + 1
        args = {"index": e.index, "node": op.node, **_operand_args(instr)}
        if op.dma is not None:
            args["hbm_bytes"] = op.dma.hbm_bytes
        if op.collective is not None:
            c = op.collective
            args.update(group=c.group, ranks=list(bundle.groups[c.group]), algorithm=c.algorithm, links=list(c.links))
        if op.signal is not None:
            args["signal"] = f"s{op.signal}"
        releasers = [(sem, value, increments[e.core, sem][value - 1]) for sem, value in op.waits if value > 0]
        if releasers:
            args["waits"] = [f"s{sem}>={value}" for sem, value, _ in releasers]
            sem, value, last = max(releasers, key=lambda r: r[2].end)
            args["semaphore"] = f"s{sem}>={value}"
            args["released_by"] = f"{last.stream} #{last.index} {ops[e.core, last.stream][last.index].mnemonic}"
        for sem, _, source in releasers:
            if source.stream == e.stream:
                continue  # a stream's own order needs no arrow
            flow = {"name": f"s{sem}", "cat": "semaphore", "id": len(flows) // 2 + 1, "pid": pid}
            # Each end sits inside its slice (mid-way), so that the viewer binds it to that slice.
            flows.append({**flow, "ph": "s", "tid": order[source.stream] + 1,
                          "ts": (source.start + source.end) / 2000})
            flows.append({**flow, "ph": "f", "bp": "e", "tid": tid, "ts": (e.start + e.end) / 2000})
        events.append({"name": op.mnemonic, "cat": "DMA" if op.dma is not None else e.stream, "ph": "X",
                       "pid": pid, "tid": tid, "ts": e.start / 1000, "dur": (e.end - e.start) / 1000,
                       "args": args})
    return {"traceEvents": events + flows, "displayTimeUnit": "ns",
            "otherData": {"elapsed_us": stats.elapsed_ns / 1000, "instructions": stats.instructions}}


def _operand_args(instr: Instruction) -> dict[str, Any]:
    """The operands as the listing prints them, and the bytes the instruction reads and writes through them."""
    operands, read, written = {}, 0, 0
    for f, o in instr.operands():
        operands[f.name] = format_operand(o)
        nbytes = o.num_partitions * o.free_size * o.dtype.size
        if f.writes:
            written += nbytes
        else:
            read += nbytes
    return {"operands": operands, "bytes_read": read, "bytes_written": written}


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


# ---- what a bundle says without running it (`neuronx-cc-lite info`) -------------------------------------------


def on_chip_peak(bundle: Bundle, mem: Mem) -> tuple[int, int]:
    """(bytes of each partition, partitions) of SBUF or PSUM that some instruction touches: the high-water mark of
    the compiler's allocation, the most of the memory the program ever holds (the bundle does not record when which
    bytes are live, so the peak of what is live at once may be lower)."""
    row, partitions = 0, 0
    for core in bundle.cores:
        for s in core.values():
            for instr in s.instructions:
                for _, o in instr.operands():
                    if o.mem is mem:
                        row = max(row, o.partition_span[1] + 1)
                        partitions = max(partitions, o.start_partition + o.num_partitions)
    return row, partitions


def semaphores_used(bundle: Bundle) -> list[int]:
    """Per core, how many distinct semaphores its instructions increment or wait on."""
    counts = []
    for core in bundle.cores:
        used: set[int] = set()
        for s in core.values():
            for instr in s.instructions:
                used.update(sem for sem, _ in instr.waits)
                if instr.signal is not None:
                    used.add(instr.signal)
        counts.append(len(used))
    return counts


def _no_work() -> Commit:
    return _nothing_to_write


def _nothing_to_write() -> None:
    return None


def _nothing(*_: Any) -> None:
    """A collective's read and write when only its time matters."""
    return None


def _no_buffers(srcs: list[Any], n: int, args: Any) -> list[Any]:
    return [None] * n


@dataclass
class TimedRun:
    """A run of a bundle's streams with their costs and none of their semantics (`timed_run`): what `summarize`
    and `chrome_trace` read of a loaded model (bundle, target, simulator, last_run)."""

    bundle: Bundle
    target: Target
    simulator: Simulator
    last_run: RunStats


def timed_run(bundle: Bundle, target: Target, collective_algorithm: str = "auto", trace: bool = False) -> TimedRun:
    """Run the simulator's clock policy over the bundle's streams with their costs but none of their semantics.
    An instruction's duration, the ports it holds and the HBM bandwidth it asks for follow from the instruction
    alone, never from the values, so this is the timeline every run has (`run --profile` reports the same)
    without the work of computing the values; a program that deadlocks raises DeadlockError."""
    topo = check_ranks(bundle, target)
    streams = []
    for c, core in enumerate(bundle.cores):
        for name, s in core.items():
            engine = stream_engine(name, target)
            # The costs as runtime.model loads them: isa/costs.py and isa/collectives.py are the cost models.
            durations = stream_durations(s.instructions, engine, target)
            ops = [Op(None, instr.waits, instr.signal, 0.0, instr.op, node, collective=collective_op(
                          instr, bundle.groups, topo, collective_algorithm, f"core {c} {name} #{i}", _nothing, _nothing,
                          _no_buffers))
                   if instr.spec.collective else
                   Op(_no_work, instr.waits, instr.signal, ns, instr.op, node,
                      dma_cost(instr, target) if instr.spec.cycles is None else None, ports(instr, engine))
                   for i, (instr, node, ns) in enumerate(zip(s.instructions, s.nodes, durations))]
            streams.append(StreamState(c, name, ops, topo.chip_of(c)))
    chips = max(topo.chip_of(r) for r in range(len(bundle.cores))) + 1
    simulator = Simulator(streams, target, len(bundle.cores), chips, bundle.groups)
    return TimedRun(bundle, target, simulator, simulator.run("clock", trace=trace))


def estimated_latency_ns(bundle: Bundle, target: Target, collective_algorithm: str = "auto") -> float:
    """The latency every run of the bundle has, without computing its values (`timed_run`)."""
    return timed_run(bundle, target, collective_algorithm).last_run.elapsed_ns


def io_bytes(bundle: Bundle) -> int:
    """The bytes one inference copies between host and device: its inputs in and its outputs out."""
    return sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in (*bundle.inputs, *bundle.outputs))


def host_overhead_us(bundle: Bundle, target: Target) -> float:
    """What the runtime adds to the device's latency per inference (the target's launch figure and the copies
    of the inputs and outputs): device latency + this is what a published P50 measures."""
    return target.host_overhead_us(io_bytes(bundle))


# ---- the summary --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transfer:
    """A DMA instruction of the bundle, as the summary sees it."""

    cost: DmaCost
    src: HbmTensorInfo | None  # the HBM tensor it reads, if any
    dst: HbmTensorInfo | None  # the HBM tensor it writes, if any
    read_bytes: int  # a gather: every row it gathers
    written_bytes: int


def _is_transfer(instr: Instruction) -> bool:
    return instr.spec.cycles is None and not instr.spec.collective


def _hbm_sides(bundle: Bundle) -> Callable[[Instruction], tuple[HbmTensorInfo | None, HbmTensorInfo | None]]:
    """A transfer's (source, destination) HBM tensors, None for a side on chip."""
    tensors = sorted(bundle.hbm_tensors, key=lambda t: t.hbm_offset)
    starts = [t.hbm_offset for t in tensors]

    def sides(instr: Instruction) -> tuple[HbmTensorInfo | None, HbmTensorInfo | None]:
        src, dst = instr.args["src"], instr.args["dst"]
        return (_tensor_at(tensors, starts, src.offset) if src.mem is Mem.HBM else None,
                _tensor_at(tensors, starts, dst.offset) if dst.mem is Mem.HBM else None)
    return sides


def transfers(bundle: Bundle, target: Target) -> list[Transfer]:
    """Every DMA instruction of the bundle, with the HBM tensors it reads and writes."""
    sides = _hbm_sides(bundle)
    found = []
    for core in bundle.cores:
        for s in core.values():
            for instr in s.instructions:
                if not _is_transfer(instr):
                    continue
                n = dma_elements(instr)
                found.append(Transfer(dma_cost(instr, target), *sides(instr),
                                      n * instr.args["src"].dtype.size, n * instr.args["dst"].dtype.size))
    return found


def _moved(src: HbmTensorInfo | None, dst: HbmTensorInfo | None) -> str:
    """What a transfer moves, by the HBM tensors it reads and writes."""
    kinds = {t.kind for t in (src, dst) if t is not None}
    if not kinds:
        return "on chip"
    if TensorKind.SCRATCH in kinds:
        return "between operators through HBM"
    if kinds <= {TensorKind.INPUT, TensorKind.OUTPUT}:
        return "inputs and outputs"
    if dst is None and src is not None and src.kind is TensorKind.WEIGHT:
        return "weights"
    return " and ".join(sorted(k.value for k in kinds))


def path_transfers(bundle: Bundle, path: Any) -> list[tuple[str, float, int]]:
    """The critical path's transfers by what they move (weights, tensors between operators through HBM, inputs and
    outputs, copies on chip): (what, ns of their data on the path, how many), most first. Their DMA latencies are
    the path's time between instructions; a model whose chain runs through HBM between its operators (Swin-T's
    window partitions) shows it here."""
    sides = _hbm_sides(bundle)
    ns: dict[str, float] = {}
    count: dict[str, int] = {}
    for e in path.events:
        instr = bundle.cores[e.core][e.stream].instructions[e.index]
        if not _is_transfer(instr):
            continue
        what = _moved(*sides(instr))
        ns[what] = ns.get(what, 0.0) + e.end - e.start
        count[what] = count.get(what, 0) + 1
    return sorted(((what, t, count[what]) for what, t in ns.items()), key=lambda r: -r[1])


def small_pieces_by_node(bundle: Bundle) -> dict[str, int]:
    """ONNX node -> the DMA pieces under 512 bytes its transfers cut where they move more per partition."""
    found: dict[str, int] = {}
    for core in bundle.cores:
        for s in core.values():
            for instr, node in zip(s.instructions, s.nodes):
                n = small_pieces(instr)
                if n:
                    found[node or "(none)"] = found.get(node or "(none)", 0) + n
    return found


def _tensor_at(tensors: list[HbmTensorInfo], starts: list[int], offset: int) -> HbmTensorInfo | None:
    k = bisect.bisect_right(starts, offset) - 1
    if k >= 0 and offset < tensors[k].hbm_offset + max(1, tensors[k].size):
        return tensors[k]
    return None


@dataclass
class Roofline:
    compute_ns: float
    memory_ns: float  # the larger of the DMA and the HBM bound
    peak_tflops: float  # of the type the matmuls run in
    matmul_dtype: str
    min_bytes: int  # R + W: what must cross HBM
    read_bytes: int = 0  # R
    written_bytes: int = 0  # W
    copy_bytes: int = 0  # C: outputs a program may copy from HBM to HBM

    @property
    def ns(self) -> float:
        return max(self.compute_ns, self.memory_ns)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ns >= self.memory_ns else "memory"


def rank_flops(bundle: Bundle) -> int:
    """The matmul FLOPs one rank does: the model's, or with several ranks the busiest one's."""
    return int(max(bundle.stats.get("rank_flops") or [bundle.stats.get("model_flops", 0)]))


def roofline(bundle: Bundle, target: Target) -> Roofline:
    """The model's matmuls run in the type the compiler recorded (the auto-cast type, else fp32); a bundle
    without the record is judged by the fastest type its matmuls use.

    The bytes that must cross HBM: every output whole (written), every input and weight up to the bytes the
    program reads of it (read). What no instruction reads no program needs, and of a table read by gathers (an
    embedding) only the rows gathered are needed, not the whole vocabulary; of a weight the compiler laid out
    with zeros (a depthwise convolution's diagonal blocks), only the model's data (stats "needed_bytes").

    A bundle of several ranks is judged a rank at a time, as its ranks run side by side: the FLOPs of its busiest
    rank (stats "rank_flops"; the whole model's would put the bound of one core under a sharded run: Llama-3-8B's
    prefill over 32 ranks ran 2,465 us against 2,689 of "roofline") and the bytes of one rank's tensors."""
    recorded = bundle.stats.get("matmul_dtype")
    if recorded in DType.__members__:
        fastest = DType[recorded]
    else:
        dtypes = {i.args["moving"].dtype for core in bundle.cores for name, s in core.items() if name == "PE"
                  for i in s.instructions if i.op == "nc_matmul"}
        fastest = max(dtypes, key=lambda d: target.pe_tflops(d.name), default=DType.bf16)
    peak = target.pe_tflops(fastest.name)
    flops = rank_flops(bundle)
    read: dict[str, int] = {}
    for t in transfers(bundle, target):
        if t.src is not None:
            read[t.src.name] = read.get(t.src.name, 0) + t.read_bytes
    written = sum(t.size for t in bundle.hbm_tensors if t.kind is TensorKind.OUTPUT)
    model_bytes = bundle.stats.get("needed_bytes", {})  # weights laid out with zeros: their data alone
    needed = sum(min(t.size, read.get(t.name, 0), model_bytes.get(t.name, t.size))
                 for t in bundle.hbm_tensors
                 if t.kind in (TensorKind.INPUT, TensorKind.WEIGHT, TensorKind.STATE))  # device state too
    copies = min(written, int(bundle.stats.get("copy_bytes", written)))  # unrecorded (a hand-written listing): all
    passes = max(needed, written, needed + written - copies)
    memory_ns = max(passes / target.core_dma_gbps, (needed + written) / target.hbm_gbps)
    return Roofline(flops / (peak * 1000), memory_ns, peak, fastest.name, needed + written, needed, written,
                    copies)


def hbm_peak_gbps(model: Any) -> float:
    """The highest rate at which the last (traced) run moved bytes across HBM, every core together, as its trace
    shows it. The trace holds when each transfer started and ended, not its rate in between, so a window counts
    only the transfers that moved all their bytes inside it: the figure is a lower bound of the true peak, and
    above HBM's bandwidth only if the simulator broke it.

        a transfer moves its bytes in [start + fixed cost, end] (the fixed cost runs first, at any HBM load)
        windows [a, a + w]: a wherever a transfer starts moving; w from the longest transfer's moving time,
            doubling until one window spans the run
        as no transfer moves for longer than w, one that starts before a has ended before a + w, so
            bytes inside [a, a + w] = bytes of transfers ending by a + w - bytes of transfers starting before a
    """
    ops = {(s.core, s.name): s.ops for s in model.simulator.streams}
    moves = []
    for e in model.last_run.trace:
        cost = ops[e.core, e.stream][e.index].dma
        if cost is not None and cost.hbm_bytes:
            moves.append((min(e.start + cost.fixed_ns, e.end), e.end, cost.hbm_bytes))
    if not moves:
        return 0.0
    begin, end, nbytes = (np.array(column, dtype=np.float64) for column in zip(*moves))
    by_begin, by_end = np.argsort(begin), np.argsort(end)
    begins, ends = begin[by_begin], end[by_end]
    begun = np.concatenate(([0.0], np.cumsum(nbytes[by_begin])))  # bytes of the first k transfers to begin
    ended = np.concatenate(([0.0], np.cumsum(nbytes[by_end])))
    before = begun[np.searchsorted(begins, begins, side="left")]
    width, peak = max(float((end - begin).max()), 1.0), 0.0  # 1 ns at least: transfers may move no bytes
    while True:
        inside = ended[np.searchsorted(ends, begins + width, side="right")] - before
        peak = max(peak, float(inside.max()) / width)
        if width >= ends[-1] - begins[0]:
            return peak
        width *= 2


@dataclass
class Summary:
    latency_us: float
    host_overhead_us: float  # the runtime's launch and input/output copies, beyond the device (host_overhead_us)
    end_to_end_us: float  # latency_us + host_overhead_us: what a P50 measured by the host sees
    roofline_us: float
    bound: str  # what the roofline is bound by: compute or memory
    ratio: float  # latency over roofline
    roofline_compute_us: float  # model FLOPs at TensorE's peak
    roofline_memory_us: float  # the DMA or HBM bound, whichever is larger (module docstring)
    roofline_bytes: int  # the least that must cross HBM: read and written
    roofline_read_bytes: int  # the inputs and weights the program needs
    roofline_written_bytes: int  # the outputs
    roofline_copy_bytes: int  # of them, copies of inputs and weights (may go from HBM to HBM)
    matmul_dtype: str
    peak_tflops: float  # TensorE's peak for matmul_dtype
    dma_gbps: float  # one core's DMA bandwidth (all queues, within HBM's)
    hbm_gbps: float  # the chip's HBM bandwidth
    mfu: float  # model FLOPs / (latency x peak_tflops)
    mbu: float  # bytes the DMA engines moved to or from HBM / (latency x dma_gbps), a rank's mean
    model_flops: int  # the matmul FLOPs of the model, or with several ranks of the busiest rank
    engines: dict[str, float]  # engine -> active share of the run (DMA: the mean over its queues)
    dma_queues_used: int
    dma_transfers: int
    dma_bytes: int  # what the engines moved
    dma_average_bytes: float
    dma_hbm_bytes: int  # what crossed HBM
    dma_hbm_pass_bytes: int  # what the engines moved to or from HBM (a copy from HBM to HBM once)
    # DMA pieces under 512 bytes in transfers that move more than that per partition (isa/costs.small_pieces),
    # and the nodes with the most of them
    dma_small_pieces: int
    hbm_peak_gbps: float  # see hbm_peak_gbps()
    spill_bytes: int
    scratch_bytes: int  # stored to tensors between operators
    # (tensor, bytes loaded / size) of the tensors loaded more than once, highest first
    reloads: list[tuple[str, float]] = field(default_factory=list)
    top_nodes: list[tuple[str, float, float]] = field(default_factory=list)  # (ONNX node, busy us, share of busy)
    small_piece_nodes: list[tuple[str, int]] = field(default_factory=list)
    # the chain of instructions that set the latency (runtime/critical_path.py): how many, their time per engine
    # (DMA: any queue), the time between them, and the ONNX nodes with the most time on it
    critical_instructions: int = 0
    critical_busy_us: dict[str, float] = field(default_factory=dict)
    critical_waiting_us: float = 0.0
    critical_nodes: list[tuple[str, float]] = field(default_factory=list)
    # the path's transfers by what they move (path_transfers): (what, us of the transfers, how many)
    critical_transfers: list[tuple[str, float, int]] = field(default_factory=list)
    ranks: int = 1  # the bundle's; with several, the roofline, MFU and MBU are a rank's (roofline())
    chips: int = 1  # that the ranks fill: the HBM peak is of all of them together

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["reloads"] = [{"tensor": name, "factor": factor} for name, factor in self.reloads]
        d["top_nodes"] = [{"node": name, "busy_us": us, "share": share} for name, us, share in self.top_nodes]
        d["small_piece_nodes"] = [{"node": name, "pieces": n} for name, n in self.small_piece_nodes]
        d["critical_nodes"] = [{"node": name, "us": us} for name, us in self.critical_nodes]
        d["critical_transfers"] = [{"what": what, "us": us, "transfers": n} for what, us, n in self.critical_transfers]
        return d


def summarize(model: Any, top: int = 8) -> Summary:
    """The summary of the model's last run, which must have been traced (`model.run(..., trace=True)`)."""
    stats: RunStats = model.last_run
    bundle: Bundle = model.bundle
    target: Target = model.target
    elapsed = stats.elapsed_ns or 1.0
    line = roofline(bundle, target)
    ops = {(s.core, s.name): s.ops for s in model.simulator.streams}
    busy: dict[str, float] = {}
    by_node: dict[str, float] = {}
    queues = set()
    for e in stats.trace:
        engine = StreamId.parse(e.stream).engine
        busy[engine.name] = busy.get(engine.name, 0.0) + e.end - e.start
        node = ops[e.core, e.stream][e.index].node or "(none)"
        by_node[node] = by_node.get(node, 0.0) + e.end - e.start
        if engine is Engine.DMA:
            queues.add((e.core, e.stream))
    engines = {k: v / elapsed / (len(bundle.cores) * (target.dma_queues if k == Engine.DMA.name else 1))
               for k, v in sorted(busy.items())}
    moved, hbm_moved, hbm_passes, scratch = 0, 0, 0, 0
    loaded: dict[str, int] = {}
    found = transfers(bundle, target)
    for t in found:
        moved += t.cost.bytes
        hbm_moved += t.cost.hbm_bytes
        hbm_passes += t.cost.bytes if t.cost.hbm_bytes else 0
        if t.dst is not None:
            scratch += t.written_bytes if t.dst.kind is TensorKind.SCRATCH else 0
        elif t.src is not None:  # into SBUF
            loaded[t.src.name] = loaded.get(t.src.name, 0) + t.read_bytes
    sizes = {t.name: t.size for t in bundle.hbm_tensors}
    reloads = sorted(((name, n / max(1, sizes[name])) for name, n in loaded.items() if n > sizes[name]),
                     key=lambda r: -r[1])[:top]
    small = small_pieces_by_node(bundle)
    total_busy = sum(by_node.values()) or 1.0
    top_nodes = sorted(((n, t / 1000, t / total_busy) for n, t in by_node.items()), key=lambda r: -r[1])[:top]
    flops = rank_flops(bundle)
    host_us = host_overhead_us(bundle, target)
    path = critical_path(stats.trace, ops)
    return Summary(
        latency_us=elapsed / 1000, host_overhead_us=host_us, end_to_end_us=elapsed / 1000 + host_us,
        roofline_us=line.ns / 1000, bound=line.bound, ratio=elapsed / max(line.ns, 1e-9),
        roofline_compute_us=line.compute_ns / 1000, roofline_memory_us=line.memory_ns / 1000,
        roofline_bytes=line.min_bytes, roofline_read_bytes=line.read_bytes,
        roofline_written_bytes=line.written_bytes, roofline_copy_bytes=line.copy_bytes,
        matmul_dtype=line.matmul_dtype, peak_tflops=line.peak_tflops,
        dma_gbps=target.core_dma_gbps, hbm_gbps=target.hbm_gbps,
        mfu=flops / (elapsed * line.peak_tflops * 1000),
        mbu=hbm_passes / (elapsed * target.core_dma_gbps * len(bundle.cores)), model_flops=flops,
        engines=engines, dma_queues_used=len(queues), dma_transfers=len(found),
        dma_bytes=moved, dma_average_bytes=moved / len(found) if found else 0.0, dma_hbm_bytes=hbm_moved,
        dma_hbm_pass_bytes=hbm_passes, dma_small_pieces=sum(small.values()),
        small_piece_nodes=sorted(small.items(), key=lambda r: -r[1])[:top],
        hbm_peak_gbps=hbm_peak_gbps(model), spill_bytes=int(bundle.stats.get("spill_bytes", 0)),
        scratch_bytes=scratch, reloads=reloads, top_nodes=top_nodes,
        critical_instructions=path.instructions, critical_busy_us={k: v / 1000 for k, v in path.busy_ns.items()},
        critical_waiting_us=path.waiting_ns / 1000, critical_nodes=[(n, ns / 1000) for n, ns in path.nodes[:top]],
        critical_transfers=[(what, ns / 1000, n) for what, ns, n in path_transfers(bundle, path)],
        ranks=len(bundle.cores), chips=-(-len(bundle.cores) // target.ranks_per_chip(bundle.lnc)))


def summary_text(s: Summary) -> str:
    engines = "  ".join(f"{k} {v:.0%}" for k, v in s.engines.items())
    lines = [
        f"latency        {s.latency_us:.2f} us simulated, {s.ratio:.2f}x the roofline",
        f"end to end     {s.end_to_end_us:.2f} us with the runtime's launch and input/output copies "
        f"({s.host_overhead_us:.2f} us, the target's figure)",
        f"roofline       {s.roofline_us:.2f} us, {s.bound}-bound{' a rank' if s.ranks > 1 else ''} (compute: "
        f"{s.model_flops / 1e9:.3f} GFLOP at "
        f"{s.peak_tflops:.1f} TFLOPS {s.matmul_dtype} = {s.roofline_compute_us:.2f} us; memory: "
        f"{s.roofline_bytes / 1e6:.2f} MB read and written through {s.dma_gbps:.0f} GB/s of DMA and "
        f"{s.hbm_gbps:.0f} of HBM = {s.roofline_memory_us:.2f} us)",
        f"MFU            {s.mfu:.1%} of TensorE's {s.matmul_dtype} peak",
        f"MBU            {s.mbu:.1%} of one core's DMA bandwidth{', a rank on average' if s.ranks > 1 else ''} "
        f"({s.dma_hbm_bytes / 1e6:.2f} MB across HBM; peak {s.hbm_peak_gbps:.0f} GB/s of "
        + (f"the chip's {s.hbm_gbps:.0f})" if s.chips == 1 else f"{s.chips} chips' {s.chips * s.hbm_gbps:.0f})"),
        f"engines        {engines}  (active share of the run; DMA: the mean over {s.dma_queues_used} queues used)",
        f"DMA            {s.dma_transfers} transfers, {s.dma_bytes / 1e6:.2f} MB, "
        f"{s.dma_average_bytes / 1024:.1f} KiB on average; {s.dma_small_pieces} pieces under 512 B where a "
        f"partition's data is longer"
        + (f" (most: {', '.join(f'{n} {name}' for name, n in s.small_piece_nodes[:3])})" if s.small_piece_nodes
           else ""),
        f"spilled        {s.spill_bytes / 1e6:.2f} MB; between operators through HBM {s.scratch_bytes / 1e6:.2f} MB",
        f"critical path  {s.critical_instructions} instructions, each started by the end of the one before: "
        + ", ".join(f"{k} {v:.1f} us" for k, v in s.critical_busy_us.items())
        + f"; {s.critical_waiting_us:.1f} us between them (hand-offs, DMA latency, shared ports)",
    ]
    lines += _listed("  on it", [f"{us:8.2f} us  {name}" for name, us in s.critical_nodes[:3]])
    lines += _listed("  transfers", [f"{us:8.2f} us  {what} ({n})" for what, us, n in s.critical_transfers])
    lines += _listed("reloaded", [f"{factor:5.1f}x  {name}" for name, factor in s.reloads] or
                     ["no tensor loaded more than once"])
    lines += _listed("top nodes", [f"{us:8.2f} us {share:4.0%}  {name}" for name, us, share in s.top_nodes])
    return "\n".join(lines)


def _listed(title: str, rows: list[str]) -> list[str]:
    return [f"{title if k == 0 else '':<15}{row}" for k, row in enumerate(rows)]
