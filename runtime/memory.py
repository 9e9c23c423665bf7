"""The memories of every rank: its HBM, its SBUF and its PSUM, each a byte array.

Operands become numpy views into these arrays once, at load, after a bounds check; instructions then read and
write through the views. SBUF and PSUM are filled with 0xFF bytes before every run, which reads as NaN in every
float type (and -1 in signed ints), so that reading a byte nobody wrote shows in the result. Only the bytes some
view reaches need filling again: no instruction touches the others.

Many ranks must not cost many chips' worth of host memory (64 ranks of 24 MiB of SBUF would be 1.5 GB), so each
rank's memories hold only what its program can touch: its HBM array ends where the furthest operand, weight or
tensor placement of that rank ends (the loader works that out before any view is made; the rank still addresses
`hbm_size` bytes, which the validator enforces), and its SBUF and PSUM are allocated when an operand first names
them. HBM is an anonymous mapping, whose pages cost memory only once touched, and only the spans some operand or
placement names are filled with UNWRITTEN: a bundle that touches 4 bytes at the end of 3 GiB pays for a page.

Device state (runtime/state.py) lives in arrays of its own, bound to the spans of HBM where the bundle places it:
an operand inside a bound span is a view of the state's array (which runs do not clear, and which other models
bound to the same state see), and an operand that straddles the edge of one is refused.
"""

from __future__ import annotations

import bisect
import mmap

import numpy as np

from isa.operand import Mem, Operand
from isa.target import Target
from runtime.errors import AccessError

UNWRITTEN = 0xFF


class RankMemories:
    def __init__(self, target: Target, hbm_reach: list[int]) -> None:
        """`hbm_reach[r]`: how many bytes of rank r's HBM anything can touch."""
        self.target = target
        self.hbm = [_lazy_bytes(reach) for reach in hbm_reach]
        self._hbm_spans: list[set[tuple[int, int]]] = [set() for _ in hbm_reach]  # [first, end) some view names
        self._hbm_fill: list[list[tuple[int, int]]] | None = None  # the spans merged, until another is added
        self._kept: list[set[tuple[int, int]]] = [set() for _ in hbm_reach]  # [first, end) clear() leaves
        self.sbuf: list[np.ndarray | None] = [None] * len(hbm_reach)
        self.psum: list[np.ndarray | None] = [None] * len(hbm_reach)
        # (memory, rank) -> how far into a partition row some view reaches: the bytes a run may have touched
        self._reach: dict[tuple[Mem, int], int] = {}
        self._bound: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in hbm_reach]  # (first, end, bytes)

    def bind(self, rank: int, first: int, array: np.ndarray) -> None:
        """HBM bytes [first, first + array.size) of `rank` are `array` (uint8): device state, which operands
        inside the span view and clear() leaves alone. Call before any view is made."""
        end = first + array.size
        spans = self._bound[rank]
        k = bisect.bisect_left(spans, first, key=lambda s: s[0])
        if (k > 0 and spans[k - 1][1] > first) or (k < len(spans) and spans[k][0] < end):
            raise AccessError(f"state at HBM [{first}, {end}) overlaps other state")
        spans.insert(k, (first, end, array))

    def _bound_view(self, rank: int, first: int, end: int) -> tuple[np.ndarray, int] | None:
        """(the state array, the offset in it) when [first, end) lies in bound state; None when it lies outside
        every bound span; AccessError when it straddles an edge."""
        spans = self._bound[rank]
        k = bisect.bisect_right(spans, first, key=lambda s: s[0]) - 1
        if k >= 0 and first < spans[k][1]:
            if end > spans[k][1]:
                raise AccessError(f"HBM access [{first}, {end}) runs past the end of device state at {spans[k][1]}")
            return spans[k][2], first - spans[k][0]
        if k + 1 < len(spans) and spans[k + 1][0] < end:
            raise AccessError(f"HBM access [{first}, {end}) runs into device state at {spans[k + 1][0]}")
        return None

    def touch(self, rank: int, first: int, end: int) -> None:
        """Bytes [first, end) of `rank`'s HBM are read or written by a run: clear() fills them."""
        if (first, end) not in self._hbm_spans[rank]:
            self._hbm_spans[rank].add((first, end))
            self._hbm_fill = None

    def keep(self, rank: int, first: int, end: int) -> None:
        """Bytes [first, end) of `rank`'s HBM hold what no run writes (the weights, placed once at load): clear()
        leaves them."""
        self._kept[rank].add((first, end))
        self._hbm_fill = None

    def clear(self) -> None:
        """Every byte a run may touch back to UNWRITTEN, but for those kept."""
        if self._hbm_fill is None:
            self._hbm_fill = [_without(_merged(spans), _merged(kept))
                              for spans, kept in zip(self._hbm_spans, self._kept)]
        for hbm, fill in zip(self.hbm, self._hbm_fill):
            for first, end in fill:
                hbm[first:end].fill(UNWRITTEN)
        for (mem, rank), reach in self._reach.items():
            self._on_chip(mem, rank)[:, :reach].fill(UNWRITTEN)

    def _on_chip(self, mem: Mem, rank: int) -> np.ndarray:
        arrays = self.sbuf if mem is Mem.SBUF else self.psum
        array = arrays[rank]
        if array is None:
            row = self.target.sbuf_partition_bytes if mem is Mem.SBUF else self.target.psum_partition_bytes
            array = arrays[rank] = np.full((self.target.partitions, row), UNWRITTEN, np.uint8)
        return array

    def view(self, o: Operand, rank: int) -> np.ndarray:
        """A numpy view of shape (partitions, *free sizes) on the bytes `o` addresses in `rank`'s memories."""
        size = o.dtype.size
        free_strides = tuple(stride * size for _, stride in o.dims)
        if o.mem is Mem.HBM:
            hbm = self.hbm[rank]
            first, end = o.byte_span()
            if end > hbm.size:
                raise AccessError(f"HBM access [{first}, {end}) past the {hbm.size} bytes of HBM")
            bound = self._bound_view(rank, first, end) if first < end else None
            if bound is None:
                self.touch(rank, first, end)
                base, offset = hbm, o.offset
            else:
                base, offset = bound[0], bound[1] + o.offset - first
            pstride = o.partition_stride * size
        else:
            array = self._on_chip(o.mem, rank)
            rows, row_bytes = array.shape
            first, last = o.partition_span
            if o.start_partition + o.num_partitions > rows or last >= row_bytes:
                raise AccessError(f"{o.mem.name} access partitions {o.start_partition}+{o.num_partitions}, "
                                  f"bytes [{first}, {last}] outside {rows} x {row_bytes}")
            self._reach[o.mem, rank] = max(self._reach.get((o.mem, rank), 0), last + 1)
            base, offset = array.reshape(-1), o.start_partition * row_bytes + o.offset
            pstride = row_bytes + o.partition_stride * size  # a DMA's skew of each row (isa/operand.py)
        try:
            return np.ndarray(o.shape, dtype=o.dtype.np, buffer=base, offset=offset,
                              strides=(pstride, *free_strides))
        except (ValueError, TypeError) as e:  # a shape numpy cannot represent, or one past the buffer
            raise AccessError(f"{o.mem.name} access of shape {list(o.shape)} at byte {o.offset}: {e}") from None

    def footprint(self, o: Operand, rank: int) -> tuple[tuple[str, int], np.ndarray]:
        """Where each element of `o` starts: (memory key, flat byte indices), for the race checker."""
        size = o.dtype.size
        grids = np.ix_(*(np.arange(n, dtype=np.int64) for n in o.shape))
        if o.mem is Mem.HBM:
            base, pstride = o.offset, o.partition_stride * size
        else:
            row_bytes = self.target.sbuf_partition_bytes if o.mem is Mem.SBUF else self.target.psum_partition_bytes
            base, pstride = o.start_partition * row_bytes + o.offset, row_bytes + o.partition_stride * size
        flat = base + grids[0] * pstride
        for grid, (_, stride) in zip(grids[1:], o.dims):
            flat = flat + grid * (stride * size)
        return (o.mem.name, rank), np.ravel(flat)


def _lazy_bytes(n: int) -> np.ndarray:
    """n zero bytes whose pages the kernel provides when first touched."""
    return np.frombuffer(mmap.mmap(-1, n), np.uint8) if n else np.zeros(0, np.uint8)


def _merged(spans: set[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, end in sorted(spans):
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((first, end))
    return merged


def _without(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of sorted disjoint `spans` outside sorted disjoint `holes`."""
    left: list[tuple[int, int]] = []
    k = 0
    for first, end in spans:
        while k < len(holes) and holes[k][1] <= first:
            k += 1
        j = k
        while first < end:
            if j == len(holes) or holes[j][0] >= end:
                left.append((first, end))
                break
            if holes[j][0] > first:
                left.append((first, holes[j][0]))
            first = max(first, holes[j][1])
            j += 1
    return left
