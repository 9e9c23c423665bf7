"""onnxruntime's QOperator contrib ops (domain com.microsoft), which `quantize_static(quant_format=QOperator)` writes,
rewritten as the Q/DQ form that defines them: each quantized operand dequantized, the float op, the result quantized
again. expand-quantization then turns the Q/DQ nodes into float arithmetic on integer values.

    QLinearAdd / QLinearMul (A, sa, za, B, sb, zb, sc, zc)   Q(DQ(A) + DQ(B), sc, zc)      (Mul: *)
    QLinearSigmoid (X, sx, zx, sy, zy)                        Q(Sigmoid(DQ(X)), sy, zy)
    QLinearLeakyRelu (X, sx, zx, sy, zy) {alpha}              Q(LeakyRelu(DQ(X)), sy, zy)
    QLinearGlobalAveragePool (X, sx, zx, sy, zy) {channels_last}
                                                              Q(GlobalAveragePool(DQ(X)), sy, zy) (NHWC: transposed
                                                              to NCHW and back)
    QLinearAveragePool (X, sx, zx, sy, zy) {pooling attributes}
                                                              Q(AveragePool(DQ(X)), sy, zy)
    QLinearConcat (sy, zy, X0, s0, z0, X1, s1, z1, ...) {axis}
                                                              Q(Concat(DQ(X0), DQ(X1), ...), sy, zy)
    QGemm (A, sa, za, B, sb, zb, C, sy, zy) {alpha, transA, transB}
                                                              Q(Gemm(DQ(A), DQ(B), DQ(C, sa * sb)), sy, zy) (B's and
                                                              C's scales per output column or not); no sy: the
                                                              float result

An absent zero point is zero of the operand's type (the output's: the type of A or X). onnxruntime's kernels
compute the same float values in another order (a lookup table for Sigmoid and LeakyRelu, precomputed multipliers
for Add and Mul), so an output may be one quantization step from theirs where a value lies that close to a rounding
tie, as with the other quantized ops (README). The pass runs first, before fold-constants: ONNX's shape inference
has no schema for these ops and leaves their outputs untyped, so each expansion is folded and inferred as it is
made (fold_constants.fold_nodes), and what follows it is inferred in turn.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.passes import fold_constants
from neuronx_cc_lite.passes.writer import Writer

CONTRIB_DOMAIN = "com.microsoft"
OPSET = 19  # DequantizeLinear and QuantizeLinear of the nodes written: per tensor, their types from the zero point


class _Writer(Writer):
    """An expansion's nodes, with the zero points and the Q/DQ pairs of the QOperator form."""

    def zero(self, zero: str, like: str) -> str:
        """The zero point, or a zero of `like`'s type where it is absent."""
        return zero or self.const(0, np.dtype(self.g.tensors[like].dtype))

    def dq(self, x: str, scale: str, zero: str, axis: int = 1) -> str:
        """DequantizeLinear; `axis` that of a per-channel scale."""
        return self.add("DequantizeLinear", [x, scale, self.zero(zero, x)], axis=axis)

    def q(self, x: str, scale: str, zero: str, like: str) -> str:
        return self.add("QuantizeLinear", [x, scale, self.zero(zero, like)], self.node.outputs[0])


def _input(node: Node, i: int) -> str:
    return node.inputs[i] if len(node.inputs) > i else ""


def _binary(w: _Writer, node: Node) -> None:
    a, sa, za, b, sb, zb, sc, zc = (_input(node, i) for i in range(8))
    value = w.add("Add" if node.op == "QLinearAdd" else "Mul", [w.dq(a, sa, za), w.dq(b, sb, zb)])
    w.q(value, sc, zc, a)


def _unary(w: _Writer, node: Node) -> None:
    x, sx, zx, sy, zy = (_input(node, i) for i in range(5))
    op = node.op.removeprefix("QLinear")
    attrs: dict[str, object] = {"alpha": node.attrs.get("alpha", 0.01)} if op == "LeakyRelu" else {}
    if op == "AveragePool":
        attrs = {k: v for k, v in node.attrs.items() if k != "channels_last"}
    value = w.dq(x, sx, zx)
    nhwc = bool(node.attrs.get("channels_last", 0))
    rank = len(w.g.tensors[x].shape or ())
    if nhwc:
        value = w.add("Transpose", [value], perm=[0, rank - 1, *range(1, rank - 1)])
    value = w.add(op, [value], **attrs)
    if nhwc:
        value = w.add("Transpose", [value], perm=[0, *range(2, rank), 1])
    w.q(value, sy, zy, x)


def _concat(w: _Writer, node: Node) -> None:
    sy, zy = node.inputs[0], _input(node, 1)
    triples = [(*node.inputs[i:i + 3], "")[:3] for i in range(2, len(node.inputs), 3)]
    value = w.add("Concat", [w.dq(x, s, z) for x, s, z in triples], axis=node.attrs["axis"])
    w.q(value, sy, zy, triples[0][0])


def _gemm(w: _Writer, node: Node) -> None:
    a, sa, za, b, sb, zb, c, sy, zy = (_input(node, i) for i in range(9))
    # B's scale may be per output column: axis 0 of B [N, K] (transB), else axis 1 of B [K, N]
    inputs = [w.dq(a, sa, za), w.dq(b, sb, zb, 0 if node.attrs.get("transB", 0) else 1)]
    if c:  # an int32 bias [N] quantized with scale sa * sb (per column when sb is) and zero point 0
        inputs.append(w.add("DequantizeLinear", [c, w.add("Mul", [sa, sb])], axis=0))
    attrs = {k: node.attrs[k] for k in ("alpha", "transA", "transB") if k in node.attrs}
    if sy:
        w.q(w.add("Gemm", inputs, **attrs), sy, zy, a)
    else:
        w.add("Gemm", inputs, node.outputs[0], **attrs)


_EXPANSIONS = {
    "QLinearAdd": _binary, "QLinearMul": _binary, "QLinearSigmoid": _unary, "QLinearLeakyRelu": _unary,
    "QLinearGlobalAveragePool": _unary, "QLinearAveragePool": _unary, "QLinearConcat": _concat, "QGemm": _gemm,
}


def why_not_expanded(node: Node, g: Graph) -> str | None:
    if node.op == "QLinearAveragePool" and node.attrs.get("channels_last", 0):
        return "QLinearAveragePool with channels_last"
    for name in node.inputs:
        if name and g.tensors[name].dtype is None:
            return f"the type of {name!r} is not known"
    return None


def run(g: Graph) -> Graph:
    if not any(n.domain == CONTRIB_DOMAIN and n.op in _EXPANSIONS for n in g.nodes):
        return g
    nodes: list[Node] = []
    for node in g.nodes:
        if node.domain == CONTRIB_DOMAIN and node.op in _EXPANSIONS and why_not_expanded(node, g) is None:
            w = _Writer(g, node, OPSET)
            _EXPANSIONS[node.op](w, node)
            out = g.tensors[node.outputs[0]]
            out.shape, out.dtype = None, None  # settled by inference, whatever the model declared
            nodes.extend(w.folded())
        elif node.domain in ("", "ai.onnx"):  # inferred in turn, now that what it reads may be typed
            nodes.extend(fold_constants.fold_nodes([node], g))
        else:
            nodes.append(node)
    g.nodes = nodes
    return g

