"""TopK along one axis, each row on its own partition, 8 at a time with VectorE's max8 family:

    max8            the row's 8 largest values, largest first
    nc_find_index8  where each first occurs; equal values take their occurrences in ascending order, so ties go
                    to the lower index, as ONNX asks
    nc_match_replace8  (between rounds of 8) those occurrences replaced by -inf, out of the next round

The smallest are the largest of the negated row. A row shorter than 8 is padded with -inf past its end (the
padding sorts last and is never among the k <= n taken). When more than one round runs, the row's own -inf values
are first raised to the lowest finite fp32 value, so that no round can take a replaced element for one of them
(they come back as -inf; a row holding -3.4028235e38 itself reads it back as -inf).
"""

from __future__ import annotations

import numpy as np

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import small_integers_ok, tile_free_max
from neuronx_cc_lite.lower.instr import copy, fill, ts
from neuronx_cc_lite.lower.rows import move_to_end, row_boxes
from neuronx_cc_lite.ops.registry import lowering

# Each round of 8 costs about six instructions per row group: beyond this many the node is refused rather than
# unrolled into a program of thousands of instructions.
MAX_K = 256
LOWEST = float(np.finfo(np.float32).min)


def _k(node: Node, g: Graph) -> int:
    return int(np.asarray(g.tensors[node.inputs[1]].value).reshape(-1)[0])


def _check_topk(node: Node, g: Graph) -> str | None:
    if _k(node, g) > MAX_K:
        return f"TopK with k = {_k(node, g)} (at most {MAX_K})"
    return small_integers_ok(node, g)


@lowering("TopK", check=_check_topk, since=10, constant_inputs=(1,))
def lower_topk(ctx: LowerCtx, node: Node) -> None:
    prog = ctx.program
    g = ctx.graph
    x = ctx.view(node.inputs[0])
    rank = len(x.shape)
    axis = int(node.attrs.get("axis", -1)) % rank
    k, n = _k(node, g), x.shape[axis]
    if n > tile_free_max(ctx):
        raise CompileError("NCC_UNSUPPORTED", f"TopK over {n} elements per row does not fit a tile "
                           f"({tile_free_max(ctx)})", node.name, node.op)
    negate = not node.attrs.get("largest", 1)
    outs = [ctx.output(name) for name in node.outputs[:2]]
    views = [move_to_end(v, (axis,)) for v in (x, *outs)]
    for row, vals_dst, idx_dst in row_boxes(views, rank - 1, prog.target.partitions):
        p = row.shape[0]
        work = prog.sbuf(p, max(n, 8), DType.fp32, f"{node.name}/work").ap()
        row_part = work.tile.region(0, n)
        prog.dma(row_part, row)
        if negate:
            ts(prog, row_part, row_part, AluOp.multiply, -1.0)
        if n < 8:
            fill(prog, work.tile.region(n, 8 - n), float("-inf"))
        values = prog.sbuf(p, k, vals_dst.dtype, node.outputs[0]).ap()
        indices = prog.sbuf(p, k, idx_dst.dtype, node.outputs[1]).ap()
        top = prog.sbuf(p, 8, DType.fp32, f"{node.name}/top8").ap()
        found = prog.sbuf(p, 8, DType.uint32, f"{node.name}/index8").ap()
        rounds = -(-k // 8)
        if rounds > 1:
            ts(prog, work, work, AluOp.maximum, LOWEST)
        for r in range(rounds):
            prog.emit("max8", Engine.DVE, dst=top, src=work)
            prog.emit("nc_find_index8", Engine.DVE, dst=found, data=work, vals=top)
            take = min(8, k - 8 * r)
            chosen = top.tile.region(0, take)
            if rounds > 1:  # the raised -inf values back to -inf
                finite = prog.sbuf(p, take, DType.uint8, f"{node.name}/finite").ap()
                ts(prog, finite, chosen, AluOp.greater, LOWEST)
                prog.emit("select_reduce", Engine.DVE, dst=chosen, predicate=finite, on_true=chosen,
                          on_false=float("-inf"), reverse=False, reduce=None)
            ts(prog, values.tile.region(8 * r, take), chosen, AluOp.multiply, -1.0 if negate else 1.0)
            copy(prog, indices.tile.region(8 * r, take), found.tile.region(0, take))
            if r < rounds - 1:
                prog.emit("nc_match_replace8", Engine.DVE, dst=work, data=work, vals=top, imm=float("-inf"),
                          dst_idx=None)
        prog.dma(vals_dst, values)
        prog.dma(idx_dst, indices)
