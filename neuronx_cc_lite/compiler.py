"""The compiler driver: ONNX model -> bundle.

    frontend -> passes (verified after each) -> [partition: one graph per rank] -> per rank: lower -> keep on chip
             -> schedule -> allocate -> lay out HBM -> emit + synchronise -> package (every rank's streams)
with the tile program verified after each stage that changes it. What the chip cannot run is refused, every node
named, or with --fallback host cut out into host parts (compile_parts: chip parts compiled as above, host parts
carried as ONNX).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import onnx

from isa.bundle import Bundle, HbmTensorInfo, Part, Placement, Segment, Stream, TensorInfo
from isa.collectives import Topology, topology
from isa.dtypes import DType
from isa.streams import StreamId
from isa.target import Target, get_target
from isa.tensor_kind import TensorKind
from neuronx_cc_lite import __version__
from neuronx_cc_lite.codegen.emit import emit
from neuronx_cc_lite.codegen.on_chip import HOME_FRACTION, Report, keep_on_chip
from neuronx_cc_lite.codegen.stages import Stages
from neuronx_cc_lite.declared import DECLARED_FLAG, Absent
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.flops import copy_bytes, model_flops
from neuronx_cc_lite.frontend import CONVERT_TO, converted_up, import_file, import_model, load_model
from neuronx_cc_lite.gc_policy import fewer_collections
from neuronx_cc_lite.input_ranges import input_ranges
from neuronx_cc_lite.integer_ranges import integer_ranges
from neuronx_cc_lite.ir import Graph, Node, model_node_of
from neuronx_cc_lite.lower import lower_graph
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.partition import RankGraph, partition
from neuronx_cc_lite.partition.host import HOST, chip_graph, host_model, host_nodes, refusal, refusals, split
from neuronx_cc_lite.options import Options  # noqa: F401 - where callers have always found it
from neuronx_cc_lite.passes import run_pipeline, split_attention
from neuronx_cc_lite.passes.verify import verify
from neuronx_cc_lite.progress import phase
from neuronx_cc_lite.sizes import check_fits_hbm, check_operator_sizes
from neuronx_cc_lite.tile.program import HbmAccess, Program, TileAccess

log = logging.getLogger(__name__)


def prepare(model: str | os.PathLike[str] | onnx.ModelProto, options: Options,
            dump: Callable[[str, str], None] | None = None) -> Graph:
    """Frontend and passes: the graph that lowering receives. A model of an older opset with nodes the chip cannot
    run as written is converted up (frontend.converted_up: Upsample, TopK-1, Sum-6, ...) and taken in that form
    when the chip can run more of it."""
    graph = _imported(model, options, dump)
    found = refusals(graph) if graph.opset < CONVERT_TO else []
    if found:
        newer = converted_up(model if isinstance(model, onnx.ModelProto) else load_model(model))
        if newer is not None:
            try:
                again = _imported(newer, options, None)
            except CompileError:
                return graph
            fewer = refusals(again)
            if len(fewer) < len(found):
                log.info(f"converted from opset {graph.opset} to {again.opset}: the chip runs {len(found) - len(fewer)} "
                         f"more of its nodes in that form")
                return again
    return graph


def _imported(model: str | os.PathLike[str] | onnx.ModelProto, options: Options,
              dump: Callable[[str, str], None] | None) -> Graph:
    with phase("import"):
        if isinstance(model, onnx.ModelProto):
            graph = import_model(model, options.input_shapes, options.input_values)
        else:
            graph = import_file(model, options.input_shapes, options.input_values)
    log.debug(f"import: {len(graph.nodes)} nodes, {len(graph.tensors)} tensors, {len(graph.inputs)} inputs, "
              f"{len(graph.outputs)} outputs")
    if options.decoder is not None:
        from neuronx_cc_lite.generate.kv_cache import decoder_step
        graph = decoder_step(graph, options.decoder)
    if options.state:
        declare_state(graph, options.state)
    with phase("passes"):
        return run_pipeline(graph, dump, options.dump_ir_after, options.stop_after)


def declare_state(graph: Graph, state: dict[str, str]) -> None:
    """Graph.state from {input: output}: each input kept on the device across runs, each output written into it
    (NCC_OPTION naming a pair that is not an input and an output of one shape and type)."""
    for name, after in state.items():
        if name not in graph.inputs or after not in graph.outputs:
            raise CompileError("NCC_OPTION", f"state {name}={after}: {name!r} must be an input of the model and "
                                             f"{after!r} an output")
        t, u = graph.tensors[name], graph.tensors[after]
        if u.shape is not None and (t.shape != u.shape or t.dtype != u.dtype):
            raise CompileError("NCC_OPTION", f"state {name}={after}: {t.dtype}{list(t.shape)} and "
                                             f"{u.dtype}{list(u.shape)} differ")
        graph.state[name] = after


@fewer_collections
def compile_graph(graph: Graph, options: Options, dump: Callable[[str, str], None] | None = None) -> Bundle:
    """The bundle of a graph after the passes: one rank's program, or (--tp, --dp) every rank's. `dump` receives
    the tile program after the stages options.dump_ir_after names (rank 0's)."""
    target = _target(options.target)
    verify(graph, "the pass pipeline")
    found = refusals(graph)
    if found and options.fallback == HOST:
        if graph.state:  # a host part would have to hand the device state over: not done
            raise CompileError("NCC_OPTION", f"device state ({', '.join(graph.state)}) with host parts is not "
                                             "supported: compile without --fallback host")
        options.check()
        return compile_parts(graph, options, target, found)
    if found:
        raise refusal(found)
    verify(graph, "the pass pipeline", require_static=True)
    options.check()
    cast = DType[options.auto_cast_type] if options.auto_cast != "none" else None
    facts = {"model_flops": model_flops(graph), "copy_bytes": copy_bytes(graph)}  # for the roofline
    ranges = {k: v for k, v in input_ranges(graph).items() if k not in graph.state}
    bounds = {k: v for k, v in integer_ranges(graph).bounds.items() if k not in graph.state}  # of what the host sends
    if options.tp * options.dp == 1:
        one = compile_rank(graph, options, target, dump=dump)
        next_state = set(graph.state.values())
        inputs = [one.info(name, "inputs") for name in graph.inputs if name not in graph.state]
        outputs = [one.info(name, "outputs") for name in graph.outputs if name not in next_state]
        state = [one.info(name, "inputs") for name in graph.state]
        with phase("package"):
            return _logged(_bundle([one], inputs, outputs, [], options, target, cast, facts, ranges, bounds,
                                   graph.model_ops, state))
    with phase("partitioning"):
        start = time.perf_counter()
        ranks = partition(graph, options.tp, options.dp)
        log.debug(f"stage partition: {time.perf_counter() - start:.3f} s, {len(ranks)} ranks of "
                  f"{', '.join(str(len(r.graph.nodes)) for r in ranks)} nodes")
    done: dict[tuple[Any, ...], CompiledRank] = {}
    groups = [tuple(range(d * options.tp, (d + 1) * options.tp)) for d in range(options.dp)]
    topo = topology(target, options.ranks_lnc(target), options.tp * options.dp)
    compiled = [compile_rank(r.graph, options, target, done, dump if r.rank == 0 else None, (groups, topo))
                for r in ranks]
    share = target.hbm_bytes // target.ranks_per_chip(options.ranks_lnc(target))
    for r, c in zip(ranks, compiled):
        if c.hbm_size > share:  # the ranks of a chip divide its HBM
            raise CompileError("NCC_HBM_FULL", f"rank {r.rank} needs {c.hbm_size} bytes of HBM; a rank's share of a "
                                               f"{target.name} chip is {share}")
    next_state = set(graph.state.values())
    inputs = [_placed(name, graph, ranks, compiled, "inputs") for name in graph.inputs if name not in graph.state]
    outputs = [_placed(name, graph, ranks, compiled, "outputs") for name in graph.outputs if name not in next_state]
    state = [_placed(name, graph, ranks, compiled, "inputs") for name in graph.state]
    with phase("package"):
        return _logged(_bundle(compiled, inputs, outputs, groups, options, target, cast, facts, ranges, bounds,
                               graph.model_ops, state))


def compile_parts(graph: Graph, options: Options, target: Target, found: list[tuple[Node, str]]) -> Bundle:
    """--fallback host: the graph cut into chip and host parts (partition/host.py); each chip part compiled as a
    graph of its own, each host part carried as ONNX."""
    if options.tp * options.dp > 1:
        raise CompileError("NCC_OPTION", f"--fallback host runs a model on one rank; {len(found)} node(s) of this one "
                                         "go to the host, so --tp and --dp cannot shard it")
    parts = split(graph, host_nodes(graph, found))
    for name in graph.outputs:
        if name in graph.tensors and graph.tensors[name].is_constant:
            raise CompileError("NCC_UNSUPPORTED", f"output {name!r} is a constant, which a partitioned bundle does "
                                                  "not carry; compile without --fallback host")
    log.info(f"--fallback host: {len(parts)} parts, " + ", ".join(
        f"{p.kind} {len(p.nodes)} node(s)" for p in parts) + f"; on the host: "
        + ", ".join(f"{op} x{k}" for op, k in sorted(Counter(n.op for n, _ in found).items())))
    built = []
    for k, p in enumerate(parts):
        if p.kind == HOST:
            built.append(Part(HOST, p.inputs, p.outputs, onnx=host_model(graph, p, k),
                              ops=dict(sorted(Counter(n.op for n in p.nodes).items()))))
        else:
            built.append(Part(p.kind, p.inputs, p.outputs, compile_graph(chip_graph(graph, p, k), options)))

    def signature(name: str) -> TensorInfo:
        t = graph.tensors[name]
        return TensorInfo(name, t.shape, np.dtype(t.dtype).name if t.dtype is not None else "float32", "", ())  # type: ignore[arg-type]

    return Bundle(target=target.name, hbm_size=0, inputs=[signature(n) for n in graph.inputs],
                  outputs=[signature(n) for n in graph.outputs], cores=[], compiler=f"neuronx-cc-lite {__version__}",
                  flags=options.flags(), stats={"host_nodes": len(found)}, parts=built)


@dataclass
class CompiledRank:
    graph: Graph
    streams: dict[str, Stream]
    hbm_size: int
    program: Program
    ctx: LowerCtx
    on_chip: Report

    def info(self, name: str, kind: str, rank: int = 0, piece: tuple[int, int, int] | None = None) -> TensorInfo:
        """The model input or output (`kind`: "inputs" or "outputs") as the model sees it, placed in this rank's HBM
        (whole, or the piece (axis, start, stop)). An input that is also an output has a tensor for each: the
        program copies one into the other."""
        view = self.ctx.inputs[name] if kind == "inputs" else self.ctx.view(name)
        t = self.graph.tensors[name]
        info = TensorInfo.whole(name, tuple(t.shape), np.dtype(t.dtype).name, view.dtype.name, view.tensor.offset,
                                rank)
        if piece is None:
            return info
        return TensorInfo(name, info.shape, info.dtype, info.device_dtype,
                          (Placement(rank, view.tensor.offset, *piece),))


def compile_rank(graph: Graph, options: Options, target: Target,
                 done: dict[tuple[Any, ...], CompiledRank] | None = None,
                 dump: Callable[[str, str], None] | None = None,
                 collectives: tuple[list[tuple[int, ...]], Topology] | None = None) -> CompiledRank:
    """Lower one rank's graph and run the stages after lowering (codegen/stages.py), then emit its streams. With
    `done` (the ranks compiled so far, by the shape of their tile program): a rank whose tile program differs
    from an earlier one's only in its weights' bytes takes that rank's schedule, HBM layout and streams (nothing
    after lowering reads weight bytes), and only its weights are its own. `collectives`: the replica groups and
    the topology of every rank, by which the schedule prices the rank's collectives."""
    check_fits_hbm(graph, target)
    check_operator_sizes(graph)
    stages = Stages(options.optimize, options.dump_ir_after, options.stop_after, dump)
    if options.optimize >= 2:
        # a quarter of the SBUF the homes may take: the scores, the probabilities and what lives beside them
        start, nodes = time.perf_counter(), len(graph.nodes)
        graph = split_attention.run(graph, int(target.partitions * target.sbuf_partition_bytes * HOME_FRACTION / 4),
                                    target.partitions)
        verify(graph, "split-attention")
        log.debug(f"pass split-attention: {time.perf_counter() - start:.3f} s, {nodes} -> {len(graph.nodes)} nodes")
    with phase("lowering"):  # the tile program, kept on chip (which may lower again)
        program, ctx, on_chip = lower_program(graph, options, target, stages)
        if collectives is not None:  # (before the stages: the schedule prices the collectives by them)
            program.groups, program.topology = collectives
        stages.run(program, "broadcast-on-pe", "dedupe-loads", "second-writes", "preload-act-table")
    key = shape_of(program) if done is not None else ()
    if done is not None and key in done:
        twin = done[key]
        for mine, theirs in zip(program.hbm, twin.program.hbm):
            mine.offset = theirs.offset
        return CompiledRank(graph, twin.streams, twin.hbm_size, program, ctx, on_chip)
    with phase("scheduling"):
        stages.run(program, "split-transfers", "schedule")
    with phase("allocation"):  # of HBM
        stages.run(program, "hbm-layout")
    with phase("emit"):
        start = time.perf_counter()
        streams = emit(program, program.hbm_size)
        _log_stage("emit", start, f"{instruction_counts(streams)} instructions")
    compiled = CompiledRank(graph, streams, program.hbm_size, program, ctx, on_chip)
    if done is not None:
        done[key] = compiled
    return compiled


def lower_program(graph: Graph, options: Options, target: Target, stages: Stages) -> tuple[Program, LowerCtx, Report]:
    """The stages "lowering" and "keep-on-chip": lower the graph, keep what can stay on chip, and lower again with
    the tensors keep-on-chip found stranded between two layouts laid out by rows (each try adds one at least, so
    this ends; a by-rows tensor with one element per row, a global pool's, looks stranded too). A dump after
    lowering shows each try."""
    cast = DType[options.auto_cast_type] if options.auto_cast != "none" else None
    by_rows: frozenset[str] | None = frozenset() if options.optimize >= 2 else None
    while True:
        start = time.perf_counter()
        program, ctx = lower_graph(graph, target, matmul_dtype=cast, by_rows=by_rows,
                                   internal_dtype=cast if options.auto_cast == "all" else None)
        start = stages.done("lowering", program, start)
        if options.optimize < 2:
            return program, ctx, Report()
        on_chip = keep_on_chip(program)
        retry = frozenset(n for n in on_chip.stranded if n in graph.tensors and ctx.feature_major(n))
        if not retry:
            break
        by_rows = by_rows | retry  # type: ignore[operator]
    stages.done("keep-on-chip", program, start, f"{len(on_chip.kept)} tensors kept on chip, "
                                                f"{on_chip.spill_bytes} bytes spilled")
    return program, ctx, on_chip


def instruction_counts(streams: dict[str, Stream]) -> str:
    """"PE 18, ACT 7, DMA 17": a core's instructions per engine, its DMA queues together."""
    counts: dict[str, int] = {}
    for name, s in streams.items():
        engine = StreamId.parse(name).engine.name
        counts[engine] = counts.get(engine, 0) + len(s.instructions)
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def describe(bundle: Bundle) -> dict[str, Any]:
    """What `compile` reports of the bundle it wrote, as JSON (the compile cache keeps it beside the entry, so that
    a hit reports it without decoding the bundle): per part (the bundle itself when it has none) its kind; for a
    chip program its instructions, in total and per engine (of rank 0), and its HBM bytes; for a host part its
    operators and their counts."""
    parts: list[dict[str, Any]] = []
    for part in bundle.parts or [None]:
        chip = bundle if part is None else part.bundle
        if chip is None:
            assert part is not None
            parts.append({"kind": "host", "ops": dict(part.ops)})
            continue
        streams = chip.cores[0]
        parts.append({"kind": "chip", "instructions": sum(len(s.instructions) for s in streams.values()),
                      "per_engine": instruction_counts(streams), "hbm_size": chip.hbm_size})
    return {"target": bundle.target, "partitioned": bool(bundle.parts), "parts": parts}


def _log_stage(name: str, start: float, sizes: str) -> None:
    log.debug(f"stage {name}: {time.perf_counter() - start:.3f} s, {sizes}")


def shape_of(program: Program) -> tuple[Any, ...]:
    """Everything about a tile program that scheduling, allocation and emission read: each instruction with its
    tiles and HBM tensors numbered, each tile's and tensor's size and kind; not the weights' bytes."""
    tiles = {id(t): i for i, t in enumerate(program.tiles)}
    tensors = {id(h): i for i, h in enumerate(program.hbm)}

    def arg(v: Any) -> Any:
        if isinstance(v, TileAccess):
            return ("tile", tiles[id(v.tile)], v.first, v.partitions, v.offset, v.dims)
        if isinstance(v, HbmAccess):
            return ("hbm", tensors[id(v.tensor)], v.dtype, v.partitions, v.partition_stride, v.offset, v.dims)
        return v

    return (tuple((t.mem, t.partitions, t.free, t.dtype) for t in program.tiles),
            tuple((h.kind, h.nbytes, h.dtype, h.layout) for h in program.hbm),
            tuple((p.op, p.engine, p.queue, p.node, tuple((k, arg(v)) for k, v in p.args.items()))
                  for p in program.instrs))


def _placed(name: str, graph: Graph, ranks: list[RankGraph], compiled: list[CompiledRank], kind: str) -> TensorInfo:
    """A model input or output with a placement on every rank that holds a piece of it."""
    pieces = [c.info(name, kind, r.rank, getattr(r, kind)[name]).placements[0]
              for r, c in zip(ranks, compiled) if name in getattr(r, kind)]
    t = graph.tensors[name]
    device = (compiled[0].ctx.inputs[name] if kind == "inputs" else compiled[0].ctx.view(name)).dtype.name
    return TensorInfo(name, tuple(t.shape), np.dtype(t.dtype).name, device, tuple(pieces))


def model_nodes(compiled: list[CompiledRank], model_ops: dict[str, str]) -> dict[str, list[str]]:
    """The model node each instruction's node came from and its operator ([name, op]: a fused MatMulEpilogue's
    Gemm, an expanded QuantizeLinear's pieces' QuantizeLinear), by the node's name: what the profile rolls engine
    time up by (operator types, layers)."""
    names = {n for c in compiled for stream in c.streams.values() for n in stream.nodes if n}
    found = {name: model_node_of(name, model_ops) for name in sorted(names)}
    return {name: [holder, model_ops[holder]] for name, holder in found.items() if holder is not None}


def _logged(b: Bundle) -> Bundle:
    log.debug(f"package: {len(b.cores)} rank(s), {sum(len(s.instructions) for c in b.cores for s in c.values())} "
              f"instructions, {sum(len(w.data) for w in b.weights)} bytes of weights, {b.hbm_size} bytes of HBM "
              "per rank")
    return b


def _bundle(compiled: list[CompiledRank], inputs: list[TensorInfo], outputs: list[TensorInfo],
            groups: list[tuple[int, ...]], options: Options, target: Target, cast: DType | None,
            facts: dict[str, int], ranges: Any, bounds: dict[str, tuple[int, int]],
            model_ops: dict[str, str], state: list[TensorInfo] | None = None) -> Bundle:
    first = compiled[0]
    stats = {**facts, "matmul_dtype": (cast or DType.fp32).name,
             "spill_bytes": first.on_chip.spill_bytes,
             "kept_on_chip": len(first.on_chip.kept), "narrowed_on_chip": len(first.on_chip.narrowed),
             "through_hbm": len(first.on_chip.through_hbm),
             "input_ranges": ranges, "model_nodes": model_nodes(compiled, model_ops),
             "schedule_tries": first.program.schedule_tries,
             # weights stored larger than the model's data (zeros around it): the bytes the roofline counts
             "needed_bytes": {h.name: h.needed for h in first.program.hbm if h.needed is not None and
                              h.needed < h.nbytes}}
    if bounds:  # the integer inputs the program computes with exactly only inside these (integer_ranges.py)
        stats["integer_bounds"] = {name: list(bound) for name, bound in sorted(bounds.items())}
    if len(compiled) > 1:
        stats["rank_flops"] = [model_flops(c.graph) for c in compiled]
    weights = [Segment(h.offset, h.data, rank) for rank, c in enumerate(compiled)
               for h in c.program.hbm if h.kind is TensorKind.WEIGHT]
    present = [s for s in weights if not isinstance(s.data, Absent)]
    flags = options.flags()
    if len(present) < len(weights):  # declared weights: the bytes are left out, the bundle can be timed, not run
        flags["weights"] = DECLARED_FLAG
        stats["declared_weight_bytes"] = sum(len(s.data) for s in weights if isinstance(s.data, Absent))
    return Bundle(
        target=target.name,
        hbm_size=max(c.hbm_size for c in compiled),
        inputs=inputs,
        outputs=outputs,
        cores=[c.streams for c in compiled],
        weights=present,
        compiler=f"neuronx-cc-lite {__version__}",
        flags=flags,
        stats=stats,
        hbm_tensors=[HbmTensorInfo(h.name, h.kind, h.offset, h.nbytes) for h in first.program.hbm],
        lnc=options.ranks_lnc(target),
        groups=groups,
        state=state or [],
    )


def compile_model(model: str | os.PathLike[str] | onnx.ModelProto, options: Options | None = None,
                  dump: Callable[[str, str], None] | None = None) -> Bundle:
    options = options or Options()
    _target(options.target)
    options.check()
    return compile_graph(prepare(model, options, dump), options, dump)


def check_options(**options: Any) -> None:
    """Raise the CompileError (NCC_OPTION, NCC_TARGET) that compiling with these Options fields would raise, before
    any work: for callers that compile later, or many times (the PyTorch front door)."""
    checked = Options(**options)
    _target(checked.target)
    checked.check()


def _target(name: str):  # type: ignore[no-untyped-def]
    try:
        return get_target(name)
    except KeyError as e:
        raise CompileError("NCC_TARGET", e.args[0]) from None
