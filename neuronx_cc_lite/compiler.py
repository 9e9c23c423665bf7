"""The compiler driver: ONNX model -> bundle.

    frontend -> passes (verified after each) -> lower -> keep on chip -> schedule -> allocate -> lay out HBM
             -> emit + synchronise -> package
with the tile program verified after each stage that changes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx

from isa.bundle import Bundle, HbmTensorInfo, Segment, TensorInfo
from isa.dtypes import DType
from isa.target import get_target
from neuronx_cc_lite import __version__
from neuronx_cc_lite.codegen.allocate import allocate, layout_hbm
from neuronx_cc_lite.codegen.broadcasts import broadcast_on_pe
from neuronx_cc_lite.codegen.dedupe import dedupe_loads
from neuronx_cc_lite.codegen.emit import emit
from neuronx_cc_lite.codegen.on_chip import Report, keep_on_chip
from neuronx_cc_lite.codegen.schedule import assign_queues_in_order, schedule
from neuronx_cc_lite.codegen.transfers import split_transfers
from neuronx_cc_lite.codegen.verify import verify_order, verify_program
from neuronx_cc_lite.errors import CompileError, UnsupportedError
from neuronx_cc_lite.flops import model_flops
from neuronx_cc_lite.frontend import import_model, load_model
from neuronx_cc_lite.input_ranges import input_ranges
from neuronx_cc_lite.ir import Graph
from neuronx_cc_lite.lower import lower_graph, unsupported_nodes
from neuronx_cc_lite.lower.program import Program
from neuronx_cc_lite.passes import run_pipeline
from neuronx_cc_lite.passes.verify import verify
from neuronx_cc_lite.precision import MODES, TYPES


@dataclass
class Options:
    target: str = "trn1"
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dump_ir_after: frozenset[str] = frozenset()
    stop_after: str | None = None
    auto_cast: str = "none"  # see precision.py
    auto_cast_type: str = "bf16"
    optimize: int = 2  # -O1: lowering order, fast compiles; -O2: list scheduling


    def flags(self) -> dict[str, Any]:
        """What the bundle records of how it was made."""
        return {"target": self.target, "auto_cast": self.auto_cast, "auto_cast_type": self.auto_cast_type,
                "input_shapes": {k: list(v) for k, v in sorted(self.input_shapes.items())},
                "optimize": self.optimize}

    def check(self) -> None:
        if self.auto_cast not in MODES:
            raise CompileError("NCC_OPTION", f"auto-cast (--auto-cast, auto_cast=) must be one of {', '.join(MODES)}")
        if self.auto_cast_type not in TYPES:
            raise CompileError("NCC_OPTION", f"the auto-cast type (--auto-cast-type, auto_cast_type=) must be one of "
                                             f"{', '.join(TYPES)}")
        if self.optimize not in (1, 2):
            raise CompileError("NCC_OPTION", "the optimisation level must be 1 or 2")


def prepare(model: str | os.PathLike[str] | onnx.ModelProto, options: Options,
            dump: Callable[[str, str], None] | None = None) -> Graph:
    """Frontend and passes: the graph that lowering receives."""
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    graph = import_model(proto, options.input_shapes)
    return run_pipeline(graph, dump, options.dump_ir_after, options.stop_after)


def compile_graph(graph: Graph, options: Options) -> Bundle:
    target = _target(options.target)
    verify(graph, "the pass pipeline", require_static=True)
    unsupported = unsupported_nodes(graph)
    if unsupported:
        raise UnsupportedError(unsupported)
    options.check()
    cast = TYPES[options.auto_cast_type] if options.auto_cast != "none" else None
    by_rows: frozenset[str] | None = frozenset() if options.optimize >= 2 else None
    while True:
        program, ctx = lower_graph(graph, target, matmul_dtype=cast,
                                   internal_dtype=cast if options.auto_cast == "all" else None, by_rows=by_rows)
        verify_program(program, "lowering")
        on_chip = Report()
        if options.optimize < 2:
            break
        on_chip = keep_on_chip(program)
        # lay the stranded tensors out by rows, those the feature-major policy chose (each try adds one at least,
        # so this ends; a by-rows tensor with one element per row, a global pool's, looks stranded too)
        retry = frozenset(n for n in on_chip.stranded if n in graph.tensors and ctx.feature_major(n))
        if not retry:
            break
        by_rows = by_rows | retry  # type: ignore[operator]
    if options.optimize >= 2:
        verify_program(program, "keep-on-chip")
        broadcast_on_pe(program)
        verify_program(program, "broadcast-on-pe")
        dedupe_loads(program)
        verify_program(program, "dedupe-loads")
    schedule_and_allocate(program, options.optimize)
    hbm_size = layout_hbm(program)
    streams = emit(program, hbm_size)

    def info(name: str) -> TensorInfo:
        view = ctx.view(name)
        t = graph.tensors[name]
        return TensorInfo.whole(name, tuple(t.shape), np.dtype(t.dtype).name, view.dtype.name, view.tensor.offset)

    return Bundle(
        target=target.name,
        hbm_size=hbm_size,
        inputs=[info(name) for name in graph.inputs],
        outputs=[info(name) for name in graph.outputs],
        cores=[streams],
        weights=[Segment(h.offset, h.data) for h in program.hbm if h.kind == "weight"],
        compiler=f"neuronx-cc-lite {__version__}",
        flags=options.flags(),
        stats={"model_flops": model_flops(graph), "matmul_dtype": (cast or DType.fp32).name,
               "spill_bytes": on_chip.spill_bytes,
               "kept_on_chip": len(on_chip.kept), "through_hbm": len(on_chip.through_hbm),
               "input_ranges": input_ranges(graph)},
        hbm_tensors=[HbmTensorInfo(h.name, h.kind, h.offset, h.nbytes) for h in program.hbm],
    )


def schedule_and_allocate(program: Program, optimize: int) -> None:
    """-O2: list scheduling, which places every tile as it goes; when it runs out of memory (every ready
    instruction waiting for room that nothing will free) the lowering order is used instead, as at -O1: it always
    fits, keeping only the tiles of one operator live at a time."""
    split_transfers(program)
    lowered = list(program.instrs)
    engines = [p.engine for p in lowered]
    if optimize >= 2:
        try:
            preds = schedule(program)
            verify_order(lowered, program.instrs, preds, "schedule")
            verify_program(program, "schedule")
            return
        except CompileError as e:
            if e.code not in ("NCC_SBUF_FULL", "NCC_PSUM_FULL"):
                raise
        program.instrs = list(lowered)
        for p, e in zip(lowered, engines):
            p.engine = e
    assign_queues_in_order(program)
    allocate(program)


def compile_model(model: str | os.PathLike[str] | onnx.ModelProto, options: Options | None = None,
                  dump: Callable[[str, str], None] | None = None) -> Bundle:
    options = options or Options()
    _target(options.target)
    options.check()
    return compile_graph(prepare(model, options, dump), options)


def _target(name: str):  # type: ignore[no-untyped-def]
    try:
        return get_target(name)
    except KeyError as e:
        raise CompileError("NCC_TARGET", e.args[0]) from None
