"""BatchNormalization in inference mode, where passes/fold_batchnorm.py could not fold it into a Conv or Gemm:

    y = x * scale + shift,   scale = gamma / sqrt(var + epsilon),   shift = beta - mean * scale   (per channel)

Channels go on partitions, so scale and shift are [P, 1] operands and each tile is one VectorE tensor_scalar
(multiply, then add). With constant statistics, scale and shift are computed at compile time and loaded as one
[C, 2] constant; otherwise the device computes them: VectorE adds epsilon, ScalarE takes the reciprocal square
root (a transcendental: ScalarE's job), VectorE does the rest.
"""

from __future__ import annotations

import math

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from isa.target import Target
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.patterns import contiguous
from neuronx_cc_lite.ops.attributes import inference_only, scale_shift
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.tile.hbm import HbmView
from neuronx_cc_lite.tile.program import Program, TileAccess


def _check(node: Node, g: Graph) -> str | None:
    x = g.tensors[node.inputs[0]]
    if not np.issubdtype(x.dtype, np.floating):
        return f"BatchNormalization on {x.dtype} tensors is not supported (floating point only)"
    if len(x.shape) < 2:
        return f"BatchNormalization needs an input of rank 2 or more, got {len(x.shape)}"
    return inference_only(node)


def tile_budget(target: Target) -> int:
    """fp32 elements per partition of one tile: a sixteenth of a partition, so that loads, the multiply-add and
    stores of several tiles overlap."""
    return target.sbuf_partition_bytes // 16 // 4


def _device_scale_shift(prog: Program, params: list[HbmView], c0: int, ct: int, epsilon: float,
                        name: str) -> tuple[TileAccess, TileAccess]:
    """scale and shift [ct, 1] computed on the chip from gamma, beta, mean and var."""
    t = prog.sbuf(ct, 6, DType.fp32, f"{name}/stats")
    gamma, beta, mean, var, scale, shift = (t.ap(((1, 1),), k) for k in range(6))
    for k, p in enumerate(params):
        prog.dma(t.ap(((1, 1),), k), HbmView(p.tensor, p.dtype, (ct, 1), (p.strides[0], 1),
                                              p.offset + c0 * p.strides[0]))
    prog.emit("tensor_scalar", Engine.DVE, dst=var, src=var, op0=AluOp.add, scalar0=float(epsilon),
              reverse0=False, reverse1=False)
    prog.emit("activation", Engine.ACT, dst=scale, src=var, func=ActFunc.rsqrt, scale=1.0)
    prog.emit("tensor_tensor", Engine.DVE, dst=scale, a=scale, b=gamma, op=AluOp.multiply)
    prog.emit("tensor_tensor", Engine.DVE, dst=shift, a=mean, b=scale, op=AluOp.multiply)
    prog.emit("tensor_tensor", Engine.DVE, dst=shift, a=beta, b=shift, op=AluOp.subtract)
    return scale, shift


@lowering("BatchNormalization", check=_check, since=7)
def lower_batchnorm(ctx: LowerCtx, node: Node) -> None:
    prog, pmax = ctx.program, ctx.program.target.partitions
    x = contiguous(prog, ctx.view(node.inputs[0]), node.name)
    out = ctx.output(node.outputs[0])
    batch, channels = x.shape[:2]
    size = math.prod(x.shape[2:])
    x3, out3 = x.reshape((batch, channels, size)), out.reshape((batch, channels, size))
    assert x3 is not None and out3 is not None
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    names = node.inputs[1:5]
    constants = [ctx.graph.tensors[n] for n in names]
    table = None
    if all(t.is_constant for t in constants):
        table = ctx.view(ctx.constant(f"{node.name}/scale_shift", np.stack(
            scale_shift([t.value for t in constants], epsilon), axis=1).astype(np.float32)))
    budget = tile_budget(prog.target)
    per_image = min(size, budget)
    images = max(1, min(batch, budget // size)) if size <= budget else 1
    for c0 in range(0, channels, pmax):
        ct = min(pmax, channels - c0)
        if table is not None:
            t = prog.sbuf(ct, 2, DType.fp32, f"{node.name}/scale_shift")
            prog.dma(t.ap(), table.slice(0, c0, c0 + ct))
            scale, shift = t.ap(((1, 1),), 0), t.ap(((1, 1),), 1)
        else:
            scale, shift = _device_scale_shift(prog, [ctx.view(n) for n in names], c0, ct, epsilon, node.name)
        for n0 in range(0, batch, images):
            nb = min(images, batch - n0)
            for s0 in range(0, size, per_image):
                sb = min(per_image, size - s0)
                box = ((n0, c0, s0), (nb, ct, sb))
                t = prog.sbuf(ct, nb * sb, DType.fp32, f"{node.name}/x")
                prog.dma(t.ap(), x3.box(*box).transpose((1, 0, 2)))
                prog.emit("tensor_scalar", Engine.DVE, dst=t.ap(), src=t.ap(), op0=AluOp.multiply, scalar0=scale,
                          reverse0=False, op1=AluOp.add, scalar1=shift, reverse1=False)
                prog.dma(out3.box(*box).transpose((1, 0, 2)), t.ap())
