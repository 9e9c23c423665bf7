"""The pass pipeline: a flat list of Graph -> Graph functions, each with its reason, verified after every pass.

`run_pipeline(graph, dump_after=..., stop_after=...)` runs it; `--dump-ir-after NAME` and `--stop-after NAME` on the
command line reach the same switches. Each pass is named by its module, imported when the pass first runs: the
list itself is data that the command line's parser reads without loading the compiler (onnx takes a second).
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from neuronx_cc_lite import progress
from neuronx_cc_lite.errors import CompileError

if TYPE_CHECKING:
    from neuronx_cc_lite.ir import Graph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pass:
    name: str
    module: str  # neuronx_cc_lite.passes.<module>.run is the pass
    reason: str

    @property
    def run(self) -> Callable[[Graph], Graph]:
        return importlib.import_module(f"{__name__}.{self.module}").run  # type: ignore[no-any-return]


PIPELINE: list[Pass] = [
    Pass("expand-qoperator", "expand_qoperator",
         "onnxruntime's QOperator contrib ops (QLinearAdd, QLinearConcat, ...) are their Q/DQ form; first, as ONNX's "
         "shape inference has no schema for them and leaves what follows them untyped"),
    Pass("fold-constants", "fold_constants",
         "shape arithmetic and constant subgraphs are compile-time work; they also settle computed shapes, and a "
         "function op over constants (a Range over static shapes) becomes a value, not a body"),
    Pass("expand-quantization", "expand_quantization",
         "quantized ops are float arithmetic on integer values that fp32 holds exactly; before expand-functions, "
         "whose DynamicQuantizeLinear body casts floats to uint8 as ONNX's Cast, which truncates"),
    Pass("inline-control-flow", "inline_control_flow",
         "the device runs straight-line code: an If whose condition folded is its chosen branch, a Loop or Scan with "
         "a trip count known now is its body repeated (a run-time exit predicated); folding follows each round"),
    Pass("expand-functions", "expand_functions",
         "ops ONNX defines as functions of simpler ops need no lowering of their own"),
    Pass("fold-function-bodies", "fold_constants",
         "the bodies just expanded hold shape arithmetic of their own (Attention's Shape, Gather and Range)"),
    Pass("merge-constants", "merge_constants",
         "a weight an export shares between layers may reach them as copies (TorchScript's Identity of each use, "
         "folded): one constant is loaded once, where each copy would be loaded by its own layer"),
    Pass("merge-common-nodes", "merge_common_nodes",
         "an export may compute one value several times (TorchScript's attention mask, once per layer): computed "
         "once, it is one pass and one tensor; after merge-constants, so that copies of a weight compare as one"),
    Pass("expand-constant-maps", "expand_constant_maps",
         "a Compress whose condition, a ReverseSequence whose lengths, a DFT whose length and axis are known now is "
         "a Gather or a MatMul by a constant; after the function bodies, whose sizes fold there"),
    Pass("expand-einsum", "expand_einsum",
         "an Einsum of one or two operands is a ReduceSum, Transposes and a MatMul, which lower already"),
    Pass("reduce-broadcasts", "reduce_broadcasts",
         "a reduction over axes an Expand repeats reads each value again and again (2.5e9 elements for x expanded to "
         "[50000, 50000]): it reduces x, times the repeat count for a sum; after expand-einsum, which makes ReduceSums"),
    Pass("expand-math", "expand_math",
         "the inverse trigonometric and hyperbolic functions are a few of the functions ScalarE has (atan, sqrt, "
         "log, exp)"),
    Pass("expand-roi-align", "expand_roi_align",
         "RoiAlign's bilinear sampling separates by axis: two batched matmuls by interpolation matrices computed "
         "from the regions, which PE runs"),
    Pass("expand-recurrent", "expand_recurrent",
         "an LSTM, GRU or RNN over a static sequence length is a chain of matmuls and activations, one step each, "
         "which the fusion after it folds together"),
    Pass("drop-no-ops", "drop_no_ops",
         "a view or Cast that changes nothing, an Add of zeros or a Mul by ones, is no step (TorchScript reshapes "
         "attention outputs to their own shape and casts RMSNorm's floats to float); before canonicalize, whose "
         "patterns such nodes break"),
    Pass("canonicalize", "canonicalize",
         "older exporters spell LayerNorm and GELU as chains of small ops: one op each lowers far better; SiLU "
         "is x * Sigmoid(x), one ScalarE pass an epilogue can take; a pool whose one window covers its input is a "
         "global pool"),
    Pass("simplify-views", "simplify_views",
         "exporters spell one transpose as Reshape, Transpose, Reshape, and scale both operands of a MatMul: one "
         "transpose lowers as a layout, one scale after the MatMul as part of its evacuation; after canonicalize, "
         "whose GELU pattern holds its own 0.5"),
    Pass("sink-transposes", "sink_transposes",
         "an export transposes a projection's output to [heads, seq, dim] and then applies RoPE to it: the "
         "elementwise ops, slices and concatenations read the projection's rows whole before the transpose, and "
         "the one transpose left is a MatMul's operand"),
    Pass("fold-batchnorm", "fold_batchnorm",
         "an inference BatchNormalization after a Conv or Gemm is a scaling of its weights and bias: no instruction"),
    Pass("fold-linear-convs", "fold_linear_convs",
         "two 1x1 convolutions with nothing between them are one product (W2 W1): the first's pass over the "
         "pixels and its evacuation disappear, where the product does no more arithmetic than the pair"),
    Pass("fold-column-scales", "fold_column_scales",
         "a constant scale of each column after a matmul with constant weights (ConvNeXt's layer scale) is a scaling "
         "of the weights' columns and the bias: no pass of its own over the result"),
    Pass("fold-norm-scales", "fold_norm_scales",
         "an RMSNorm read only by matmuls with constant weights (a Llama layer's) scales their weights' rows "
         "instead: the scale's pass over each row goes, which in a decode step sits between an all-reduce and the "
         "projections"),
    Pass("fuse-epilogues", "fuse_epilogues",
         "a bias, a residual and an activation after a matmul are applied as its result leaves PSUM: no passes of "
         "their own over the result"),
    Pass("eliminate-dead-code", "eliminate_dead_code",
         "results nobody reads (a Dropout's mask) need neither a static shape nor an instruction"),
]

PASS_NAMES = [p.name for p in PIPELINE]


def run_pipeline(g: Graph, dump_after: Callable[[str, str], None] | None = None,
                 dump: frozenset[str] = frozenset(), stop_after: str | None = None) -> Graph:
    """Run every pass in order; print the IR after the passes named in `dump` through `dump_after(name, text)`.
    At debug level each pass logs its time and the graph's size after it."""
    from neuronx_cc_lite.ir import print_graph
    from neuronx_cc_lite.passes.verify import verify

    from neuronx_cc_lite.codegen.stages import STAGE_NAMES  # dumped after lowering, by the compiler

    unknown = (set(dump) | ({stop_after} if stop_after else set())) - set(PASS_NAMES) - set(STAGE_NAMES) - {"import"}
    if unknown:
        raise CompileError("NCC_OPTION", f"unknown pass(es) {', '.join(sorted(unknown))}; passes: "
                           f"{', '.join(PASS_NAMES)}; stages after lowering: {', '.join(STAGE_NAMES)}")
    verify(g, "import")
    if dump_after and "import" in dump:
        dump_after("import", print_graph(g))
    for k, p in enumerate(PIPELINE):
        progress.step("passes", k, len(PIPELINE), p.name)
        start, nodes = time.perf_counter(), len(g.nodes)
        g = p.run(g)
        verify(g, p.name)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(f"pass {p.name}: {time.perf_counter() - start:.3f} s, {nodes} -> {len(g.nodes)} nodes, "
                      f"{len(g.tensors)} tensors")
        if dump_after and p.name in dump:
            dump_after(p.name, print_graph(g))
        if p.name == stop_after:
            break
    return g
