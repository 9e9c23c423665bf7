"""Depthwise convolution with each channel's input rows on the partitions (stride 1), where that takes PE much
less than the diagonals of lower/depthwise.py.

With the channels on the partitions, a column through PE does one useful multiply-add per partition (a diagonal
stationary per tap): a 7x7 layer over 96 channels at 56 x 56 (ConvNeXt-T's first stage) streams 49 x 3,136
columns. With a channel's input rows on the partitions, a kernel column's taps are one banded stationary (output
row o reads input rows o - pad .. o - pad + kh - 1), and each partition's value feeds kh outputs of a column: the
same layer takes 7 matmuls of 56 columns for a group of two channels, 48 groups (benchmarks/pe_floor.py
`_rows_cycles`).

    g = pmax // H channels a group (H rows each; the output has H rows too: "same" padding)
    for each image, for each bank of groups of g channels (W columns each, side by side):
        for each group:
            window [g * H, padded row] = the group's rows, between zero columns (one transfer)
            acc[group] [g * H, W] = bias (PE: the bias rows against ones)
                                    + sum over kernel columns kx of band_kx.T @ (window read kx columns on)
        ScalarE evacuates the bank (the activation); each group's output rows stored (one transfer)

Partition p = c * H + i holds input row i of the group's channel c, and output row o of channel c lands on
partition c * H + o. The stationary of kernel column kx holds, in row p, that row's weights for the outputs it
feeds at columns p .. p + kh - 1 (w[c, kh - 1 - t, kx] at p + t, for output row i + pad - (kh - 1 - t)), zero
where that output row lies outside its channel's H: so the channels' blocks touch, with no padding rows between
them, and the view from column kh - 1 - pad on puts output row o of channel c on partition c * H + o. Every band
lands on the same places whatever the layer (p + t), so a ring of tiles zeroed once holds them, as the diagonals'
ring does (Program.bands); one transfer writes a group's bands for every kernel column at once (row p starts p
kernel columns further in: its skew). HBM holds each row's weights (kh x kw, zeros where its outputs leave the
channel). The windows come from a ring zeroed once too: each load writes the same interior, the padding columns
stay zero.

The output keeps its channels on the partitions, as the diagonals' does, so its readers see the layout they
expect. Where the input and the output stay on chip with their channels on the partitions (codegen/on_chip.py),
a group's transfer fans its channels' partitions out over the window's, a row a partition, SBUF to SBUF, and the
store gathers them back: no HBM traffic.
"""

from __future__ import annotations

import numpy as np

from isa.dtypes import DType
from isa.instructions import pe_rate
from isa.operand import Engine, Mem
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.activations import hard_activation
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.conv_geometry import ConvGeometry
from neuronx_cc_lite.lower.depthwise import diagonal_block
from neuronx_cc_lite.lower.instr import act
from neuronx_cc_lite.lower.operands import bias_rows
from neuronx_cc_lite.ops.registry import fused_function
from neuronx_cc_lite.tile.hbm import HbmTensor, HbmView
from neuronx_cc_lite.tile.homes import Layout, home_access
from neuronx_cc_lite.tile.program import HbmAccess, Tile, TileAccess

# The rows take a layer only where PE's time with them, and the time the DMA engines take to move its input in
# and its output out once more, are together at most this share of the diagonals' time (PE's, with VectorE taking
# a share of the taps where that pays): the transfers share the engines with the weights' loads, and the estimate
# of the diagonals is the better case. Measured on the layers near it (trn1, bf16 / fp32): ConvNeXt-T's first
# stage (0.40 / 0.41) 791.3 -> 647.9 us / 1,902.9 -> 1,581.9, its second (0.55 / 0.72) -> 636.4 / 1,404.6;
# MobileNetV2's and EfficientNet-B0's 144-channel 3x3 layers at 56 x 56 (0.99 / 0.87) lost 15 us in bf16 and 6 us
# in fp32 (the diagonals' whole time, 6.6 + 13.3 us of rows and transfers against 20.2 in bf16).
MIN_GAIN = 0.75


def row_groups(ctx: LowerCtx, node: Node, geo: ConvGeometry) -> int:
    """Channels a group when the rows take this layer (module docstring), else 0: a 2-D depthwise convolution of
    stride 1 with "same" padding, no dilation or zero insertion, constant weights and bias, no residual or input
    scale in its epilogue, whose output row fits a bank and whose input's rows lie in runs (_rows_in_runs), and
    whose PE time with the rows (a matmul a kernel column and group, and the bias's, each at least 64 cycles) and
    transfers are at most MIN_GAIN of the diagonals' time (a matmul a tap and 128 channels over every output, or
    VectorE's share of the taps: depthwise.diagonal_block)."""
    pmax, target = ctx.program.target.partitions, ctx.program.target
    if not geo.depthwise or geo.transposed or len(geo.axes) != 2:
        return 0
    rows, cols = geo.axes
    if any(ax.stride != 1 or ax.dilation != 1 or ax.up != 1 for ax in geo.axes) or geo.kernel[0] < 2:
        return 0
    if rows.out != rows.size or not 0 <= rows.offset < geo.kernel[0] or cols.offset < 0 or \
            cols.offset + cols.size > cols.span(cols.out):
        return 0
    tensors = ctx.graph.tensors
    if not tensors[node.inputs[1]].is_constant or any(len(node.inputs) > k and node.inputs[k] for k in (3, 4)):
        return 0
    if len(node.inputs) > 2 and node.inputs[2] and tensors[node.inputs[2]].value is None:
        return 0
    g = pmax // rows.size
    if g < 1 or cols.out > min(target.psum_bank_fmax, target.gemm_moving_fmax):
        return 0
    x = ctx.view(node.inputs[0])
    pe_ns = 1 / (pe_rate(ctx.program.operand_dtype(DType.fp32), target) * target.pe_ghz)
    # a matmul a kernel column and group, and the bias's
    banded = -(-geo.channels // g) * (geo.kernel[1] + 1) * max(64, cols.out) * pe_ns
    # the diagonals: a block of whole output rows a bank, VectorE taking a share of its taps where that pays
    per_block = min(target.psum_bank_fmax, target.gemm_moving_fmax) // cols.out * cols.out
    full, rest = divmod(rows.out * cols.out, per_block)
    diagonal = -(-geo.channels // pmax) * x.shape[0] * (
        full * diagonal_block(ctx.program, geo, per_block, min(pmax, geo.channels))[0] +
        (diagonal_block(ctx.program, geo, rest, min(pmax, geo.channels))[0] if rest else 0.0))
    moved = x.shape[0] * geo.channels * rows.size * cols.size * (x.dtype.size + DType.fp32.size)
    transfers = moved / target.core_dma_gbps  # bytes / (GB/s) = ns
    if banded + transfers > MIN_GAIN * diagonal or not _rows_in_runs(x, pmax):
        return 0
    return g


def _rows_in_runs(x: HbmView, pmax: int) -> bool:
    """Whether a channel's rows are runs of elements wherever the input lies: in HBM as stored, or on chip in the
    layout its producer recorded (one partition a channel). A token-major input (ConvNeXt's stem, read through a
    Transpose and left in HBM) would be a piece an element."""
    channel = _group_access(x, 0, 0, 1)
    layout = x.tensor.layout
    if layout is not None:
        home = Tile(Mem.SBUF, pmax, Layout(*layout).home_free(pmax), x.dtype, "probe")
        mapped = home_access(Layout(*layout), channel, home, pmax)
        return mapped is not None and mapped.partitions == 1 and mapped.dims[-1][1] == 1
    return x.strides[-1] == 1


def _group_access(x: HbmView, n: int, c0: int, count: int) -> HbmAccess:
    """Channels c0 .. c0 + count - 1 of image n of an [N, C, H, W] view: a channel a row of the access."""
    _, _, h, w = x.shape
    sn, sc, sh, sw = x.strides
    return HbmAccess(x.tensor, x.dtype, count, sc, x.offset + n * sn + c0 * sc, ((h, sh), (w, sw)))


def lower_row_depthwise(ctx: LowerCtx, node: Node, geo: ConvGeometry, g: int) -> None:
    prog, target = ctx.program, ctx.program.target
    rows, cols = geo.axes
    kh, kw = geo.kernel
    h, width, channels, taps = rows.size, cols.out, geo.channels, geo.taps
    dtype = prog.operand_dtype(DType.fp32)  # auto-cast: the matmul's operands in bf16
    x = ctx.view(node.inputs[0])  # [N, C, H, W]
    out = ctx.output(node.outputs[0], (1, 2))  # output channels on partitions, as the diagonals' readers expect
    weights = _band_weights(ctx, node, geo, dtype)
    bias = ctx.graph.tensors[node.inputs[2]].value if len(node.inputs) > 2 and node.inputs[2] else None
    # PE adds the bias (exactly: bias_rows), so that one ScalarE instruction evacuates a bank of several groups,
    # whose bias columns differ
    pe_bias = bias_rows(ctx, np.repeat(np.asarray(bias, np.float32).reshape(-1), h), f"{node.name}/bias") \
        if bias is not None else None
    bank = min(target.psum_bank_fmax, target.gemm_moving_fmax)
    ones = prog.filled(pe_bias.partitions, bank, pe_bias.dtype, 1.0) if pe_bias is not None else None
    func, hard = fused_function(node.attrs.get("activation", "")), hard_activation(ctx, node)
    padded = cols.span(cols.out)  # a padded row
    first_column = kh - 1 - rows.offset  # the band's column of output row 0 of the group's first channel
    for n in range(x.shape[0]):
        for batch in _banks(channels, g, bank // width):
            gc = min(g, channels - batch[0])
            k = gc * h
            acc = prog.psum(k, len(batch) * width, f"{node.name}/acc")
            for j, c0 in enumerate(batch):
                region = acc.ap(((width, 1),), j * width, 0, k)
                window = prog.windows(padded, dtype)
                prog.emit("dma_copy", Engine.DMA, dst=window.ap(((cols.size, 1),), cols.offset, 0, k),
                          src=_group_access(x, n, c0, gc))
                tile = prog.bands(kh, kw, dtype)
                prog.emit("dma_copy", Engine.DMA, dst=TileAccess(tile, 0, k, 0, ((taps, 1),), skew=kw),
                          src=HbmAccess(weights, dtype, k, taps, c0 * h * taps, ((taps, 1),)))
                if pe_bias is not None:
                    prog.emit("nc_matmul", Engine.PE, dst=region, stationary=pe_bias.ap(((k, 1),), c0 * h),
                              moving=ones.ap(((width, 1),)), accumulate=False)
                for kx in range(kw):
                    prog.emit("nc_matmul", Engine.PE, dst=region,
                              stationary=tile.ap(((k, kw),), first_column * kw + kx, 0, k),
                              moving=window.ap(((width, 1),), kx, 0, k), accumulate=pe_bias is not None or kx > 0)
            res = prog.sbuf(k, len(batch) * width, DType.fp32, f"{node.name}/y")
            act(prog, res.ap(), acc.ap(), func)
            if hard is not None:
                hard(res.ap(), res.ap())
            for j, c0 in enumerate(batch):
                prog.emit("dma_copy", Engine.DMA, dst=_group_access(out, n, c0, gc),
                          src=res.ap(((width, 1),), j * width, 0, k))


def _banks(channels: int, g: int, per_bank: int) -> list[list[int]]:
    """The first channels of the groups, per_bank groups a bank; a last group of fewer channels (fewer
    partitions) in a bank of its own."""
    whole = list(range(0, channels - channels % g, g))
    banks = [whole[i:i + per_bank] for i in range(0, len(whole), per_bank)]
    return banks + ([[len(whole) * g]] if channels % g else [])


def _band_weights(ctx: LowerCtx, node: Node, geo: ConvGeometry, dtype: DType) -> HbmTensor:
    """HBM: row i of channel c holds, at t * kw + kx, w[c, kh - 1 - t, kx] where output row i + pad - (kh - 1 - t)
    exists, else zero (module docstring)."""
    (rows, _), (kh, kw), channels = geo.axes, geo.kernel, geo.channels
    h = rows.size
    w = ctx.graph.tensors[node.inputs[1]].value.astype(np.float64).reshape(channels, kh, kw)
    bands = np.zeros((channels, h, kh, kw))
    for t in range(kh):
        o = np.arange(h) + rows.offset - (kh - 1 - t)
        bands[:, (o >= 0) & (o < h), t, :] = w[:, None, kh - 1 - t, :]
    data = bands.astype(dtype.np)
    weights = ctx.program.hbm_tensor(f"{node.name}/bands", data.nbytes, TensorKind.WEIGHT, dtype, data.tobytes())
    weights.needed = channels * geo.taps * dtype.size  # (the roofline counts the model's weights, not the repeats)
    return weights
