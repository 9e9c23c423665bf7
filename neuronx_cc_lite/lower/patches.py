"""PatchEmbedding (the compiler's own op, passes/canonicalize.py): a convolution whose stride is its kernel (a
ViT's patch embedding: non-overlapping patches, no padding), with its result token-major, a row per patch:

    out[(n, ph, pw), m] = bias[m] + sum over c, i < kh, j < kw of  x[n, c, ph * kh + i, pw * kw + j] * W[m, c, i, j]

The contraction goes over (channel, kernel row) on partitions and over the kernel column j by accumulation:
partition (c, i) of a window holds rows i, kh + i, 2 kh + i, ... of channel c, each whole (W elements, one
contiguous DMA piece of the image's row: 896 bytes of a 224-wide fp32 image). For each j one matmul then reads the
window with stride kw along the row, column pw * kw + j for every patch of the block, as the stationary operand
(patches on PE columns, at most pmax of them), against W's slice [(c, i), m] for that j as the moving one: the
block's rows of the result land on partitions, a PSUM bank of output features wide. An im2col gather instead
copies each patch's (c, i) row of kw elements on its own: 16 elements, 64 bytes a DMA piece, 9,408 of them for
ViT-Base's 224x224 image. PE adds the bias as it accumulates (lower/operands.bias_rows against ones).

Over more (c, i) than pmax, the windows and the weights are cut into K tiles of pmax partitions (a tile may start
inside a channel), each accumulating kw matmuls into the same bank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc
from isa.operand import Engine
from isa.target import Target
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.instr import act
from neuronx_cc_lite.lower.operands import bias_rows, blocks, laid_out
from neuronx_cc_lite.lower.patterns import dma_tile
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, Tile


def window_budget(target: Target) -> int:
    """Bytes per partition the windows of every block may take together, so that they are loaded once for every
    group of output features; beyond it, each group loads its own."""
    return target.sbuf_partition_bytes // 8


@dataclass(frozen=True)
class Patches:
    images: int
    channels: int
    height: int
    width: int
    kernel: tuple[int, int]
    features: int  # M

    @property
    def grid(self) -> tuple[int, int]:
        return self.height // self.kernel[0], self.width // self.kernel[1]

    @property
    def rows(self) -> int:
        """Partition rows of the contraction: (channel, kernel row)."""
        return self.channels * self.kernel[0]

    def blocks(self, target: Target) -> list[tuple[int, int, int, int, int]]:
        """(image, first patch row, patch rows, first patch column, patch columns) of each block of at most
        gemm_stationary_fmax patches: whole patch rows, or a run of one row's patches where a row has more."""
        ph, pw = self.grid
        most = target.gemm_stationary_fmax
        found = []
        for n in range(self.images):
            if pw <= most:
                per = most // pw
                found += [(n, r0, min(per, ph - r0), 0, pw) for r0 in range(0, ph, per)]
            else:
                found += [(n, r0, 1, c0, min(most, pw - c0)) for r0 in range(ph) for c0 in range(0, pw, most)]
        return found


def _geometry(node: Node, g: Graph) -> Patches:
    n, c, h, w = g.tensors[node.inputs[0]].shape
    m, _, kh, kw = g.tensors[node.inputs[1]].shape
    return Patches(n, c, h, w, (kh, kw), m)


def _check(node: Node, g: Graph) -> str | None:
    x, w = (g.tensors[name].shape for name in node.inputs[:2])
    if len(x) != 4 or len(w) != 4 or x[1] != w[1] or x[2] % w[2] or x[3] % w[3]:
        return f"patches of {list(w[2:])} do not tile an input of shape {list(x)} with {w[1]} channels"
    if not g.tensors[node.inputs[1]].is_constant or (len(node.inputs) > 2 and node.inputs[2] and
                                                      not g.tensors[node.inputs[2]].is_constant):
        return "PatchEmbedding needs its weights and bias at compile time"
    return None


def _weights(ctx: LowerCtx, node: Node, geo: Patches, k_tiles: list[tuple[int, int]],
             groups: list[tuple[int, int]], dtype: DType) -> dict[tuple[int, int], HbmView]:
    """W laid out per (K tile, feature group) as [rows of the tile, kw, group's features]: row (c, i) of a tile
    holds W[group, c, i, j] for every j, one contiguous run per partition."""
    w = ctx.graph.tensors[node.inputs[1]].value  # [M, C, kh, kw]
    kw = geo.kernel[1]
    by_row = w.reshape(geo.features, geo.rows, kw).transpose(1, 2, 0)  # [(c, i), j, m]
    parts = [by_row[r0:r0 + kt, :, g0:g0 + gn] for r0, kt in k_tiles for g0, gn in groups]
    tensor, offsets = laid_out(ctx, f"{node.name}/weights", parts, dtype)
    views, at = {}, iter(offsets)
    for r0, kt in k_tiles:
        for g0, gn in groups:
            views[r0, g0] = HbmView(tensor, dtype, (kt, kw * gn), (kw * gn, 1), next(at))
    return views


def _load_window(prog: Program, x: HbmView, geo: Patches, block: tuple[int, int, int, int, int], r0: int, kt: int,
                 dtype: DType, name: str) -> Tile:
    """Partitions (c, i) - r0 of K tile [r0, r0 + kt): rows ph * kh + i of channel c for the block's patch rows,
    whole. One DMA per channel the tile covers (its rows i one stride apart)."""
    n, row0, rows, _, _ = block
    kh = geo.kernel[0]
    tile = prog.sbuf(kt, rows * geo.width, dtype, name)
    for c in range(r0 // kh, (r0 + kt - 1) // kh + 1):
        first, last = max(r0, c * kh), min(r0 + kt, (c + 1) * kh)  # flattened rows (c, i) of this channel
        start = x.offset + n * x.strides[0] + c * x.strides[1] + (row0 * kh + first - c * kh) * x.strides[2]
        image_rows = HbmView(x.tensor, x.dtype, (last - first, rows, geo.width),
                             (x.strides[2], kh * x.strides[2], x.strides[3]), start)
        dma_tile(prog, tile, image_rows, (geo.width, 1), 0, first - r0)
    return tile


@lowering("PatchEmbedding", check=_check, floats=True)
def lower_patch_embedding(ctx: LowerCtx, node: Node) -> None:
    prog, target = ctx.program, ctx.program.target
    geo = _geometry(node, ctx.graph)
    x = ctx.view(node.inputs[0])
    out = ctx.output(node.outputs[0], (0, 1))  # patches on partitions
    dtype = prog.operand_dtype(DType.fp32)
    kw, pw = geo.kernel[1], geo.grid[1]
    k_tiles = blocks(geo.rows, target.partitions)
    groups = blocks(geo.features, min(target.psum_bank_fmax, target.gemm_moving_fmax))
    weights = _weights(ctx, node, geo, k_tiles, groups, dtype)
    bias = ctx.graph.tensors[node.inputs[2]].value if len(node.inputs) > 2 and node.inputs[2] else None
    rows_of_bias = bias_rows(ctx, np.asarray(bias), node.name) if bias is not None else None
    plan = geo.blocks(target)
    window_bytes = sum(rows * geo.width for _, _, rows, _, _ in plan) * dtype.size
    keep = window_bytes <= window_budget(target)  # one load per block for every group
    windows: dict[tuple[int, int, int], Tile] = {}
    for g0, gn in groups:
        w_tiles = {}
        for r0, kt in k_tiles:
            w_tiles[r0] = prog.sbuf(kt, kw * gn, dtype, f"{node.name}/w")
            prog.dma(w_tiles[r0].ap(), weights[r0, g0])
        for block in plan:
            n, row0, rows, col0, cols = block
            patches = rows * cols
            acc = prog.psum(patches, gn, f"{node.name}/acc")
            first = True
            for r0, kt in k_tiles:
                key = (n, row0, r0)
                window = windows.get(key) or _load_window(prog, x, geo, block, r0, kt, dtype, f"{node.name}/x")
                if keep:
                    windows[key] = window
                for j in range(kw):  # column pw * kw + j of each patch row of the block
                    stationary = window.ap(tuple(d for d in ((rows, geo.width), (cols, kw)) if d[0] > 1) or ((1, 1),),
                                           col0 * kw + j)
                    prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=stationary,
                              moving=w_tiles[r0].ap(((gn, 1),), j * gn), accumulate=not first)
                    first = False
            if rows_of_bias is not None:  # acc[p, m] += sum over rows r of 1 * bias_r[m]
                r = rows_of_bias.partitions
                prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=prog.ones(rows_of_bias.dtype).region(
                    0, patches, 0, r), moving=rows_of_bias.region(g0, gn, 0, r), accumulate=True)
            res = prog.sbuf(patches, gn, out.dtype, f"{node.name}/out")
            act(prog, res.ap(), acc.ap(), ActFunc.copy)
            first_patch = (n * geo.grid[0] + row0) * pw + col0  # a block's patches are consecutive rows
            prog.dma(out.box((first_patch, g0), (patches, gn)), res.ap())
