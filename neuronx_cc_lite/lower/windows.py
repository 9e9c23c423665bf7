"""Sliding windows (Conv, ConvTranspose, pooling): their geometry, the blocks of outputs a tile holds, and the
padded input tiles those blocks read.

Along each spatial axis an output o reads the taps at virtual coordinates o * stride + j * dilation (j < kernel)
of the padded input, in which input element i sits at `offset + i * up`: `offset` is the leading padding, `up` the
zero insertion of a transposed convolution. A block of outputs reads one box of virtual coordinates, its window:
a tile holds it, filled (memset) where it has no input element and loaded by one strided DMA elsewhere. A tap then
reads the tile through an access pattern that steps `stride` along each axis (`window_ap`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from isa.dtypes import DType
from isa.operand import Engine
from neuronx_cc_lite.lower.hbm import HbmView
from neuronx_cc_lite.lower.patterns import dma_tile
from neuronx_cc_lite.lower.program import Program, Tile, TileAccess

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Axis:
    size: int  # input elements
    out: int  # outputs
    kernel: int
    stride: int = 1
    dilation: int = 1
    offset: int = 0  # virtual coordinate of input element 0: the leading padding (negative: a crop)
    pad_end: int = 0  # trailing padding (AveragePool counts it)
    up: int = 1  # virtual coordinates from one input element to the next

    @property
    def extent(self) -> int:
        """Virtual coordinates one output's taps span."""
        return (self.kernel - 1) * self.dilation + 1

    def span(self, count: int) -> int:
        """Virtual coordinates the taps of `count` consecutive outputs span."""
        return (count - 1) * self.stride + self.extent

    def interior(self, o0: int, count: int, shift: int = 0) -> tuple[int, int, int]:
        """(first input element, number of them, its position in the window) of the input elements inside the
        window of outputs o0 .. o0 + count - 1 (moved `shift` virtual coordinates along the axis)."""
        lo = o0 * self.stride + shift
        hi = lo + self.span(count)
        first = max(0, -(-(lo - self.offset) // self.up))
        end = min(self.size, (hi - 1 - self.offset) // self.up + 1)
        return first, max(0, end - first), self.offset + first * self.up - lo


@dataclass(frozen=True)
class Block:
    """Images n0 .. n0 + images - 1 and, along each spatial axis, outputs starts[k] .. starts[k] + counts[k] - 1."""

    n0: int
    images: int
    starts: tuple[int, ...]
    counts: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.images * math.prod(self.counts)


def blocks(batch: int, axes: list[Axis], out_max: int, in_max: int) -> list[Block]:
    """Cut (batch, *outputs) into blocks of at most out_max outputs whose windows hold at most in_max elements
    (at least one output per block). The innermost axis is cut first; an outer axis (and the batch) takes more
    than one element per block only when every inner axis is whole, so that a block is a dense box."""
    counts: list[int] = []
    inner_out, inner_in, whole = 1, 1, True
    for ax in reversed(axes):
        count = 1
        if whole:
            by_in = (in_max // inner_in - ax.extent) // ax.stride + 1
            count = max(1, min(ax.out, out_max // inner_out, by_in))
        whole = whole and count == ax.out
        counts.insert(0, count)
        inner_out, inner_in = inner_out * count, inner_in * ax.span(count)
    images = max(1, min(batch, out_max // inner_out, in_max // inner_in)) if whole else 1
    ranges = [range(0, batch, images)] + [range(0, ax.out, c) for ax, c in zip(axes, counts)]
    return [Block(n0, min(images, batch - n0), tuple(starts),
                  tuple(min(c, ax.out - s) for ax, c, s in zip(axes, counts, starts)))
            for n0, *starts in itertools.product(*ranges)]


def window_strides(block: Block, axes: list[Axis]) -> tuple[tuple[int, ...], int]:
    """(strides of the window tile per spatial axis, elements per image) of a block's windows."""
    spans = [ax.span(c) for ax, c in zip(axes, block.counts)]
    return tuple(math.prod(spans[k + 1:]) for k in range(len(spans))), math.prod(spans)


def needs_fill(block: Block, axes: list[Axis]) -> bool:
    """Whether some of the block's window has no input element (padding, or zeros between inputs)."""
    return any(ax.up != 1 or ax.interior(s, c)[1] != ax.span(c) for ax, s, c in zip(axes, block.starts, block.counts))


def fill_edges(prog: Program, tile: Tile, block: Block, axes: list[Axis], shifts: list[int], value: float,
               phases: list[list[Axis]] | None = None) -> None:
    """Fill what no input element of the block's windows covers, for windows moved by each of `shifts` along the
    last axis (all on the tile's partitions), and with `phases`, for the window of each of those axes too (row
    phases of the same spans, lower/conv.py): per axis, the slab before the first input element and the slab
    after the last (over the other axes whole), instead of the whole tile. Only for windows without zero
    insertion (up = 1), where the input elements along an axis are one run."""
    strides, image = window_strides(block, axes)
    spans = [ax.span(c) for ax, c in zip(axes, block.counts)]
    options = phases or [axes]
    for k, (start, count) in enumerate(zip(block.starts, block.counts)):
        runs = [option[k].interior(start, count, sh if k == len(axes) - 1 else 0)
                for option in options for sh in shifts]
        before = max(pos if n else spans[k] for _, n, pos in runs)
        after = min(pos + n if n else 0 for _, n, pos in runs)
        for lo, hi in ((0, before), (after, spans[k])):
            if hi <= lo:
                continue
            dims = [(block.images, image)] + [((hi - lo) if j == k else spans[j], strides[j])
                                              for j in range(len(axes))]
            dims = [d for d in dims if d[0] > 1] or [(1, 1)]
            prog.emit("memset", Engine.POOL, dst=tile.ap(tuple(dims), lo * strides[k]), value=float(value))


def fill_window(prog: Program, tile: Tile, src: HbmView, block: Block, axes: list[Axis], first: int = 0,
                shift: int = 0) -> None:
    """Load the input elements of the block's windows into partitions first .. of `tile` (laid out as
    window_strides says), the window moved `shift` virtual coordinates along the last axis."""
    strides, image = window_strides(block, axes)
    shifts = [0] * (len(axes) - 1) + [shift]
    inside = [ax.interior(s, c, sh) for ax, s, c, sh in zip(axes, block.starts, block.counts, shifts)]
    if all(n > 0 for _, n, _ in inside):
        box = src.box((0, block.n0, *(f for f, _, _ in inside)),
                      (src.shape[0], block.images, *(n for _, n, _ in inside)))
        offset = sum(pos * st for (_, _, pos), st in zip(inside, strides))
        dma_tile(prog, tile, box, (image, *(ax.up * st for ax, st in zip(axes, strides))), offset, first)


def load_windows(prog: Program, src: HbmView, block: Block, axes: list[Axis], fill: float, name: str,
                 dtype: DType = DType.fp32) -> tuple[Tile, tuple[int, ...]]:
    """The windows of `block` in a tile [partitions, images, *spans] (the DMA casts to `dtype`). `src` has
    shape (partitions, batch, *inputs). Returns the tile and its strides (per image, per spatial axis)."""
    strides, image = window_strides(block, axes)
    tile = prog.sbuf(src.shape[0], block.images * image, dtype, name)
    if needs_fill(block, axes):
        if all(ax.up == 1 for ax in axes):
            fill_edges(prog, tile, block, axes, [0], fill)
        else:
            prog.emit("memset", Engine.POOL, dst=tile.ap(), value=float(fill))
    fill_window(prog, tile, src, block, axes)
    return tile, (image, *strides)


def window_ap(tile: Tile, strides: tuple[int, ...], block: Block, axes: list[Axis], tap: tuple[int, ...],
              partitions: int) -> TileAccess:
    """What tap `tap` (one kernel index per axis) reads of a window tile for every output of the block, in the
    order (image, *outputs)."""
    dims = [(block.images, strides[0])] + [(c, ax.stride * st) for c, ax, st in zip(block.counts, axes, strides[1:])]
    offset = sum(j * ax.dilation * st for j, ax, st in zip(tap, axes, strides[1:]))
    return tile.ap(tuple(d for d in dims if d[0] > 1) or ((1, 1),), offset, 0, partitions)


def window_axes(attrs: dict[str, Any], sizes: tuple[int, ...], kernel: tuple[int, ...],
                outs: tuple[int, ...], ceil_mode: bool = False) -> list[Axis] | str:
    """The axes of a Conv or pooling node from its strides, dilations, pads / auto_pad (and ceil_mode), checked
    against the output shape shape inference gave; a reason string when they do not fit."""
    rank = len(kernel)
    strides = tuple(attrs.get("strides") or (1,) * rank)
    dilations = tuple(attrs.get("dilations") or (1,) * rank)
    pads = tuple(attrs.get("pads") or (0,) * 2 * rank)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        return f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}"
    if len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank:
        return f"strides, dilations and pads must give {rank}, {rank} and {2 * rank} values"
    if min(strides + dilations + kernel) < 1 or min(pads) < 0:
        return "strides, dilations and kernel sizes must be positive and pads non-negative"
    axes = []
    for k, (n, kern, s, d) in enumerate(zip(sizes, kernel, strides, dilations)):
        extent = (kern - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-n // s)
            total = max(0, (out - 1) * s + extent - n)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            end = total - begin
        else:
            begin, end = (0, 0) if auto_pad == "VALID" else (pads[k], pads[k + rank])
            room = n + begin + end - extent
            if room < 0:
                return f"the window ({extent} elements) is larger than the padded input ({n + begin + end})"
            out = (-(-room // s) if ceil_mode else room // s) + 1
            if ceil_mode and (out - 1) * s >= n + begin:  # the last window must start inside the input
                out -= 1
        axes.append(Axis(n, out, kern, s, d, begin, end))
    if tuple(ax.out for ax in axes) != tuple(outs):
        return f"output shape {list(outs)} does not match the window arithmetic ({[ax.out for ax in axes]})"
    return axes
