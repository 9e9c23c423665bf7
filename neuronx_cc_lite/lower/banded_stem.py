"""A packed convolution over few output channels (an image stem), with bands of output rows stacked on the
partitions.

Packed (lower/conv.py packed_taps), a stem contracts over (shift, input channel) rows: 3 shifts x 3 channels = 9
of PE's 128 rows for MobileNetV3's 3x3 stem, and its 16 output channels fill 16 of the 128 output partitions, so
the epilogue (a HardSwish: a ScalarE and a VectorE pass) runs on 16 lanes over 112 x 112 outputs: 30 us of a
150 us network on one dependent chain. As lower/depthwise.py does for a depthwise convolution, B bands of R output
rows each take their own partitions: channel c of band b's window moved j taps on partition (j * C + c) * B + b,
its outputs on b * M .. (M output channels), and a tap group's stationary operand holds each band's [K, M] weights
in its rows and columns, so that one matmul computes B bands: B times fewer columns, the epilogue on B * M
partitions. With B fewer columns a pass, the shifted copies may load longer than the passes they save: conv.py
then packs none (K = C, a tap a pass).

    B = min(pmax // M, pmax // K, bands of R rows the outputs have);  R as lower/depthwise.band_plan
    for each image, for each group of B bands (R * B output rows):
        window [K * B, span(R) x span(W)]: zeros where no input lands (the padding columns; the rows above the
            image or below it, of every band: the engines start only at a quadrant's first partition, and the
            other bands' loads come after), then per shift j and channel c one load of every band's rows onto
            partitions (j * C + c) * B + b: the bands' rows lie R * stride input rows apart, one stride, so one
            transfer moves them all (a band at the image's edge, with fewer rows, apart)
        acc [B * M, R * W] = sum over tap groups of W_group.T @ (window read at the group's tap), W_group's rows
            (j, c, b) holding band b's weights in its M columns
        epilogue (lower/conv_epilogue.py), each band's rows stored from its partitions
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from isa.dtypes import DType
from isa.operand import Engine
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.conv_epilogue import Epilogue
from neuronx_cc_lite.lower.hbm import HbmView
from neuronx_cc_lite.lower.program import Program, Tile
from neuronx_cc_lite.lower.patterns import dma_tile
from neuronx_cc_lite.lower.windows import Axis, Block, short_rows, window_ap, window_strides

if TYPE_CHECKING:
    from neuronx_cc_lite.lower.conv import ConvGeometry

# Two bands halve the passes' columns but add a load per shift and channel a group of bands and the edge fills:
# ResNet's stem (64 outputs: two bands) in bf16 made ResNet-18 174.9 us banded against 160.9 without.
MIN_BANDS = 4


def stem_bands(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, window_budget: int) -> tuple[int, int]:
    """(bands, output rows a band) for a convolution packed_taps packs (few input channels, constant weights), 2-D
    without zero insertion, over rows long enough to load as they lie, when at least MIN_BANDS bands' outputs (M
    each) fit on the partitions; else (1, 0). Bands are taken before row phases (packed_taps): a band group's
    passes cover B bands over 1/B of the columns, where phases only halve the passes (MobileNetV3's stem in fp32:
    56 passes of 448 columns with phases, 21 of 224 banded; 235.3 -> 212.4 us)."""
    target, pmax = ctx.program.target, ctx.program.target.partitions
    if packed < 2 or len(geo.axes) != 2 or any(ax.up != 1 for ax in geo.axes):
        return 1, 0
    x = ctx.graph.tensors[node.inputs[0]]
    dtype = ctx.program.operand_dtype(DType.fp32)
    if short_rows(geo.axes, max(x.dtype.itemsize, dtype.size)):
        return 1, 0  # (their windows load whole rows: windows.flat_rows)
    rows, cols = geo.axes
    per_bank = min(target.psum_bank_fmax, target.gemm_moving_fmax) // cols.out
    per_band = min(-(-target.min_efficient_elements // cols.out), per_bank)
    bands = min(pmax // geo.outputs, pmax // (packed * geo.channels), -(-rows.out // max(per_band, 1)))
    if bands < MIN_BANDS or per_band < 1 or rows.span(per_band) * cols.span(cols.out) > window_budget:
        return 1, 0
    return bands, per_band


def _banded_weights(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, bands: int,
                    groups: list[tuple[int, int, int]]) -> Tile:
    """[K * B, groups x B * M]: group q's block holds, for band b, rows (j * C + c) * B + b and columns b * M + m:
    W[m, c, kh, w0 + j] of the group's kernel row kh and first column w0 (zero past the kernel's last column)."""
    c, m, k = geo.channels, geo.outputs, packed * geo.channels
    w = ctx.graph.tensors[node.inputs[1]].value.astype(np.float64)  # [M, C, KH, KW]
    block = np.zeros((bands * k, len(groups), bands * m))
    for q, (kh, w0, count) in enumerate(groups):
        for b, j in itertools.product(range(bands), range(count)):
            rows = [(j * c + ci) * bands + b for ci in range(c)]
            block[rows, q, b * m:(b + 1) * m] = w[:, :, kh, w0 + j].T
    prog = ctx.program
    dtype = prog.operand_dtype(DType.fp32)  # auto-cast: stored in the type the matmul reads
    data = block.astype(dtype.np)
    tensor = prog.hbm_tensor(f"{node.name}/banded_weights", data.nbytes, "weight", dtype, data.tobytes())
    tensor.needed = min(data.nbytes, w.size * dtype.size)  # the blocks off the diagonal are zeros
    tile = prog.sbuf(bands * k, len(groups) * bands * m, dtype, f"{node.name}/w")
    prog.dma(tile.ap(), HbmView(tensor, dtype, (bands * k, len(groups) * bands * m), (len(groups) * bands * m, 1)))
    return tile


def lower_banded_stem(ctx: LowerCtx, node: Node, geo: ConvGeometry, packed: int, bands: int, per_band: int) -> None:
    """`packed`: the shifted copies of the window a pass reads (1: a tap a pass; lower/conv.py decides)."""
    prog = ctx.program
    c, m = geo.channels, geo.outputs
    k, p = packed * c, bands * m
    x, epilogue = ctx.view(node.inputs[0]), Epilogue(ctx, node, bands)
    src = x.transpose((1, 0, 2, 3))  # (C, batch, rows, columns)
    rows, cols = geo.axes
    groups = [(kh, w0, min(packed, geo.kernel[1] - w0)) for kh in range(geo.kernel[0])
              for w0 in range(0, geo.kernel[1], packed)]
    weights = _banded_weights(ctx, node, geo, packed, bands, groups)
    column = epilogue.bias_column(p, [(b * m, 0, m) for b in range(bands)])
    shifts = [j * cols.dilation for j in range(packed)]
    dtype = prog.operand_dtype(DType.fp32)
    for n in range(x.shape[0]):
        for r0 in range(0, rows.out, bands * per_band):
            # every band's window laid out as a whole band's, past the last output row too
            whole = [Block(n, 1, (r0 + b * per_band, 0), (per_band, cols.out)) for b in range(bands)]
            strides, image = window_strides(whole[0], geo.axes)
            window = prog.sbuf(bands * k, image, dtype, f"{node.name}/x")
            _fill_edges(prog, window, whole, geo.axes, shifts, (image, *strides))
            for j, shift in enumerate(shifts):
                _load_bands(prog, window, src, whole, geo.axes, shift, j, c, strides[0])
            acc = prog.psum(p, per_band * cols.out, f"{node.name}/acc")
            for q, (kh, w0, _) in enumerate(groups):
                prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=weights.ap(((p, 1),), q * p),
                          moving=window_ap(window, (image, *strides), whole[0], geo.axes, (kh, w0), bands * k),
                          accumulate=q > 0)
            parts = [(Block(n, 1, block.starts, (min(per_band, rows.out - block.starts[0]), cols.out)), b * m, 0, m)
                     for b, block in enumerate(whole) if block.starts[0] < rows.out]
            epilogue.finish(acc, column, parts)


def _load_bands(prog: Program, window: Tile, src: HbmView, whole: list[Block], axes: list[Axis], shift: int, j: int,
                channels: int, row_stride: int) -> None:
    """The bands' windows moved `shift` columns, channel c of band b on partition (j * C + c) * B + b: one
    transfer per channel for each run of bands whose rows lie alike in their windows (all but those at the
    image's top and bottom edges), the runs' first rows one stride apart."""
    rows, cols = axes
    first_col, ncols, col_pos = cols.interior(0, cols.out, shift)
    if ncols == 0:
        return
    spans = [rows.interior(block.starts[0], block.counts[0]) for block in whole]
    step = whole[0].counts[0] * rows.stride
    runs: list[list[int]] = []
    for b, (first, count, pos) in enumerate(spans):
        if count == 0:
            continue
        last = runs[-1][-1] if runs else None
        if last is not None and last == b - 1 and spans[last][1:] == (count, pos) and \
                first - spans[last][0] == step:
            runs[-1].append(b)
        else:
            runs.append([b])
    n, bands = whole[0].n0, len(whole)
    s_c, s_n, s_h, s_w = src.strides
    for run in runs:
        first, count, pos = spans[run[0]]
        for c in range(channels):
            view = HbmView(src.tensor, src.dtype, (len(run), count, ncols), (step * s_h, s_h, s_w),
                           src.offset + c * s_c + n * s_n + first * s_h + first_col * s_w)
            dma_tile(prog, window, view, (row_stride, cols.up), pos * row_stride + col_pos,
                     (j * channels + c) * bands + run[0])


def _fill_edges(prog: Program, window: Tile, whole: list[Block], axes: list[Axis], shifts: list[int],
                strides: tuple[int, ...]) -> None:
    """Zero what no load of the group writes: the columns before the first input column and after the last of any
    shift (every band alike), and the rows before and after each band's input rows, on every partition (a band
    past the image's last row: its whole window). The loads, which write over the other bands' rows, follow."""
    rows, cols = axes
    row_span, col_span = rows.span(whole[0].counts[0]), cols.span(cols.out)
    runs = [cols.interior(0, cols.out, shift) for shift in shifts]
    before = max(pos if n else col_span for _, n, pos in runs)
    after = min(pos + n if n else 0 for _, n, pos in runs)
    row_stride = strides[1]
    for lo, hi in ((0, before), (after, col_span)):
        if hi > lo:
            prog.emit("memset", Engine.POOL, dst=window.ap(((row_span, row_stride), (hi - lo, 1)), lo), value=0.0)
    slabs = set()
    for block in whole:
        _, count, pos = rows.interior(block.starts[0], block.counts[0])
        slabs |= {(0, pos), (pos + count, row_span)} if count else {(0, row_span)}
    for lo, hi in sorted(slabs):
        if hi > lo:
            prog.emit("memset", Engine.POOL, dst=window.ap((((hi - lo) * row_stride, 1),), lo * row_stride), value=0.0)
