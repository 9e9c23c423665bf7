"""Floor, Ceil and Mod, from the ALU's fmod (remainder with the dividend's sign, AluOp.mod); Round, from fp32
addition.

fmod is exact in floating point, so x - fmod(x, 1) is x truncated toward zero, exactly; Floor and Ceil then step
by one where the remainder was negative (Floor) or positive (Ceil). Mod with fmod=0 takes the divisor's sign, as
numpy.mod: a remainder whose sign differs from the divisor's gets the divisor added (so mod(-1, inf) is inf).

Round (half to even) is sign(x) * ((|x| + 2**23) - 2**23), each step written to an fp32 tile: for
|x| < 2**23 the sum lies in [2**23, 2**24), where fp32's spacing is exactly 1, so round-to-nearest-even on write
rounds |x| to the nearest integer, ties to even, and subtracting 2**23 is exact. Every fp32 of magnitude 2**23 or
more is an integer already (or infinite): those are selected unchanged. The sign is applied after, so -0.4 gives
-0.0 as ONNX's Round does.
"""

from __future__ import annotations

from isa.functions import ActFunc, AluOp
from neuronx_cc_lite.ir import Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import Operand, apply, elementwise, small_integers_ok
from neuronx_cc_lite.lower.instr import act, scratch, select, ts, tt
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.tile.program import Program, TileAccess


def _round_to_integer(step: AluOp, past: AluOp):  # type: ignore[no-untyped-def]
    """trunc(x), then `step` (add or subtract) one where the remainder is `past` (greater or less than) 0."""
    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        x = s[0]
        assert isinstance(x, TileAccess)
        frac, flag = scratch(prog, dst, "frac"), scratch(prog, dst, "flag")
        ts(prog, frac, x, AluOp.mod, 1.0)
        tt(prog, dst, x, frac, AluOp.subtract)
        ts(prog, flag, frac, past, 0.0)
        tt(prog, dst, dst, flag, step)
        # fmod(inf, 1) is NaN: infinities are their own floor and ceiling.
        ts(prog, flag, x, AluOp.abs_max, 0.0, AluOp.equal, float("inf"))
        select(prog, dst, x, flag)

    return compute


@lowering("Floor", floats=True, since=6, kind=OpKind.ELEMENTWISE)
def lower_floor(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, _round_to_integer(AluOp.subtract, AluOp.less))


@lowering("Ceil", floats=True, since=6, kind=OpKind.ELEMENTWISE)
def lower_ceil(ctx: LowerCtx, node: Node) -> None:
    elementwise(ctx, node, _round_to_integer(AluOp.add, AluOp.greater))


_INTEGRAL = float(2**23)  # from here on every fp32 is an integer, and fp32's spacing is 1 up to twice this


def round_half_even(prog: Program, dst: TileAccess, x: TileAccess) -> None:
    """dst = x rounded to the nearest integer, ties to even, in fp32 (dst may be any float tile)."""
    magnitude, big, sign = scratch(prog, dst, "magnitude"), scratch(prog, dst, "big"), scratch(prog, dst, "sign")
    ts(prog, magnitude, x, AluOp.abs_max, 0.0)
    ts(prog, big, magnitude, AluOp.greater_equal, _INTEGRAL)
    ts(prog, magnitude, magnitude, AluOp.add, _INTEGRAL)  # the rounding happens here, as the fp32 tile is written
    ts(prog, magnitude, magnitude, AluOp.subtract, _INTEGRAL)
    act(prog, sign, x, ActFunc.sign)
    tt(prog, dst, magnitude, sign, AluOp.multiply)
    select(prog, dst, x, big)


@lowering("Round", floats=True, since=11, kind=OpKind.ELEMENTWISE)
def lower_round(ctx: LowerCtx, node: Node) -> None:
    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        assert isinstance(s[0], TileAccess)
        round_half_even(prog, dst, s[0])

    elementwise(ctx, node, compute, immediates=False)


def _divisor_signed_mod(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
    """r = fmod(a, b); r + b where r * b < 0 (r non-zero with the other sign than b). Selected, not added as
    flag * b, since 0 * inf would be NaN."""
    a, b = s
    wrong_sign, shifted = scratch(prog, dst, "wrong_sign"), scratch(prog, dst, "shifted")
    apply(prog, dst, a, b, AluOp.mod)
    apply(prog, wrong_sign, dst, b, AluOp.multiply)
    ts(prog, wrong_sign, wrong_sign, AluOp.less, 0.0)
    apply(prog, shifted, dst, b, AluOp.add)
    select(prog, dst, shifted, wrong_sign)


@lowering("Mod", check=small_integers_ok, since=10, kind=OpKind.ELEMENTWISE)
def lower_mod(ctx: LowerCtx, node: Node) -> None:
    if node.attrs.get("fmod", 0):
        elementwise(ctx, node, lambda prog, dst, s: apply(prog, dst, s[0], s[1], AluOp.mod))
    else:
        elementwise(ctx, node, _divisor_signed_mod)
