"""Each partition's row normalised by its own statistics, on tiles: y = (x - mean) / sqrt(var + eps). The step
the row normalisations share (LayerNormalization, RMSNormalization, InstanceNormalization and
MeanVarianceNormalization, normalize.py), and the feature-major LayerNorm's (feature_norm.py) when its input
arrives token-major.
"""

from __future__ import annotations

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.lower.instr import act, copy, ts
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


def normalize_rows(prog: Program, p: int, n: int, x: TileAccess, y: TileAccess, eps: float,
                   subtract_mean: bool = True, keep_mean: bool = True) -> tuple[TileAccess, TileAccess]:
    """y = (x - mean) / sqrt(var + eps) per row (without the mean for RMS norm, where the variance is the mean
    square). Returns the -mean and 1/sqrt(var + eps) columns; without `keep_mean` (no caller reads it) the -mean
    column is not filled when the statistics come from VectorE's bn_stats (an instruction a row tile saved)."""
    neg_mean, rstd = prog.sbuf(p, 1, DType.fp32, "-mean").ap(), prog.sbuf(p, 1, DType.fp32, "rstd").ap()
    if subtract_mean and x.dims == ((n, 1),):  # one dense row per partition: VectorE's statistics
        moments = row_moments(prog, p, n, x)
        mean, var = moments.region(0, 1), moments.region(1, 1)
        ts(prog, rstd, var, AluOp.add, eps)
        act(prog, rstd, rstd, ActFunc.rsqrt)
        ts(prog, y, x, AluOp.subtract, mean, AluOp.multiply, rstd)
        if keep_mean:
            ts(prog, neg_mean, mean, AluOp.multiply, -1.0)
        return neg_mean, rstd
    centered = prog.sbuf(p, n, DType.fp32, "centered").ap()
    if subtract_mean:
        prog.emit("tensor_reduce", Engine.DVE, dst=neg_mean, src=x, op=AluOp.add, axes=1)
        ts(prog, neg_mean, neg_mean, AluOp.multiply, -1.0 / n)
        ts(prog, centered, x, AluOp.add, neg_mean)
    else:
        copy(prog, centered, x)
    squares = prog.sbuf(p, n, DType.fp32, "squares").ap()
    act(prog, squares, centered, ActFunc.square, reduce=rstd)  # the squares' row sums land in rstd
    ts(prog, rstd, rstd, AluOp.multiply, 1.0 / n, AluOp.add, eps)
    act(prog, rstd, rstd, ActFunc.rsqrt)
    ts(prog, y, centered, AluOp.multiply, rstd)
    return neg_mean, rstd
