"""Lowering: graph IR -> tile program (neuronx_cc_lite/tile/). Importing this package registers every op lowering in
the op registry (neuronx_cc_lite/ops/registry.py)."""

from __future__ import annotations

from isa.dtypes import DType
from isa.target import Target
from neuronx_cc_lite import progress
from neuronx_cc_lite.frontend import release_mapped_weights
from neuronx_cc_lite.ir import Graph
from neuronx_cc_lite.lower import (  # noqa: F401  (each module registers its lowerings)
    activations, batchnorm, cast, collective, concat, conv, cumsum, einsum, elementwise, feature_norm, gather,
    group_norm, logic, lrn, matmul, movement, normalize, onehot, pad, patches, pool, quantization, recurrent, reduce,
    resize, rounding, scatter, topk, views)
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.relayout import copy_hbm
from neuronx_cc_lite.ops.registry import LOWERINGS
from neuronx_cc_lite.tile.program import Program

__all__ = ["lower_graph"]


def lower_graph(g: Graph, target: Target, matmul_dtype: DType | None = None,
                internal_dtype: DType | None = None, by_rows: frozenset[str] | None = None
                ) -> tuple[Program, LowerCtx]:
    """Lower every node in order. `matmul_dtype`: the type matmul operands are cast to as they load (auto-cast);
    `internal_dtype`: the type fp32 tensors inside the model are held in (auto-cast all); `by_rows`: tensors
    not to lay out feature-major (None: none at all, for programs whose tensors stay in HBM)."""
    program = Program(target, matmul_dtype, copy_hbm)
    ctx = LowerCtx(g, program, internal_dtype, by_rows)
    for k, node in enumerate(g.nodes):
        progress.step("lowering", k, len(g.nodes), node.name)
        program.node = node.name
        LOWERINGS[node.op].lower(ctx, node)
        release_mapped_weights()  # what the node read of a file's weights it has laid out by now
    ctx.materialize_outputs()
    ctx.columns.finish()
    return program, ctx
