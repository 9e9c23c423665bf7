"""Many small matrix products at once: a batched MatMul whose every product fits one PSUM bank a few times over.

    out[i] = func(alpha * A[i] @ B[i])      i over the batch axes; A[i] [m <= 64, k <= 128], B[i] [k, n <= 256]

Swin's window attention makes such products by the thousand (64 windows x 3 heads of 49 x 49 scores in its first
stage). Taken one at a time, each pays the fixed costs of its operands' turns out of PSUM and of its evacuation
for a few dozen columns: Swin-T spent more time in those instructions than in anything else. Here a group of
products shares everything but the matmuls themselves:

    A^T tiles   each product's rows turned on PE into one [k, G * m] tile: one copy out of PSUM a bank
    B tiles     each product's [k, n] side by side in one [k, G * n] tile (turned alike when read down K)
    products    G matmuls into one bank [m, G * n], side by side
    result      one evacuation (alpha, the activation); each product's part stored to its place

A group is a box of the batch axes, innermost whole first (tiling.chunk_sizes), so that its results lie together
in the result's layout (its rows on partitions, codegen/on_chip.py): the result tile becomes a region of the home.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import numpy as np

from isa.dtypes import DType
from isa.operand import Engine, Mem
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.instr import act
from neuronx_cc_lite.lower.operands import a_rows_along_k, b_rows_along_k
from neuronx_cc_lite.lower.tiling import chunk_sizes
from neuronx_cc_lite.lower.transpose import Piece, transpose_pieces
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Tile

if TYPE_CHECKING:
    from neuronx_cc_lite.lower.matmul import Epilogue


def fits(ctx: LowerCtx, a: object, b: object, epilogue: Epilogue, dtype: DType) -> bool:
    """Whether a batched product ([*batch, m, k] @ [*batch, k, n], operands computed at run time) goes in groups:
    one K tile, products of at most half the partitions' rows (a full-height one keeps the engines busy on its
    own, and one head at a time a product starts as soon as its own operands are ready, not the group's), at
    least two products a bank, an epilogue of alpha and a function alone, and, by the cost model, the evacuations
    a group saves outweigh what its first evacuation waits for (the group's other products). BERT's 128 x 128
    scores do not pay (grouped, BERT-base in fp32 ran 1,366.5 -> 1,430.4 us, the 4-head BERT-12 of
    benchmarks/run.py 273.3 -> 279.5); Swin's 49 x 49 do."""
    t = ctx.program.target
    if not isinstance(a, HbmView) or not isinstance(b, HbmView) or len(a.shape) < 3:
        return False
    (m, k), n = a.shape[-2:], b.shape[-1]
    e = epilogue
    plain = not e.addends and e.gate is None and e.bias is None and e.hard is None
    if not plain or math.prod(a.shape[:-2]) < 2 or 2 * m > t.partitions or k > t.partitions or \
            2 * n > t.psum_bank_fmax:
        return False
    count = min(math.prod(a.shape[:-2]), t.psum_bank_fmax // n)
    prog = ctx.program

    def out_of_psum(op: str, rows: int, columns: int, dt: DType) -> float:
        """An evacuation (op "activation") or a turn's copy ("tensor_copy") of [rows, columns] from PSUM."""
        extra = {"func": e.func, "scale": 1.0} if op == "activation" else {}
        return prog.cost_ns(op, Engine.ACT, dependent=True, dst=Tile(Mem.SBUF, rows, columns, dt, "out").ap(),
                            src=Tile(Mem.PSUM, rows, columns, dt, "acc").ap(), **extra)

    def saved(op: str, rows: int, columns: int, dt: DType) -> float:
        """What one instruction over the group's columns saves on `count` over one product's each (a bank of
        turns holds 2 KiB a partition of their type)."""
        banks = -(-count * columns * dt.size // t.psum_bank_bytes)
        return count * out_of_psum(op, rows, columns, dt) - banks * out_of_psum(op, rows, count * columns // banks, dt)

    def turn(rows: int, columns: int) -> float:
        return prog.cost_ns("nc_transpose", Engine.PE, dst=Tile(Mem.PSUM, columns, rows, dtype, "T").ap(),
                            src=Tile(Mem.SBUF, rows, columns, dtype, "rows").ap())

    pe = prog.cost_ns("nc_matmul", Engine.PE, dst=Tile(Mem.PSUM, m, n, DType.fp32, "acc").ap(),
                      stationary=Tile(Mem.SBUF, k, m, dtype, "A^T").ap(),
                      moving=Tile(Mem.SBUF, k, n, dtype, "B").ap(), accumulate=False)
    gain = saved("activation", m, n, DType.fp32)
    first_a, first_b = a.at((0,) * (len(a.shape) - 2)), b.at((0,) * (len(b.shape) - 2))
    if a_rows_along_k(first_a):
        pe, gain = pe + turn(m, k), gain + saved("tensor_copy", k, m, dtype)
    if b_rows_along_k(first_b):
        pe, gain = pe + turn(n, k), gain + saved("tensor_copy", k, n, dtype)
    return gain > (count - 1) * pe


def products(ctx: LowerCtx, a: HbmView, b: HbmView, out: HbmView, epilogue: Epilogue, dtype: DType) -> None:
    """out = epilogue(a @ b) over the batch axes, a group of products at a time."""
    prog, t = ctx.program, ctx.program.target
    batch, (m, k), n = a.shape[:-2], a.shape[-2:], b.shape[-1]
    name = prog.node
    chunks = chunk_sizes(batch, t.psum_bank_fmax // n)
    for starts in itertools.product(*(range(0, size, c) for size, c in zip(batch, chunks))):
        sizes = tuple(min(c, size - s) for size, c, s in zip(batch, chunks, starts))
        items = [tuple(s + i for s, i in zip(starts, index)) for index in np.ndindex(*sizes)]
        count = len(items)
        a_t = prog.sbuf(k, count * m, dtype, f"{name}/A^T")
        b_t = prog.sbuf(k, count * n, dtype, f"{name}/B")
        a_turns: list[Piece] = []
        b_turns: list[Piece] = []
        for i, index in enumerate(items):
            a_turns += _a_transposed(ctx, a.at(index), a_t, i * m, dtype)
            b_turns += _b_tile(ctx, b.at(index), b_t, i * n, dtype)
        transpose_pieces(prog, a_turns + b_turns, name)  # (a bank shares pieces of one destination in a row)
        acc = prog.psum(m, count * n, f"{name}/acc")
        for i in range(count):
            prog.emit("nc_matmul", Engine.PE, dst=acc.region(i * n, n), stationary=a_t.region(i * m, m, 0, k),
                      moving=b_t.region(i * n, n, 0, k), accumulate=False)
        res = prog.sbuf(m, count * n, out.dtype, f"{name}/out")
        act(prog, res.ap(), acc.ap(), epilogue.func, scale=epilogue.alpha)
        # stored a product at a time: on chip the parts become the home's region (codegen/on_chip._rename_parts),
        # nothing moves; in HBM each partition's row of a product is whole (one store of the group would cut a
        # row of the result tile into a product's pieces, each shorter than the row)
        for i, index in enumerate(items):
            prog.dma(out.at(index), res.region(i * n, n))


def _a_transposed(ctx: LowerCtx, a: HbmView, at: Tile, offset: int, dtype: DType) -> list[Piece]:
    """A^T [k, m] into `at` from column `offset`: read as it is when K is on partitions already, else the rows
    loaded and returned as a piece to turn."""
    prog = ctx.program
    m, k = a.shape
    if not a_rows_along_k(a):  # K on partitions already
        prog.dma(at.region(offset, m, 0, k), a.transpose((1, 0)))
        return []
    rows = prog.sbuf(m, k, dtype, f"{prog.node}/A")
    prog.dma(rows.ap(), a)
    return [Piece(rows.ap(), at, offset)]


def _b_tile(ctx: LowerCtx, b: HbmView, bt: Tile, offset: int, dtype: DType) -> list[Piece]:
    """B [k, n] into `bt` from column `offset`: as it is when its rows run along N (or K is on partitions),
    else loaded as B^T [n, k] and returned as a piece to turn."""
    prog = ctx.program
    k, n = b.shape
    if not b_rows_along_k(b):
        prog.dma(bt.region(offset, n, 0, k), b)
        return []
    rows = prog.sbuf(n, k, dtype, f"{prog.node}/B^T")
    prog.dma(rows.ap(), b.transpose((1, 0)))
    return [Piece(rows.ap(), bt, offset)]

