"""What follows a convolution's matmuls, per PSUM bank of outputs (output channels on partitions).

    plain         ScalarE evacuates the bank adding the bias (a [P, 1] column: of the program's column pool when
                  constant, lower/columns.py) and applying Relu, Tanh or Sigmoid
    residual      VectorE adds bias and residual as the bank leaves (a ConvEpilogue, passes/fuse_epilogues.py),
                  then ScalarE the activation
    hard          HardSwish or HardSigmoid (lower/activations.py) on the evacuated block; or, under auto-cast with
                  a constant bias and no residual, on the bank itself: PE adds the bias as it accumulates (three
                  bf16 rows summing to it exactly against ones, lower/operands.bias_rows), no evacuation pass
then DMA stores the block. A bank may hold several parts, each (block of outputs, first partition, first output
channel, channels): a plain convolution has one over its partitions; a depthwise convolution over few channels
stacks bands of output rows on the partitions (lower/depthwise.py), one part per band.
"""

from __future__ import annotations

import math

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.instructions import pe_rate
from isa.operand import Engine
from neuronx_cc_lite.declared import is_declared
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.activations import hard_activation
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.instr import act
from neuronx_cc_lite.lower.operands import bias_rows
from neuronx_cc_lite.lower.windows import Block
from neuronx_cc_lite.ops.registry import fused_function
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, Tile, TileAccess

Part = tuple[Block, int, int, int]  # (outputs, first partition, first output channel, channels)


def pe_has_room(prog: Program) -> bool:
    """Whether PE has room for the bias matmul: when matmuls run at the bf16 rate or faster. With fp32 operands
    (four passes) PE is a convolution network's busiest engine (MobileNetV3-Small in fp32: 223 us of PE against 63
    of ScalarE; adding the bias on PE there cost 3 us, 280.3 -> 283.5, where in bf16 it gained 13.6)."""
    return pe_rate(prog.operand_dtype(DType.fp32), prog.target) >= 1


class Epilogue:
    """The epilogue of one convolution node; `repeat`: the bias repeated that many times down the partitions
    (bands of a depthwise convolution), of output channels `channels` (first, count; all by default), into the
    output another epilogue of the node made (`out`), else a new one."""

    def __init__(self, ctx: LowerCtx, node: Node, repeat: int = 1, channels: tuple[int, int] | None = None,
                 out: HbmView | None = None) -> None:
        self.ctx, self.node = ctx, node
        self.out = out or ctx.output(node.outputs[0], (1, 2))  # output channels on partitions
        self.bias = ctx.view(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        self.residual = ctx.view(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
        self.func = fused_function(node.attrs.get("activation", ""))  # a hard one: after it
        self.hard = hard_activation(ctx, node)
        value = ctx.graph.tensors[node.inputs[2]].value if self.bias is not None else None
        # a hard activation after a constant bias (or none), without a residual, reads the bank itself
        self.direct = self.hard is not None and self.residual is None and \
            (self.bias is None or value is not None) and pe_has_room(ctx.program)
        self.pe_bias: tuple[Tile, Tile] | None = None
        if self.direct and value is not None:
            prog = ctx.program
            first, count = channels or (0, len(value))
            rows = bias_rows(ctx, np.tile(np.asarray(value).reshape(-1)[first:first + count], repeat),
                             f"{node.name}/bias{first or ''}")
            ones = prog.filled(rows.partitions, min(prog.target.psum_bank_fmax, prog.target.gemm_moving_fmax),
                               rows.dtype, 1.0)
            self.pe_bias = rows, ones

    def bias_column(self, partitions: int, parts: list[tuple[int, int, int]]) -> TileAccess | None:
        """The bias as a [partitions, 1] column, for each (first partition, first output channel, channels);
        None when there is none or PE adds it."""
        if self.bias is None or self.direct:
            return None
        prog, bias = self.ctx.program, self.bias
        value = self.ctx.graph.tensors[self.node.inputs[2]].value
        if value is not None and not is_declared(value):
            # a constant (a folded batch norm's): a column of the program's resident pool, where a [P, 1] load per
            # output tile is P one-element pieces and a DMA latency (ResNet-50: 823 of them)
            column = np.zeros(partitions, np.float32)
            for first, co0, count in parts:
                column[first:first + count] = np.asarray(value, np.float32).reshape(-1)[co0:co0 + count]
            return self.ctx.columns.column(self.ctx.columns.add(column), partitions)
        tile = prog.sbuf(partitions, 1, DType.fp32, f"{self.node.name}/bias")
        for first, co0, count in parts:
            prog.dma(tile.ap(((1, 1),), 0, first, count),
                     HbmView(bias.tensor, bias.dtype, (count, 1), (bias.strides[0], 1),
                             bias.offset + co0 * bias.strides[0]))
        return tile.ap()

    def finish_side_by_side(self, bank: Tile, block: Block, tiles: list[tuple[int, int]]) -> None:
        """After the matmuls of several output tiles (first output channel, channels), tile t's in the bank's
        columns t * block.size ..: PE adds each tile's bias, the hard activation runs once over the whole bank
        (the partitions a short last tile leaves are computed and never stored), and each tile is stored."""
        assert self.direct and self.hard is not None
        size = block.size
        for t, (co0, mt) in enumerate(tiles):
            self._add_bias(bank.ap(((size, 1),), t * size, 0, mt), co0)
        res = self.ctx.program.sbuf(bank.partitions, bank.free, DType.fp32, f"{self.node.name}/y")
        self.hard(res.ap(), bank.ap())
        for t, (co0, mt) in enumerate(tiles):
            self._store(block, co0, res.ap(((size, 1),), t * size, 0, mt))

    def _add_bias(self, bank: TileAccess, row0: int) -> None:
        """PE adds the bias as the bank accumulates (psum[m, n] += sum over rows r of bias_r[m] * 1), the bias
        rows' column row0 on the bank's first partition; nothing without a bias."""
        if self.pe_bias is None:
            return
        rows, ones = self.pe_bias
        columns = math.prod(n for n, _ in bank.dims)
        self.ctx.program.emit("nc_matmul", Engine.PE, dst=bank, stationary=rows.ap(((bank.partitions, 1),), row0),
                              moving=ones.ap(((columns, 1),)), accumulate=True)

    def _store(self, block: Block, co0: int, src: TileAccess) -> None:
        """The block's outputs of channels co0 .. (src's partitions) from `src`."""
        spatial = tuple(range(2, 2 + len(block.counts)))
        box = self.out.box((block.n0, co0, *block.starts), (block.images, src.partitions, *block.counts))
        self.ctx.program.dma(box.transpose((1, 0, *spatial)), src)

    def can_sum(self) -> bool:
        """Whether finish can also give each partition's sum of its results (`sums`): where the last instruction
        is ScalarE's evacuation (no residual, no hard activation)."""
        return self.residual is None and self.hard is None

    def finish_into(self, acc: Tile, column: TileAccess | None, dst: TileAccess, row0: int = 0,
                    sums: TileAccess | None = None) -> None:
        """After the block's matmuls: the bank's results written to `dst` (as many elements a partition, in the
        order of the bank's columns; a region of the tile its consumer reads, a depthwise window) instead of
        stored; with `sums` ([P, 1], where self.can_sum()), each partition's sum of them too. Not for a residual
        epilogue."""
        assert self.residual is None and (sums is None or self.can_sum())
        prog = self.ctx.program
        if self.direct:
            assert self.hard is not None
            self._add_bias(acc.ap(), row0)
            self.hard(dst, acc.ap())
            return
        act(prog, dst, acc.ap(), self.func, bias=column, reduce=sums)
        if self.hard is not None:
            self.hard(dst, dst)

    def finish(self, acc: Tile, column: TileAccess | None, parts: list[Part], row0: int = 0,
               sums: TileAccess | None = None) -> None:
        """After the block's matmuls: the bank (all its partitions and columns) to each part's outputs. `row0`:
        the bias rows' first column for the bank's partition 0 (its first output channel); `sums`: as for
        finish_into."""
        prog, name, residual = self.ctx.program, self.node.name, self.residual
        spatial = tuple(range(2, 2 + len(parts[0][0].counts)))
        res = prog.sbuf(acc.partitions, acc.free, DType.fp32, f"{name}/y")
        if residual is None:
            self.finish_into(acc, column, res.ap(), row0, sums)
        else:  # (psum + bias) + residual as the bank leaves, then the activation
            extra = prog.sbuf(acc.partitions, acc.free, residual.dtype, f"{name}/residual")
            if len(parts) > 1 or parts[0][0].size < acc.free:  # the bank's columns no part covers are read too
                prog.emit("memset", Engine.POOL, dst=extra.ap(), value=0.0)
            for block, first, co0, count in parts:
                prog.dma(extra.ap(((block.size, 1),), 0, first, count),
                         residual.box((block.n0, co0, *block.starts),
                                      (block.images, count, *block.counts)).transpose((1, 0, *spatial)))
            prog.emit("scalar_tensor_tensor", Engine.DVE, dst=res.ap(), src=acc.ap(), op0=AluOp.add,
                      scalar=column if column is not None else 0.0, op1=AluOp.add, b=extra.ap())
            if self.func is not ActFunc.copy:
                prog.emit("activation", Engine.ACT, dst=res.ap(), src=res.ap(), func=self.func, scale=1.0)
            if self.hard is not None:
                self.hard(res.ap(), res.ap())
        for block, first, co0, count in parts:
            self._store(block, co0, res.ap(((block.size, 1),), 0, first, count))
