"""GroupNormalization: the channels of an image in G groups, each normalised by the mean and variance of all its
elements, then scaled and shifted per channel (opset 21; ONNX's checker refuses opset 18's, which scales per group):

    y[n, c, s] = (x[n, c, s] - mean[n, g]) / sqrt(var[n, g] + eps) * scale[c] + bias[c],   g = c // (C / G)

The rows of x are its (image, channel) pairs, so a group is C/G consecutive rows. Rows go on partitions, the
spatial extent S in the free dimension, in blocks of whole groups (or, for groups of more than pmax channels,
blocks inside one group), so each block is loaded once and every statistic is a [rows, 1] column:

    moments  DVE    bn_stats over each row (per load, as it arrives), bn_aggr: mean_r and var_r per row
    groups   PE     psum = M^T [mean_r, var_r]         (M[r, q] = 1 when rows r and q share a group: the group's
                                                         sums, already repeated on each of its rows)
    spread   DVE    d_r = (mean_r - mean_g)^2;  PE again: var_g = mean of var_r + mean of d_r
                    (the variance of the group without subtracting squares of large means)
    affine   DVE    a_r = scale_r * rsqrt(var_g + eps),  b_r = bias_r - mean_g * a_r   (rsqrt on ACT)
    apply    DVE    y = x * a_r + b_r per load, stored as it is done (with an activation, ScalarE's
                    f(x * a_r + b_r), its scale and bias the two columns)

The statistics are fp32 throughout (the PE matmuls too). A group larger than a tile's budget is read twice: once
for its moments, once to apply them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import tile_free_max
from neuronx_cc_lite.lower.instr import act, ts, tt
from neuronx_cc_lite.lower.operands import blocks
from neuronx_cc_lite.lower.patterns import contiguous
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, TileAccess

# Elements per partition of one load (and one store): the moments of the first load are taken while the next
# arrive, and the first results leave while the last are scaled.
LOAD_ELEMENTS = 512
# GroupNormActivation's functions (passes/canonicalize.py), applied by ScalarE to each tile of the result
ACTIVATIONS = {"Silu": ActFunc.silu, "Relu": ActFunc.relu, "Sigmoid": ActFunc.sigmoid, "Tanh": ActFunc.tanh}


def _check(node: Node, g: Graph) -> str | None:
    x = g.tensors[node.inputs[0]]
    if len(x.shape) < 2 or 0 in x.shape:
        return f"GroupNormalization needs a non-empty input of rank 2 or more, got shape {list(x.shape)}"
    groups = int(node.attrs.get("num_groups", 0))
    if groups <= 0 or x.shape[1] % groups:
        return f"num_groups {groups} does not divide the {x.shape[1]} channels"
    for role, name in zip(("scale", "bias"), node.inputs[1:3]):
        shape = g.tensors[name].shape
        if shape is None or tuple(shape) != (x.shape[1],):
            return f"{role} {name!r} has shape {list(shape or ())}, not [{x.shape[1]}] (one value per channel)"
    if node.attrs.get("stash_type", 1) != 1:
        return "stash_type other than float32"
    if node.op == "GroupNormActivation" and node.attrs.get("activation") not in ACTIVATIONS:
        return f"activation {node.attrs.get('activation')!r} is not one of {', '.join(ACTIVATIONS)}"
    return None


@dataclass(frozen=True)
class _Block:
    rows: tuple[int, int]  # first row, row count
    partners: tuple[int, ...]  # the blocks whose rows share a group with this one's (itself included)


def _blocks(rows: int, group: int, pmax: int) -> list[_Block]:
    """Blocks of whole groups, or, when a group has more than pmax rows, blocks that each lie in one group."""
    if group <= pmax:
        step = pmax // group * group
        return [_Block(b, (k,)) for k, b in enumerate(blocks(rows, step))]
    found: list[_Block] = []
    for g0 in range(0, rows, group):
        first = len(found)
        parts = blocks(group, pmax)
        found += [_Block((g0 + r0, rb), tuple(range(first, first + len(parts)))) for r0, rb in parts]
    return found


class _Params:
    """The per-row scale and bias columns of a block: constants from the column pool, or loaded from HBM."""

    def __init__(self, ctx: LowerCtx, node: Node, channels: int, images: int) -> None:
        self.ctx, self.node, self.channels = ctx, node, channels
        self.names = node.inputs[1:3]
        tensors = [ctx.graph.tensors[n] for n in self.names]
        self.values = [np.tile(t.value.reshape(-1).astype(np.float32), images) if t.is_constant else None
                       for t in tensors]

    def columns(self, r0: int, rb: int) -> tuple[TileAccess, TileAccess]:
        prog, found = self.ctx.program, []
        loaded = None
        for name, value in zip(self.names, self.values):
            if value is not None:
                found.append(self.ctx.columns.column(self.ctx.columns.add(value[r0:r0 + rb]), rb))
                continue
            if loaded is None:
                loaded = prog.sbuf(rb, 2, DType.fp32, f"{self.node.name}/scale_bias")
            view = self.ctx.view(name)
            for start in range(r0, r0 + rb):  # a transfer per image the block's rows reach into
                if start == r0 or start % self.channels == 0:
                    count = min(r0 + rb, (start // self.channels + 1) * self.channels) - start
                    channel = start % self.channels
                    prog.dma(loaded.ap(((1, 1),), len(found), start - r0, count),
                             HbmView(view.tensor, view.dtype, (count, 1), (1, 1), view.offset + channel))
            found.append(loaded.ap(((1, 1),), len(found)))
        return found[0], found[1]


@lowering("GroupNormalization", "GroupNormActivation", check=_check, since=21, shaped_like_input=True,
          floats=True)
def lower_group_norm(ctx: LowerCtx, node: Node) -> None:
    prog, pmax = ctx.program, ctx.program.target.partitions
    x = contiguous(prog, ctx.view(node.inputs[0]), node.name)
    shape = x.shape
    images, channels, size = shape[0], shape[1], math.prod(shape[2:])
    group = channels // int(node.attrs["num_groups"])
    rows = images * channels
    xr = x.reshape((rows, size))
    out = ctx.output(node.outputs[0], (0, 2)).reshape((rows, size))
    assert xr is not None and out is not None
    eps = float(node.attrs.get("epsilon", 1e-5))
    function = ACTIVATIONS[node.attrs["activation"]] if node.op == "GroupNormActivation" else None
    params = _Params(ctx, node, channels, images)
    found = _blocks(rows, group, pmax)
    budget = tile_free_max(ctx)
    done: set[int] = set()
    for k, block in enumerate(found):
        if k in done:
            continue
        members = [found[j] for j in block.partners]
        done.update(block.partners)
        resident = len(members) * size <= budget
        loaded = [_load_rows(prog, xr, b.rows, size, resident, node.name) for b in members]
        stats = _group_moments(ctx, [m for _, m in loaded], members, group, node.name)
        for j, (member, group_stats) in enumerate(zip(members, stats)):
            r0, rb = member.rows
            scale, bias = params.columns(r0, rb)
            a, b = _affine(prog, rb, group_stats, scale, bias, eps, node.name)
            tiles = loaded[j][0] if resident else _load_rows(prog, xr, member.rows, size, False, node.name, True)[0]
            for (c0, cn), t in zip(blocks(size, LOAD_ELEMENTS), tiles):
                y = prog.sbuf(rb, cn, out.dtype, f"{node.name}/y")
                if function is None:
                    ts(prog, y.ap(), t, AluOp.multiply, a, AluOp.add, b)
                else:  # ScalarE scales and shifts by columns as it applies the function: one pass, not two
                    act(prog, y.ap(), t, function, scale=a, bias=b)
                prog.dma(out.box((r0, c0), (rb, cn)), y.ap())


def _load_rows(prog: Program, x: HbmView, rows: tuple[int, int], size: int, keep: bool, name: str,
               only_load: bool = False) -> tuple[list[TileAccess], TileAccess]:
    """The rows of a block, load by load, with their moments [rb, 2] (mean, variance) unless `only_load`. Without
    `keep` each load's tile is its own, for the planner to rotate (the rows are loaded again to be applied)."""
    r0, rb = rows
    step = prog.target.bn_stats_fmax
    loads = blocks(size, LOAD_ELEMENTS)
    pieces = sum(math.ceil(cn / step) for _, cn in loads)
    stats = None if only_load else prog.sbuf(rb, 6 * pieces, DType.fp32, f"{name}/stats")
    whole = prog.sbuf(rb, size, x.dtype, f"{name}/x") if keep else None
    tiles, k = [], 0
    for c0, cn in loads:
        t = whole.region(c0, cn) if whole is not None else prog.sbuf(rb, cn, x.dtype, f"{name}/x").ap()
        prog.dma(t, x.box((r0, c0), (rb, cn)))
        tiles.append(t)
        if stats is None:
            continue
        for p0 in range(0, cn, step):
            piece = TileAccess(t.tile, t.first, rb, t.offset + p0, ((min(step, cn - p0), 1),))
            prog.emit("bn_stats", Engine.DVE, dst=stats.region(6 * k, 6), src=piece)
            k += 1
    if stats is None:
        return tiles, stats  # type: ignore[return-value]
    moments = prog.sbuf(rb, 2, DType.fp32, f"{name}/moments")
    prog.emit("bn_aggr", Engine.DVE, dst=moments.ap(), src=stats.ap())
    return tiles, moments.ap()


def _group_moments(ctx: LowerCtx, moments: list[TileAccess], members: list[_Block], group: int,
                   name: str) -> list[TileAccess]:
    """[mean_g, var_g] of each row's group, on the rows of each member (in PSUM): PE averages the row moments over
    the group (the mean of the means, the mean of the variances), ScalarE squares each row mean's deviation from
    the group mean, and PE adds their average to the second column."""
    prog = ctx.program
    if group == 1:  # a row per group (InstanceNormalization's statistics): the row moments themselves
        return moments
    sums = []
    for j, member in enumerate(members):
        acc = prog.psum(member.rows[1], 2, f"{name}/group_moments")
        _average_groups(ctx, moments, members, j, group, acc.ap(), False)
        sums.append(acc)
    spreads = []
    for m, acc in zip(moments, sums):  # (mean_r - mean_g)^2: a function of the PSUM column, the row mean its bias
        spread = prog.sbuf(m.partitions, 1, DType.fp32, f"{name}/spread")
        act(prog, spread.ap(), acc.ap(((1, 1),), 0), ActFunc.square, scale=-1.0, bias=_first_column(m))
        spreads.append(spread.ap())
    for j, acc in enumerate(sums):
        _average_groups(ctx, spreads, members, j, group, acc.ap(((1, 1),), 1), True)
    return [acc.ap() for acc in sums]


def _first_column(t: TileAccess) -> TileAccess:
    return TileAccess(t.tile, t.first, t.partitions, t.offset, ((1, 1),))


def _average_groups(ctx: LowerCtx, values: list[TileAccess], members: list[_Block], j: int, group: int,
                    dst: TileAccess, accumulate: bool) -> None:
    """dst[q, :] (+)= the mean of values[., :] over the rows of q's group, for the rows q of member j: against a
    matrix of 1/group where two rows share a group (blocks of whole groups), or of 1/group everywhere, member by
    member (a group over several blocks)."""
    prog, pmax = ctx.program, ctx.program.target.partitions
    rb = members[j].rows[1]
    for k, v in enumerate(values):
        matrix = np.zeros((pmax, rb), np.float32)  # column q of the pool: matrix[:, q]
        if len(members) == 1:
            rk, index = rb, np.arange(rb) // group
            matrix[:rb] = (index[:, None] == index[None, :]) / group
        else:
            rk = members[k].rows[1]
            matrix[:rk] = 1.0 / group
        first = ctx.columns.add(matrix.T.reshape(-1))
        assert ctx.columns.tile is not None
        stationary = TileAccess(ctx.columns.tile, 0, rk, first, ((rb, 1),))
        prog.emit("nc_matmul", Engine.PE, dst=dst, stationary=stationary, moving=v, accumulate=accumulate or k > 0)


def _affine(prog: Program, rb: int, stats: TileAccess, scale: TileAccess, bias: TileAccess, eps: float,
            name: str) -> tuple[TileAccess, TileAccess]:
    """a = scale * (var + eps)^-0.5 and b = bias - mean * a, [rb, 1] each, from stats [mean, var] (VectorE's
    power: no ScalarE table for rsqrt, which would displace the activation's)."""
    t = prog.sbuf(rb, 2, DType.fp32, f"{name}/affine")
    a, b = t.ap(((1, 1),), 0), t.ap(((1, 1),), 1)
    mean, var = _first_column(stats), TileAccess(stats.tile, stats.first, rb, stats.offset + 1, ((1, 1),))
    ts(prog, a, var, AluOp.add, eps, AluOp.power, -0.5)
    tt(prog, a, a, scale, AluOp.multiply)
    ts(prog, b, mean, AluOp.multiply, a, AluOp.subtract, bias, reverse1=True)
    return a, b
