"""What the roofline knows of a model, counted on the graph as the passes leave it, before any lowering: the FLOPs
of its matrix products (MatMul, Gemm, Conv, ConvTranspose, PatchEmbedding), 2 per multiply-add (MFU and the
compute term), and the bytes of its outputs that are copies of its inputs and weights (the DMA term:
runtime/profile.py)."""

from __future__ import annotations

import math

import numpy as np

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.ops.registry import lowerings


def node_flops(node: Node, g: Graph) -> int:
    if node.op not in ("MatMul", "Gemm", "MatMulEpilogue", "Conv", "ConvEpilogue", "ConvTranspose",
                       "PatchEmbedding"):
        return 0
    shape = [g.tensors[n].shape for n in node.inputs[:2]]
    out = g.tensors[node.outputs[0]].shape
    if node.op in ("MatMul", "Gemm", "MatMulEpilogue"):
        a = shape[0]
        k = a[-1] if node.op == "MatMul" or not node.attrs.get("transA", 0) else a[0]
        return 2 * math.prod(out) * k
    if node.op in ("Conv", "ConvEpilogue", "PatchEmbedding"):  # PatchEmbedding: out [patches, M]
        w = shape[1]  # [M, C / group, *kernel]
        return 2 * math.prod(out) * math.prod(w[1:])
    if node.op == "ConvTranspose":
        x, w = shape  # x [N, C, *spatial], w [C, M / group, *kernel]
        return 2 * math.prod(x) * math.prod(w[1:])
    return 0


def model_flops(g: Graph) -> int:
    return sum(node_flops(n, g) for n in g.nodes)


def copy_bytes(g: Graph) -> int:
    """Bytes of the graph outputs made only of copies of graph inputs and weights (through ops whose registry row
    says they move data: views, transposes, slices, concats, gathers): a program may move those from HBM to HBM
    in one pass of the DMA engines, while every other byte read or written passes through SBUF."""
    producers = g.producers()
    copies: dict[str, bool] = {}

    def data_inputs(node: Node) -> list[str]:
        """The inputs whose elements the outputs copy: those of the outputs' type (not indices, shapes, axes)."""
        dtype = g.tensors[node.outputs[0]].dtype
        return [i for i in node.inputs if i and g.tensors[i].dtype == dtype]

    def copied(name: str) -> bool:
        if name not in copies:
            node = producers.get(name)
            entry = lowerings().get(node.op) if node is not None else None
            copies[name] = node is None or (entry is not None and entry.moves_data and
                                           all(copied(i) for i in data_inputs(node)))
        return copies[name]

    total = 0
    for name in g.outputs:
        t = g.tensors[name]
        if copied(name) and t.shape is not None and t.dtype is not None:
            total += math.prod(t.shape) * np.dtype(t.dtype).itemsize
    return total
