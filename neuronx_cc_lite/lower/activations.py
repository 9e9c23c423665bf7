"""Activation functions ScalarE has no single entry for, as short sequences of ScalarE and VectorE instructions
on the same tile: LeakyRelu, PRelu, HardSigmoid, HardSwish, Clip, Elu, Selu, Celu, ThresholdedRelu, Softsign,
Shrink."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from isa.operand import Engine
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import Operand, elementwise
from neuronx_cc_lite.lower.instr import act, fill, scratch, select, ts, tt
from neuronx_cc_lite.ops.attributes import clip_bounds, hard_sigmoid_attrs
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.ops.traits import FusedActivation, OpKind
from neuronx_cc_lite.tile.program import Program, TileAccess


def _negative_part_scaled(prog: Program, dst: TileAccess, x: TileAccess, slope: Operand) -> None:
    """dst = max(x, 0) + slope * min(x, 0): LeakyRelu and PRelu."""
    neg = scratch(prog, dst, "neg")
    if isinstance(slope, TileAccess):
        ts(prog, neg, x, AluOp.minimum, 0.0)
        tt(prog, neg, neg, slope, AluOp.multiply)
    else:
        ts(prog, neg, x, AluOp.minimum, 0.0, AluOp.multiply, slope)
    ts(prog, dst, x, AluOp.maximum, 0.0)
    tt(prog, dst, dst, neg, AluOp.add)


def _elu_negative(prog: Program, dst: TileAccess, x: TileAccess, alpha: float, inner_scale: float = 1.0) -> None:
    """dst = alpha * (exp(min(x, 0) * inner_scale) - 1): the negative branch of Elu, Selu and Celu (zero for
    x >= 0, and exp never sees a large positive argument)."""
    ts(prog, dst, x, AluOp.minimum, 0.0)
    act(prog, dst, dst, ActFunc.exp, scale=inner_scale)
    ts(prog, dst, dst, AluOp.subtract, 1.0, AluOp.multiply, alpha)


@lowering("LeakyRelu", floats=True, kind=OpKind.ELEMENTWISE)
def lower_leaky_relu(ctx: LowerCtx, node: Node) -> None:
    alpha = float(node.attrs.get("alpha", 0.01))
    elementwise(ctx, node, lambda prog, dst, s: _negative_part_scaled(prog, dst, s[0], alpha))


@lowering("PRelu", floats=True, since=7, kind=OpKind.ELEMENTWISE)
def lower_prelu(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, lambda prog, dst, s: _negative_part_scaled(prog, dst, s[0], s[1]))


def hard_sigmoid(prog: Program, dst: TileAccess, x: TileAccess, alpha: float, beta: TileAccess) -> None:
    """dst = min(relu(alpha * x + beta), 1), `beta` a column: ScalarE's relu (table-less; it may read x from PSUM
    as a convolution's epilogue does), then one VectorE pass."""
    act(prog, dst, x, ActFunc.relu, scale=alpha, bias=beta)
    ts(prog, dst, dst, AluOp.minimum, 1.0)


def hard_swish(prog: Program, dst: TileAccess, x: TileAccess, half: TileAccess) -> None:
    """dst = x * min(relu(x / 6 + 0.5), 1), `half` a column of 0.5: the relu on ScalarE (a table-less function),
    the rest in one VectorE instruction, so that VectorE and GpSimdE (which share an SBUF port) make one pass
    over the tile, not three. x may be in PSUM (a convolution's bank, its bias added by PE): VectorE then reads
    one input from each memory, at one element per cycle instead of two."""
    # (dense, as many elements a partition as dst: dst may be a region of a larger tile, a depthwise window)
    gate = prog.sbuf(dst.partitions, math.prod(n for n, _ in dst.dims), DType.fp32, "gate").ap()
    act(prog, gate, x, ActFunc.relu, scale=1 / 6, bias=half)
    prog.emit("scalar_tensor_tensor", Engine.DVE, dst=dst, src=gate, op0=AluOp.minimum, scalar=1.0,
              op1=AluOp.multiply, b=x)


def constant_column(ctx: LowerCtx, value: float, partitions: int) -> TileAccess:
    """A column of `value` on `partitions` partitions, from the program's column pool."""
    index = ctx.columns.add(np.full(ctx.program.target.partitions, value))
    return ctx.columns.column(index, partitions)


def hard_activation(ctx: LowerCtx, node: Node) -> Callable[[TileAccess, TileAccess], None] | None:
    """A fused epilogue's HardSwish, HardSigmoid or Clip (its `activation` attribute, passes/fuse_epilogues.py) as
    hard(dst, x): x a convolution's bank with its bias added by PE, or an evacuated result (a ConvEpilogue's in
    place, a MatMulEpilogue's fp32 one); None for any other activation."""
    activation = node.attrs.get("activation", "")
    prog = ctx.program
    if activation == "HardSwish":
        return lambda dst, x: hard_swish(prog, dst, x, constant_column(ctx, 0.5, dst.partitions))
    if activation in ("HardSigmoid", "HardSigmoid/unclamped"):
        alpha, beta = float(node.attrs["activation_alpha"]), float(node.attrs["activation_beta"])
        if activation == "HardSigmoid":
            return lambda dst, x: hard_sigmoid(prog, dst, x, alpha, constant_column(ctx, beta, dst.partitions))
        # (its reader clamps it at 1: passes/fuse_epilogues.py _clamp_gates_where_read)
        return lambda dst, x: act(prog, dst, x, ActFunc.relu, scale=alpha,
                                  bias=constant_column(ctx, beta, dst.partitions))
    if activation == "Clip":
        low, high = (float(node.attrs[k]) if k in node.attrs else None for k in ("activation_min", "activation_max"))
        return lambda dst, x: clip(prog, dst, x, low, high)
    return None


@lowering("HardSigmoid", floats=True, kind=OpKind.ELEMENTWISE, fused={"HardSigmoid": FusedActivation(None)})
def lower_hard_sigmoid(ctx: LowerCtx, node: Node) -> None:
    alpha, beta = hard_sigmoid_attrs(node.attrs)
    elementwise(ctx, node, lambda prog, dst, s: hard_sigmoid(prog, dst, s[0], alpha,
                                                             constant_column(ctx, beta, dst.partitions)))


@lowering("HardSwish", floats=True, kind=OpKind.ELEMENTWISE, fused={"HardSwish": FusedActivation(None)})
def lower_hard_swish(ctx: LowerCtx, node: Node) -> None:
    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        assert isinstance(s[0], TileAccess)
        hard_swish(prog, dst, s[0], constant_column(ctx, 0.5, dst.partitions))

    elementwise(ctx, node, compute)


def _check_clip(node: Node, g: Graph) -> str | None:
    bounds = clip_bounds(node, g)
    dtype = g.tensors[node.inputs[0]].dtype
    if dtype in (np.dtype(np.uint32), np.dtype(np.uint64), np.dtype(np.int64)) and any(
            b is not None and abs(b) >= 2**24 for b in bounds):
        return "integer bounds beyond the exact fp32 range"
    return None


def clip(prog: Program, dst: TileAccess, x: TileAccess, low: float | None, high: float | None) -> None:
    """dst = min(max(x, low), high), each bound where given: one VectorE instruction."""
    ops = [(AluOp.maximum, low), (AluOp.minimum, high)]
    ops = [(op, v) for op, v in ops if v is not None] or [(AluOp.add, 0.0)]
    (op0, s0), (op1, s1) = ops[0], ops[1] if len(ops) > 1 else (None, None)
    ts(prog, dst, x, op0, s0, op1, s1)  # type: ignore[arg-type]


# A Clip (ReLU6, as MobileNetV2 and EfficientNet-Lite export it) fuses into a matmul's or a convolution's
# epilogue as a hard activation: its bounds ride along (activation_min, activation_max)
@lowering("Clip", check=_check_clip, constant_inputs=(1, 2), kind=OpKind.ELEMENTWISE,
          fused={"Clip": FusedActivation(None)})
def lower_clip(ctx: LowerCtx, node: Node) -> None:
    low, high = clip_bounds(node, ctx.graph)

    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        assert isinstance(s[0], TileAccess)
        clip(prog, dst, s[0], low, high)

    elementwise(ctx, node, compute, inputs=[node.inputs[0]])


def _exponential_linear(alpha: float, inner_scale: float = 1.0, gamma: float = 1.0):  # type: ignore[no-untyped-def]
    """gamma * (max(x, 0) + alpha * (exp(min(x, 0) * inner_scale) - 1)): Elu, Selu (gamma) and Celu (inner
    scale 1/alpha)."""
    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        neg = scratch(prog, dst, "neg")
        _elu_negative(prog, neg, s[0], alpha, inner_scale)
        ts(prog, dst, s[0], AluOp.maximum, 0.0)
        tt(prog, dst, dst, neg, AluOp.add)
        if gamma != 1.0:
            ts(prog, dst, dst, AluOp.multiply, gamma)

    return compute


@lowering("Elu", floats=True, kind=OpKind.ELEMENTWISE)
def lower_elu(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, _exponential_linear(float(node.attrs.get("alpha", 1.0))))


@lowering("Selu", floats=True, kind=OpKind.ELEMENTWISE)
def lower_selu(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, _exponential_linear(float(node.attrs.get("alpha", 1.67326319217681884765625)),
                                               gamma=float(node.attrs.get("gamma", 1.05070102214813232421875))))


@lowering("Celu", floats=True, kind=OpKind.ELEMENTWISE)
def lower_celu(ctx: LowerCtx, node: Node) -> None:
    alpha = float(node.attrs.get("alpha", 1.0))
    elementwise(ctx, node, _exponential_linear(alpha, inner_scale=1.0 / alpha))


@lowering("ThresholdedRelu", floats=True, kind=OpKind.ELEMENTWISE)
def lower_thresholded_relu(ctx: LowerCtx, node: Node) -> None:
    alpha = float(node.attrs.get("alpha", 1.0))

    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        keep = scratch(prog, dst, "keep")
        ts(prog, keep, s[0], AluOp.greater, alpha)
        fill(prog, dst, 0.0)
        select(prog, dst, s[0], keep)

    elementwise(ctx, node, compute)


@lowering("Softsign", floats=True, kind=OpKind.ELEMENTWISE)
def lower_softsign(ctx: LowerCtx, node: Node) -> None:
    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        denominator = scratch(prog, dst, "den")
        act(prog, denominator, s[0], ActFunc.abs)
        ts(prog, denominator, denominator, AluOp.add, 1.0)
        tt(prog, dst, s[0], denominator, AluOp.divide)

    elementwise(ctx, node, compute)


@lowering("Shrink", floats=True, kind=OpKind.ELEMENTWISE)
def lower_shrink(ctx: LowerCtx, node: Node) -> None:
    """x - bias where x > lambd, x + bias where x < -lambd, else 0."""
    lambd, bias = float(node.attrs.get("lambd", 0.5)), float(node.attrs.get("bias", 0.0))

    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        x = s[0]
        mask = scratch(prog, dst, "mask")
        shifted = scratch(prog, dst, "shifted")
        fill(prog, dst, 0.0)
        ts(prog, mask, x, AluOp.greater, lambd)
        ts(prog, shifted, x, AluOp.subtract, bias)
        select(prog, dst, shifted, mask)
        ts(prog, mask, x, AluOp.less, -lambd)
        ts(prog, shifted, x, AluOp.add, bias)
        select(prog, dst, shifted, mask)

    elementwise(ctx, node, compute)
