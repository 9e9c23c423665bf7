"""The memories of a chip: HBM, and per core SBUF and PSUM, each a byte array.

Operands become numpy views into these arrays once, at load, after a bounds check; instructions then read and
write through the views. SBUF and PSUM are filled with 0xFF bytes before every run, which reads as NaN in every
float type (and -1 in signed ints), so that reading a byte nobody wrote shows in the result. Only the bytes some
view reaches need filling again: no instruction touches the others.
"""

from __future__ import annotations

import numpy as np

from isa.operand import Mem, Operand
from isa.target import Target
from runtime.errors import AccessError

UNWRITTEN = 0xFF


class ChipMemory:
    def __init__(self, target: Target, hbm_size: int, cores: int) -> None:
        self.hbm = np.full(hbm_size, UNWRITTEN, dtype=np.uint8)
        self.sbuf = [np.full((target.partitions, target.sbuf_partition_bytes), UNWRITTEN, np.uint8)
                     for _ in range(cores)]
        self.psum = [np.full((target.partitions, target.psum_partition_bytes), UNWRITTEN, np.uint8)
                     for _ in range(cores)]
        # (memory, core) -> how far into a partition row some view reaches: the bytes a run may have touched
        self._reach = {(mem, core): 0 for mem in (Mem.SBUF, Mem.PSUM) for core in range(cores)}

    def clear_on_chip(self) -> None:
        for (mem, core), reach in self._reach.items():
            (self.sbuf if mem is Mem.SBUF else self.psum)[core][:, :reach].fill(UNWRITTEN)

    def view(self, o: Operand, core: int) -> np.ndarray:
        """A numpy view of shape (partitions, *free sizes) on the bytes `o` addresses."""
        size = o.dtype.size
        free_strides = tuple(stride * size for _, stride in o.dims)
        if o.mem is Mem.HBM:
            first, end = o.byte_span()
            if end > self.hbm.size:
                raise AccessError(f"HBM access [{first}, {end}) past the {self.hbm.size} bytes of HBM")
            base, offset, pstride = self.hbm, o.offset, o.partition_stride * size
        else:
            array = self.sbuf[core] if o.mem is Mem.SBUF else self.psum[core]
            rows, row_bytes = array.shape
            first, last = o.partition_span
            if o.start_partition + o.num_partitions > rows or last >= row_bytes:
                raise AccessError(f"{o.mem.name} access partitions {o.start_partition}+{o.num_partitions}, "
                                  f"bytes [{first}, {last}] outside {rows} x {row_bytes}")
            self._reach[o.mem, core] = max(self._reach[o.mem, core], last + 1)
            base, offset, pstride = array.reshape(-1), o.start_partition * row_bytes + o.offset, row_bytes
        try:
            return np.ndarray(o.shape, dtype=o.dtype.np, buffer=base, offset=offset,
                              strides=(pstride, *free_strides))
        except (ValueError, TypeError) as e:  # a shape numpy cannot represent, or one past the buffer
            raise AccessError(f"{o.mem.name} access of shape {list(o.shape)} at byte {o.offset}: {e}") from None

    def footprint(self, o: Operand, core: int) -> tuple[tuple[str, int], np.ndarray]:
        """Where each element of `o` starts: (memory key, flat byte indices), for the race checker."""
        size = o.dtype.size
        grids = np.ix_(*(np.arange(n, dtype=np.int64) for n in o.shape))
        if o.mem is Mem.HBM:
            key, base, pstride = ("HBM", 0), o.offset, o.partition_stride * size
        else:
            row_bytes = (self.sbuf if o.mem is Mem.SBUF else self.psum)[core].shape[1]
            key, base, pstride = (o.mem.name, core), o.start_partition * row_bytes + o.offset, row_bytes
        flat = base + grids[0] * pstride
        for grid, (_, stride) in zip(grids[1:], o.dims):
            flat = flat + grid * (stride * size)
        return key, np.ravel(flat)
