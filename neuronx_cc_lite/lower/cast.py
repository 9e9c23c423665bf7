"""Cast and CastLike.

Between types the device holds the same way (float64 and float32 are both fp32 on the device; int64 and int32
both int32) the result is a view of the input. Widening and float-to-float conversions are a DMA with a cast,
which rounds to nearest even as ONNX does. To bool is a comparison with zero. Casts to fp8 saturate (ONNX's
default) by clamping to the largest finite value before the cast. Float to integer truncates toward zero in
ONNX; the engines round on write, so that case is refused, as are narrowing integer casts, which wrap in ONNX.

SaturatingCast (the compiler's own op, which expand-quantization emits where QuantizeLinear and the integer
matmuls leave floats for an integer type) rounds half to even and clamps to the type's range, as QuantizeLinear
defines: both in fp32 before the write, so the value written is an integer inside the range and the engines'
conversion has nothing left to decide.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import helper

from isa.dtypes import DType
from isa.functions import AluOp
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import LowerCtx, device_dtype
from neuronx_cc_lite.lower.elementwise import Operand, elementwise
from neuronx_cc_lite.lower.instr import scratch, ts
from neuronx_cc_lite.lower.program import Program, TileAccess
from neuronx_cc_lite.lower.registry import lowering
from neuronx_cc_lite.lower.rounding import round_half_even

_FP8 = {DType.fp8_e4m3: float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max),
        DType.fp8_e5m2: float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)}


def _types(node: Node, g: Graph) -> tuple[np.dtype, np.dtype]:
    return np.dtype(g.tensors[node.inputs[0]].dtype), np.dtype(g.tensors[node.outputs[0]].dtype)


def _kind(t: np.dtype) -> str:
    if t == np.bool_:
        return "bool"
    held = device_dtype(t)
    return "float" if held is not None and held.is_float else "int"


def _check_cast(node: Node, g: Graph) -> str | None:
    src, dst = _types(node, g)
    if node.op == "Cast" and helper.tensor_dtype_to_np_dtype(node.attrs["to"]) != dst:
        return "the output type does not match the `to` attribute"
    if _kind(dst) in ("bool", "float") or _kind(src) == "bool":
        return None
    if _kind(src) == "float":
        return f"a cast from {src} to {dst} truncates toward zero, which the engines do not do"
    if device_dtype(src) is device_dtype(dst) or (
            np.iinfo(dst).min <= np.iinfo(src).min and np.iinfo(src).max <= np.iinfo(dst).max):
        return None
    return f"a narrowing cast from {src} to {dst} wraps around, which the engines do not do"


@lowering("Cast", check=_check_cast, elementwise=True)
@lowering("CastLike", check=_check_cast)
def lower_cast(ctx: LowerCtx, node: Node) -> None:
    src_type, dst_type = _types(node, ctx.graph)
    x = ctx.view(node.inputs[0])
    target = ctx.dtype(node.outputs[0])
    if x.dtype is target and _kind(src_type) == _kind(dst_type):
        ctx.alias(node.outputs[0], x)
    elif dst_type == np.bool_:
        elementwise(ctx, node, lambda prog, dst, s: ts(prog, dst, s[0], AluOp.not_equal, 0.0),
                    inputs=[node.inputs[0]])
    elif target in _FP8 and node.attrs.get("saturate", 1):
        bound = _FP8[target]
        elementwise(ctx, node, lambda prog, dst, s: ts(prog, dst, s[0], AluOp.maximum, -bound, AluOp.minimum,
                                                       bound), inputs=[node.inputs[0]])
    else:
        ctx.program.dma(ctx.output(node.outputs[0]), x)


def _integer_bounds(dtype: np.dtype) -> tuple[float, float]:
    """The type's range as fp32 values inside it (int32's top, 2**31 - 1, is no fp32: the fp32 below it)."""
    info = np.iinfo(dtype)
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
