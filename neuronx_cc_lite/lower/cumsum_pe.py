"""CumSum along an axis that is not the last, on the Tensor engine.

A running sum over a sequence ([.., S, D], summed along S: a scan layer's torch.cumsum over time) would put S in
the free dimension and D on partitions, which reads a row-major tensor one element per DMA piece. Instead S stays
on partitions, 128 steps a block, and each block of the result is two matmuls into one PSUM bank:

    out[block b] = U.T @ x[block b] + ONES.T @ carry[b]      carry[b] = x[block 0] + ... + x[block b - 1]

where U[k, m] = 1 when k <= m (the sums within the block) and ONES is all ones (the carry's column sums, on every
row). The carry is a running tile GpSimd adds each block into (fp32: a bf16 input's sums would round; GpSimd,
as VectorE is usually busy making the blocks, a scan layer's gating), so the Tensor engine does two matmuls a block
instead of one per earlier block, and only the block and the carry are kept. The matmuls read the input in its own
type (products by one are exact) and add in fp32 PSUM; the blocks' loads and stores move whole rows of D. Taken
when the input is float, inclusive and forward, and a block and its carry fit a share of SBUF; else the scan along
the free axis (cumsum.py).
"""

from __future__ import annotations

import math

import numpy as np

from isa.dtypes import DType
from isa.functions import AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.instr import copy, tt
from neuronx_cc_lite.tile.hbm import HbmView

# Types PE multiplies by one exactly (a bf16 input under auto-cast stays bf16: its sums still add in fp32).
FLOATS = frozenset({DType.fp32, DType.bf16, DType.fp16})
# Bytes per partition a block and its carry may take.
KEPT_SHARE = 1 / 8


def cumsum_on_pe(ctx: LowerCtx, node: Node, axis: int) -> bool:
    """Lower the CumSum as above; False (nothing emitted) when it does not apply."""
    prog = ctx.program
    x = ctx.view(node.inputs[0])
    shape, pmax = x.shape, prog.target.partitions
    exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))
    out_dtype = ctx.dtype(node.outputs[0])
    if exclusive or reverse or axis >= len(shape) - 1 or x.dtype not in FLOATS or out_dtype not in FLOATS or \
            shape[axis] <= 1 or not x.is_contiguous:
        return False
    batch, steps, width = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    blocks = [(s0, min(pmax, steps - s0)) for s0 in range(0, steps, pmax)]
    if width * (x.dtype.size + DType.fp32.size) > prog.target.sbuf_partition_bytes * KEPT_SHARE:
        return False
    out = ctx.output(node.outputs[0], (axis, axis + 1))  # its rows, S, on partitions: how it is written
    rows_in = x.reshape((batch, steps, width))
    rows_out = out.reshape((batch, steps, width))
    assert rows_in is not None and rows_out is not None
    upper = _triangle(ctx, node.name, x.dtype)
    bank = prog.target.psum_bank_fmax
    for b in range(batch):
        carry = previous = None  # the sum of the blocks before `previous`; the block before this one
        for s0, n in blocks:
            tile = prog.sbuf(n, width, x.dtype, f"{node.name}/x")
            prog.dma(tile.ap(), _rows(rows_in, b, s0, n))
            if previous is not None:  # every earlier block is whole: pmax rows
                carry = previous if carry is None else _add(ctx, node.name, carry, previous)
            for d0 in range(0, width, bank):
                dn = min(bank, width - d0)
                acc = prog.psum(n, dn, f"{node.name}/acc")
                if carry is not None:
                    ones = prog.ones(carry.dtype)
                    prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=ones.ap(((n, 1),), 0, 0, pmax),
                              moving=carry.ap(((dn, 1),), d0), accumulate=False)
                prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=upper.ap(((n, 1),), 0, 0, n),
                          moving=tile.ap(((dn, 1),), d0), accumulate=carry is not None)
                result = prog.sbuf(n, dn, out_dtype, node.outputs[0])
                copy(prog, result.ap(), acc.ap(), Engine.ACT)
                prog.dma(HbmView(rows_out.tensor, out_dtype, (n, dn), (width, 1),
                                 rows_out.offset + (b * steps + s0) * width + d0), result.ap())
            previous = tile
    return True


def _add(ctx: LowerCtx, name: str, carry, block):  # type: ignore[no-untyped-def]
    """A new fp32 tile carry + block (a new tile, not in place: the matmuls of the block before still read
    the old carry)."""
    total = ctx.program.sbuf(carry.partitions, carry.free, DType.fp32, f"{name}/carry")
    tt(ctx.program, total.ap(), carry.ap(), block.ap(), AluOp.add, Engine.POOL)
    return total


def _rows(view: HbmView, b: int, s0: int, n: int) -> HbmView:
    """Rows s0 .. s0 + n of batch row b, [n, width]."""
    _, steps, width = view.shape
    return HbmView(view.tensor, view.dtype, (n, width), (width, 1), view.offset + (b * steps + s0) * width)


def _triangle(ctx: LowerCtx, name: str, dtype: DType):  # type: ignore[no-untyped-def]
    """U [pmax, pmax], U[k, m] = 1 when k <= m, loaded once (a constant of the compiler, not of the model: the
    roofline does not count it)."""
    pmax = ctx.program.target.partitions
    const = ctx.constant(f"{name}/upper", np.triu(np.ones((pmax, pmax), np.float32)))
    view = ctx.view(const)
    view.tensor.needed = 0
    tile = ctx.program.sbuf(pmax, pmax, dtype, f"{name}/upper")
    ctx.program.dma(tile.ap(), view)
    return tile
