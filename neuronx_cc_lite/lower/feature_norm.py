"""LayerNormalization over the last axis when the tensors are laid out feature-major (lower/layout.py): the
normalised features on partitions, the tokens in the free dimension.

A per-token statistic is then a sum over partitions, which is what the Tensor engine does: against a tile of ones,

    psum[p, t] = sum over features h of ones[h, p] * x[h, t]       (the same column sum on every partition p)

so the mean and the variance arrive already repeated on every partition, ready to combine with x elementwise, and
gamma and beta are per-partition columns:

    sums     PE     psum_s = ones^T x                     (fp32, one matmul per 128 features)
    centre   DVE    c = x - psum_s / H                    (scalar_tensor_tensor, reading PSUM)
    square   ACT    q = c^2
    sums     PE     psum_v = ones^T q
    rstd     DVE    r = (psum_v + H eps)^-0.5             (= rsqrt(psum_v / H + eps) / sqrt(H))
    scale    DVE    y = (c * gamma sqrt(H)) * r           (gamma sqrt(H) a per-partition column)
    shift    ACT    y = y + beta                          (beta a per-partition bias)

VectorE's power computes the rstd, not ScalarE's rsqrt: a transformer's ScalarE alternates LayerNorm with the
MLP's GELU (or the softmax's exp), and each switch of function loads another table (1 us, isa/target.py); ConvNeXt-T
switched 59 times (bf16 611.6 -> 563.6 us, fp32 1,382.3 -> 1,338.6; ViT 972.0 -> 950.6 in bf16).

When the input is token-major (after an embedding lookup) the rows are normalised as usual and turned on PE into
the feature-major output; when the output must be token-major (a graph output) the result is turned back.
"""

from __future__ import annotations

import math

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.instr import act
from neuronx_cc_lite.lower.moments import normalize_rows
from neuronx_cc_lite.lower.operands import bias_columns, blocks
from neuronx_cc_lite.lower.transpose import Piece, transpose_pieces
from neuronx_cc_lite.tile.hbm import HbmView, reshaped_strides
from neuronx_cc_lite.tile.program import Program, Tile


def applies(ctx: LowerCtx, node: Node) -> bool:
    """LayerNormalization over the last axis with constant scale and bias and no statistics outputs, where the
    input or the output is feature-major."""
    shape = ctx.shape(node.inputs[0])
    axis = int(node.attrs.get("axis", -1)) % len(shape)
    params = [node.inputs[i] for i in (1, 2) if len(node.inputs) > i and node.inputs[i]]
    if axis != len(shape) - 1 or len(shape) < 2 or any(o for o in node.outputs[1:]):
        return False
    if not all(ctx.graph.tensors[p].is_constant for p in params):
        return False
    x = ctx.view(node.inputs[0])
    return (x.is_contiguous and (_is_feature_major(x) or ctx.feature_major(node.outputs[0]))) or \
        _by_features(x) is not None


def _is_feature_major(view: HbmView) -> bool:
    layout = view.tensor.layout
    return layout is not None and layout[2] == 1


def _by_features(view: HbmView) -> HbmView | None:
    """The input as [tokens, features] where each feature's tokens are one contiguous run: a transposed view of a
    channel-major tensor (ConvNeXt normalises a convolution's [1, C, H, W] output over C, read through its permute
    to [1, H, W, C]). Loaded feature-major, a partition's tokens are one run; loaded by rows, every element would be
    a DMA piece of its own. None for any other view."""
    tokens, h = math.prod(view.shape[:-1]), view.shape[-1]
    if view.is_contiguous or tokens < 2:
        return None
    rank = len(view.shape)
    flipped = view.transpose((rank - 1, *range(rank - 1)))
    strides = reshaped_strides(flipped.shape, flipped.strides, (h, tokens))
    if strides is None or strides[1] != 1:
        return None
    return HbmView(view.tensor, view.dtype, (tokens, h), (1, strides[0]), view.offset)


def _param(ctx: LowerCtx, node: Node, index: int, default: float) -> np.ndarray:
    h = ctx.shape(node.inputs[0])[-1]
    if len(node.inputs) > index and node.inputs[index]:
        return np.broadcast_to(ctx.graph.tensors[node.inputs[index]].value.astype(np.float32), (h,))
    return np.full((h,), default, np.float32)


def lower_layer_norm_feature_major(ctx: LowerCtx, node: Node) -> None:
    prog = ctx.program
    shape = ctx.shape(node.inputs[0])
    rank, h = len(shape), shape[-1]
    tokens = math.prod(shape[:-1])
    eps = float(node.attrs.get("epsilon", 1e-5))
    view = ctx.view(node.inputs[0])
    columns = _by_features(view)
    x = columns if columns is not None else view.reshape((tokens, h))
    out_fm = ctx.feature_major(node.outputs[0])
    out = ctx.output(node.outputs[0], (rank - 1, rank) if out_fm else (0, rank - 1)).reshape((tokens, h))
    assert x is not None and out is not None
    token_major = columns is None and not _is_feature_major(x)
    # gamma as the token-major rows apply it, or times sqrt(H) as the rstd below leaves it to be
    gamma = bias_columns(ctx, _param(ctx, node, 1, 1.0) * np.float32(1.0 if token_major else math.sqrt(h)))
    beta = bias_columns(ctx, _param(ctx, node, 2, 0.0))
    pmax = prog.target.partitions
    features = blocks(h, pmax)
    if token_major:  # token-major in: normalise rows, turn the result
        for t0, tt_ in blocks(tokens, pmax):
            rows = prog.sbuf(tt_, h, x.dtype, f"{node.name}/x")
            prog.dma(rows.ap(), x.box((t0, 0), (tt_, h)))
            y = prog.sbuf(tt_, h, DType.fp32, f"{node.name}/y")
            normalize_rows(prog, tt_, h, rows.ap(), y.ap(), eps)
            # turned and scaled in fp32, rounded once to the output's type, as the op computes
            turned = prog.sbuf(min(pmax, h), len(features) * tt_, DType.fp32, f"{node.name}/y^T")
            transpose_pieces(prog, [Piece(y.region(h0, hb), turned, j * tt_) for j, (h0, hb) in enumerate(features)],
                             node.name)
            done = turned if out.dtype is DType.fp32 else prog.sbuf(min(pmax, h), len(features) * tt_, out.dtype,
                                                                    f"{node.name}/y^T_out")
            for j, (h0, hb) in enumerate(features):
                region, result = turned.region(j * tt_, tt_, 0, hb), done.region(j * tt_, tt_, 0, hb)
                prog.emit("tensor_scalar", Engine.DVE, dst=result, src=region, op0=AluOp.multiply,
                          scalar0=gamma(h0, hb), reverse0=False, op1=AluOp.add, scalar1=beta(h0, hb), reverse1=False)
                prog.dma(out.box((t0, h0), (tt_, hb)).transpose((1, 0)), result)
        return
    # rstd = (sum_v / H + eps)^-0.5 = (sum_v + H eps)^-0.5 * sqrt(H): VectorE's power, the sqrt(H) in gamma
    for t0, tw in blocks(tokens, prog.target.gemm_moving_fmax):
        xs = []
        for h0, hb in features:
            t = prog.sbuf(hb, tw, x.dtype, f"{node.name}/x^T")
            prog.dma(t.ap(), x.box((t0, h0), (tw, hb)).transpose((1, 0)))
            xs.append(t)
        sums = _column_sums(prog, xs, tw, f"{node.name}/sums")
        centred = []
        for t in xs:
            c = prog.sbuf(t.partitions, tw, DType.fp32, f"{node.name}/centred")
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=c.ap(), src=sums.ap(partitions=t.partitions),
                      op0=AluOp.multiply, scalar=-1.0 / h, op1=AluOp.add, b=t.ap())
            centred.append(c)
        squares = []
        for c in centred:
            q = prog.sbuf(c.partitions, tw, DType.fp32, f"{node.name}/squares")
            act(prog, q.ap(), c.ap(), ActFunc.square)
            squares.append(q)
        variance = _column_sums(prog, squares, tw, f"{node.name}/variance")
        rstd = prog.sbuf(pmax, tw, DType.fp32, f"{node.name}/rstd")
        prog.emit("tensor_scalar", Engine.DVE, dst=rstd.ap(), src=variance.ap(), op0=AluOp.add, scalar0=h * eps,
                  reverse0=False, op1=AluOp.power, scalar1=-0.5, reverse1=False)
        ys = []
        for (h0, hb), c in zip(features, centred):
            scaled = prog.sbuf(hb, tw, DType.fp32, f"{node.name}/scaled")
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=scaled.ap(), src=c.ap(), op0=AluOp.multiply,
                      scalar=gamma(h0, hb), op1=AluOp.multiply, b=rstd.ap(partitions=hb))
            y = prog.sbuf(hb, tw, out.dtype if out_fm else DType.fp32, f"{node.name}/y^T")
            act(prog, y.ap(), scaled.ap(), ActFunc.copy, bias=beta(h0, hb))
            ys.append(y)
        if out_fm:
            for (h0, hb), y in zip(features, ys):
                prog.dma(out.box((t0, h0), (tw, hb)).transpose((1, 0)), y.ap())
            continue
        for c0, cn in blocks(tw, pmax):  # back to rows
            rows = prog.sbuf(cn, h, out.dtype, f"{node.name}/y")
            transpose_pieces(prog, [Piece(y.region(c0, cn, 0, hb), rows, h0) for (h0, hb), y in zip(features, ys)],
                             node.name)
            prog.dma(out.box((t0 + c0, 0), (cn, h)), rows.ap())


def _column_sums(prog: Program, tiles: list[Tile], width: int, name: str) -> Tile:
    """psum[p, t] = sum over the tiles' partitions of x[., t], on every partition p (PE against ones)."""
    pmax = prog.target.partitions
    acc = prog.psum(pmax, width, name)
    for k, t in enumerate(tiles):
        ones = prog.ones(t.dtype)
        prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=ones.region(0, pmax, 0, t.partitions),
                  moving=t.ap(), accumulate=k > 0)
    return acc
