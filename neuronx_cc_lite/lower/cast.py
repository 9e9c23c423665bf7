"""Cast and CastLike.

Between types the device holds the same way (float64 and float32 are both fp32 on the device; int64 and int32
both int32) the result is a view of the input. Widening and float-to-float conversions are a DMA with a cast,
which rounds to nearest even as ONNX does. To bool is a comparison with zero. Casts to fp8 saturate (ONNX's
default) by clamping to the largest finite value before the cast. Float to integer truncates toward zero in
ONNX; the engines round on write, so that case is refused. A narrowing integer cast wraps in ONNX: it is a
bit-vector operator (bitwise or 0), whose result wraps to the destination's width as ONNX's does.

SaturatingCast (the compiler's own op, which expand-quantization emits where QuantizeLinear and the integer
matmuls leave floats for an integer type) rounds half to even and clamps to the type's range, as QuantizeLinear
defines: both in fp32 before the write, so the value written is an integer inside the range and the engines'
conversion has nothing left to decide.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from onnx import helper

from isa.dtypes import DType
from isa.functions import ActFunc, AluOp
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx
from neuronx_cc_lite.lower.elementwise import Operand, elementwise
from neuronx_cc_lite.lower.instr import act, copy, fill, scratch, select, ts, tt
from neuronx_cc_lite.lower.rounding import round_half_even
from neuronx_cc_lite.ops.dtypes import device_dtype
from neuronx_cc_lite.ops.registry import lowering
from neuronx_cc_lite.ops.traits import OpKind
from neuronx_cc_lite.tile.program import Program, TileAccess

_FP8 = {DType.fp8_e4m3: float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max),
        DType.fp8_e5m2: float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)}


def _types(node: Node, g: Graph) -> tuple[np.dtype, np.dtype]:
    return np.dtype(g.tensors[node.inputs[0]].dtype), np.dtype(g.tensors[node.outputs[0]].dtype)


def _kind(t: np.dtype) -> str:
    if t == np.bool_:
        return "bool"
    held = device_dtype(t)
    return "float" if held is not None and held.is_float else "int"


# The floats no engine writes (held in fp16, ops/dtypes.py): a cast to one rounds to its grid on the engines
_GRIDS = tuple(np.dtype(t) for t in (ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn))
# The integers held in a byte: a cast from a float truncates, and a value outside the type becomes 0 (as ONNX's
# reference, through ml_dtypes, casts)
_SMALL_INTEGERS = tuple(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))


def _check_cast(node: Node, g: Graph) -> str | None:
    src, dst = _types(node, g)
    if node.op == "Cast" and helper.tensor_dtype_to_np_dtype(node.attrs["to"]) != dst:
        return "the output type does not match the `to` attribute"
    if dst == np.dtype(ml_dtypes.float8_e8m0fnu) and src != dst:
        return "a cast to float8_e8m0fnu rounds to a power of two by its round_mode, which no lowering does"
    if _kind(dst) in ("bool", "float") or _kind(src) == "bool":
        return None
    if _kind(src) == "float" and dst in _SMALL_INTEGERS:
        return None
    if _kind(src) == "float":
        return f"a cast from {src} to {dst} truncates toward zero, which the engines do not do"
    if device_dtype(src) is device_dtype(dst) or (
            ml_dtypes.iinfo(dst).min <= ml_dtypes.iinfo(src).min and ml_dtypes.iinfo(src).max <= ml_dtypes.iinfo(dst).max):
        return None
    if src in _WORD_INTEGERS and dst in _WORD_INTEGERS:
        return None  # wraps by its bits (`_wrapping_cast`)
    return f"a narrowing cast from {src} to {dst} wraps around, which the engines do not do"


# The integers a bit-vector operator reads and writes by their bits (up to 32 of them; int64 held as int32)
_WORD_INTEGERS = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                             np.int64))


def _narrowing(src: np.dtype, dst: np.dtype) -> bool:
    """An integer cast that may wrap: dst does not hold every value of src."""
    return (src in _WORD_INTEGERS and dst in _WORD_INTEGERS
            and not (np.iinfo(dst).min <= np.iinfo(src).min and np.iinfo(src).max <= np.iinfo(dst).max))


def _wrapping_cast(prog: Program, dst: TileAccess, srcs: list[Operand]) -> None:
    """A narrowing integer cast keeps the low bits, as ONNX's (C's) does: a bitwise or with 0 reads the source's
    bits exactly and its result wraps to dst's width on write, where a value cast would saturate. An int64 source
    is held in int32, and its low 32 bits are those of the value it holds."""
    ts(prog, dst, srcs[0], AluOp.bitwise_or, 0.0)  # type: ignore[arg-type]


@lowering("Cast", check=_check_cast, kind=OpKind.ELEMENTWISE)
@lowering("CastLike", check=_check_cast)
def lower_cast(ctx: LowerCtx, node: Node) -> None:
    src_type, dst_type = _types(node, ctx.graph)
    x = ctx.view(node.inputs[0])
    target = ctx.dtype(node.outputs[0])
    if dst_type in _GRIDS and src_type != dst_type:  # held in fp16 as the source may be: rounded all the same
        saturate = bool(node.attrs.get("saturate", 1)) or dst_type == np.dtype(ml_dtypes.float4_e2m1fn)
        elementwise(ctx, node, lambda prog, dst, s: round_to_grid(prog, dst, s[0], dst_type, saturate),
                    inputs=[node.inputs[0]], immediates=False)
    elif x.dtype is target and _kind(src_type) == _kind(dst_type):
        ctx.alias(node.outputs[0], x)
    elif dst_type == np.bool_:
        elementwise(ctx, node, lambda prog, dst, s: ts(prog, dst, s[0], AluOp.not_equal, 0.0),
                    inputs=[node.inputs[0]])
    elif target in _FP8 and node.attrs.get("saturate", 1):
        bound = _FP8[target]
        elementwise(ctx, node, lambda prog, dst, s: ts(prog, dst, s[0], AluOp.maximum, -bound, AluOp.minimum,
                                                       bound), inputs=[node.inputs[0]])
    elif _narrowing(src_type, dst_type) and x.dtype is not target:
        elementwise(ctx, node, _wrapping_cast, inputs=[node.inputs[0]], immediates=False)
    elif dst_type in _SMALL_INTEGERS and _kind(src_type) == "float":
        elementwise(ctx, node, lambda prog, dst, s: truncate_into(prog, dst, s[0], dst_type),
                    inputs=[node.inputs[0]], immediates=False)
    else:
        ctx.program.dma(ctx.output(node.outputs[0]), x)


def _power_of_two(prog: Program, dst: TileAccess, exponent: TileAccess) -> None:
    """dst = 2 ** exponent for integral exponents (exact in fp32 from 2**-126 to 2**127)."""
    ts(prog, dst, exponent, AluOp.power, 2.0, reverse0=True)


def round_to_grid(prog: Program, dst: TileAccess, x: Operand, dtype: np.dtype, saturate: bool) -> None:
    """dst = x rounded to the nearest value of the small float `dtype` (ties to even), every step exact in fp32:

        e = floor(log2 |x|), at least the type's smallest normal exponent: ScalarE's log, rounded to an integer,
            then lowered by one where 2**e > |x| (the log is within one of the exact value)
        ulp = 2 ** (e - mantissa bits); |y| = round(|x| / ulp) * ulp (a division by a power of two is exact)
        |y| above the type's largest value: that value (saturate) or NaN; the sign of x (its sign bit: -0 stays -0)

    NaN stays NaN, but for float4_e2m1fn, which has none, where it is -0 as ONNX's reference gives it."""
    assert isinstance(x, TileAccess)
    info = ml_dtypes.finfo(dtype)
    largest, mantissa, lowest_exponent = float(info.max), int(info.nmant), int(info.minexp)
    a, e, t, flag = (scratch(prog, dst, n) for n in ("magnitude", "exponent", "scale", "flag"))
    ts(prog, a, x, AluOp.abs_max, 0.0, AluOp.minimum, 2 * largest)  # infinities saturate (or overflow) below
    act(prog, e, a, ActFunc.log, bias=None)
    ts(prog, e, e, AluOp.multiply, 1 / math.log(2))
    round_half_even(prog, e, e)
    ts(prog, e, e, AluOp.maximum, float(lowest_exponent))  # log(0) = -inf: the subnormal spacing
    _power_of_two(prog, t, e)
    tt(prog, flag, t, a, AluOp.greater)
    tt(prog, e, e, flag, AluOp.subtract)
    ts(prog, e, e, AluOp.maximum, float(lowest_exponent), AluOp.subtract, float(mantissa))
    _power_of_two(prog, t, e)  # the spacing of the grid around |x|
    tt(prog, a, a, t, AluOp.divide)
    round_half_even(prog, a, a)
    tt(prog, a, a, t, AluOp.multiply)
    if saturate:
        ts(prog, a, a, AluOp.minimum, largest)
    else:
        ts(prog, flag, a, AluOp.greater, largest)
        fill(prog, t, float("nan"))
        select(prog, a, t, flag)
    # the sign bit of x: x < 0, or 1 / x < 0 (x = -0)
    ts(prog, flag, x, AluOp.divide, 1.0, reverse0=True, op1=AluOp.less, s1=0.0)
    ts(prog, t, x, AluOp.less, 0.0)
    tt(prog, flag, flag, t, AluOp.maximum)
    ts(prog, flag, flag, AluOp.multiply, -2.0, AluOp.add, 1.0)
    tt(prog, a, a, flag, AluOp.multiply)
    tt(prog, flag, x, x, AluOp.not_equal)  # NaN
    fill(prog, t, -0.0 if dtype == np.dtype(ml_dtypes.float4_e2m1fn) else float("nan"))
    select(prog, a, t, flag)
    copy(prog, dst, a)


def truncate_into(prog: Program, dst: TileAccess, x: Operand, dtype: np.dtype) -> None:
    """dst = x truncated toward zero (x - fmod(x, 1), exact), 0 where that falls outside the integer type or x
    is NaN or infinite."""
    assert isinstance(x, TileAccess)
    info = ml_dtypes.iinfo(dtype)
    t, keep = scratch(prog, dst, "truncated"), scratch(prog, dst, "inside")
    ts(prog, t, x, AluOp.mod, 1.0)
    tt(prog, t, x, t, AluOp.subtract)
    ts(prog, keep, t, AluOp.greater_equal, float(info.min))
    ts(prog, dst, t, AluOp.less_equal, float(info.max))  # NaN compares false: out
    tt(prog, keep, keep, dst, AluOp.logical_and)
    fill(prog, dst, 0.0)
    select(prog, dst, t, keep)


def _integer_bounds(dtype: np.dtype) -> tuple[float, float]:
    """The type's range as fp32 values inside it (int32's top, 2**31 - 1, is no fp32: the fp32 below it)."""
    info = ml_dtypes.iinfo(dtype)
    high = np.float32(info.max)
    return float(info.min), float(high if high <= info.max else np.nextafter(high, np.float32(0)))


def _check_saturating_cast(node: Node, g: Graph) -> str | None:
    src, dst = _types(node, g)
    if _kind(src) != "float" or _kind(dst) != "int":
        return f"SaturatingCast from {src} to {dst} (float to integer only)"
    return None


@lowering("SaturatingCast", check=_check_saturating_cast)
def lower_saturating_cast(ctx: LowerCtx, node: Node) -> None:
    low, high = _integer_bounds(_types(node, ctx.graph)[1])

    def compute(prog: Program, dst: TileAccess, s: list[Operand]) -> None:
        assert isinstance(s[0], TileAccess)
        rounded = scratch(prog, dst, "rounded")
        round_half_even(prog, rounded, s[0])
        ts(prog, dst, rounded, AluOp.maximum, low, AluOp.minimum, high)

    elementwise(ctx, node, compute, immediates=False)
