"""Comparisons, logic and selection: Equal, Less, Greater (and -OrEqual), And, Or, Xor, Not, Bitwise*, BitShift,
IsNaN, IsInf, Where.

The ALU writes 1.0 or 0.0 for a comparison; ONNX bool tensors live on the device as uint8 0/1, which the cast on
write produces. Where copies one branch, then the other under the condition (`tensor_copy_predicated`), so
neither branch's infinities or NaNs leak into the other as an arithmetic blend would let them.
"""

from __future__ import annotations

import numpy as np

from isa.functions import AluOp
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import Operand, elementwise, fold, in_limbs, small_integers_ok
from neuronx_cc_lite.lower.instr import copy, fill, select, ts, tt
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.tile.program import Program, TileAccess

COMPARISONS = {"Equal": AluOp.equal, "Less": AluOp.less, "LessOrEqual": AluOp.less_equal,
               "Greater": AluOp.greater, "GreaterOrEqual": AluOp.greater_equal}
LOGICAL = {"And": AluOp.logical_and, "Or": AluOp.logical_or, "Xor": AluOp.logical_xor}
BITWISE = {"BitwiseAnd": AluOp.bitwise_and, "BitwiseOr": AluOp.bitwise_or, "BitwiseXor": AluOp.bitwise_xor}
_NARROW_INTS = {np.dtype(t) for t in (np.int8, np.int16, np.uint8, np.uint16, np.bool_)}
_BIT_INTS = _NARROW_INTS | {np.dtype(t) for t in (np.int32, np.uint32, np.int64)}


@lowering(*COMPARISONS, check=small_integers_ok, since=7, kind=OpKind.ELEMENTWISE)
def lower_comparison(ctx: LowerCtx, node: Node) -> None:
    if not in_limbs(ctx, node):
        elementwise(ctx, node, fold(COMPARISONS[node.op]))


@lowering(*LOGICAL, since=7, kind=OpKind.ELEMENTWISE)
def lower_logical(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, fold(LOGICAL[node.op]))


@lowering("Not", kind=OpKind.ELEMENTWISE)
def lower_not(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, lambda prog, dst, s: ts(prog, dst, s[0], AluOp.equal, 0.0))


def _check_bitvec(node: Node, g: Graph) -> str | None:
    """The ALU's bit-vector operators read integer tiles' bits: every integer type the device holds (int64 as
    int32, as everywhere)."""
    for name in (*node.inputs, *node.outputs):
        if name and g.tensors[name].dtype not in _BIT_INTS:
            return f"{node.op} on {g.tensors[name].dtype} is not supported (integers of up to 32 bits, and int64)"
    return None


@lowering(*BITWISE, check=_check_bitvec)
def lower_bitwise(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, fold(BITWISE[node.op]))


@lowering("BitwiseNot", check=_check_bitvec)
def lower_bitwise_not(ctx: LowerCtx, node: Node) -> None:
    """~x == x ^ (all ones): -1 is all ones in every width once the result wraps to it."""
    elementwise(ctx, node, lambda prog, dst, s: ts(prog, dst, s[0], AluOp.bitwise_xor, -1.0))


@lowering("BitShift", check=_check_bitvec, since=11)
def lower_bit_shift(ctx: LowerCtx, node: Node) -> None:
    op = AluOp.left_shift if node.attrs.get("direction") == "LEFT" else AluOp.right_shift
    elementwise(ctx, node, fold(op))


def _check_float_input(node: Node, g: Graph) -> str | None:
    dtype = g.tensors[node.inputs[0]].dtype
    return None if np.issubdtype(dtype, np.floating) else f"{node.op} of {dtype} is not supported"


@lowering("IsNaN", check=_check_float_input, kind=OpKind.ELEMENTWISE)
def lower_is_nan(ctx: LowerCtx, node: Node) -> None:
    """NaN is the one value not equal to itself."""
    elementwise(ctx, node, lambda prog, dst, s: tt(prog, dst, s[0], s[0], AluOp.not_equal))


@lowering("IsInf", check=_check_float_input, kind=OpKind.ELEMENTWISE)
def lower_is_inf(ctx: LowerCtx, node: Node) -> None:
    positive = node.attrs.get("detect_positive", 1)
    negative = node.attrs.get("detect_negative", 1)

    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        if positive and negative:
            ts(prog, dst, s[0], AluOp.abs_max, 0.0, AluOp.equal, float("inf"))
        elif positive or negative:
            ts(prog, dst, s[0], AluOp.equal, float("inf") if positive else float("-inf"))
        else:
            fill(prog, dst, 0.0)

    elementwise(ctx, node, compute)


@lowering("Where", since=9, kind=OpKind.ELEMENTWISE)
def lower_where(ctx: LowerCtx, node: Node) -> None:
    """Integers are copied by their bits (a bitwise or with 0; the predicated copy moves bits too), so Where is
    exact over any integer's whole range, where a copy through the fp32 ALU would round past 2^24."""
    integers = np.dtype(ctx.graph.tensors[node.outputs[0]].dtype).kind in "biu"

    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        condition, if_true, if_false = s
        if isinstance(if_false, float):
            fill(prog, dst, if_false)
        elif integers:
            ts(prog, dst, if_false, AluOp.bitwise_or, 0.0)
        else:
            copy(prog, dst, if_false)
        select(prog, dst, if_true, condition)  # type: ignore[arg-type]

    # a float false branch may be a memset; the others are read (an integer's bits never pass through a float)
    elementwise(ctx, node, compute, immediates=() if integers else (2,))
