"""Constant vectors laid out with their elements on partitions, for every operator of the program at once.

A feature-major operator needs its per-feature constants (a bias, LayerNorm's gamma and beta) as columns: element
f of the vector on partition f % pmax. Loaded vector by vector, each column costs a DMA of pmax one-element pieces
(3.4 us for 512 bytes). The pool instead gathers every vector the lowerings ask for into one weight tensor, laid
out partition by partition, and loads it at the start of the program in a few large transfers: a column is then a
slice of one resident tile.
"""

from __future__ import annotations

import numpy as np

from isa.dtypes import DType
from isa.operand import Engine
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.declared import contiguous
from neuronx_cc_lite.tile.program import HbmAccess, PendingInstr, Program, Tile, TileAccess

COLUMNS_PER_LOAD = 64  # 256 bytes per partition per transfer: a few transfers for a whole transformer


class ColumnPool:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.tile: Tile | None = None
        self.columns: list[np.ndarray] = []  # each [pmax] fp32
        self.known: dict[bytes, int] = {}

    def add(self, vector: np.ndarray) -> int:
        """The index of the vector's first column (features 0 .. pmax-1; then the next column, and so on)."""
        pmax = self.program.target.partitions
        vector = contiguous(vector, dtype=np.float32).reshape(-1)
        key = vector.tobytes()
        if key not in self.known:
            self.known[key] = len(self.columns)
            for c0 in range(0, vector.size, pmax):
                column = np.zeros(pmax, np.float32)
                part = vector[c0:c0 + pmax]
                column[:part.size] = part
                self.columns.append(column)
        if self.tile is None:
            self.tile = self.program.sbuf(pmax, 1, DType.fp32, "columns")
        return self.known[key]

    def column(self, index: int, partitions: int) -> TileAccess:
        assert self.tile is not None
        return TileAccess(self.tile, 0, partitions, index, ((1, 1),))

    def finish(self) -> None:
        """Size the tile and load it first thing."""
        if self.tile is None:
            return
        prog, pmax = self.program, self.program.target.partitions
        count = len(self.columns)
        self.tile.free = count
        data = np.stack(self.columns, axis=1)  # [pmax, count]: partition p holds element p of every column
        tensor = prog.hbm_tensor("columns", data.nbytes, TensorKind.WEIGHT, DType.fp32, data.tobytes())
        loads = []
        for c0 in range(0, count, COLUMNS_PER_LOAD):
            cn = min(COLUMNS_PER_LOAD, count - c0)
            loads.append(PendingInstr("dma_copy", Engine.DMA, 0, {
                "dst": TileAccess(self.tile, 0, pmax, c0, ((cn, 1),)),
                "src": HbmAccess(tensor, DType.fp32, pmax, count, c0, ((cn, 1),))}, ""))
        prog.instrs[0:0] = loads
