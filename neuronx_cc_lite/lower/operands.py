"""The operands of a matmul, brought into the layout the Tensor engine reads: K (the contraction) on partitions.

    B tiles [kt, columns]   the moving operand of a row-major product, the stationary one of a feature-major one
    A^T tiles [kt, rows]    the stationary operand of a row-major product, the moving one of a feature-major one

Each comes in whichever way reads it in large contiguous pieces:

    a weight                        laid out at compile time (transposed, cast to the matmul type, cut into K tiles
                                    so that each tile of a column group is one contiguous block in HBM)
    K already on partitions         a tensor its producer laid out feature-major (lower/layout.py), or a transposed
                                    view: read as it is (codegen/on_chip.py maps the read to the tensor's home)
    K along the rows' free axis     an activation laid out token-major: rows loaded as they are, turned on PE
"""

from __future__ import annotations

import math
from typing import Callable

import ml_dtypes
import numpy as np

from isa.dtypes import DType
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.transpose import Piece, transpose_pieces
from neuronx_cc_lite.declared import Absent, declared, is_declared
from neuronx_cc_lite.frontend import release_mapped_weights
from neuronx_cc_lite.tile.hbm import HbmTensor, HbmView
from neuronx_cc_lite.tile.program import Tile, TileAccess

# Bytes per partition the operands kept for a whole matmul may take (B's column groups); beyond it they are
# streamed. The memory planner sees them as ordinary tiles.
RESIDENT_BYTES = 96 * 1024

Operand = HbmView | np.ndarray  # a view of a tensor computed at run time, or a constant's value


def bias_columns(ctx: LowerCtx, bias: np.ndarray) -> Callable[[int, int], TileAccess]:
    """The vector with its features on partitions (lower/columns.py): a function giving, for the feature block
    starting at n0 (a multiple of pmax), the [nb, 1] fp32 column ScalarE or VectorE take as a per-partition
    operand of a feature-major result."""
    first = ctx.columns.add(bias)
    pmax = ctx.program.target.partitions
    return lambda n0, nb: ctx.columns.column(first + n0 // pmax, nb)


def blocks(size: int, step: int) -> list[tuple[int, int]]:
    return [(start, min(step, size - start)) for start in range(0, size, step)]


def k_on_partitions(view: HbmView, axis: int) -> bool:
    """Whether the view's `axis` is the last axis of a tensor laid out feature-major (on partitions)."""
    layout = view.tensor.layout
    return layout is not None and layout[2] == 1 and view.strides[axis] == 1 and view.shape[axis] > 1


def a_rows_along_k(a: HbmView) -> bool:
    """Whether A [m, k] lies by rows along K (loaded as it is and turned on PE), not with K on partitions."""
    return not k_on_partitions(a, 1) and (a.strides[1] == 1 or a.shape[1] == 1)


def b_rows_along_k(b: HbmView) -> bool:
    """Whether B [k, n] lies by rows along K (a transposed view, K^T in attention: loaded as B^T and turned on
    PE), not along N or with K on partitions."""
    return not (k_on_partitions(b, 0) or b.strides[1] == 1 or b.shape[1] == 1) and b.strides[0] == 1


def bias_rows(ctx: LowerCtx, bias: np.ndarray, key: str) -> Tile:
    """The bias as the moving operand of a matmul against ones: three bf16 rows whose sum is the fp32 bias
    exactly (hi, mid and lo parts of its 24-bit mantissa), so that PE adds it at the bf16 rate; one fp32 row when
    a value does not split (inf, NaN, or beyond bf16's exponent range)."""
    row = np.asarray(bias, dtype=np.float32).reshape(1, -1)
    parts, rest = [], row
    for _ in range(3):
        part = rest.astype(ml_dtypes.bfloat16)
        parts.append(part)
        rest = (rest - part.astype(np.float32)).astype(np.float32)
    exact = np.isfinite(row).all() and np.array_equal(sum(p.astype(np.float64) for p in parts), row)
    dtype, parts_or_row = (DType.bf16, parts) if exact else (DType.fp32, [row])
    weight, _ = laid_out(ctx, f"{key}/rows", parts_or_row, dtype)
    rows = ctx.program.sbuf(len(parts_or_row), row.shape[1], dtype, f"{key}/rows")
    ctx.program.dma(rows.ap(), HbmView(weight, dtype, (len(parts_or_row), row.shape[1]), (row.shape[1], 1)))
    return rows


def laid_out(ctx: LowerCtx, key: str, parts: list[np.ndarray | KTiles], dtype: DType
              ) -> tuple[HbmTensor, list[int]]:
    """A weight tensor holding `parts` back to back in `dtype` (cached by key), and each part's element offset.

    The parts are cast into the one buffer the bundle stores (its bytes are that buffer's, not a copy), a part at
    a time, and the pages of mapped model files read for a part are given back after it: a weight is in memory
    once, beside the part of its source being copied (a 2.2 GB LM head compiles in about its own size)."""
    cache = ctx.laid_out
    if key not in cache:
        sizes = [math.prod(p.shape) for p in parts]
        offsets = [int(o) for o in np.cumsum([0] + sizes[:-1])]
        if any(is_declared(p) for p in parts):  # shapes only: no bytes to lay out
            data: bytes | memoryview | Absent = Absent(sum(sizes) * dtype.size)
        else:
            out = np.zeros(sum(sizes), dtype.np)  # pages untouched until written: padding costs nothing
            tiled = []
            for part, at, size in zip(parts, offsets, sizes):
                dst = out[at:at + size].reshape(part.shape)
                if isinstance(part, KTiles):
                    tiled.append((part, dst))
                else:
                    dst[...] = ctx.narrowed(part, dtype)
                    release_mapped_weights()
            # column groups a K tile at a time: B's rows are read in order, and given back after each tile (read a
            # group at a time, every group touches every row's pages, and the kernel maps pages around each read)
            for j in range(max((len(part.k_tiles) for part, _ in tiled), default=0)):
                for part, dst in tiled:
                    part.write(j, dst, lambda v: ctx.narrowed(v, dtype))
                release_mapped_weights()
            data = memoryview(out.view(np.uint8)).toreadonly()  # compares as bytes do (hash bytes(data))
        cache[key] = (ctx.program.hbm_tensor(key, len(data), TensorKind.WEIGHT, dtype, data), offsets)
    return cache[key]


class KTiles:
    """Columns g0 .. g0 + gn of a weight B [K, N] as the Tensor engine reads a column group: [kmax, K tiles, gn],
    row p of every K tile side by side, zeros below a short last tile. `write` copies one K tile of it into the
    laid-out weight, so it is never built on its own (parts held whole beside the weight double it)."""

    def __init__(self, b: np.ndarray, k_tiles: list[tuple[int, int]], g0: int, gn: int) -> None:
        self.b, self.k_tiles, self.g0, self.gn = b, k_tiles, g0, gn
        self.shape = (max(kt for _, kt in k_tiles), len(k_tiles), gn)

    def write(self, j: int, dst: np.ndarray, cast: Callable[[np.ndarray], np.ndarray]) -> None:
        """K tile j of dst ([kmax, K tiles, gn], zeros) = the group's rows of it, cast."""
        k0, kt = self.k_tiles[j]
        dst[:kt, j] = cast(self.b[k0:k0 + kt, self.g0:self.g0 + self.gn])


class BSource:
    """B tiles [kt, nt] per (K tile, column block).

    A weight is laid out per column group partition by partition: row p of every K tile of the group side by
    side, so that one transfer with one contiguous piece per partition brings the whole group (a piece per
    partition per K tile would cost more than the bytes for the narrow weights of a transformer)."""

    def __init__(self, ctx: LowerCtx, b: Operand, dtype: DType, k_tiles: list[tuple[int, int]], n_size: int,
                 name: str, key: str | None) -> None:
        self.ctx, self.b, self.dtype, self.k_tiles, self.name = ctx, b, dtype, k_tiles, name
        prog = ctx.program
        width = len(k_tiles) * n_size * dtype.size
        # column groups of one PSUM bank: the first column block needs only its group of every K tile, so the
        # multiplying starts after a fraction of B has arrived; the groups stay for every row block when all fit.
        # A group (its columns of every K tile) is live whole, so a long K narrows it (a matrix-vector layer's
        # 144 K tiles of 512 fp32 columns would not fit SBUF), to whole stationary blocks at least
        block = prog.target.gemm_stationary_fmax
        fit = RESIDENT_BYTES // (len(k_tiles) * dtype.size) // block * block
        self.group = min(n_size, prog.target.psum_bank_fmax, max(block, fit))
        self.groups = blocks(n_size, self.group)
        self.resident = width <= RESIDENT_BYTES
        self.tiles: dict[tuple, Tile] = {}
        if isinstance(b, np.ndarray):
            parts: list[np.ndarray | KTiles] = [declared((max(kt for _, kt in k_tiles), len(k_tiles), gn), b.dtype)
                                                if is_declared(b) else KTiles(b, k_tiles, g0, gn)
                                                for g0, gn in self.groups]
            self.weight, self.offsets = laid_out(ctx, f"{key}/PxKxN{self.group}", parts, dtype)

    def tile(self, j: int, n0: int, nt: int, m_block: int) -> TileAccess:
        """B for K tile j and columns n0 .. n0 + nt (within one group)."""
        g = n0 // self.group
        g0, gn = self.groups[g]
        kt = self.k_tiles[j][1]
        if isinstance(self.b, np.ndarray):
            key = (g,) if self.resident else (g, m_block)
            if key not in self.tiles:
                self.tiles[key] = self._load_group(g, gn)
            return self.tiles[key].region(j * gn + n0 - g0, nt, 0, kt)
        key = (j, g) if self.resident else (j, g, m_block)
        if key not in self.tiles:
            self.tiles[key] = self._load(j, g0, gn)
        return self.tiles[key].region(n0 - g0, nt)

    def _load_group(self, g: int, gn: int) -> Tile:
        prog = self.ctx.program
        kmax, count = max(kt for _, kt in self.k_tiles), len(self.k_tiles)
        t = prog.sbuf(kmax, count * gn, self.dtype, f"{self.name}/B")
        prog.dma(t.ap(), HbmView(self.weight, self.dtype, (kmax, count * gn), (count * gn, 1), self.offsets[g]))
        return t

    def _load(self, j: int, g0: int, gn: int) -> Tile:
        prog, b = self.ctx.program, self.b
        assert isinstance(b, HbmView)
        k0, kt = self.k_tiles[j]
        t = prog.sbuf(kt, gn, self.dtype, f"{self.name}/B")
        if b_rows_along_k(b):  # load B^T [n, K] and turn it
            pieces = []
            for c0, cn in blocks(gn, prog.target.partitions):
                rows = prog.sbuf(cn, kt, self.dtype, f"{self.name}/B^T")
                prog.dma(rows.ap(), b.box((k0, g0 + c0), (kt, cn)).transpose((1, 0)))
                pieces.append(Piece(rows.ap(), t, c0))
            transpose_pieces(prog, pieces, self.name)
        else:  # K on partitions, rows along N, or a pattern strided both ways: as it comes
            prog.dma(t.ap(), b.box((k0, g0), (kt, gn)))
        return t


def a_transposed(ctx: LowerCtx, a: Operand, dtype: DType, m0: int, mt: int, k_tiles: list[tuple[int, int]],
                 name: str, key: str | None) -> list[TileAccess]:
    """A^T for rows m0 .. m0 + mt: per K tile j, [kt_j, mt] (mt <= 512: rows are turned 128 at a time)."""
    prog = ctx.program
    pmax = prog.target.partitions
    k_size = sum(kt for _, kt in k_tiles)
    if isinstance(a, np.ndarray):
        parts = [a[m0:m0 + mt, k0:k0 + kt].T for k0, kt in k_tiles]
        weight, offsets = laid_out(ctx, f"{key}/MxK{m0}:{mt}", parts, dtype)
        tiles = []
        for j, (k0, kt) in enumerate(k_tiles):
            t = prog.sbuf(kt, mt, dtype, f"{name}/A^T")
            prog.dma(t.ap(), HbmView(weight, dtype, (kt, mt), (mt, 1), offsets[j]))
            tiles.append(t.ap())
        return tiles
    if a_rows_along_k(a):  # turn them on PE
        if a.tensor.kind is TensorKind.STATE:  # device state may be written in place between two reads: turned each time
            return _turned_rows(ctx, a, dtype, m0, mt, k_tiles, name)
        turned = (id(a.tensor), a.offset, a.shape, a.strides, dtype, m0, mt, tuple(k_tiles))
        if turned not in ctx.turned:  # (any other tensor is written once, before any reader: the same rows)
            ctx.turned[turned] = _turned_rows(ctx, a, dtype, m0, mt, k_tiles, name)
        return ctx.turned[turned]
    # K on partitions already (feature-major, or a transposed view): each K tile as it comes, a tile of its own
    # (on chip, then, the region of the home itself)
    tiles = []
    for k0, kt in k_tiles:
        t = prog.sbuf(kt, mt, dtype, f"{name}/A^T")
        prog.dma(t.ap(), a.box((m0, k0), (mt, kt)).transpose((1, 0)))
        tiles.append(t.ap())
    return tiles


def _turned_rows(ctx: LowerCtx, a: HbmView, dtype: DType, m0: int, mt: int, k_tiles: list[tuple[int, int]],
                 name: str) -> list[TileAccess]:
    """A^T of rows m0 .. m0 + mt laid out along K: the rows loaded 128 at a time and turned on PE."""
    prog = ctx.program
    k_size = sum(kt for _, kt in k_tiles)
    kmax = max(kt for _, kt in k_tiles)
    at = prog.sbuf(kmax, len(k_tiles) * mt, dtype, f"{name}/A^T")
    pieces = []
    for r0, rt in blocks(mt, prog.target.partitions):
        rows = prog.sbuf(rt, k_size, dtype, f"{name}/A")
        prog.dma(rows.ap(), a.box((m0 + r0, 0), (rt, k_size)))
        pieces += [Piece(rows.region(k0, kt), at, j * mt + r0) for j, (k0, kt) in enumerate(k_tiles)]
    transpose_pieces(prog, sorted(pieces, key=lambda p: p.offset), name)
    return [at.region(j * mt, mt, 0, kt) for j, (_, kt) in enumerate(k_tiles)]
