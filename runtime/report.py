"""`neuronx-cc-lite profile --html`: one self-contained HTML page of a traced run (no network: the CSS, the script
and the SVG charts are inline).

    html = render_html(model.bundle, model.last_run, summarize(model), title="bert.neff")

The page holds
- the summary of runtime/profile.py (summarize, summary_text): figures, engine shares, DMA, top ONNX nodes;
- engine time rolled up by the model's operator type and by layer (rollups(), from the bundle's stats.model_nodes:
  the model node and operator each instruction's node came from);
- an engine timeline per core: a row per engine and DMA queue (PE, ACT, DVE, POOL, SP, DMA0.., CC), a box per
  instruction coloured by engine or by ONNX node, drawn on a canvas by the inline script from packed arrays
  (base64 typed arrays, about 32 bytes an instruction), so 100k instructions stay a few MB and draw fast; beyond
  MAX_BOXES the boxes of a row that start in one slice of time merge (see _merge); a DMA's or collective's box
  tells the bytes it moved and at what rate;
- SBUF and PSUM occupancy over time per core (see occupancy()), drawn by the same script on the timeline's time
  axis: the charts line up with it under the rows' labels, and zoom and pan with it.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from isa.bundle import Bundle
from isa.instructions import Instruction
from isa.operand import Engine, Mem
from isa.streams import StreamId, stream_names
from isa.target import Target, get_target
from runtime.profile import Summary, summary_text
from runtime.simulator import RunStats, TraceEvent

MAX_BOXES = 150_000  # instructions drawn one box each (about 3.6 MB of page); above it, boxes merge
GRANULES = 512  # occupancy tracks a partition row in this many pieces (finer than a chart can show)
CHART_POINTS = 800  # occupancy samples per chart (each the highest value in its slice of time)
ENGINE_ROWS = ("PE", "ACT", "DVE", "POOL", "SP")  # always shown, busy or not
ROLLUP_ROWS = 12  # rows of each roll-up table


# ---- the instructions ---------------------------------------------------------------------------------------------


@dataclass
class _Program:
    """Every instruction of the bundle numbered (a stream's instructions in a row, from first[(core, stream)]), with
    what the page shows of each and its on-chip accesses; built once, so that the trace is handled as arrays."""

    cores: int
    keys: list[tuple[int, str]]  # (core, stream) of each row, in the order of the engines
    first: dict[tuple[int, str], int]
    row: np.ndarray  # per instruction
    node: np.ndarray  # per instruction, into nodes
    mnem: np.ndarray  # per instruction, into mnemonics
    nodes: list[str]
    mnemonics: list[str]
    access_first: np.ndarray  # instruction k's accesses are [access_first[k], access_first[k + 1])
    access: dict[str, np.ndarray]  # per access: mem, lo, hi (its first and last byte in a row), writes
    moved: np.ndarray  # per instruction: the bytes a DMA or a collective writes (0 for the compute engines)

    @staticmethod
    def of(bundle: Bundle, dma_queues: int) -> _Program:
        order = {name: k for k, name in enumerate(stream_names(dma_queues))}
        keys: list[tuple[int, str]] = []
        first: dict[tuple[int, str], int] = {}
        row: list[int] = []
        node: list[int] = []
        mnem: list[int] = []
        nodes: dict[str, int] = {}
        mnemonics: dict[str, int] = {}
        counts: list[int] = []
        access: list[tuple[int, int, int, bool]] = []
        moved: list[int] = []
        for core, streams in enumerate(bundle.cores):
            names = set(ENGINE_ROWS) | {n for n, s in streams.items() if s.instructions}
            for name in sorted(names, key=order.__getitem__):
                first[core, name] = len(row)
                s = streams.get(name)
                transfers = StreamId.parse(name).engine in (Engine.DMA, Engine.CC)
                for instr, source in zip(s.instructions, s.nodes) if s else ():
                    row.append(len(keys))
                    node.append(nodes.setdefault(source or "(none)", len(nodes)))
                    mnem.append(mnemonics.setdefault(instr.op, len(mnemonics)))
                    accesses = _accesses(instr)
                    counts.append(len(accesses))
                    access += accesses
                    moved.append(sum(o.nbytes for o in instr.writes()) if transfers else 0)
                keys.append((core, name))
        columns = list(zip(*access)) or [(), (), (), ()]
        return _Program(len(bundle.cores), keys, first, np.array(row, np.int64), np.array(node, np.int64),
                        np.array(mnem, np.int64), list(nodes), list(mnemonics),
                        np.concatenate(([0], np.cumsum(counts, dtype=np.int64))),
                        {k: np.array(c, dtype) for k, c, dtype in
                         zip(("mem", "lo", "hi", "writes"), columns, (np.int64, np.int64, np.int64, bool))},
                        np.array(moved, np.float64))

    @property
    def rows(self) -> list[str]:
        return [f"{core} {name}" for core, name in self.keys]

    def events(self, trace: list[TraceEvent]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(instruction, start, end) of every event of the trace."""
        first = self.first
        which = np.fromiter((first[e.core, e.stream] + e.index for e in trace), np.int64, len(trace))
        start = np.fromiter((e.start for e in trace), np.float64, len(trace))
        end = np.fromiter((e.end for e in trace), np.float64, len(trace))
        return which, start, end


def _accesses(instr: Instruction) -> list[tuple[int, int, int, bool]]:
    """(memory, first byte, last byte in a partition row, written) of each on-chip operand, reads first."""
    return [(int(o.mem), *o.partition_span, writes)
            for writes, operands in ((False, instr.reads()), (True, instr.writes()))
            for o in operands if o.mem is not Mem.HBM]


# ---- the timeline -------------------------------------------------------------------------------------------------


def timeline(program: _Program, trace: list[TraceEvent]) -> dict[str, Any]:
    """The boxes of the timeline as the page's script reads them: row names, node and mnemonic tables, and per box
    (sorted by row, then start) its row, start and end (ns), instruction index, node, mnemonic and bytes moved,
    packed as little-endian typed arrays in base64. When boxes were merged, count gives the instructions of each
    (and bytes their sum)."""
    which, start, end = program.events(trace)
    row = program.row[which]
    by = np.lexsort((start, row))
    which, row, start, end = which[by], row[by], start[by], end[by]
    index = which - np.array([program.first[k] for k in program.keys], np.int64)[row]
    node, mnem, moved = program.node[which], program.mnem[which], program.moved[which]
    nodes, mnemonics = list(program.nodes), list(program.mnemonics)
    data: dict[str, Any] = {"rows": program.rows, "nodes": nodes, "mnemonics": mnemonics,
                            "instructions": len(trace)}
    if len(trace) > MAX_BOXES:
        nodes.append("(several)")
        mnemonics.append("(several)")
        row, index, node, mnem, start, end, count, moved = _merge(row, index, node, mnem, start, end, moved,
                                                                  len(nodes) - 1, len(mnemonics) - 1)
        data["count"] = _pack(count, np.uint32)  # absent: one instruction a box
    wide = data["node32"] = len(nodes) > np.iinfo(np.uint16).max
    return {**data, "boxes": int(len(row)), "row": _pack(row, np.uint16), "start": _pack(start, np.float32),
            "end": _pack(end, np.float32), "index": _pack(index, np.uint32),
            "node": _pack(node, np.uint32 if wide else np.uint16), "mnem": _pack(mnem, np.uint16),
            "bytes": _pack(moved, np.float64)}


def _merge(row: np.ndarray, index: np.ndarray, node: np.ndarray, mnem: np.ndarray, start: np.ndarray,
           end: np.ndarray, moved: np.ndarray, several_nodes: int, several_mnemonics: int) -> tuple[np.ndarray, ...]:
    """At most MAX_BOXES boxes (rows permitting). Time is cut into slices, from a 100000th of the run, doubled
    until few enough boxes remain; consecutive boxes of a row that start in one slice join: first only boxes of the
    same node and mnemonic, then any (a box of several nodes or mnemonics says so: several_*). A joined box spans
    little more than its slice, so the picture keeps that resolution."""
    begin = float(start.min())
    span = float(end.max()) - begin or 1.0
    same_row = row[1:] == row[:-1]
    alike = same_row & (node[1:] == node[:-1]) & (mnem[1:] == mnem[:-1])
    for joinable in (alike, same_row):
        width = span / 100_000
        while True:
            cut = np.floor((start - begin) / width)
            joins = joinable & (cut[1:] == cut[:-1])
            if len(row) - joins.sum() <= MAX_BOXES or width > span:
                break
            width *= 2
        if len(row) - joins.sum() <= MAX_BOXES:
            break
    heads = np.flatnonzero(np.concatenate(([True], ~joins)))
    tails = np.append(heads[1:], len(row)) - 1

    def one(values: np.ndarray, several: int) -> np.ndarray:
        same = np.minimum.reduceat(values, heads) == np.maximum.reduceat(values, heads)
        return np.where(same, values[heads], several)

    return (row[heads], index[heads], one(node, several_nodes), one(mnem, several_mnemonics), start[heads],
            end[tails], np.diff(np.append(heads, len(row))), np.add.reduceat(moved, heads))


def _pack(values: np.ndarray, dtype: type) -> str:
    return base64.b64encode(values.astype(dtype).astype(np.dtype(dtype).newbyteorder("<")).tobytes()).decode()


# ---- engine time by operator type and by layer ----------------------------------------------------------------


@dataclass
class Rollup:
    name: str  # the operator type, or the layer
    nodes: int  # ONNX nodes in it
    busy_us: float  # engine time of their instructions
    share: float  # of all engine time


def rollups(bundle: Bundle, program: _Program, trace: list[TraceEvent]) -> dict[str, list[Rollup]]:
    """Engine time (every engine's and queue's busy time, as the top-nodes table counts it) summed by the operator
    type of the model node each instruction came from (the bundle's stats.model_nodes; without an entry, a
    hand-written bundle's: "(unknown)") and by that node's layer (layer_of), the largest first."""
    which, start, end = program.events(trace)
    busy = np.bincount(program.node[which], weights=end - start, minlength=len(program.nodes))
    sources = bundle.stats.get("model_nodes", {})
    total = float(busy.sum()) or 1.0
    tables = {}
    def operator(node: str) -> str:
        return sources[node][1] if node in sources else "(no ONNX node)" if node == "(none)" else "(unknown)"

    def layer(node: str) -> str:
        return layer_of(sources[node][0] if node in sources else node)

    for kind, key in (("operator", operator), ("layer", layer)):
        groups: dict[str, list[float]] = {}
        for name, t in zip(program.nodes, busy):
            if t > 0:
                entry = groups.setdefault(key(name), [0, 0.0])
                entry[0] += 1
                entry[1] += float(t)
        tables[kind] = sorted((Rollup(g, int(n), t / 1000, t / total) for g, (n, t) in groups.items()),
                              key=lambda r: -r.busy_us)
    return tables


def layer_of(node: str) -> str:
    """The layer an ONNX node belongs to, from the scope path exporters name nodes by ("/encoder/layer.3/attention/
    self/query/MatMul"): the path up to its first numbered part, a layer of a stack or a stage ("/encoder/layer.3",
    "/layer1"), else its first part ("/embeddings"); a name without a path is "(top level)"."""
    parts = [p for p in node.split("/") if p][:-1]  # the last part names the node itself
    for k, part in enumerate(parts):
        if any(c.isdigit() for c in part):
            return "/" + "/".join(parts[:k + 1])
    return "/" + parts[0] if parts else "(top level)"


# ---- SBUF and PSUM over time --------------------------------------------------------------------------------------


@dataclass
class Occupancy:
    """Bytes of one partition row in use over time on one core, as a step curve sampled into CHART_POINTS slices
    of the run (each sample the highest value inside its slice, so that no peak is lost)."""

    core: int
    mem: str
    capacity: int  # bytes per partition
    times: list[float]  # ns, the start of each slice
    live: list[int]  # bytes live during the slice (its highest)
    high_water: list[int]  # the highest byte touched so far, + 1
    peak_live: int
    peak_high_water: int


def occupancy(program: _Program, target: Target, trace: list[TraceEvent], elapsed_ns: float) -> list[Occupancy]:
    """SBUF and PSUM bytes in use per partition over time, for each core, from the trace and each instruction's
    operands. A partition row is split into GRANULES granules; an operand covers the granules from its first to its
    last byte in a row (holes of strided patterns included), the same in every partition it spans: a row counts a
    byte as used when any partition uses it (the curve may overcount a range's ends by up to a granule, never above
    the high-water mark). A granule's value is live

        from the start of the instruction that writes it (the writer owns its destination while it runs)
        to the end of its last reader, cut at the start of the next writer of those bytes (reads happen at issue);

    writes with no read between them (PSUM accumulation) extend one live range, and a value nobody reads is live
    while its writer runs. The curve is the sum of the live granules' bytes. Next to it, the high-water mark: the
    highest byte any instruction has touched so far, what `info` reports as the peak at the run's end."""
    capacity = {Mem.SBUF: target.sbuf_partition_bytes, Mem.PSUM: target.psum_partition_bytes}
    which, start, end = program.events(trace)
    core_of = np.array([core for core, _ in program.keys], np.int64)[program.row[which]]
    edges = np.linspace(0.0, max(elapsed_ns, 1.0), CHART_POINTS + 1)
    charts = []
    for core in range(program.cores):
        mine = np.flatnonzero(core_of == core)
        mine = mine[np.lexsort((end[mine], start[mine]))]  # program order: by start
        # every access of those events, an event's in the instruction's order (reads first)
        counts = np.diff(program.access_first)[which[mine]]
        event = np.repeat(mine, counts)
        acc = np.repeat(program.access_first[which[mine]], counts) + np.arange(len(event)) - \
            np.repeat(np.cumsum(counts) - counts, counts)
        for mem in (Mem.SBUF, Mem.PSUM):
            on = program.access["mem"][acc] == int(mem)
            a_start, a_end, a = start[event[on]], end[event[on]], acc[on]
            lo, hi, writes = program.access["lo"][a], program.access["hi"][a], program.access["writes"][a]
            granule = max(1, math.ceil(capacity[mem] / GRANULES))
            begins, ends = _live_ranges(a_start, a_end, lo // granule,
                                        np.minimum(hi // granule, GRANULES - 1) + 1, writes)
            times, live = _sweep(begins, ends, granule)
            high_water = np.maximum.accumulate(np.concatenate(([0], hi + 1))).astype(np.int64)
            hw_times = np.concatenate(([0.0], a_start))
            # whole granules overcount a range's ends; what is live never lies above the highest byte touched
            live = np.minimum(live, high_water[np.searchsorted(hw_times, times, side="right") - 1])
            charts.append(Occupancy(core, mem.name, capacity[mem], edges[:-1].tolist(),
                                    _sample(times, live, edges).tolist(),
                                    _sample(hw_times, high_water, edges).tolist(),
                                    int(live.max(initial=0)), int(high_water[-1])))
    return charts


def _live_ranges(start: np.ndarray, end: np.ndarray, g0: np.ndarray, g1: np.ndarray, writes: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The live ranges (begins, ends) of every granule, one per value, from accesses in program order (access k
    covers granules [g0[k], g1[k])), as occupancy() defines them. Vectorised over (granule, access) pairs:

        per granule, in access order, drop the reads before its first write (nothing is live there);
        a value starts at a write that is the granule's first or follows a read (a write after writes accumulates);
        it ends at the latest end of its accesses, cut at the start of the next value's write."""
    counts = g1 - g0
    which = np.repeat(np.arange(len(start)), counts)  # the access of each pair
    granule = g0[which] + np.arange(len(which)) - np.repeat(np.cumsum(counts) - counts, counts)
    order = np.lexsort((which, granule))
    which, granule = which[order], granule[order]
    new_granule = np.ones(len(which), bool)
    new_granule[1:] = granule[1:] != granule[:-1]
    w = writes[which]
    written = np.maximum.accumulate(np.where(w, np.arange(len(which)), -1))  # the latest write so far
    first = np.maximum.accumulate(np.where(new_granule, np.arange(len(which)), 0))  # the granule's first pair
    keep = written >= first
    which, granule, new_granule, w = which[keep], granule[keep], new_granule[keep], w[keep]
    new_granule = np.ones(len(which), bool)
    new_granule[1:] = granule[1:] != granule[:-1]
    opens = w & (new_granule | np.concatenate(([True], ~w[:-1])))
    value = np.cumsum(opens) - 1
    if not len(value):
        return np.zeros(0), np.zeros(0)
    begins = start[which[opens]]
    ends = np.full(len(begins), -np.inf)
    np.maximum.at(ends, value, end[which])
    same_granule_next = np.zeros(len(begins), bool)
    same_granule_next[:-1] = ~new_granule[opens][1:]
    cut = np.full(len(begins), np.inf)
    cut[:-1] = np.where(same_granule_next[:-1], begins[1:], np.inf)
    return begins, np.maximum(begins, np.minimum(ends, cut))


def _sweep(starts: np.ndarray, ends: np.ndarray, granule: int) -> tuple[np.ndarray, np.ndarray]:
    """The step curve (change times, bytes live from each on) of ranges of `granule` bytes each."""
    times = np.concatenate(([0.0], starts, ends))
    delta = np.concatenate(([0], np.full(len(starts), granule), np.full(len(ends), -granule)))
    by = np.lexsort((delta, times))  # at one instant, frees before allocations: touching ranges do not add up
    return times[by], np.cumsum(delta[by])


def _sample(times: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The highest value of the step curve (values[k] from times[k] on, times sorted) in each [edges[i],
    edges[i+1]): the value carried in at the slice's start, or any step inside it."""
    at_edge = values[np.maximum(np.searchsorted(times, edges[:-1], side="right") - 1, 0)]
    slot = np.searchsorted(edges, times, side="right") - 1
    inside = (slot >= 0) & (slot < len(edges) - 1)
    best = at_edge.astype(np.int64)
    np.maximum.at(best, slot[inside], values[inside].astype(np.int64))
    return best


# ---- the page -----------------------------------------------------------------------------------------------------


def render_html(bundle: Bundle, stats: RunStats, summary: Summary, title: str = "") -> str:
    """The report page of a traced run (`model.run(inputs, trace=True)`) and its summary."""
    if stats.instructions and not stats.trace:
        raise ValueError("the HTML report needs a traced run: model.run(inputs, trace=True)")
    target = get_target(bundle.target)
    program = _Program.of(bundle, target.dma_queues)
    data = timeline(program, stats.trace)
    data["elapsed"] = stats.elapsed_ns
    charts = occupancy(program, target, stats.trace, stats.elapsed_ns)
    data["charts"] = [_chart_data(c) for c in charts]
    tables = rollups(bundle, program, stats.trace)
    heading = f"{title or 'profile'}: {target.name}, {len(bundle.cores)} core(s), {stats.instructions} instructions"
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")  # cannot end the script element
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(heading)}</title>", f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(heading)}</h1>",
        _figures(summary),
        "<h2>Engine timeline</h2>",
        '<div class="controls">colour by <select id="colour"><option value="engine">engine</option>'
        '<option value="node">ONNX node</option></select> <span class="hint">wheel: zoom, drag: pan, double-click: '
        "whole run; hover a box for its instruction</span></div>",
        '<div id="legend"></div><div id="timeline-box"><canvas id="timeline"></canvas>'
        '<div id="tip"></div></div>',
        "<h2>SBUF and PSUM in use per partition</h2>",
        '<p class="hint">On the timeline\'s time axis (they zoom and pan with it). Filled: bytes live (from the start '
        "of the instruction writing them to the end of their last reader); line: the highest byte touched so far. "
        "Each point is the highest value in its slice of time.</p>",
        *(_chart(c) for c in charts),
        "<h2>Engine time by operator type</h2>", _rollup(tables["operator"], "operator type (the model's)"),
        "<h2>Engine time by layer</h2>", _rollup(tables["layer"], "layer"),
        "<h2>Top ONNX nodes</h2>", _top_nodes(summary),
        "<h2>Critical path</h2>", _critical_path(summary),
        "<h2>Summary</h2>", f"<pre>{html.escape(summary_text(summary))}</pre>",
        f'<script type="application/json" id="timeline-data">{payload}</script>',
        f"<script>{_SCRIPT}</script>", "</body></html>", ""])


def _figures(s: Summary) -> str:
    cards = [("latency", f"{s.latency_us:.2f} us", f"{s.ratio:.2f}x the roofline"),
             ("roofline", f"{s.roofline_us:.2f} us", f"{s.bound}-bound"),
             ("MFU", f"{s.mfu:.1%}", f"of TensorE's {s.matmul_dtype} peak ({s.peak_tflops:.1f} TFLOPS)"),
             ("MBU", f"{s.mbu:.1%}", f"{s.dma_hbm_bytes / 1e6:.2f} MB across HBM"),
             ("DMA", f"{s.dma_transfers} transfers", f"{s.dma_bytes / 1e6:.2f} MB, "
                                                     f"{s.dma_average_bytes / 1024:.1f} KiB on average"),
             ("spilled", f"{s.spill_bytes / 1e6:.2f} MB", f"{s.scratch_bytes / 1e6:.2f} MB between operators")]
    out = ['<div class="cards">']
    out += [f'<div class="card"><div class="k">{k}</div><div class="v">{html.escape(v)}</div>'
            f'<div class="d">{html.escape(d)}</div></div>' for k, v, d in cards]
    out.append('</div><table class="shares"><tr><th>engine</th><th>active share of the run</th></tr>')
    engines = {**dict.fromkeys(ENGINE_ROWS, 0.0), **s.engines}  # in the engines' order, an idle one named too
    out += [f'<tr><td>{html.escape(k)}</td><td><div class="bar engine-{html.escape(k)}" style="width:{v * 80:.1f}%">'
            f"</div>{v:.0%}{' (idle)' if not v else ''}</td></tr>" for k, v in engines.items()]
    out.append("</table>")
    return "\n".join(out)


def _top_nodes(s: Summary) -> str:
    most = max((share for _, _, share in s.top_nodes), default=1.0) or 1.0  # the longest bar fills its cell
    rows = [f'<tr><td>{html.escape(name)}</td><td class="n">{us:.2f}</td><td><div class="bar" '
            f'style="width:{share / most * 80:.1f}%"></div>{share:.1%}</td></tr>' for name, us, share in s.top_nodes]
    return ('<table class="nodes"><tr><th>ONNX node</th><th>engine time (us)</th><th>share of engine time</th></tr>'
            + "".join(rows) + "</table>")


def _critical_path(s: Summary) -> str:
    """The chain of instructions that set the latency (runtime/critical_path.py): its time per engine and between
    its instructions, as shares of the latency, then the nodes with the most time on it and its transfers by what
    they move."""
    latency = s.latency_us or 1.0
    parts = [*s.critical_busy_us.items(), ("between", s.critical_waiting_us)]
    rows = [f'<tr><td>{html.escape(k)}</td><td class="n">{us:.2f}</td><td><div class="bar engine-{html.escape(k)}" '
            f'style="width:{us / latency * 80:.1f}%"></div>{us / latency:.1%}</td></tr>' for k, us in parts]
    nodes = [f'<tr><td>{html.escape(name)}</td><td class="n">{us:.2f}</td><td></td></tr>'
             for name, us in s.critical_nodes]
    moved = [f'<tr><td>{html.escape(what)}</td><td class="n">{us:.2f}</td><td class="n">{n}</td></tr>'
             for what, us, n in s.critical_transfers]
    return (f'<p class="hint">{s.critical_instructions} instructions, each started by the end of the one before it '
            "(on its engine or queue, or through a semaphore); between them: hand-offs, DMA latency, shared ports."
            '</p><table class="nodes"><tr><th>engine</th><th>time on the path (us)</th><th>share of the latency'
            "</th></tr>" + "".join(rows) + '</table><table class="nodes"><tr><th>ONNX node</th><th>time on the path '
            "(us)</th><th></th></tr>" + "".join(nodes) + '</table><table class="nodes"><tr><th>transfers of'
            "</th><th>time on the path (us)</th><th>transfers</th></tr>" + "".join(moved) + "</table>")


def _rollup(rows: list[Rollup], what: str) -> str:
    most = max((r.share for r in rows), default=1.0) or 1.0
    shown, rest = rows[:ROLLUP_ROWS], rows[ROLLUP_ROWS:]
    cells = [f'<tr><td>{html.escape(r.name)}</td><td class="n">{r.nodes}</td><td class="n">{r.busy_us:.2f}</td>'
             f'<td><div class="bar" style="width:{r.share / most * 80:.1f}%"></div>{r.share:.1%}</td></tr>'
             for r in shown]
    if rest:
        cells.append(f'<tr><td>{len(rest)} more</td><td class="n">{sum(r.nodes for r in rest)}</td>'
                     f'<td class="n">{sum(r.busy_us for r in rest):.2f}</td><td>{sum(r.share for r in rest):.1%}'
                     "</td></tr>")
    return (f'<table class="rollup"><tr><th>{html.escape(what)}</th><th>nodes</th><th>engine time (us)</th>'
            f"<th>share of engine time</th></tr>{''.join(cells)}</table>")


def _chart_top(c: Occupancy) -> int:
    """The chart's top: the capacity, or, for a program that uses under half of it, a round figure above its
    high-water mark, so that it shows."""
    if 2 * c.peak_high_water < c.capacity:
        return min(c.capacity, 2 ** math.ceil(math.log2(max(c.peak_high_water, 1024) * 1.2)))
    return c.capacity


def _caption(c: Occupancy) -> str:
    return (f"core {c.core} {c.mem}: at most {c.peak_live / 1024:.1f} KiB live, highest byte touched "
            f"{c.peak_high_water / 1024:.1f} KiB, of {c.capacity // 1024} KiB per partition")


def _chart_data(c: Occupancy) -> dict[str, Any]:
    """What the script draws of a chart: its samples (from times[k] to the next), top and caption."""
    return {"core": c.core, "mem": c.mem, "top": _chart_top(c), "times": [round(t, 3) for t in c.times],
            "live": c.live, "hw": c.high_water}


def _chart(c: Occupancy) -> str:
    """A chart's place: the script draws it on the timeline's time axis (live bytes as a filled step curve, the
    high-water mark as a line), in the order of the payload's charts."""
    caption = html.escape(_caption(c))
    return (f'<figure class="occupancy" data-mem="{c.mem}" data-core="{c.core}"><figcaption>{caption}</figcaption>'
            f'<canvas class="chart" role="img" aria-label="{caption}"></canvas></figure>')


_CSS = """
body{font:14px system-ui,sans-serif;margin:16px 24px;color:#222;background:#fff}
h1{font-size:18px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:150px}
.card .k{color:#666;font-size:12px}.card .v{font-size:20px;font-weight:600}.card .d{color:#666;font-size:12px}
table{border-collapse:collapse;margin-top:10px}td,th{padding:2px 10px;text-align:left;font-size:13px}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:inline-block;height:10px;background:#4e79a7;margin-right:6px;vertical-align:middle;max-width:300px}
table.shares td:nth-child(2),table.nodes td:nth-child(3){width:360px}
.engine-PE{background:#4e79a7}.engine-ACT{background:#f28e2b}.engine-DVE{background:#59a14f}
.engine-POOL{background:#b07aa1}.engine-SP{background:#edc948}.engine-DMA{background:#76b7b2}
.engine-CC{background:#e15759}
.controls,.hint{color:#555;font-size:12px;margin:6px 0}
#legend span{display:inline-block;margin-right:12px;font-size:12px}
#legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
#timeline-box{position:relative}#timeline{width:100%;display:block;border:1px solid #ddd;cursor:crosshair}
#tip{position:absolute;display:none;pointer-events:none;background:#fff;border:1px solid #999;padding:4px 6px;
font:12px monospace;white-space:pre;box-shadow:2px 2px 4px rgba(0,0,0,.2)}
figure{margin:8px 0}figcaption{font-size:12px;color:#444}
canvas.chart{width:100%;height:110px;display:block;border:1px solid #ddd}
table.rollup td:nth-child(4){width:360px}pre{font-size:12px;background:#f7f7f7;padding:8px;overflow-x:auto}
"""

_SCRIPT = r"""
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("timeline-data").textContent);
  function unpack(b64, T) {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new T(bytes.buffer);
  }
  const row = unpack(D.row, Uint16Array), st = unpack(D.start, Float32Array), en = unpack(D.end, Float32Array),
    idx = unpack(D.index, Uint32Array), nd = unpack(D.node, D.node32 ? Uint32Array : Uint16Array),
    mn = unpack(D.mnem, Uint16Array), cnt = D.count ? unpack(D.count, Uint32Array) : null,
    moved = unpack(D.bytes, Float64Array);
  const nrows = D.rows.length, first = new Int32Array(nrows + 1);  // boxes come sorted by row, then start
  for (let i = 0; i < row.length; i++) first[row[i] + 1]++;
  for (let r = 0; r < nrows; r++) first[r + 1] += first[r];
  const ENGINE = {PE: "#4e79a7", ACT: "#f28e2b", DVE: "#59a14f", POOL: "#b07aa1", SP: "#edc948", DMA: "#76b7b2",
                  CC: "#e15759"};
  const rowEngine = D.rows.map(n => { const s = n.split(" ")[1]; return s.startsWith("DMA") ? "DMA" : s; });
  const rowCore = D.rows.map(n => n.split(" ")[0]);
  const nodeColour = D.nodes.map((_, k) => "hsl(" + ((k * 137.508) % 360).toFixed(1) + ",55%,55%)");
  const ROW = 18, AXIS = 22;
  const canvas = document.getElementById("timeline"), tip = document.getElementById("tip");
  const select = document.getElementById("colour"), legend = document.getElementById("legend");
  const ctx = canvas.getContext("2d");
  ctx.font = "11px system-ui, sans-serif";
  const LABEL = 12 + Math.max(60, ...D.rows.map(r => ctx.measureText("core " + r + " (idle)").width));
  let t0 = 0, t1 = Math.max(D.elapsed, 1), drag = null;
  function width() { return canvas.clientWidth || 900; }
  function scale() { return (width() - LABEL) / (t1 - t0); }
  function colour(i) { return select.value === "node" ? nodeColour[nd[i]] : ENGINE[rowEngine[row[i]]]; }
  function firstEndingAfter(r, t) {  // boxes of a stream do not overlap, so their ends are sorted too
    let lo = first[r], hi = first[r + 1];
    while (lo < hi) { const m = (lo + hi) >> 1; if (en[m] < t) lo = m + 1; else hi = m; }
    return lo;
  }
  function niceStep(span) {
    const raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 5, 10].map(f => f * p).find(s => s >= raw);
  }
  function draw() {
    const dpr = window.devicePixelRatio || 1, w = width(), h = AXIS + nrows * ROW + 4;
    canvas.style.height = h + "px";
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
    const k = scale(), step = niceStep(t1 - t0);
    ctx.fillStyle = "#555"; ctx.strokeStyle = "#eee";
    const decimals = Math.max(0, Math.ceil(-Math.log10(step / 1000)));
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      const x = LABEL + (t - t0) * k;
      ctx.beginPath(); ctx.moveTo(x, AXIS - 4); ctx.lineTo(x, h); ctx.stroke();
      if (x < w - 60) ctx.fillText((t / 1000).toFixed(decimals) + " us", x + 2, 9);
    }
    let drawn = 0;
    for (let r = 0; r < nrows; r++) {
      const y = AXIS + r * ROW;
      if (r > 0 && rowCore[r] !== rowCore[r - 1]) {
        ctx.strokeStyle = "#888"; ctx.beginPath(); ctx.moveTo(0, y); ctx.lineTo(w, y); ctx.stroke();
      }
      ctx.fillStyle = first[r + 1] > first[r] ? "#222" : "#999";  // an idle engine keeps its named row
      ctx.fillText("core " + D.rows[r] + (first[r + 1] > first[r] ? "" : " (idle)"), 4, y + ROW / 2);
      ctx.save(); ctx.beginPath(); ctx.rect(LABEL, y, w - LABEL, ROW); ctx.clip();
      let lastPx = -1;
      for (let i = firstEndingAfter(r, t0); i < first[r + 1] && st[i] <= t1; i++) {
        let x0 = LABEL + (st[i] - t0) * k, x1 = LABEL + (en[i] - t0) * k;
        if (x1 - x0 < 1) {  // thinner than a pixel: one pixel column per box at most
          const px = Math.floor(x0);
          if (px === lastPx) continue;
          lastPx = px; x0 = px; x1 = px + 1;
        } else {
          lastPx = Math.floor(x1);
          if (x1 - x0 > 3) x1 -= 1;  // a gap, so that boxes end to end stay apart
        }
        ctx.fillStyle = colour(i); ctx.fillRect(x0, y + 2, x1 - x0, ROW - 4); drawn++;
      }
      ctx.restore();
    }
    canvas.dataset.drawn = String(drawn); canvas.dataset.left = String(LABEL); canvas.dataset.scale = String(k);
    drawCharts(w, k);
    document.body.dataset.timeline = "drawn";
  }
  // SBUF and PSUM charts: the timeline's label column and time axis, so that a time sits at the same x in all
  const charts = Array.from(document.querySelectorAll("canvas.chart"));
  function drawCharts(w, k) {
    charts.forEach((cv, n) => {
      const C = D.charts[n], dpr = window.devicePixelRatio || 1, h = cv.clientHeight || 110, PAD = 6;
      cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
      const g = cv.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0); g.clearRect(0, 0, w, h);
      g.font = "11px system-ui, sans-serif"; g.textBaseline = "middle";
      const y = v => PAD + (h - 2 * PAD) * (1 - v / C.top), x = t => LABEL + (t - t0) * k;
      g.strokeStyle = "#ddd"; g.fillStyle = "#555";
      for (const v of [0, C.top / 2, C.top]) {
        g.beginPath(); g.moveTo(LABEL, y(v)); g.lineTo(w, y(v)); g.stroke();
        g.fillText((v / 1024) + " KiB", 4, Math.min(Math.max(y(v), 8), h - 8));
      }
      g.save(); g.beginPath(); g.rect(LABEL, 0, w - LABEL, h); g.clip();
      const end = i => i + 1 < C.times.length ? C.times[i + 1] : D.elapsed;
      g.beginPath(); g.moveTo(x(0), y(0));
      for (let i = 0; i < C.times.length; i++) {
        g.lineTo(x(C.times[i]), y(C.live[i])); g.lineTo(x(end(i)), y(C.live[i]));
      }
      g.lineTo(x(D.elapsed), y(0)); g.closePath();
      g.fillStyle = "rgba(78,121,167,.45)"; g.fill(); g.strokeStyle = "#4e79a7"; g.lineWidth = 0.6; g.stroke();
      g.beginPath();
      for (let i = 0; i < C.times.length; i++) {
        if (i === 0) g.moveTo(x(C.times[i]), y(C.hw[i])); else g.lineTo(x(C.times[i]), y(C.hw[i]));
        g.lineTo(x(end(i)), y(C.hw[i]));
      }
      g.strokeStyle = "#e15759"; g.lineWidth = 1; g.stroke(); g.restore();
      cv.dataset.drawn = "1"; cv.dataset.left = String(LABEL); cv.dataset.scale = String(k);
    });
  }
  function drawLegend() {
    let items;
    if (select.value === "node") {
      const busy = new Float64Array(D.nodes.length);
      for (let i = 0; i < nd.length; i++) busy[nd[i]] += en[i] - st[i];
      items = Array.from(busy.keys()).sort((a, b) => busy[b] - busy[a]).slice(0, 16)
        .map(n => [nodeColour[n], D.nodes[n]]);
    } else items = Object.keys(ENGINE).filter(e => rowEngine.includes(e)).map(e => [ENGINE[e], e]);
    legend.replaceChildren(...items.map(([c, name]) => {
      const s = document.createElement("span"), i = document.createElement("i");
      i.style.background = c; s.append(i, name); return s;
    }));
  }
  function hit(ev) {
    const rect = canvas.getBoundingClientRect(), x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    const r = Math.floor((y - AXIS) / ROW);
    if (r < 0 || r >= nrows || x < LABEL) return -1;
    const k = scale(), t = t0 + (x - LABEL) / k, slack = 2 / k;
    const i = firstEndingAfter(r, t - slack);
    return i < first[r + 1] && st[i] <= t + slack ? i : -1;
  }
  canvas.addEventListener("mousemove", ev => {
    if (drag) {
      const dt = (ev.clientX - drag.x) / scale();
      t0 = drag.t0 - dt; t1 = drag.t1 - dt; draw(); return;
    }
    const i = hit(ev), rect = canvas.getBoundingClientRect();
    if (i < 0) { tip.style.display = "none"; return; }
    showTip(i, ev.clientX - rect.left, ev.clientY - rect.top);
  });
  function showTip(i, x, y) {
    const us = v => (v / 1000).toFixed(3) + " us";
    tip.textContent = D.mnemonics[mn[i]] + (cnt && cnt[i] > 1 ? "  (" + cnt[i] + " instructions merged)" : "") +
      "\nnode   " + D.nodes[nd[i]] + "\nwhere  core " + D.rows[row[i]] + " #" + idx[i] +
      "\nstart  " + us(st[i]) + "\nend    " + us(en[i]) + "\ntook   " + us(en[i] - st[i]) +
      (moved[i] > 0 ? "\nbytes  " + size(moved[i]) + "\nrate   " + (moved[i] / Math.max(en[i] - st[i], 1e-9))
        .toFixed(2) + " GB/s" : "");
    tip.style.left = Math.min(x + 12, canvas.clientWidth - 260) + "px";
    tip.style.top = (y + 12) + "px"; tip.style.display = "block";
  }
  function size(b) {
    return b >= 1048576 ? (b / 1048576).toFixed(2) + " MiB (" + b + " B)" : b >= 1024 ?
      (b / 1024).toFixed(1) + " KiB (" + b + " B)" : b + " B";
  }
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; drag = null; });
  canvas.addEventListener("mousedown", ev => { drag = {x: ev.clientX, t0: t0, t1: t1}; });
  window.addEventListener("mouseup", () => { drag = null; });
  canvas.addEventListener("wheel", ev => {
    ev.preventDefault();
    const rect = canvas.getBoundingClientRect(), at = t0 + (ev.clientX - rect.left - LABEL) / scale();
    const f = Math.exp(ev.deltaY * 0.002), span = Math.max((t1 - t0) * f, 1e-3);
    t0 = at - (at - t0) * span / (t1 - t0); t1 = t0 + span; draw();
  }, {passive: false});
  canvas.addEventListener("dblclick", () => { t0 = 0; t1 = Math.max(D.elapsed, 1); draw(); });
  select.addEventListener("change", () => { drawLegend(); draw(); });
  window.addEventListener("resize", draw);
  if (location.hash === "#node") select.value = "node";  // a link may ask for the colouring by node
  drawLegend(); draw();
  const box = /^#box=(.+):(\d+)$/.exec(decodeURIComponent(location.hash));  // a link to a box opens its tooltip
  if (box) {
    const r = D.rows.indexOf(box[1]);
    for (let i = r < 0 ? 0 : first[r]; r >= 0 && i < first[r + 1]; i++)
      if (idx[i] === Number(box[2])) { showTip(i, LABEL + (st[i] - t0) * scale(), AXIS + r * ROW); break; }
  }
})();
"""
