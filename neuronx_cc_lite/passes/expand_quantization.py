"""Quantization operators rewritten as the float arithmetic that defines them, which the compiler lowers already.

Integer values of 8 and 16 bits are exact in fp32, so each integer tensor is cast to fp32 where it enters, the
arithmetic runs in fp32 (matmuls on PE with fp32 accumulation) and a result that ONNX types as an integer leaves
through `SaturatingCast` (round half to even, clamp to the type's range). With q(v) = SaturatingCast(v) and
zero points and scales shaped to broadcast against the tensor they describe (per tensor, per axis, per block):

    DequantizeLinear(x, s, z)     (float(x) - float(z)) * s               cast to s's type (or output_dtype)
    QuantizeLinear(x, s, z)       q(Round(x / s) + z)                      integer outputs: z added after rounding,
                                  Cast(x / s + z, saturate)                 fp8 outputs (rounds to nearest even)
    MatMulInteger(A, B, za, zb)   q((float(A) - za) @ (float(B) - zb))     an int32 result
    ConvInteger(x, w, zx, zw)     q(Conv(float(x) - zx, float(w) - zw))
    QLinearMatMul                 q(Round(acc * (sa * sb / sy)) + zy)      acc = MatMulInteger's product
    QLinearConv                   q(Round((acc + float(B)) * (sx * sw / sy)) + zy)
    DynamicQuantizeLinear         ONNX's function body: s = (max(x, 0) - min(x, 0)) / 255 (1 where that is 0,
                                  as onnxruntime has it), z = q(Round(Clip(-min(x, 0) / s, 0, 255))),
                                  y = QuantizeLinear(x, s, z)

The requantization of QLinear* multiplies by sa * sb / sy as onnxruntime's integer kernels do. The fp32
accumulation equals their int32 one while every partial sum stays below 2**24 (K * max|a - za| * max|b - zb| <
2**24: K <= 258 for any 8-bit values); see the README for what happens beyond.

Constant operands (weights, their scales and zero points) become constants again in the fold after this pass, so
a dequantized weight costs nothing at run time. A node this cannot express (a type the device does not hold, int4,
a per-row scale of QLinearMatMul's left operand) is left as it is, for lowering to name as unsupported.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import helper

from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.ops.dtypes import device_dtype
from neuronx_cc_lite.ops.registry import INTERNAL_DOMAIN

F32 = np.dtype(np.float32)
# The opset the expansions are written in: Cast with `saturate` (fp8), Clip with bound inputs, Round, ReduceMin
# without axes reducing everything. Below it (QuantizeLinear-10) these ops did not exist or meant otherwise.
OPSET = 19
_INTEGER_TYPES = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, ml_dtypes.int4,
                                              ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))


class _Builder:
    """Appends the nodes of one expansion, naming each new value and node under the original node's name."""

    def __init__(self, g: Graph, node: Node) -> None:
        self.g, self.node, self.count = g, node, 0
        self.nodes: list[Node] = []

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.g.tensors[name].shape)

    def dtype(self, name: str) -> np.dtype:
        return np.dtype(self.g.tensors[name].dtype)

    def fresh(self, stem: str) -> str:
        """A value name under the node's that no tensor has (node names need not be unique in ONNX)."""
        self.count += 1
        name = f"{self.node.name}/{stem}{self.count}"
        while name in self.g.tensors:
            name += "_"
        return name

    def add(self, op: str, inputs: list[str], shape: tuple[int, ...], dtype: np.dtype = F32,
            out: str | None = None, domain: str = "", **attrs: object) -> str:
        name = out or self.fresh("q")
        if out is None:
            self.g.tensors[name] = Tensor(name, tuple(shape), np.dtype(dtype))
        self.nodes.append(Node(op, f"{self.node.name}/{op}{self.count}", inputs, [name], attrs, domain,
                               None if domain else OPSET))
        return name

    def const(self, value: np.ndarray) -> str:
        name = self.fresh("q_const")
        self.g.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
        return name

    def binary(self, op: str, a: str, b: str, out: str | None = None) -> str:
        shape = tuple(np.broadcast_shapes(self.shape(a), self.shape(b)))
        return self.add(op, [a, b], shape, self.dtype(a), out)

    def to_float(self, name: str) -> str:
        if self.dtype(name) == F32:
            return name
        return self.add("Cast", [name], self.shape(name), F32, to=helper.np_dtype_to_tensor_dtype(F32))

    def cast(self, name: str, dtype: np.dtype, out: str | None = None, **attrs: object) -> str:
        return self.add("Cast", [name], self.shape(name), dtype, out, to=helper.np_dtype_to_tensor_dtype(dtype),
                        **attrs)

    def reshape(self, name: str, shape: tuple[int, ...]) -> str:
        if self.shape(name) == shape:
            return name
        return self.add("Reshape", [name, self.const(np.asarray(shape, dtype=np.int64))], shape, self.dtype(name))

    def saturating_cast(self, name: str, dtype: np.dtype, out: str | None = None) -> str:
        return self.add("SaturatingCast", [name], self.shape(name), dtype, out, INTERNAL_DOMAIN,
                        to=helper.np_dtype_to_tensor_dtype(dtype))

    def round(self, name: str) -> str:
        return self.add("Round", [name], self.shape(name))

    def minus_zero_point(self, x: str, zero: str | None, axis: int, block: int) -> str:
        """float(x) - float(zero), the zero point shaped to broadcast (absent or all-zero: float(x))."""
        xf = self.to_float(x)
        if zero is None or _is_zero(self.g, zero):
            return xf
        return self.binary("Sub", xf, self.broadcastable(self.to_float(zero), axis, block, self.shape(x)))

    def broadcastable(self, param: str, axis: int, block: int, shape: tuple[int, ...]) -> str:
        """A scale or zero point of a tensor of `shape`, reshaped or repeated to broadcast against it: a scalar or
        one value stays; a 1-D one of shape[axis] values gets trailing unit axes; a blocked one (its `axis`
        dimension ceil(shape[axis] / block)) is repeated `block` times along `axis` and cut to shape[axis]."""
        pshape = self.shape(param)
        if int(np.prod(pshape)) == 1:
            return param
        axis = axis % len(shape)
        if block:
            n = pshape[axis]
            unit = self.reshape(param, pshape[:axis + 1] + (1,) + pshape[axis + 1:])
            wide = pshape[:axis + 1] + (block,) + pshape[axis + 1:]
            repeated = self.add("Expand", [unit, self.const(np.asarray(wide, dtype=np.int64))], wide,
                                self.dtype(param))
            full = self.reshape(repeated, pshape[:axis] + (n * block,) + pshape[axis + 1:])
            if n * block == shape[axis]:
                return full
            cut = pshape[:axis] + (shape[axis],) + pshape[axis + 1:]
            return self.add("Slice", [full, self.const(np.asarray([0], dtype=np.int64)),
                                      self.const(np.asarray([shape[axis]], dtype=np.int64)),
                                      self.const(np.asarray([axis], dtype=np.int64))], cut, self.dtype(param))
        return self.reshape(param, (shape[axis],) + (1,) * (len(shape) - axis - 1))

    def requantize(self, value: str, zero: str | None, dtype: np.dtype, out: str) -> None:
        """q(Round(value) + zero): the zero point is an integer, added after rounding so that ties stay even."""
        rounded = self.round(value)
        if zero is not None and not _is_zero(self.g, zero):
            rounded = self.binary("Add", rounded, self.to_float(zero))
        self.saturating_cast(rounded, dtype, out)


def _is_zero(g: Graph, name: str) -> bool:
    t = g.tensors[name]
    return t.is_constant and not np.any(t.value.astype(np.float64))


def _input(node: Node, i: int) -> str | None:
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i] else None


def _dequantize(b: _Builder, node: Node) -> None:
    x, scale, zero = node.inputs[0], node.inputs[1], _input(node, 2)
    axis, block = node.attrs.get("axis", 1), node.attrs.get("block_size", 0)
    shape = b.shape(x)
    centred = b.minus_zero_point(x, zero, axis, block)
    out_type = b.dtype(node.outputs[0])
    scaled = b.binary("Mul", centred, b.broadcastable(b.to_float(scale), axis, block, shape),
                      node.outputs[0] if out_type == F32 else None)
    if out_type != F32:
        b.cast(scaled, out_type, node.outputs[0])


def _quantize(b: _Builder, node: Node) -> None:
    x, scale, zero = node.inputs[0], node.inputs[1], _input(node, 2)
    axis, block = node.attrs.get("axis", 1), node.attrs.get("block_size", 0)
    shape, out_type = b.shape(x), b.dtype(node.outputs[0])
    scaled = b.binary("Div", b.to_float(x), b.broadcastable(b.to_float(scale), axis, block, shape))
    zero_b = b.broadcastable(zero, axis, block, shape) if zero and not _is_zero(b.g, zero) else None
    if out_type in _INTEGER_TYPES:
        b.requantize(scaled, zero_b, out_type, node.outputs[0])
    else:  # fp8: no rounding to integers; the cast rounds to nearest even and saturates unless told not to
        if zero_b is not None:
            scaled = b.binary("Add", scaled, b.to_float(zero_b))
        b.cast(scaled, out_type, node.outputs[0], saturate=node.attrs.get("saturate", 1))


def _matmul_integer(b: _Builder, node: Node) -> None:
    a, bm = node.inputs[0], node.inputs[1]
    product = _integer_matmul(b, a, _input(node, 2), bm, _input(node, 3))
    b.saturating_cast(product, b.dtype(node.outputs[0]), node.outputs[0])


def _integer_matmul(b: _Builder, a: str, za: str | None, bm: str, zb: str | None) -> str:
    """(float(a) - za) @ (float(b) - zb): za per row of a (axis -2), zb per column of b (axis -1)."""
    ra, rb = len(b.shape(a)), len(b.shape(bm))
    left = b.minus_zero_point(a, za, max(ra - 2, 0), 0)
    right = b.minus_zero_point(bm, zb, rb - 1, 0)
    shape = _matmul_shape(b.shape(left), b.shape(right))
    return b.add("MatMul", [left, right], shape)


def _matmul_shape(a: tuple[int, ...], c: tuple[int, ...]) -> tuple[int, ...]:
    a2, c2 = (a if len(a) > 1 else (1,) + a), (c if len(c) > 1 else c + (1,))
    shape = tuple(np.broadcast_shapes(a2[:-2], c2[:-2])) + (a2[-2], c2[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(c) == 1:
        shape = shape[:-1]
    return shape


def _conv_attrs(node: Node) -> dict[str, object]:
    return {k: v for k, v in node.attrs.items()
            if k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}


def _integer_conv(b: _Builder, node: Node, x: str, zx: str | None, w: str, zw: str | None,
                  bias: str | None = None) -> str:
    """Conv(float(x) - zx, float(w) - zw) (+ float(bias)): zx is per tensor, zw per output channel. Conv's zero
    padding is then padding with x's zero point, as ONNX defines it."""
    left = b.minus_zero_point(x, zx, 1, 0)
    right = b.minus_zero_point(w, zw, 0, 0)
    inputs = [left, right] + ([b.to_float(bias)] if bias else [])
    return b.add("Conv", inputs, b.shape(node.outputs[0]), **_conv_attrs(node))


def _conv_integer(b: _Builder, node: Node) -> None:
    acc = _integer_conv(b, node, node.inputs[0], _input(node, 2), node.inputs[1], _input(node, 3))
    b.saturating_cast(acc, b.dtype(node.outputs[0]), node.outputs[0])


def _multiplier(b: _Builder, sa: str, sb: str, sy: str, axis: int, shape: tuple[int, ...]) -> str:
    """sa * sb / sy in fp32 (per output channel when sb is), shaped to broadcast against the accumulator."""
    ratio = b.binary("Div", b.binary("Mul", b.to_float(sa), b.to_float(sb)), b.to_float(sy))
    return b.broadcastable(ratio, axis, 0, shape)


def _qlinear_matmul(b: _Builder, node: Node) -> None:
    a, sa, za, bm, sb, zb, sy, zy = (_input(node, i) for i in range(8))
    assert a and sa and bm and sb and sy
    acc = _integer_matmul(b, a, za, bm, zb)
    scaled = b.binary("Mul", acc, _multiplier(b, sa, sb, sy, -1, b.shape(acc)))
    b.requantize(scaled, zy, b.dtype(node.outputs[0]), node.outputs[0])


def _qlinear_conv(b: _Builder, node: Node) -> None:
    x, sx, zx, w, sw, zw, sy, zy, bias = (_input(node, i) for i in range(9))
    assert x and sx and w and sw and sy
    acc = _integer_conv(b, node, x, zx, w, zw, bias)
    scaled = b.binary("Mul", acc, _multiplier(b, sx, sw, sy, 1, b.shape(acc)))
    b.requantize(scaled, zy, b.dtype(node.outputs[0]), node.outputs[0])


def _dynamic_quantize(b: _Builder, node: Node) -> None:
    x = b.to_float(node.inputs[0])
    y, y_scale, y_zero = node.outputs
    zero = b.const(np.asarray(0.0, dtype=F32))
    reduce_attrs = {"keepdims": 0}
    low = b.binary("Min", b.add("ReduceMin", [x], (), **reduce_attrs), zero)
    high = b.binary("Max", b.add("ReduceMax", [x], (), **reduce_attrs), zero)
    spread = b.binary("Sub", high, low)
    empty = b.add("Equal", [spread, zero], (), np.dtype(np.bool_))
    # onnxruntime's scale of an all-zero x is 1 (the function body's 0 would make every quotient NaN)
    scale = b.add("Where", [empty, b.const(np.asarray(1.0, dtype=F32)),
                            b.binary("Div", spread, b.const(np.asarray(255.0, dtype=F32)))], (), F32, y_scale)
    start = b.binary("Sub", zero, b.binary("Div", low, scale))
    clipped = b.add("Clip", [start, zero, b.const(np.asarray(255.0, dtype=F32))], ())
    b.saturating_cast(b.round(clipped), np.dtype(np.uint8), y_zero)
    b.requantize(b.binary("Div", x, scale), y_zero, np.dtype(np.uint8), y)


_EXPANSIONS = {
    "DequantizeLinear": _dequantize,
    "QuantizeLinear": _quantize,
    "MatMulInteger": _matmul_integer,
    "ConvInteger": _conv_integer,
    "QLinearMatMul": _qlinear_matmul,
    "QLinearConv": _qlinear_conv,
    "DynamicQuantizeLinear": _dynamic_quantize,
}


SINCE = {op: 11 if op == "DynamicQuantizeLinear" else 10 for op in _EXPANSIONS}  # the opset each op came in


def why_not_expanded(node: Node, g: Graph) -> str | None:
    """None when the node can be rewritten, else why not."""
    for name in (n for n in (*node.inputs, *node.outputs) if n):
        t = g.tensors[name]
        if t.shape is None or t.dtype is None:
            return f"the shape or type of {name!r} is not known when expand-quantization runs"
        if device_dtype(np.dtype(t.dtype)) is None:
            return f"tensor {name!r} has element type {t.dtype}, which the device does not hold"
    if node.op == "QLinearMatMul" and g.tensors[node.inputs[1]].size != 1:
        return "a per-row scale of QLinearMatMul's left operand (onnxruntime has none either)"
    return None


def run(g: Graph) -> Graph:
    nodes: list[Node] = []
    for node in g.nodes:
        if node.op in _EXPANSIONS and node.domain in ("", "ai.onnx") and why_not_expanded(node, g) is None:
            b = _Builder(g, node)
            _EXPANSIONS[node.op](b, node)
            nodes.extend(b.nodes)
        else:
            nodes.append(node)
    g.nodes = nodes
    return g
