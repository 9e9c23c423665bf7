"""The pass pipeline: a flat list of Graph -> Graph functions, each with its reason, verified after every pass.

`run_pipeline(graph, dump_after=..., stop_after=...)` runs it; `--dump-ir-after NAME` and `--stop-after NAME` on the
command line reach the same switches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from neuronx_cc_lite import progress
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, print_graph
from neuronx_cc_lite.passes import (canonicalize, eliminate_dead_code, expand_einsum, expand_functions,
                                    expand_quantization, expand_recurrent, fold_batchnorm, fold_constants,
                                    fuse_epilogues, inline_control_flow, simplify_views)
from neuronx_cc_lite.passes.verify import verify


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph], Graph]
    reason: str


PIPELINE: list[Pass] = [
    Pass("fold-constants", fold_constants.run,
         "shape arithmetic and constant subgraphs are compile-time work; they also settle computed shapes, and a "
         "function op over constants (a Range over static shapes) becomes a value, not a body"),
    Pass("expand-quantization", expand_quantization.run,
         "quantized ops are float arithmetic on integer values that fp32 holds exactly; before expand-functions, "
         "whose DynamicQuantizeLinear body casts floats to uint8 as ONNX's Cast, which truncates"),
    Pass("inline-control-flow", inline_control_flow.run,
         "the device runs straight-line code: an If whose condition folded is its chosen branch, a Loop or Scan with "
         "a trip count known now is its body repeated (a run-time exit predicated); folding follows each round"),
    Pass("expand-functions", expand_functions.run,
         "ops ONNX defines as functions of simpler ops need no lowering of their own"),
    Pass("fold-function-bodies", fold_constants.run,
         "the bodies just expanded hold shape arithmetic of their own (Attention's Shape, Gather and Range)"),
    Pass("expand-einsum", expand_einsum.run,
         "an Einsum of one or two operands is a ReduceSum, Transposes and a MatMul, which lower already"),
    Pass("expand-recurrent", expand_recurrent.run,
         "an LSTM, GRU or RNN over a static sequence length is a chain of matmuls and activations, one step each, "
         "which the fusion after it folds together"),
    Pass("canonicalize", canonicalize.run,
         "older exporters spell LayerNorm and GELU as chains of small ops: one op each lowers far better"),
    Pass("simplify-views", simplify_views.run,
         "exporters spell one transpose as Reshape, Transpose, Reshape, and scale both operands of a MatMul: one "
         "transpose lowers as a layout, one scale after the MatMul as part of its evacuation; after canonicalize, "
         "whose GELU pattern holds its own 0.5"),
    Pass("fold-batchnorm", fold_batchnorm.run,
         "an inference BatchNormalization after a Conv or Gemm is a scaling of its weights and bias: no instruction"),
    Pass("fuse-epilogues", fuse_epilogues.run,
         "a bias, a residual and an activation after a matmul are applied as its result leaves PSUM: no passes of "
         "their own over the result"),
    Pass("eliminate-dead-code", eliminate_dead_code.run,
         "results nobody reads (a Dropout's mask) need neither a static shape nor an instruction"),
]

PASS_NAMES = [p.name for p in PIPELINE]


def run_pipeline(g: Graph, dump_after: Callable[[str, str], None] | None = None,
                 dump: frozenset[str] = frozenset(), stop_after: str | None = None) -> Graph:
    """Run every pass in order; print the IR after the passes named in `dump` through `dump_after(name, text)`."""
    unknown = (set(dump) | ({stop_after} if stop_after else set())) - set(PASS_NAMES) - {"import"}
    if unknown:
        raise CompileError("NCC_OPTION", f"unknown pass(es) {', '.join(sorted(unknown))}; passes: "
                           f"{', '.join(PASS_NAMES)}")
    verify(g, "import")
    if dump_after and "import" in dump:
        dump_after("import", print_graph(g))
    for k, p in enumerate(PIPELINE):
        progress.step("passes", k, len(PIPELINE), p.name)
        g = p.run(g)
        verify(g, p.name)
        if dump_after and p.name in dump:
            dump_after(p.name, print_graph(g))
        if p.name == stop_after:
            break
    return g
