"""Fold a row normalisation's scale into the constant weights of the matrix products that read it.

    y = RMSNormalization(x, g)  ->  MatMul(y, W1), MatMul(y, W2), ...
    becomes
    y = RMSNormalization(x)     ->  MatMul(y, diag(g) W1), MatMul(y, diag(g) W2), ...

(x * r * g) @ W = (x * r) @ (diag(g) W): each of g's values scales a row of W. A Llama layer's two RMSNorms feed
only projections (q, k and v; the MLP's gate and up): the scale's pass over the row goes, and the normalisation is
one multiply by the row's 1/rms. In a decode step that row is one partition's [1, hidden], a pass over it
microseconds long, between an all-reduce and the projections that wait for it. (A LayerNormalization without a
shift would fold the same way; ONNX's takes a scale, which a part of the graph run by onnxruntime on the host
would then lack: left as it is.)

Taken where the normalisation runs over the last axis only, its scale is a constant of that axis's length, its
result is read by MatMuls alone (as their first operand, with constant [K, N] float weights) and is no graph
output. The products are taken in float64 and keep W's element type; declared weights (shapes without values,
neuronx_cc_lite/declared.py) stay declared.
"""

from __future__ import annotations

import math

import numpy as np

from neuronx_cc_lite.declared import declared, is_declared
from neuronx_cc_lite.ir import Graph, Node, add_constant, drop_unused_constants


def run(g: Graph) -> Graph:
    consumers = g.consumers()
    for node in g.nodes:
        scale = _foldable_scale(g, node)
        if scale is None:
            continue
        k = g.tensors[node.inputs[0]].shape[-1]
        readers = consumers.get(node.outputs[0], [])
        if not readers or not all(_takes_scaled_rows(g, r, node.outputs[0], k) for r in readers):
            continue
        for r in readers:
            w = g.tensors[r.inputs[1]].value
            value = declared(w.shape, w.dtype) if is_declared(w) or is_declared(scale) else \
                (w.astype(np.float64) * np.asarray(scale, np.float64).reshape(-1)[:, None]).astype(w.dtype)
            r.inputs = [r.inputs[0], add_constant(g, f"{r.inputs[1]}/scaled", value)]
        node.inputs = [node.inputs[0], ""] + node.inputs[2:]  # (no scale: the lowering multiplies by none)
    drop_unused_constants(g)
    return g


def _foldable_scale(g: Graph, node: Node) -> np.ndarray | None:
    """The normalisation's scale, a constant over its last axis only, when the node may give it away (its
    values, or a declared constant's placeholder)."""
    if node.op != "RMSNormalization" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2 or \
            not node.inputs[1] or node.outputs[0] in g.outputs:
        return None
    shape = g.tensors[node.inputs[0]].shape
    s = g.tensors[node.inputs[1]]
    if shape is None or not s.is_constant or node.attrs.get("axis", -1) not in (-1, len(shape) - 1):
        return None
    value = s.value
    if value.dtype.kind != "f" or math.prod(value.shape) != shape[-1] or tuple(value.shape[-1:]) != (shape[-1],):
        return None
    return value


def _takes_scaled_rows(g: Graph, reader: Node, y: str, k: int) -> bool:
    """Whether `reader` is a MatMul of y by constant float weights [k, N]."""
    if reader.op != "MatMul" or reader.domain not in ("", "ai.onnx") or reader.inputs[:1] != [y] or \
            y in reader.inputs[1:]:
        return False
    w = g.tensors[reader.inputs[1]]
    return w.is_constant and len(w.value.shape) == 2 and w.value.shape[0] == k and w.value.dtype.kind == "f"
