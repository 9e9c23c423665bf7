"""The model's arithmetic: FLOPs of its matrix products (MatMul, Gemm, Conv, ConvTranspose), 2 per multiply-add,
counted on the graph as the passes leave it, before any lowering. MFU and the roofline's compute term use it."""

from __future__ import annotations

import math

from neuronx_cc_lite.ir import Graph, Node


def node_flops(node: Node, g: Graph) -> int:
    if node.op not in ("MatMul", "Gemm", "MatMulEpilogue", "Conv", "ConvEpilogue", "ConvTranspose"):
        return 0
    shape = [g.tensors[n].shape for n in node.inputs[:2]]
    out = g.tensors[node.outputs[0]].shape
    if node.op in ("MatMul", "Gemm", "MatMulEpilogue"):
        a = shape[0]
        k = a[-1] if node.op == "MatMul" or not node.attrs.get("transA", 0) else a[0]
        return 2 * math.prod(out) * k
    if node.op in ("Conv", "ConvEpilogue"):
        w = shape[1]  # [M, C / group, *kernel]
        return 2 * math.prod(out) * math.prod(w[1:])
    if node.op == "ConvTranspose":
        x, w = shape  # x [N, C, *spatial], w [C, M / group, *kernel]
        return 2 * math.prod(x) * math.prod(w[1:])
    return 0


def model_flops(g: Graph) -> int:
    return sum(node_flops(n, g) for n in g.nodes)
