"""TopK along one axis: k rounds of selection on VectorE, each row on its own partition.

Per round: the row's maximum (of the negated row for the smallest), the first index holding it among the
elements not yet taken (iota where equal and untaken, n elsewhere, then a min reduction: ties go to the lower
index, as ONNX asks), both written to column j of the outputs, and that element marked taken and set to -inf.
The values come out sorted whatever `sorted` says, which ONNX allows.
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
from neuronx_cc_lite.lower.instr import copy, fill, select, ts, tt
from neuronx_cc_lite.lower.program import Program, TileAccess
from neuronx_cc_lite.lower.registry import lowering
from neuronx_cc_lite.lower.rows import move_to_end, row_boxes

# Each round costs about ten instructions per row group: beyond this many the node is refused rather than
# unrolled into a program of tens of thousands of instructions.
MAX_K = 256


def _k(node: Node, g: Graph) -> int:
    return int(np.asarray(g.tensors[node.inputs[1]].value).reshape(-1)[0])


def _check_topk(node: Node, g: Graph) -> str | None:
    if _k(node, g) > MAX_K:
        return f"TopK with k = {_k(node, g)} (at most {MAX_K})"
    return small_integers_ok(node, g)


def _select_round(prog: Program, j: int, work: TileAccess, taken: TileAccess, index: TileAccess,
                  scratch: tuple[TileAccess, TileAccess, TileAccess, TileAccess], values: TileAccess,
                  indices: TileAccess, n: int, negate: bool) -> None:
    peak, first, hit, lowest = scratch
    prog.emit("tensor_reduce", Engine.DVE, dst=peak, src=work, op=AluOp.maximum, axes=1)
    ts(prog, hit, work, AluOp.equal, peak)
    tt(prog, hit, hit, taken, AluOp.greater)  # equal to the peak and not taken yet
    ts(prog, hit, hit, AluOp.subtract, 1.0, AluOp.multiply, float(n), reverse0=True)  # 0 at hits, n elsewhere
    tt(prog, hit, hit, index, AluOp.add)
    prog.emit("tensor_reduce", Engine.DVE, dst=first, src=hit, op=AluOp.minimum, axes=1)
    column = values.tile.region(j, 1, values.first, values.partitions)
    ts(prog, column, peak, AluOp.multiply, -1.0 if negate else 1.0)
    copy(prog, indices.tile.region(j, 1, indices.first, indices.partitions), first)
    ts(prog, hit, index, AluOp.equal, first)
    tt(prog, taken, taken, hit, AluOp.maximum)
    select(prog, work, lowest, hit)  # out of the next rounds' maxima (`taken` tells it from a real -inf)


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
        work = prog.sbuf(p, n, DType.fp32, f"{node.name}/work").ap()
        prog.dma(work, row)
        if negate:
            ts(prog, work, work, AluOp.multiply, -1.0)
        index = prog.sbuf(p, n, DType.fp32, f"{node.name}/iota").ap()
        prog.emit("iota", Engine.POOL, dst=index, base=0, channel_multiplier=0, steps=(1,))
        taken = prog.sbuf(p, n, DType.fp32, f"{node.name}/taken").ap()
        fill(prog, taken, 0.0)
        scratch = (prog.sbuf(p, 1, DType.fp32, "peak").ap(), prog.sbuf(p, 1, DType.fp32, "first").ap(),
                   prog.sbuf(p, n, DType.fp32, "hit").ap(), prog.sbuf(p, n, DType.fp32, "lowest").ap())
        fill(prog, scratch[3], float("-inf"))
        values = prog.sbuf(p, k, vals_dst.dtype, node.outputs[0]).ap()
        indices = prog.sbuf(p, k, idx_dst.dtype, node.outputs[1]).ap()
        for j in range(k):
            _select_round(prog, j, work, taken, index, scratch, values, indices, n, negate)
        prog.dma(vals_dst, values)
        prog.dma(idx_dst, indices)
