"""DMA access patterns beyond `Program.dma`: into strided tile regions, and index maps cut into pieces that access
patterns can walk.

A padded window tile is filled by a memset and one DMA into its interior (`dma_tile`); Pad and nearest Resize
are copies whose source walks an index map (`pieces`) with zero strides where it repeats an element: on chip
between whole rows (`copy_pieces_on_chip`), or HBM to HBM (`copy_pieces`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence


from isa.operand import MAX_FREE_DIMS, Engine
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.tile.hbm import HbmView, coalesce, contiguous_strides
from neuronx_cc_lite.tile.program import HbmAccess, Program, Tile, TileAccess


def _split_outer(shape: tuple[int, ...]) -> tuple[int, list[tuple[int, ...]]]:
    """How many leading axes exceed the four free dimensions of one access pattern, and their index tuples."""
    outer = max(0, len(shape) - MAX_FREE_DIMS)
    return outer, list(itertools.product(*(range(n) for n in shape[:outer])))


def dma_tile(prog: Program, tile: Tile, view: HbmView, strides: tuple[int, ...], offset: int = 0,
             first: int = 0) -> None:
    """Load an HBM view of shape (partitions, *free) into a strided region of `tile`: the view's axis 0 lands
    on partitions first.., free axis k walks the tile with stride strides[k] (elements) from element `offset`."""
    if view.size == 0:
        return
    assert len(strides) == len(view.shape) - 1, (strides, view.shape)
    shape, (hbm_strides, tile_strides) = coalesce([view, (view.shape, (0, *strides))], keep_first=True)
    free, h_free, t_free = shape[1:] or (1,), hbm_strides[1:] or (1,), tile_strides[1:] or (1,)
    outer, indices = _split_outer(free)
    for index in indices:
        h_off = view.offset + sum(i * s for i, s in zip(index, h_free))
        t_off = offset + sum(i * s for i, s in zip(index, t_free))
        hbm = HbmAccess(view.tensor, view.dtype, shape[0], hbm_strides[0], h_off,
                        tuple(zip(free[outer:], h_free[outer:])))
        region = TileAccess(tile, first, shape[0], t_off, tuple(zip(free[outer:], t_free[outer:])))
        prog.emit("dma_copy", Engine.DMA, dst=region, src=hbm)


def contiguous(prog: Program, view: HbmView, name: str) -> HbmView:
    """`view` itself when its elements lie in row-major order, else a copy of it in a scratch tensor (so that it
    can be reshaped)."""
    if view.is_contiguous:
        return view
    tensor = prog.hbm_tensor(f"{name}/contiguous", view.size * view.dtype.size, TensorKind.SCRATCH, view.dtype)
    copy = HbmView.whole(tensor, view.dtype, view.shape)
    prog.dma(copy, view)
    return copy


@dataclass(frozen=True)
class Piece:
    """Outputs start .. start + runs * length - 1 of an index map: `runs` runs of `length` equal indices, the
    first run reading input `source` and each next one `step` further on. source -1: a fill, no input."""

    start: int
    runs: int
    length: int
    source: int
    step: int

    @property
    def fill(self) -> bool:
        return self.source < 0

    def out_axes(self, stride: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(size, stride) of the two axes that walk these outputs, for an axis of element stride `stride`."""
        return (self.runs, self.length * stride), (self.length, stride)

    def in_axes(self, stride: int) -> tuple[tuple[int, int], tuple[int, int]]:
        return (self.runs, self.step * stride), (self.length, 0)


def pieces(index: Sequence[int]) -> list[Piece]:
    """Cut an index map (output position -> input index, -1 for a fill) greedily into pieces: an upsampling by
    an integer factor is one piece, an arithmetic progression (a strided subsampling) another, a reflection one
    piece per element."""
    n, found, o = len(index), [], 0

    def run_length(at: int) -> int:
        r = 1
        while at + r < n and index[at + r] == index[at]:
            r += 1
        return r

    while o < n:
        v, r = index[o], run_length(o)
        q, step = 1, 0
        if v < 0:
            pass  # one fill piece for the whole run
        elif r > 1:  # runs of r equal indices, each `step` after the last
            step = index[o + r] - v if o + r < n else 0
            while step > 0 and o + (q + 1) * r <= n and all(index[o + q * r + j] == v + q * step
                                                           for j in range(r)):
                q += 1
        elif o + 1 < n and index[o + 1] > v:  # single elements in a rising progression
            step = index[o + 1] - v
            while o + q < n and index[o + q] - index[o + q - 1] == step:
                q += 1
        found.append(Piece(o, q, r, v, step if q > 1 else 0))
        o += q * r
    return found


def piece_view(view: HbmView, axis: int, piece: Piece, source: bool) -> HbmView:
    """`view` with `axis` replaced by the two axes that walk `piece` (the inputs it reads when `source`)."""
    stride = view.strides[axis]
    axes = piece.in_axes(stride) if source else piece.out_axes(stride)
    first = (piece.source if source else piece.start) * stride
    return HbmView(view.tensor, view.dtype, view.shape[:axis] + tuple(n for n, _ in axes) + view.shape[axis + 1:],
                   view.strides[:axis] + tuple(s for _, s in axes) + view.strides[axis + 1:], view.offset + first)


def copy_pieces(prog: Program, out: HbmView, x: HbmView, per_axis: list[list[Piece]], fill: HbmView | None,
                fills_only: bool = False) -> None:
    """out[o] = x[index(o)] through one index map per axis, cut into pieces: one HBM-to-HBM copy per combination of
    pieces, reading `fill` (a one-element view, broadcast) where any axis of the combination is a fill. With
    `fills_only`, only the fills are written."""
    for combo in itertools.product(*per_axis):
        filled = any(p.fill for p in combo)
        if fills_only and not filled:
            continue
        dst, src = out, x
        for axis in reversed(range(len(combo))):  # the last axis first: earlier axes keep their index
            dst = piece_view(dst, axis, combo[axis], source=False)
            if not filled:
                src = piece_view(src, axis, combo[axis], source=True)
        if filled:
            assert fill is not None, "an index map with fills needs a fill value"
            src = fill.broadcast_to(dst.shape)
        prog.dma(dst, src)


def _identity(piece_list: list[Piece], size: int) -> bool:
    """Whether an axis's pieces copy it unchanged: one piece reading input o for output o."""
    if len(piece_list) != 1:
        return False
    p = piece_list[0]
    return (p.start, p.source, p.length, p.runs) == (0, 0, 1, size) and (p.step == 1 or size == 1)


def copy_pieces_on_chip(prog: Program, out: HbmView, x: HbmView, per_axis: list[list[Piece]],
                        fill: HbmView | None, budget: int) -> bool:
    """copy_pieces through SBUF: the leading axes that the index maps leave alone (an image's batch and channels)
    go on partitions, each row of x is loaded whole, the pieces are on-chip copies (a fill a copy of the fill value
    loaded once per partition, read with stride 0) into the output rows, stored whole. A reflection or an edge
    costs a copy per piece on VectorE instead of a DMA piece of a few bytes. False (nothing emitted) when no
    leading axis is left alone, every axis is, the rows of x are not one stride apart, or x's and the output's
    rows take more than `budget` elements a partition."""
    k = 0
    while k < len(per_axis) and _identity(per_axis[k], x.shape[k]):
        k += 1
    if k == 0 or k == len(per_axis):
        return False
    rows, free_in, free_out = math.prod(x.shape[:k]), x.shape[k:], out.shape[k:]
    lead = [(n, s) for n, s in zip(x.shape[:k], x.strides[:k]) if n > 1]
    if any(s != n_in * s_in for (_, s), (n_in, s_in) in zip(lead, lead[1:])) or not out.is_contiguous:
        return False
    if math.prod(free_in) + math.prod(free_out) + 1 > budget:
        return False
    row_stride = lead[-1][1] if lead else 0
    in_strides, out_strides = contiguous_strides(free_in), contiguous_strides(free_out)
    combos = list(itertools.product(*per_axis[k:]))
    pmax = prog.target.partitions
    for r0 in range(0, rows, pmax):
        p = min(pmax, rows - r0)
        t_in = prog.sbuf(p, math.prod(free_in), x.dtype, f"{prog.node}/in")
        prog.dma(t_in.ap(), HbmView(x.tensor, x.dtype, (p, *free_in), (row_stride, *x.strides[k:]),
                                    x.offset + r0 * row_stride))
        t_fill = None
        if fill is not None and any(q.fill for combo in combos for q in combo):
            t_fill = prog.sbuf(p, 1, fill.dtype, f"{prog.node}/fill")
            prog.dma(t_fill.ap(), HbmView(fill.tensor, fill.dtype, (p, 1), (0, 0), fill.offset))
        t_out = prog.sbuf(p, math.prod(free_out), out.dtype, f"{prog.node}/out")
        for combo in combos:
            dst: list[tuple[int, int]] = []
            src: list[tuple[int, int]] = []
            dst_at = src_at = 0
            for q, so, si in zip(combo, out_strides, in_strides):
                dst.extend(q.out_axes(so))
                dst_at += q.start * so
                if q.fill:
                    src.extend((n, 0) for n, _ in q.out_axes(so))
                else:
                    src.extend(q.in_axes(si))
                    src_at += q.source * si
            filled = any(q.fill for q in combo)
            _copy_walks(prog, t_out, dst_at, dst, t_fill if filled else t_in, 0 if filled else src_at,
                        [(n, 0) for n, _ in src] if filled else src, p)
        prog.dma(HbmView(out.tensor, out.dtype, (p, *free_out), (math.prod(free_out), *out_strides),
                         out.offset + r0 * math.prod(free_out)), t_out.ap())
    return True


def _copy_walks(prog: Program, dst: Tile, dst_at: int, dst_dims: list[tuple[int, int]], src: Tile, src_at: int,
                src_dims: list[tuple[int, int]], partitions: int) -> None:
    """tensor_copy between two walks of one shape, looped over the axes beyond an access pattern's four."""
    walks: list[tuple[int, int, int]] = []  # (size, dst stride, src stride), size-1 axes dropped, merged where both
    for n, sd, ss in ((n, sd, ss) for (n, sd), (_, ss) in zip(dst_dims, src_dims) if n > 1):
        if walks and walks[-1][1:] == (sd * n, ss * n):
            walks[-1] = (walks[-1][0] * n, sd, ss)
        else:
            walks.append((n, sd, ss))
    dst_dims, src_dims = [(n, sd) for n, sd, _ in walks], [(n, ss) for n, _, ss in walks]
    outer = max(0, len(walks) - MAX_FREE_DIMS)
    for index in itertools.product(*(range(n) for n, _ in dst_dims[:outer])):
        d0 = dst_at + sum(i * s for i, (_, s) in zip(index, dst_dims))
        s0 = src_at + sum(i * s for i, (_, s) in zip(index, src_dims))
        d = TileAccess(dst, 0, partitions, d0, tuple(dst_dims[outer:]) or ((1, 1),))
        s = TileAccess(src, 0, partitions, s0, tuple(src_dims[outer:]) or ((1, 1),))
        prog.emit("tensor_copy", Engine.DVE, dst=d, src=s)
