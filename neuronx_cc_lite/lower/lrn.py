"""LRN (local response normalisation across channels), as in AlexNet and Inception v1:

    y = x / (bias + alpha / size * sum of x^2 over the `size` neighbouring channels) ** beta

With channels on partitions, the sum over neighbouring channels is a sum across partitions, which is what the
Tensor engine does: PSUM[c, f] = sum over c' of band[c', c] * x^2[c', f], with a constant 0/1 band matrix as the
stationary operand. ScalarE scales and shifts the sums on their way out of PSUM; GpSimdE raises them to -beta.
"""

from __future__ import annotations

import math

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.instr import act, ts, tt
from neuronx_cc_lite.lower.patterns import contiguous
from neuronx_cc_lite.ops.registry import lowering


def _check(node: Node, g: Graph) -> str | None:
    if len(g.tensors[node.inputs[0]].shape) < 3:
        return "LRN needs an input of shape [N, C, ...]"
    return None


@lowering("LRN", check=_check, floats=True)
def lower_lrn(ctx: LowerCtx, node: Node) -> None:
    prog, t = ctx.program, ctx.program.target
    size = int(node.attrs["size"])
    alpha, beta = float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("beta", 0.75))
    bias = float(node.attrs.get("bias", 1.0))
    x = ctx.view(node.inputs[0])
    n, c = x.shape[:2]
    spatial = math.prod(x.shape[2:])
    x3 = contiguous(prog, x, node.name).reshape((n, c, spatial))
    out = ctx.output(node.outputs[0]).reshape((n, c, spatial))
    assert x3 is not None and out is not None
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    channel = np.arange(c)
    band = ((channel[:, None] >= channel[None, :] - lo) & (channel[:, None] <= channel[None, :] + hi))
    band_view = ctx.view(ctx.constant(f"{node.name}/band", band.astype(np.float32)))
    tiles = [(c0, min(t.partitions, c - c0)) for c0 in range(0, c, t.partitions)]
    bands = {}
    for (i0, it) in tiles:  # the band blocks that are not all zero: (input tile, output tile) -> SBUF tile
        for (o0, ot) in tiles:
            if band[i0:i0 + it, o0:o0 + ot].any():
                b = prog.sbuf(it, ot, DType.fp32, f"{node.name}/band")
                prog.dma(b.ap(), band_view.box((i0, o0), (it, ot)))
                bands[i0, o0] = b
    for batch in range(n):
        for f0 in range(0, spatial, t.psum_bank_fmax):
            ft = min(t.psum_bank_fmax, spatial - f0)
            xs, squares = {}, {}
            for i0, it in tiles:
                xt = prog.sbuf(it, ft, DType.fp32, f"{node.name}/x")
                prog.dma(xt.ap(), x3.at((batch,)).box((i0, f0), (it, ft)))
                sq = prog.sbuf(it, ft, DType.fp32, f"{node.name}/x^2")
                act(prog, sq.ap(), xt.ap(), ActFunc.square)
                xs[i0], squares[i0] = xt, sq
            for o0, ot in tiles:
                acc = prog.psum(ot, ft, f"{node.name}/sum")
                sources = [i0 for i0, _ in tiles if (i0, o0) in bands]
                for k, i0 in enumerate(sources):
                    prog.emit("nc_matmul", Engine.PE, dst=acc.ap(), stationary=bands[i0, o0].ap(),
                              moving=squares[i0].ap(), accumulate=k > 0)
                scale = prog.sbuf(ot, ft, DType.fp32, f"{node.name}/scale")
                ts(prog, scale.ap(), acc.ap(), AluOp.multiply, alpha / size, AluOp.add, bias)
                ts(prog, scale.ap(), scale.ap(), AluOp.power, -beta, engine=Engine.POOL)
                y = prog.sbuf(ot, ft, out.dtype, f"{node.name}/y")
                tt(prog, y.ap(), xs[o0].ap(), scale.ap(), AluOp.multiply)
                prog.dma(out.at((batch,)).box((o0, f0), (ot, ft)), y.ap())
