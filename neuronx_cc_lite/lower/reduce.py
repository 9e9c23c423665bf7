"""Reductions (ReduceSum, ReduceMean, ReduceMax, ... ArgMax, ArgMin) along any axes.

The reduced axes are moved to the end of the input view, rows go on partitions (rows.py), and VectorE reduces
each row with `tensor_reduce` (a sum, mean or max over a few leading axes reduces down the partitions instead, on
GpSimdE: `_across_partitions`). A row longer than a tile is reduced piece by piece, the partial results combined
with `tensor_tensor`. What a reduction needs before (abs, square, exp after subtracting the max) or after (scale
by 1/n, sqrt, log) runs on the same tiles, on ScalarE or VectorE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.integer_ranges import integer_ranges
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import tile_free_max
from neuronx_cc_lite.lower.instr import act, fill, select, tt
from neuronx_cc_lite.lower.rows import free_chunks, move_to_end, row_boxes
from neuronx_cc_lite.ops.attributes import normalize_axes, reduced_axes
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, Tile


MEAN_PIECE = 512  # a piece of a long plain mean over few partitions (reduce_rows): a bank's length


@dataclass(frozen=True)
class Reduction:
    op: AluOp  # how elements (and partial results) combine
    before: ActFunc | None = None  # applied to every element first
    shift_by_max: bool = False  # exp(x - max) before summing, max added back after the log (LogSumExp)
    after: ActFunc | None = None  # applied to the result
    mean: bool = False  # divide by the number of reduced elements
    integers: bool = False  # also defined on integer tensors


REDUCTIONS = {
    "ReduceSum": Reduction(AluOp.add, integers=True),
    "ReduceMean": Reduction(AluOp.add, mean=True),
    "ReduceMax": Reduction(AluOp.maximum, integers=True),
    "ReduceMin": Reduction(AluOp.minimum, integers=True),
    "ReduceProd": Reduction(AluOp.multiply, integers=True),
    "ReduceL1": Reduction(AluOp.add, before=ActFunc.abs),
    "ReduceL2": Reduction(AluOp.add, before=ActFunc.square, after=ActFunc.sqrt),
    "ReduceSumSquare": Reduction(AluOp.add, before=ActFunc.square),
    "ReduceLogSum": Reduction(AluOp.add, after=ActFunc.log),
    "ReduceLogSumExp": Reduction(AluOp.add, shift_by_max=True, after=ActFunc.log),
}
def _check_reduce(node: Node, g: Graph) -> str | None:
    x = g.tensors[node.inputs[0]]
    if not REDUCTIONS[node.op].integers and not np.issubdtype(x.dtype, np.floating):
        return f"{node.op} on {x.dtype} is not supported (floating point only)"
    if 0 in x.shape:
        return "reductions of empty tensors are not supported"
    return integer_ranges(g).why_inexact(node)


def reduce_rows(prog: Program, row: HbmView, p: int, length: int, r: Reduction, name: str, budget: int) -> Tile:
    """Reduce every row of the (p, *free) HBM view `row` into a [p, 1] fp32 tile."""
    shift = None
    if r.shift_by_max:
        peak = reduce_rows(prog, row, p, length, Reduction(AluOp.maximum), name, budget)
        shift = prog.sbuf(p, 1, DType.fp32, f"{name}/-max")
        prog.emit("tensor_scalar", Engine.DVE, dst=shift.ap(), src=peak.ap(), op0=AluOp.multiply, scalar0=-1.0,
                  reverse0=False, reverse1=False)
    acc = None
    chunks = list(free_chunks(row, budget))
    if r.mean and r.op is AluOp.add and r.before is None and r.after is None and shift is None and len(chunks) == 1:
        # a plain mean on ScalarE: x / length, its row sums landing in the result (a global pool's mean on a
        # dependent chain: one instruction instead of a VectorE sum then a scaling). A long row over few partitions
        # (a pool over few channels) goes in pieces of MEAN_PIECE, their sums added after: each piece runs as soon
        # as its part of the row is written, and the chain waits for the last only (MobileNetV3's first pooled
        # mean, 3,136 values on 16 partitions, took 2.3 us of ScalarE after its depthwise convolution's last rows:
        # bf16 101.3 -> 100.4 us, fp32 184.5 -> 184.2)
        few = 2 * p <= prog.target.partitions and length >= 2 * MEAN_PIECE
        pieces = list(free_chunks(row, MEAN_PIECE)) if few else chunks
        acc = prog.sbuf(p, 1, DType.fp32, f"{name}/mean")
        sums = prog.sbuf(p, len(pieces), DType.fp32, f"{name}/sums") if len(pieces) > 1 else acc
        for k, (_, piece) in enumerate(pieces):
            f = math.prod(piece.shape[1:])
            x = prog.sbuf(p, f, piece.dtype, f"{name}/x")
            prog.dma(x.ap(), piece)
            scaled = prog.sbuf(p, f, DType.fp32, f"{name}/scaled")
            act(prog, scaled.ap(), x.ap(), ActFunc.copy, scale=1.0 / length, reduce=sums.ap(((1, 1),), k))
        if sums is not acc:
            prog.emit("tensor_reduce", Engine.DVE, dst=acc.ap(), src=sums.ap(), op=AluOp.add, axes=1)
        return acc
    for _, piece in chunks:
        f = math.prod(piece.shape[1:])
        x = prog.sbuf(p, f, piece.dtype, f"{name}/x")
        prog.dma(x.ap(), piece)
        src = x
        if r.before is not None or shift is not None:
            src = prog.sbuf(p, f, DType.fp32, f"{name}/pre")
            func = ActFunc.exp if shift is not None else r.before
            prog.emit("activation", Engine.ACT, dst=src.ap(), src=x.ap(), func=func, scale=1.0,
                      bias=shift.ap() if shift is not None else None)
        part = prog.sbuf(p, 1, DType.fp32, f"{name}/part")
        prog.emit("tensor_reduce", Engine.DVE, dst=part.ap(), src=src.ap(), op=r.op, axes=1)
        if acc is None:
            acc = part
        else:
            prog.emit("tensor_tensor", Engine.DVE, dst=acc.ap(), a=acc.ap(), b=part.ap(), op=r.op)
    assert acc is not None
    if r.mean:
        prog.emit("tensor_scalar", Engine.DVE, dst=acc.ap(), src=acc.ap(), op0=AluOp.multiply,
                  scalar0=1.0 / length, reverse0=False, reverse1=False)
    if r.after is not None:
        prog.emit("activation", Engine.ACT, dst=acc.ap(), src=acc.ap(), func=r.after, scale=1.0)
    if shift is not None:  # log(sum(exp(x - max))) + max
        prog.emit("tensor_tensor", Engine.DVE, dst=acc.ap(), a=acc.ap(), b=shift.ap(), op=AluOp.subtract)
    return acc


# Reductions over leading axes of at most pmax rows that reduce down the partitions on GpSimdE instead
PARTITION_REDUCTIONS = {"ReduceSum": AluOp.add, "ReduceMean": AluOp.add, "ReduceMax": AluOp.maximum}


def _across_partitions(ctx: LowerCtx, node: Node, x: HbmView, axes: tuple[int, ...]) -> bool:
    """ReduceSum, ReduceMean or ReduceMax of float data over axes that lie outermost in memory (the leading ones,
    or ones a view moved: Swin's pooling, a mean over the tokens of its [tokens, features] output read through a
    Transpose), 2 to pmax rows of them, keeping at least pmax elements: moving the reduced axes to the end would
    give groups of pmax short strided rows (Swin's: 37,632 pieces of 4 bytes), so the rows load as they lie, one
    per partition, and GpSimdE's `tensor_partition_reduce` reduces down the partitions (fp32). Returns whether it
    lowered the node."""
    prog = ctx.program
    length = math.prod(x.shape[a] for a in axes)
    if node.op not in PARTITION_REDUCTIONS or not x.dtype.is_float:
        return False
    kept = x.size // length
    # (the reduced axes first, the kept ones after in their order: the output's)
    rows = x.transpose((*axes, *(a for a in range(len(x.shape)) if a not in axes))).reshape((length, kept))
    if rows is None or rows.strides[1] != 1 or not 1 < length <= prog.target.partitions or \
            kept < prog.target.partitions:
        return False  # (each partition's row one run: not a mean over a [C, H, W] tensor's rows and columns)
    out = ctx.output(node.outputs[0]).reshape((1, kept))
    assert out is not None  # a fresh output is contiguous
    for start, piece in free_chunks(rows, tile_free_max(ctx)):
        f = piece.shape[1]
        t = prog.sbuf(length, f, x.dtype, f"{node.name}/x")
        prog.dma(t.ap(), piece)
        result = prog.sbuf(1, f, DType.fp32, f"{node.name}/acc")
        prog.emit("tensor_partition_reduce", Engine.POOL, dst=result.ap(), src=t.ap(),
                  op=PARTITION_REDUCTIONS[node.op])
        if node.op == "ReduceMean" or out.dtype is not DType.fp32:
            scaled = prog.sbuf(1, f, out.dtype, f"{node.name}/out")
            prog.emit("tensor_scalar", Engine.DVE, dst=scaled.ap(), src=result.ap(), op0=AluOp.multiply,
                      scalar0=1.0 / length if node.op == "ReduceMean" else 1.0, reverse0=False, reverse1=False)
            result = scaled
        prog.dma(out.box((0, start), (1, f)), result.ap())
    return True


@lowering(*REDUCTIONS, check=_check_reduce, constant_inputs=(1,), kind=OpKind.REDUCTION)
def lower_reduce(ctx: LowerCtx, node: Node) -> None:
    prog = ctx.program
    x = ctx.view(node.inputs[0])
    rank = len(x.shape)
    axes = reduced_axes(node, ctx.graph)
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            ctx.alias(node.outputs[0], x)
            return
        axes = tuple(range(rank))
    ready = ctx.means.pop(node.outputs[0], None)  # computed by its input's producer (lower/depthwise.py)
    if ready is None and _across_partitions(ctx, node, x, axes):
        return
    kept = tuple(n for a, n in enumerate(x.shape) if a not in axes)
    length = math.prod(x.shape[a] for a in axes)
    # the kept axes, merged, on partitions: the layout the result is written in (a pooled feature vector is then
    # K on partitions for the classifier's matmul, read on chip as it lies)
    out = ctx.output(node.outputs[0], partition_axes=(0, len(ctx.shape(node.outputs[0]))))
    rows_out = out.reshape((*kept, 1))
    assert rows_out is not None
    r = REDUCTIONS[node.op]
    for row, dst in row_boxes([move_to_end(x, axes), rows_out], len(kept), prog.target.partitions):
        p = row.shape[0]
        assert ready is None or ready.partitions == p  # (a producer's means: at most a partition's worth of rows)
        acc = ready if ready is not None else reduce_rows(prog, row, p, length, r, node.name, tile_free_max(ctx))
        if dst.dtype is not DType.fp32:
            cast = prog.sbuf(p, 1, dst.dtype, f"{node.name}/cast")
            prog.emit("tensor_copy", Engine.DVE, dst=cast.ap(), src=acc.ap())
            acc = cast
        prog.dma(dst, acc.ap())


def _check_arg(node: Node, g: Graph) -> str | None:
    if 0 in g.tensors[node.inputs[0]].shape:
        return f"{node.op} of an empty tensor is not defined"
    return integer_ranges(g).why_inexact(node)


def _extreme_of_numbers(prog: Program, row: HbmView, p: int, op: AluOp, name: str, budget: int) -> Tile:
    """Each row's largest (op maximum) or smallest number, NaNs left out (the engines' max and min propagate a
    NaN): every piece is copied over a tile of -inf (+inf) where it equals itself, then reduced. A row of NaNs
    gives -inf (+inf), which no element equals."""
    acc = None
    for _, piece in free_chunks(row, budget):
        f = piece.shape[1]
        x = prog.sbuf(p, f, piece.dtype, f"{name}/x")
        prog.dma(x.ap(), piece)
        number = prog.sbuf(p, f, DType.fp32, f"{name}/number")
        tt(prog, number.ap(), x.ap(), x.ap(), AluOp.equal)
        clean = prog.sbuf(p, f, DType.fp32, f"{name}/numbers")
        fill(prog, clean.ap(), -math.inf if op is AluOp.maximum else math.inf)
        select(prog, clean.ap(), x.ap(), number.ap())
        part = prog.sbuf(p, 1, DType.fp32, f"{name}/part")
        prog.emit("tensor_reduce", Engine.DVE, dst=part.ap(), src=clean.ap(), op=op, axes=1)
        if acc is None:
            acc = part
        else:
            prog.emit("tensor_tensor", Engine.DVE, dst=acc.ap(), a=acc.ap(), b=part.ap(), op=op)
    assert acc is not None
    return acc


@lowering("ArgMax", "ArgMin", check=_check_arg, kind=OpKind.REDUCTION)
def lower_arg(ctx: LowerCtx, node: Node) -> None:
    """The index of the first (or, with select_last_index, the last) extreme element along an axis: find the
    row's extreme, then in each piece of the row keep the index (from iota) where an element equals it and a
    sentinel elsewhere, and reduce those candidates with min (first) or max (last).

    A NaN is treated as onnxruntime's loop over the row treats it (`if x[i] > best`: a NaN is never greater and
    nothing is greater than a NaN): a row that starts with a NaN gives 0, any other gives the extreme of its
    numbers, NaNs left out. So the extreme of a float row leaves NaNs out, and the index found is multiplied by
    (x[0] == x[0]): 0 where the row starts with a NaN (and where it holds nothing but NaNs)."""
    prog = ctx.program
    x = ctx.view(node.inputs[0])
    axis = normalize_axes((node.attrs.get("axis", 0),), len(x.shape))[0]
    length = x.shape[axis]
    out = ctx.output(node.outputs[0])
    kept = tuple(n for a, n in enumerate(x.shape) if a != axis)
    rows_out = out.reshape((*kept, 1))
    assert rows_out is not None
    extreme = AluOp.maximum if node.op == "ArgMax" else AluOp.minimum
    last = bool(node.attrs.get("select_last_index", 0))
    pick = AluOp.maximum if last else AluOp.minimum
    budget = tile_free_max(ctx)
    floats = x.dtype.is_float
    for row, dst in row_boxes([move_to_end(x, (axis,)), rows_out], len(kept), prog.target.partitions):
        p = row.shape[0]
        if floats:
            peak = _extreme_of_numbers(prog, row, p, extreme, node.name, budget)
        else:
            peak = reduce_rows(prog, row, p, length, Reduction(extreme), node.name, budget)
        acc = starts_with_number = None
        for start, piece in free_chunks(row, budget):
            f = piece.shape[1]
            t = prog.sbuf(p, f, piece.dtype, f"{node.name}/x")
            prog.dma(t.ap(), piece)
            if floats and start == 0:
                starts_with_number = prog.sbuf(p, 1, DType.fp32, f"{node.name}/first")
                first = t.region(0, 1)
                tt(prog, starts_with_number.ap(), first, first, AluOp.equal)
            hit = prog.sbuf(p, f, DType.fp32, f"{node.name}/hit")
            prog.emit("tensor_scalar", Engine.DVE, dst=hit.ap(), src=t.ap(), op0=AluOp.equal, scalar0=peak.ap(),
                      reverse0=False, reverse1=False)
            index = prog.sbuf(p, f, DType.fp32, f"{node.name}/index")
            prog.emit("iota", Engine.POOL, dst=index.ap(), base=start + (1 if last else 0), channel_multiplier=0,
                      steps=(1,))
            if last:  # hit * (i + 1) - 1: -1 where no hit, so max picks the last hit
                prog.emit("tensor_tensor", Engine.DVE, dst=hit.ap(), a=hit.ap(), b=index.ap(), op=AluOp.multiply)
                prog.emit("tensor_scalar", Engine.DVE, dst=hit.ap(), src=hit.ap(), op0=AluOp.subtract,
                          scalar0=1.0, reverse0=False, reverse1=False)
            else:  # i + (1 - hit) * length: past every index where no hit, so min picks the first hit
                prog.emit("tensor_scalar", Engine.DVE, dst=hit.ap(), src=hit.ap(), op0=AluOp.subtract,
                          scalar0=1.0, reverse0=True, op1=AluOp.multiply, scalar1=float(length), reverse1=False)
                prog.emit("tensor_tensor", Engine.DVE, dst=hit.ap(), a=hit.ap(), b=index.ap(), op=AluOp.add)
            part = prog.sbuf(p, 1, DType.fp32, f"{node.name}/part")
            prog.emit("tensor_reduce", Engine.DVE, dst=part.ap(), src=hit.ap(), op=pick, axes=1)
            if acc is None:
                acc = part
            else:
                prog.emit("tensor_tensor", Engine.DVE, dst=acc.ap(), a=acc.ap(), b=part.ap(), op=pick)
        assert acc is not None
        if starts_with_number is not None:  # 0 where the row starts with a NaN
            prog.emit("tensor_tensor", Engine.DVE, dst=acc.ap(), a=acc.ap(), b=starts_with_number.ap(),
                      op=AluOp.multiply)
        result = prog.sbuf(p, 1, dst.dtype, f"{node.name}/arg")
        prog.emit("tensor_copy", Engine.DVE, dst=result.ap(), src=acc.ap())
        prog.dma(dst, result.ap())
