"""Fold an inference BatchNormalization into the Conv, ConvTranspose or Gemm that feeds it.

BN(y) = y * scale + shift per channel (scale = gamma / sqrt(var + eps), shift = beta - mean * scale). When y is
a convolution or a Gemm with constant weights, and the BN is the only reader of y, the product scales the
weights of each output channel and the shift joins the bias: the BN disappears and no instruction is spent on it.
Folding is done in float64 and the new weights keep the old ones' element type.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, add_constant, drop_unused_constants
from neuronx_cc_lite.ops.attributes import inference_only, scale_shift


def _constant(g: Graph, node: Node, index: int) -> np.ndarray | None:
    """Input `index` of the node as a constant, an absent input as an empty array, or None if it is computed."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return np.zeros(0)
    t = g.tensors[node.inputs[index]]
    return t.value if t.is_constant else None


def _fold_conv(g: Graph, node: Node, scale: np.ndarray, shift: np.ndarray) -> bool:
    w, b = _constant(g, node, 1), _constant(g, node, 2)
    if w is None or b is None or w.size == 0:
        return False
    groups = int(node.attrs.get("group", 1))
    if node.op == "Conv":  # weights [M, C / groups, *kernel]
        per_output = scale.reshape((-1,) + (1,) * (w.ndim - 1))
        new_w = w.astype(np.float64) * per_output
    else:  # ConvTranspose: weights [C, M / groups, *kernel]; output channel g * M/groups + m
        c, mg = w.shape[:2]
        grouped = w.astype(np.float64).reshape((groups, c // groups, mg) + w.shape[2:])
        new_w = (grouped * scale.reshape((groups, 1, mg) + (1,) * (w.ndim - 2))).reshape(w.shape)
    bias = b.astype(np.float64) if b.size else np.zeros_like(scale)
    new_b = bias * scale + shift
    node.inputs[1:] = [add_constant(g, node.inputs[1] + "/bn_folded", new_w.astype(w.dtype)),
                       add_constant(g, node.inputs[1] + "/bias/bn_folded", new_b.astype(w.dtype))]
    return True


def _fold_gemm(g: Graph, node: Node, scale: np.ndarray, shift: np.ndarray) -> bool:
    b, c = _constant(g, node, 1), _constant(g, node, 2)
    if b is None or c is None or len(g.tensors[node.outputs[0]].shape) != 2:
        return False
    columns = scale[None, :] if not node.attrs.get("transB", 0) else scale[:, None]
    beta = float(node.attrs.get("beta", 1.0))
    bias = beta * c.astype(np.float64) * scale + shift if c.size else shift
    node.inputs[1:] = [add_constant(g, node.inputs[1] + "/bn_folded", (b.astype(np.float64) * columns).astype(b.dtype)),
                       add_constant(g, node.inputs[1] + "/bias/bn_folded", bias.astype(b.dtype))]
    node.attrs["beta"] = 1.0
    return True


_FOLDERS = {"Conv": _fold_conv, "ConvTranspose": _fold_conv, "Gemm": _fold_gemm}


def run(g: Graph) -> Graph:
    producers, consumers = g.producers(), g.consumers()
    removed: set[int] = set()
    for bn in g.nodes:
        if bn.op != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or inference_only(bn):
            continue
        y = bn.inputs[0]
        producer = producers.get(y)
        stats = [g.tensors[name] for name in bn.inputs[1:5]]
        if (producer is None or producer.op not in _FOLDERS or len(consumers.get(y, [])) != 1
                or y in g.outputs or not all(t.is_constant for t in stats)):
            continue
        scale, shift = scale_shift([t.value for t in stats], float(bn.attrs.get("epsilon", 1e-5)))
        if _FOLDERS[producer.op](g, producer, scale, shift):
            producer.outputs[0] = bn.outputs[0]
            del g.tensors[y]
            removed.add(id(bn))
    g.nodes = [n for n in g.nodes if id(n) not in removed]
    drop_unused_constants(g)
    return g
