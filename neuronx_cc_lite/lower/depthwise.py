"""Depthwise convolution over few channels, with bands of output rows stacked on the partitions.

A depthwise tap on PE is a diagonal stationary over the channels, and the moving operand streams one column per
output pixel whatever the channel count: over C channels PE uses C of its rows and the epilogue C partitions.
MobileNetV3's first block has C = 16 at 56x56 outputs: 9 taps x 3,136 columns on 16 rows (40 us of PE in fp32,
its largest node). With B = pmax // C bands, band b holds the window of its R output rows (halo rows included)
on partitions b * C ..; a tap's stationary operand is its diagonal repeated on each band's block, so one matmul
covers B bands: B times fewer columns, and the epilogue runs on B * C partitions.

    R rows a band (below);  B = min(pmax // C, bands of R rows the outputs have)
    for each image, for each group of B bands (R * B output rows):
        window [B * C, span(R) x span(W)]: a fill where no input lands (padding, rows past the last output),
            one load per band onto its partitions (on chip, an SBUF-to-SBUF copy: codegen/on_chip.py)
        acc [B * C, R * W] = sum over taps of diag_B(w[:, tap]).T @ (window read at the tap)
        epilogue (lower/conv_epilogue.py), each band's rows stored from its partitions

R is small, a bank of at least min_efficient_elements columns (128: below it the epilogue's instructions pay a
fixed overhead), so that the first group can start while the producer of the input still writes its later rows
(MobileNetV3: 3 rows of 56; bf16 151.1 -> 150.0 us, fp32 280.9 -> 249.6; 2 rows gave 151.9 and 255.3, 7 rows
153.5 and 266.4).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable

import numpy as np

from isa.dtypes import DType
from isa.operand import Engine
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.conv_epilogue import Epilogue
from neuronx_cc_lite.lower.program import HbmAccess, Tile, TileAccess
from neuronx_cc_lite.lower.windows import Block, fill_window, flat_window, needs_fill, window_strides, window_taps

if TYPE_CHECKING:
    from neuronx_cc_lite.lower.conv import ConvGeometry


def band_plan(ctx: LowerCtx, node: Node, geo: ConvGeometry, window_budget: int) -> tuple[int, int]:
    """(bands, output rows a band), or (1, 0) where bands do not apply: they need a 2-D depthwise convolution
    (no zero insertion) with constant weights over at most half the partitions, whose rows fit a bank and
    whose windows the budget."""
    target = ctx.program.target
    if not geo.depthwise or geo.transposed or len(geo.axes) != 2 or any(ax.up != 1 for ax in geo.axes):
        return 1, 0
    if not ctx.graph.tensors[node.inputs[1]].is_constant:
        return 1, 0
    rows, cols = geo.axes
    per_bank = min(target.psum_bank_fmax, target.gemm_moving_fmax) // cols.out
    per_band = min(-(-target.min_efficient_elements // cols.out), per_bank)
    bands = min(target.partitions // geo.channels, -(-rows.out // max(per_band, 1)))
    if bands < 2 or per_band < 1 or rows.span(per_band) * cols.span(cols.out) > window_budget:
        return 1, 0
    return bands, per_band


def diagonal_weights(ctx: LowerCtx, node: Node, geo: ConvGeometry, bands: int = 1) -> Callable[[int, int], Tile]:
    """A loader of the stationary operands of channels c0 .. c0 + ct - 1: a tile of Program.diagonals whose tap t
    reads as diagonal_tap(tile, t, ct). With bands, partition b * C + c holds channel c of band b (each band's
    block repeats the diagonal). HBM holds the weights as the model does, [C, taps] (repeated per band): one
    DMA writes each partition's taps, a run of taps elements, at element c * taps of partition c (its row's skew,
    isa/operand.py), onto the diagonal of every tap at once."""
    prog = ctx.program
    taps = geo.taps
    w = ctx.graph.tensors[node.inputs[1]].value.astype(np.float64).reshape(geo.channels, taps)
    dtype = prog.operand_dtype(DType.fp32)  # auto-cast: stored in the type the matmul reads
    data = np.tile(w, (bands, 1)).astype(dtype.np)
    tensor = prog.hbm_tensor(f"{node.name}/taps", data.nbytes, "weight", dtype, data.tobytes())

    def load(c0: int, ct: int) -> Tile:
        tile = prog.diagonals(taps, dtype)
        prog.emit("dma_copy", Engine.DMA, dst=TileAccess(tile, 0, ct, 0, ((taps, 1),), skew=taps),
                  src=HbmAccess(tensor, dtype, ct, taps, c0 * taps, ((taps, 1),)))
        return tile

    return load


def diagonal_tap(tile: Tile, tap: int, channels: int) -> TileAccess:
    """Tap `tap` of a tile of diagonal_weights: [channels, channels], element (c, j) at c's j * taps + tap."""
    taps = tile.free // tile.partitions
    return tile.ap(((channels, taps),), tap, 0, channels)


def lower_banded_depthwise(ctx: LowerCtx, node: Node, geo: ConvGeometry, bands: int, per_band: int) -> None:
    prog = ctx.program
    c, p = geo.channels, bands * geo.channels
    x, epilogue = ctx.view(node.inputs[0]), Epilogue(ctx, node, bands)
    src = x.transpose((1, 0, 2, 3))  # (C, batch, rows, columns)
    rows, cols = geo.axes
    weights = diagonal_weights(ctx, node, geo, bands)(0, p)
    column = epilogue.bias_column(p, [(b * c, 0, c) for b in range(bands)])
    taps = list(itertools.product(*(range(k) for k in geo.kernel)))
    dtype = prog.operand_dtype(DType.fp32)
    for n in range(x.shape[0]):
        for r0 in range(0, rows.out, bands * per_band):
            # every band's window laid out as a whole band's, past the last output row too
            whole = [Block(n, 1, (r0 + b * per_band, 0), (per_band, cols.out)) for b in range(bands)]
            # over rows shorter than an efficient DMA piece, the input's rows whole (a run per band, not a piece
            # per row), the taps along the row writing only the outputs they reach (windows.window_taps)
            flat = flat_window(whole[0], geo.axes, src, dtype)
            strides, image = window_strides(whole[0], geo.axes, flat)
            window = prog.sbuf(p, image, dtype, f"{node.name}/x")
            if any(needs_fill(block, geo.axes[:-1] if flat else geo.axes) for block in whole):
                prog.emit("memset", Engine.POOL, dst=window.ap(), value=0.0)
            for b, block in enumerate(whole):
                fill_window(prog, window, src, block, geo.axes, b * c, flat=flat)
            acc = prog.psum(p, per_band * cols.out, f"{node.name}/acc")
            for k, (t, dst, moving) in enumerate(window_taps(window, (image, *strides), whole[0], geo.axes, taps, p,
                                                            acc, flat)):
                prog.emit("nc_matmul", Engine.PE, dst=dst, stationary=diagonal_tap(weights, t, p), moving=moving,
                          accumulate=k > 0)
            parts = [(Block(n, 1, block.starts, (min(per_band, rows.out - block.starts[0]), cols.out)), b * c, 0, c)
                     for b, block in enumerate(whole) if block.starts[0] < rows.out]
            epilogue.finish(acc, column, parts)
