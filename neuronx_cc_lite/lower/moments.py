"""Each partition's row normalised by its own statistics, on tiles: y = (x - mean) / sqrt(var + eps). The step
the row normalisations share (LayerNormalization, RMSNormalization, InstanceNormalization and
MeanVarianceNormalization, normalize.py), and the feature-major LayerNorm's (feature_norm.py) when its input
arrives token-major.
"""

from __future__ import annotations

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.lower.instr import act, ts
from neuronx_cc_lite.tile.program import Program, Tile, TileAccess


def row_moments(prog: Program, p: int, n: int, x: TileAccess) -> Tile:
    """(mean, variance) of each partition's row x (dense, n elements): bn_stats over pieces of at most
    bn_stats_fmax, one bn_aggr over their statistics; one pass over the row instead of a sum, a subtraction
    and a sum of squares."""
    step = prog.target.bn_stats_fmax
    starts = range(0, n, step)
    stats = prog.sbuf(p, 6 * len(starts), DType.fp32, "stats")
    for k, c0 in enumerate(starts):
        piece = TileAccess(x.tile, x.first, p, x.offset + c0, ((min(step, n - c0), 1),))
        prog.emit("bn_stats", Engine.DVE, dst=stats.region(6 * k, 6), src=piece)
    moments = prog.sbuf(p, 2, DType.fp32, "moments")
    prog.emit("bn_aggr", Engine.DVE, dst=moments.ap(), src=stats.ap())
    return moments


# A row's centre as an instruction applies it: (the mean, subtract) or (-mean, add), whichever the statistics gave
Centre = tuple[TileAccess, AluOp]


def row_statistics(prog: Program, p: int, n: int, x: TileAccess, eps: float, subtract_mean: bool = True
                   ) -> tuple[Centre | None, TileAccess]:
    """Each partition's row x's centre (None for RMS norm, no `subtract_mean`, where the variance is the mean square)
    and 1/sqrt(var + eps) column."""
    rstd = prog.sbuf(p, 1, DType.fp32, "rstd").ap()
    if subtract_mean and x.dims == ((n, 1),):  # one dense row per partition: VectorE's statistics, in one pass
        moments = row_moments(prog, p, n, x)
        ts(prog, rstd, moments.region(1, 1), AluOp.add, eps)
        act(prog, rstd, rstd, ActFunc.rsqrt)
        return (moments.region(0, 1), AluOp.subtract), rstd
    centre: Centre | None = None
    if subtract_mean:
        neg_mean = prog.sbuf(p, 1, DType.fp32, "-mean").ap()
        prog.emit("tensor_reduce", Engine.DVE, dst=neg_mean, src=x, op=AluOp.add, axes=1)
        ts(prog, neg_mean, neg_mean, AluOp.multiply, -1.0 / n)
        centre = (neg_mean, AluOp.add)
    # (x - mean)^2, or x^2, and their row sums, which land in rstd, in one pass
    squares = prog.sbuf(p, n, DType.fp32, "squares").ap()
    act(prog, squares, x, ActFunc.square, bias=centre[0] if centre is not None else None, reduce=rstd)
    ts(prog, rstd, rstd, AluOp.multiply, 1.0 / n, AluOp.add, eps)
    act(prog, rstd, rstd, ActFunc.rsqrt)
    return centre, rstd


def mean_of(prog: Program, centre: Centre) -> TileAccess:
    """The mean column of a centre (a LayerNorm's mean output is stored from it)."""
    column, op = centre
    if op is AluOp.subtract:
        return column
    mean = prog.sbuf(column.partitions, 1, DType.fp32, "mean").ap()
    ts(prog, mean, column, AluOp.multiply, -1.0)
    return mean


def normalize(prog: Program, y: TileAccess, x: TileAccess, centre: Centre | None, rstd: TileAccess,
              scale: TileAccess | None = None, shift: TileAccess | None = None) -> None:
    """y = (x - mean) * rstd, times `scale` and plus `shift` ([p, n] tiles) where given, in as few passes as
    VectorE's forms allow: one scalar_tensor_tensor for an RMS norm's (x * rstd) * scale, two for a LayerNorm's
    ((x - mean) * scale) * rstd + shift, in fp32 and rounded once, to y's type, by the last. (A pass over a long
    row takes microseconds: an 8B decoder's [1, 4096] RMSNorm took five, 19.5 us, between an all-reduce and the
    projections that wait for it.)"""
    # (with a shift after, the normalised row stays in fp32 until the shift's pass rounds it)
    first = y if shift is None else prog.sbuf(x.partitions, x.tile.free, DType.fp32, "normalized").ap()
    if scale is None or centre is None:
        if scale is not None:
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=first, src=x, op0=AluOp.multiply, scalar=rstd,
                      op1=AluOp.multiply, b=scale)
        elif centre is None:
            ts(prog, first, x, AluOp.multiply, rstd)
        else:
            ts(prog, first, x, centre[1], centre[0], AluOp.multiply, rstd)
        if shift is not None:
            prog.emit("tensor_tensor", Engine.DVE, dst=y, a=first, b=shift, op=AluOp.add)
    else:
        scaled = prog.sbuf(x.partitions, x.tile.free, DType.fp32, "scaled").ap()
        prog.emit("scalar_tensor_tensor", Engine.DVE, dst=scaled, src=x, op0=centre[1], scalar=centre[0],
                  op1=AluOp.multiply, b=scale)
        if shift is None:
            ts(prog, y, scaled, AluOp.multiply, rstd)
        else:
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=y, src=scaled, op0=AluOp.multiply, scalar=rstd,
                      op1=AluOp.add, b=shift)


def normalize_rows(prog: Program, p: int, n: int, x: TileAccess, y: TileAccess, eps: float,
                   subtract_mean: bool = True) -> tuple[Centre | None, TileAccess]:
    """y = (x - mean) / sqrt(var + eps) per row (without the mean for RMS norm, where the variance is the mean
    square); the row's centre and 1/sqrt(var + eps) column (row_statistics)."""
    centre, rstd = row_statistics(prog, p, n, x, eps, subtract_mean)
    normalize(prog, y, x, centre, rstd)
    return centre, rstd
