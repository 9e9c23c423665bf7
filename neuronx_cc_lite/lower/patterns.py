"""DMA access patterns beyond `Program.dma`: into strided tile regions, and index maps cut into pieces that access
patterns can walk.

A padded window tile is filled by a memset and one DMA into its interior (`dma_tile`); Pad and nearest Resize
are HBM-to-HBM copies whose source walks an index map (`pieces`) with zero strides where it repeats an element.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence


from isa.operand import MAX_FREE_DIMS, Engine
from neuronx_cc_lite.lower.hbm import HbmView, coalesce
from neuronx_cc_lite.lower.program import HbmAccess, Program, Tile, TileAccess


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
    tensor = prog.hbm_tensor(f"{name}/contiguous", view.size * view.dtype.size, "scratch", view.dtype)
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
