"""Softmax, LogSoftmax, Hardmax, LayerNormalization, RMSNormalization, InstanceNormalization,
MeanVarianceNormalization and LpNormalization: ops that scale every row by statistics of that row.

Rows go on partitions with the whole normalised extent in the free dimension (rows.py), so each statistic is a
[rows, 1] column: VectorE reduces, ScalarE applies a function with the column as its per-partition bias and can
sum its own output in the same instruction (softmax's exp and its sum, layer norm's squares and their sum), and
VectorE scales by a column with `tensor_scalar`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import tile_free_max
from neuronx_cc_lite.lower import feature_norm
from neuronx_cc_lite.lower.instr import act, ts, tt
from neuronx_cc_lite.lower.moments import mean_of, normalize, normalize_rows, row_statistics
from neuronx_cc_lite.lower.reduce import Reduction, reduce_rows
from neuronx_cc_lite.lower.rows import free_chunks, move_to_end, row_boxes, segment_boxes
from neuronx_cc_lite.ops.attributes import normalize_axes
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, TileAccess

# body(prog, rows, row length, x tile, y tile, the extra views cut to these rows)
Body = Callable[[Program, int, int, TileAccess, TileAccess, list[HbmView]], None]
# streamed(prog, rows, row length, x rows view, y rows view, extra views cut to these rows, elements per piece)
Streamed = Callable[[Program, int, int, HbmView, HbmView, list[HbmView], int], None]
# Elements per partition of a box of rows side by side (per_row's `segmented`; an eighth of a tile, or less):
# enough that an instruction's fixed cost is a fraction of it, few enough that the boxes of one operator pipeline
# across the engines and with the operators around it. Swin-T on trn1 (bf16 / fp32 us): 256 1498.6 / 1804.9, 512 1427.5 / 1765.4, 1024 1437.9 /
# 1797.0, 2048 (half a tile) 1486.5 / 1857.0.
SEGMENT_ELEMENTS = 512
# segmented(prog, rows, segments, row length, x tile, y tile, extra views cut to the box): each partition holds
# `segments` rows side by side
Segmented = Callable[[Program, int, int, int, TileAccess, TileAccess, list[HbmView]], None]


def _normalized_axes(node: Node, g: Graph) -> tuple[int, ...]:
    rank = len(g.tensors[node.inputs[0]].shape)
    if node.op in ("Softmax", "LogSoftmax", "Hardmax"):
        if g.opset_of(node) >= 13:
            return normalize_axes((node.attrs.get("axis", -1),), rank)
        axis = normalize_axes((node.attrs.get("axis", 1),), rank)[0]
        return tuple(range(axis, rank))  # before opset 13 the input is flattened to 2-D at `axis`
    if node.op in ("LayerNormalization", "RMSNormalization"):
        return tuple(range(normalize_axes((node.attrs.get("axis", -1),), rank)[0], rank))
    if node.op == "InstanceNormalization":
        return tuple(range(2, rank))
    if node.op == "MeanVarianceNormalization":
        return normalize_axes(node.attrs.get("axes", (0, 2, 3)), rank)
    return normalize_axes((node.attrs.get("axis", -1),), rank)  # LpNormalization


def _check(node: Node, g: Graph) -> str | None:
    if 0 in g.tensors[node.inputs[0]].shape:
        return f"{node.op} of an empty tensor is not supported"
    return None


def per_row(ctx: LowerCtx, node: Node, axes: tuple[int, ...], extra: list[HbmView], body: Body,
            streamed: Streamed | None = None, segmented: Segmented | None = None) -> None:
    """For each group of rows: when a row fits a tile, load it once, let `body` fill the output tile and store
    it; when it does not, hand the row views to `streamed`, which reads them piece by piece. `extra` views have
    the row axes first, like the input once its normalised axes are moved to the end. With `segmented`, rows laid
    out by their producer go several to a partition, side by side, as its layout holds them (rows.segment_boxes:
    a batched product's results, or blocks of 128 rows), so that each instruction covers many short rows."""
    prog = ctx.program
    x = ctx.view(node.inputs[0])
    length = math.prod(x.shape[a] for a in axes)
    budget = tile_free_max(ctx)
    if length > budget and streamed is None:
        raise CompileError("NCC_UNSUPPORTED", f"{length} elements per row do not fit a tile ({budget})",
                           node.name, node.op)
    rank = len(x.shape) - len(axes)
    trailing = tuple(axes) == tuple(range(rank, len(x.shape)))
    hint = ctx.partition_axes(node.inputs[0])
    first = hint[0] if hint is not None and hint[1] == rank and trailing else None
    out = ctx.output(node.outputs[0], (first or 0, rank) if trailing else None)
    views = [move_to_end(x, axes), move_to_end(out, axes), *extra]
    # only rows shorter than an instruction's efficient size (the cost model's small-instruction overhead): rows of
    # 128 or more are better one to a partition (softmax's exp sums its row as it goes; T5's 128 x 128 attention
    # ran 223.2 -> 224.7 us in bf16 with its heads side by side)
    segments = max(1, SEGMENT_ELEMENTS // length)
    grouped = segment_boxes(views, rank, first, prog.target.partitions, segments) \
        if segmented is not None and first is not None and segments > 1 and \
        length < prog.target.min_efficient_elements else None
    if grouped is not None:
        for row, dst, *cut in grouped:
            p, size = row.shape[0], math.prod(row.shape[1:])
            xt = prog.sbuf(p, size, row.dtype, f"{node.name}/x")
            prog.dma(xt.ap(), row)
            yt = prog.sbuf(p, size, dst.dtype, f"{node.name}/y")
            segmented(prog, p, size // length, length, xt.ap(), yt.ap(), cut)  # type: ignore[misc]
            prog.dma(dst, yt.ap())
        return
    for cut in row_boxes(views, rank, prog.target.partitions, first):
        row, dst = cut[0], cut[1]
        p = row.shape[0]
        if length > budget:
            assert streamed is not None
            streamed(prog, p, length, row, dst, cut[2:], budget)
            continue
        xt = prog.sbuf(p, length, row.dtype, f"{node.name}/x")
        prog.dma(xt.ap(), row)
        yt = prog.sbuf(p, length, dst.dtype, f"{node.name}/y")
        body(prog, p, length, xt.ap(), yt.ap(), cut[2:])
        prog.dma(dst, yt.ap())


def _rows(t: TileAccess, g: int, n: int) -> TileAccess:
    """A tile of g rows of n side by side in each partition, as [g, n] (a segmented body's reductions take n)."""
    return replace(t, dims=((g, n), (n, 1)))


def _along_rows(column: TileAccess, g: int, n: int) -> TileAccess:
    """A [p, g] tile of one value per row, read back along each of the g rows (stride 0)."""
    return replace(column, dims=((g, 1), (n, 0)))


def _pieces(views: list[HbmView], budget: int) -> list[tuple[HbmView, ...]]:
    """The views of one row group, cut alike into pieces of at most `budget` elements per row."""
    return list(zip(*[[piece for _, piece in free_chunks(v, budget)] for v in views]))


def _load(prog: Program, view: HbmView, name: str) -> TileAccess:
    t = prog.sbuf(view.shape[0], math.prod(view.shape[1:]), view.dtype, name)
    prog.dma(t.ap(), view)
    return t.ap()


def _column(prog: Program, p: int, name: str) -> TileAccess:
    return prog.sbuf(p, 1, DType.fp32, name).ap()


def _row_tile(prog: Program, p: int, n: int, name: str) -> TileAccess:
    return prog.sbuf(p, n, DType.fp32, name).ap()


def _reduce(prog: Program, dst: TileAccess, src: TileAccess, op: AluOp) -> None:
    prog.emit("tensor_reduce", Engine.DVE, dst=dst, src=src, op=op, axes=1)


def _zero_where(prog: Program, y: TileAccess, predicate: TileAccess) -> None:
    """y = 0 where `predicate` is non-zero (a NaN guard's Where), y elsewhere: one VectorE pass."""
    zero = prog.scalar(0.0, DType.fp32).ap(((math.prod(n for n, _ in y.dims), 0),), 0, 0, y.partitions)
    prog.emit("tensor_copy_predicated", Engine.DVE, dst=y, src=zero, predicate=predicate)


@lowering("Softmax", "LogSoftmax", check=_check, floats=True)
def lower_softmax(ctx: LowerCtx, node: Node) -> None:
    """Softmax with nan_to_zero (passes/fuse_epilogues.py): Where(IsNaN(softmax), 0, softmax), the NaN rows zero."""
    log = node.op == "LogSoftmax"
    guarded = bool(node.attrs.get("nan_to_zero"))

    def body(prog: Program, p: int, n: int, x: TileAccess, y: TileAccess, _: list[HbmView]) -> None:
        neg_max, total = _column(prog, p, "-max"), _column(prog, p, "sum")
        _reduce(prog, neg_max, x, AluOp.maximum)
        ts(prog, neg_max, neg_max, AluOp.multiply, -1.0)
        # the exponentials in fp32 unless the op computes in a narrower type (its input's); a result stored
        # narrower (read only by a matmul under auto-cast) is rounded once, by the division
        e = _row_tile(prog, p, n, "exp") if log or y.tile.dtype is not x.tile.dtype else y
        if x.tile.dtype is DType.fp32:
            act(prog, e, x, ActFunc.exp, bias=neg_max, reduce=total)  # exp(x - max) and its row sums at once
        else:  # a narrower type: x - max, its exp and their sum each rounded to it, as the op computes in its type
            shifted = prog.sbuf(p, n, e.tile.dtype, "shifted").ap()
            ts(prog, shifted, x, AluOp.add, neg_max)
            act(prog, e, shifted, ActFunc.exp)
            total = prog.sbuf(p, 1, e.tile.dtype, "sum").ap()
            _reduce(prog, total, e, AluOp.add)
        if log:  # x - max - log(sum)
            act(prog, total, total, ActFunc.log)
            tt(prog, total, total, neg_max, AluOp.subtract)
            ts(prog, y, x, AluOp.subtract, total)
        else:
            ts(prog, y, e, AluOp.divide, total)
        if guarded:  # a row is NaN whole or not at all (a NaN anywhere makes its sum NaN): zero the rows whose is
            bad = _column(prog, p, "nan")
            tt(prog, bad, total, total, AluOp.not_equal)
            _zero_where(prog, y, bad.tile.ap(((n, 0),), 0, 0, p))

    def streamed(prog: Program, p: int, n: int, row: HbmView, dst: HbmView, _: list[HbmView], budget: int) -> None:
        """A row longer than a tile: log-sum-exp over its pieces (two passes), then each piece of the output
        as x - lse (log) or exp(x - lse)."""
        lse = reduce_rows(prog, row, p, n, Reduction(AluOp.add, shift_by_max=True, after=ActFunc.log), node.name,
                          budget).ap()
        ts(prog, lse, lse, AluOp.multiply, -1.0)
        for piece, out in _pieces([row, dst], budget):
            x = _load(prog, piece, f"{node.name}/x")
            y = prog.sbuf(p, x.tile.free, out.dtype, f"{node.name}/y").ap()
            if log:
                ts(prog, y, x, AluOp.add, lse)
            else:
                act(prog, y, x, ActFunc.exp, bias=lse)
            if guarded:  # (here a row with +inf holds NaN where it is and zeros elsewhere: element by element)
                nan = prog.sbuf(p, x.tile.free, DType.fp32, f"{node.name}/nan").ap()
                tt(prog, nan, y, y, AluOp.not_equal)
                _zero_where(prog, y, nan)
            prog.dma(out, y)

    def segmented(prog: Program, p: int, g: int, n: int, x: TileAccess, y: TileAccess, _: list[HbmView]) -> None:
        """Softmax of g rows a partition, each its own max and sum (one shift for all would underflow a row
        far below another to zeros): per-row columns [p, g] read back with stride 0 along each row."""
        peak, total = prog.sbuf(p, g, DType.fp32, "max").ap(), prog.sbuf(p, g, DType.fp32, "sum").ap()
        e = prog.sbuf(p, g * n, DType.fp32, "exp").ap()
        prog.emit("tensor_reduce", Engine.DVE, dst=peak, src=_rows(x, g, n), op=AluOp.maximum, axes=1)
        tt(prog, _rows(e, g, n), _rows(x, g, n), _along_rows(peak, g, n), AluOp.subtract, engine=Engine.POOL)
        act(prog, e, e, ActFunc.exp)
        prog.emit("tensor_reduce", Engine.POOL, dst=total, src=_rows(e, g, n), op=AluOp.add, axes=1)
        tt(prog, _rows(y, g, n), _rows(e, g, n), _along_rows(total, g, n), AluOp.divide)

    plain = not log and not guarded and ctx.view(node.inputs[0]).dtype is DType.fp32
    per_row(ctx, node, _normalized_axes(node, ctx.graph), [], body, streamed, segmented if plain else None)


@lowering("Hardmax", check=_check, floats=True)
def lower_hardmax(ctx: LowerCtx, node: Node) -> None:
    """1 at the first maximum of each row, 0 elsewhere."""
    def body(prog: Program, p: int, n: int, x: TileAccess, y: TileAccess, _: list[HbmView]) -> None:
        peak, first = _column(prog, p, "max"), _column(prog, p, "first")
        hit, index = _row_tile(prog, p, n, "hit"), _row_tile(prog, p, n, "index")
        _reduce(prog, peak, x, AluOp.maximum)
        ts(prog, hit, x, AluOp.equal, peak)
        prog.emit("iota", Engine.POOL, dst=index, base=0, channel_multiplier=0, steps=(1,))
        ts(prog, hit, hit, AluOp.subtract, 1.0, AluOp.multiply, float(n), reverse0=True)  # 0 at hits, n elsewhere
        tt(prog, hit, hit, index, AluOp.add)
        _reduce(prog, first, hit, AluOp.minimum)
        ts(prog, y, index, AluOp.equal, first)

    per_row(ctx, node, _normalized_axes(node, ctx.graph), [], body)


def normalize_streamed(prog: Program, p: int, n: int, row: HbmView, dst: HbmView, affine: list[HbmView],
                       budget: int, eps: float, subtract_mean: bool, name: str) -> tuple[TileAccess, TileAccess]:
    """normalize_rows for rows longer than a tile, piece by piece: the mean, then the sum of squared deviations,
    then each output piece (x - mean) * rstd, scaled and shifted by the pieces of `affine`."""
    neg_mean = _column(prog, p, "-mean")
    if subtract_mean:
        mean = reduce_rows(prog, row, p, n, Reduction(AluOp.add, mean=True), name, budget).ap()
        ts(prog, neg_mean, mean, AluOp.multiply, -1.0)
    else:
        prog.emit("memset", Engine.DVE, dst=neg_mean, value=0.0)
    rstd, part = _column(prog, p, "rstd"), _column(prog, p, "part")
    for k, (piece,) in enumerate(_pieces([row], budget)):
        x = _load(prog, piece, f"{name}/x")
        squares = _row_tile(prog, p, x.tile.free, "squares")
        act(prog, squares, x, ActFunc.square, bias=neg_mean, reduce=rstd if k == 0 else part)
        if k:
            tt(prog, rstd, rstd, part, AluOp.add)
    ts(prog, rstd, rstd, AluOp.multiply, 1.0 / n, AluOp.add, eps)
    act(prog, rstd, rstd, ActFunc.rsqrt)
    for piece, out, *scale_shift in _pieces([row, dst, *affine], budget):
        x = _load(prog, piece, f"{name}/x")
        y = prog.sbuf(p, x.tile.free, out.dtype, f"{name}/y").ap()
        ts(prog, y, x, AluOp.add, neg_mean, AluOp.multiply, rstd)
        for view, op in zip(scale_shift, (AluOp.multiply, AluOp.add)):
            tt(prog, y, y, _load(prog, view, f"{name}/affine"), op)
        prog.dma(out, y)
    return neg_mean, rstd


def _check_layer_norm(node: Node, g: Graph) -> str | None:
    if node.attrs.get("stash_type", 1) != 1:
        return "stash_type other than float32"
    return _check(node, g)


@lowering("LayerNormalization", "RMSNormalization", check=_check_layer_norm, floats=True)
def lower_layer_norm(ctx: LowerCtx, node: Node) -> None:
    if node.op == "LayerNormalization" and feature_norm.applies(ctx, node):
        feature_norm.lower_layer_norm_feature_major(ctx, node)
        return
    axes = _normalized_axes(node, ctx.graph)
    eps = float(node.attrs.get("epsilon", 1e-5))
    rms = node.op == "RMSNormalization"
    shape = ctx.shape(node.inputs[0])
    affine_inputs = [i for i in (1, 2) if len(node.inputs) > i and node.inputs[i]]  # the scale, the shift
    affine = [move_to_end(ctx.view(node.inputs[i]).broadcast_to(shape), axes) for i in affine_inputs]
    kept = tuple(n for a, n in enumerate(shape) if a not in axes)
    stats = [(i, ctx.output(node.outputs[i]).reshape((*kept, 1)))
             for i in (1, 2) if not rms and len(node.outputs) > i and node.outputs[i]]

    def store_stats(prog: Program, mean: TileAccess, rstd: TileAccess, views: list[HbmView]) -> None:
        for (i, _), view in zip(stats, views):
            prog.dma(view, mean if i == 1 else rstd)

    def body(prog: Program, p: int, n: int, x: TileAccess, y: TileAccess, extra: list[HbmView]) -> None:
        centre, rstd = row_statistics(prog, p, n, x, eps, subtract_mean=not rms)
        # (the scale and the shift where the node has them: fold-norm-scales may have taken an RMSNorm's scale)
        loaded = {i: _load(prog, view, f"{node.name}/affine") for i, view in zip(affine_inputs, extra)}
        normalize(prog, y, x, centre, rstd, loaded.get(1), loaded.get(2))
        if stats:
            assert centre is not None
            store_stats(prog, mean_of(prog, centre), rstd, extra[len(affine):])

    def streamed(prog: Program, p: int, n: int, row: HbmView, dst: HbmView, extra: list[HbmView],
                 budget: int) -> None:
        neg_mean, rstd = normalize_streamed(prog, p, n, row, dst, extra[:len(affine)], budget, eps, not rms,
                                            node.name)
        if stats:
            ts(prog, neg_mean, neg_mean, AluOp.multiply, -1.0)
            store_stats(prog, neg_mean, rstd, extra[len(affine):])

    loaded: dict[tuple[int, int], TileAccess] = {}  # the scale and shift, on p partitions, loaded once

    def parameter(prog: Program, view: HbmView, p: int, n: int) -> TileAccess:
        key = (id(view.tensor), view.offset, p)
        if key not in loaded:
            t = prog.sbuf(p, n, view.dtype, f"{node.name}/affine")
            prog.dma(t.ap(), HbmView(view.tensor, view.dtype, (p, n), (0, view.strides[-1]), view.offset))
            loaded[key] = t.ap()
        return loaded[key]

    def segmented(prog: Program, p: int, g: int, n: int, x: TileAccess, y: TileAccess, extra: list[HbmView]) -> None:
        """g rows a partition, each normalised by its own statistics: sums along each row ([p, g] columns read
        back with stride 0 along it), the scale and shift loaded once and read with stride 0 across the rows."""
        centered = prog.sbuf(p, g * n, DType.fp32, "centered").ap()
        if not rms:
            sums = prog.sbuf(p, g, DType.fp32, "sum").ap()
            prog.emit("tensor_reduce", Engine.DVE, dst=sums, src=_rows(x, g, n), op=AluOp.add, axes=1)
            prog.emit("scalar_tensor_tensor", Engine.POOL, dst=_rows(centered, g, n), src=_along_rows(sums, g, n),
                      op0=AluOp.multiply, scalar=-1.0 / n, op1=AluOp.add, b=_rows(x, g, n))
        squares = prog.sbuf(p, g * n, DType.fp32, "squares").ap()
        act(prog, squares, x if rms else centered, ActFunc.square)
        rstd = prog.sbuf(p, g, DType.fp32, "rstd").ap()
        prog.emit("tensor_reduce", Engine.POOL, dst=rstd, src=_rows(squares, g, n), op=AluOp.add, axes=1)
        ts(prog, rstd, rstd, AluOp.multiply, 1.0 / n, AluOp.add, eps)
        act(prog, rstd, rstd, ActFunc.rsqrt)
        work = y if y.tile.dtype is DType.fp32 or not affine else centered  # rounded once, after the shift
        tt(prog, _rows(work, g, n), _rows(x if rms else centered, g, n), _along_rows(rstd, g, n), AluOp.multiply)
        for k, (view, op) in enumerate(zip(extra, (AluOp.multiply, AluOp.add))):
            last = k == len(extra) - 1
            tt(prog, _rows(y if last else work, g, n), _rows(work, g, n),
               replace(parameter(prog, view, p, n), dims=((g, 0), (n, 1))), op)

    whole = all(view.strides[:len(kept)] == (0,) * len(kept) for view in affine)  # one scale for every row
    per_row(ctx, node, axes, affine + [v for _, v in stats], body, streamed,
            segmented if not stats and whole else None)


@lowering("InstanceNormalization", check=_check, floats=True)
def lower_instance_norm(ctx: LowerCtx, node: Node) -> None:
    """Per (batch, channel) over the spatial axes, then a per-channel scale and bias."""
    axes = _normalized_axes(node, ctx.graph)
    shape = ctx.shape(node.inputs[0])
    channel = (1, shape[1]) + (1,) * (len(shape) - 2)
    affine = [move_to_end(ctx.view(node.inputs[i]).reshape(channel).broadcast_to(shape), axes)  # type: ignore
              for i in (1, 2)]
    eps = float(node.attrs.get("epsilon", 1e-5))

    def body(prog: Program, p: int, n: int, x: TileAccess, y: TileAccess, extra: list[HbmView]) -> None:
        centre, rstd = row_statistics(prog, p, n, x, eps)
        scale, shift = (_load(prog, view, f"{node.name}/affine") for view in extra)
        normalize(prog, y, x, centre, rstd, scale, shift)

    def streamed(prog: Program, p: int, n: int, row: HbmView, dst: HbmView, extra: list[HbmView],
                 budget: int) -> None:
        normalize_streamed(prog, p, n, row, dst, extra, budget, eps, True, node.name)

    per_row(ctx, node, axes, affine, body, streamed)


@lowering("MeanVarianceNormalization", check=_check, floats=True)
def lower_mvn(ctx: LowerCtx, node: Node) -> None:
    def body(prog: Program, p: int, n: int, x: TileAccess, y: TileAccess, _: list[HbmView]) -> None:
        normalize_rows(prog, p, n, x, y, 1e-9)

    def streamed(prog: Program, p: int, n: int, row: HbmView, dst: HbmView, _: list[HbmView], budget: int) -> None:
        normalize_streamed(prog, p, n, row, dst, [], budget, 1e-9, True, node.name)

    per_row(ctx, node, _normalized_axes(node, ctx.graph), [], body, streamed)


def _check_lp(node: Node, g: Graph) -> str | None:
    if node.attrs.get("p", 2) not in (1, 2):
        return "p must be 1 or 2"
    return _check(node, g)


@lowering("LpNormalization", check=_check_lp, floats=True)
def lower_lp_norm(ctx: LowerCtx, node: Node) -> None:
    """x / ||x||_p along an axis (a zero norm gives 0, as in ONNX's reference)."""
    p_norm = node.attrs.get("p", 2)

    def body(prog: Program, p: int, n: int, x: TileAccess, y: TileAccess, _: list[HbmView]) -> None:
        norm = _column(prog, p, "norm")
        powered = _row_tile(prog, p, n, "powered")
        act(prog, powered, x, ActFunc.square if p_norm == 2 else ActFunc.abs, reduce=norm)
        if p_norm == 2:
            act(prog, norm, norm, ActFunc.sqrt)
        zero = _column(prog, p, "zero")
        ts(prog, zero, norm, AluOp.equal, 0.0)
        tt(prog, norm, norm, zero, AluOp.add)  # an all-zero row divides by 1 instead of 0
        ts(prog, y, x, AluOp.divide, norm)

    per_row(ctx, node, _normalized_axes(node, ctx.graph), [], body)
