"""Fold a 1x1 convolution that applies no function into the 1x1 convolution that reads it.

Two pointwise convolutions in a row with nothing between them are one: W2 (W1 x + b1) + b2 = (W2 W1) x + (W2 b1 +
b2). MobileNetV3-Small's first block projects its 16 channels to 16 (no activation, no residual: the next block
has stride 2) and the next block expands those 16 to 72 at 56 x 56. Folded, the 16 x 16 product over 3,136 pixels
disappears, and with it seven PSUM banks evacuated on 16 lanes, ScalarE's work on the network's critical path.

The fold is taken only where it does no more arithmetic than the pair (C -> R -> M: C * M <= R * (C + M); a
low-rank bottleneck stays as it is), where the first convolution's output is read by the second alone, is no graph
output and is fp32 (an fp16 model's values are rounded to their type between ops), and where both have constant
weights. The first must not move its window (stride 1, no padding: each output pixel is the same pixel's
channels); the second may (its stride then subsamples the folded product as it did the pair's). Weights are
multiplied in float64 and keep the second's element type.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, add_constant, drop_unused_constants


def _pointwise(g: Graph, node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(weights [M, C], bias [M]) of a group-1 1x1 Conv with constant weights (and bias, if any); else None."""
    if node.op != "Conv" or node.domain not in ("", "ai.onnx") or int(node.attrs.get("group", 1)) != 1:
        return None
    if len(node.inputs) < 2 or not g.tensors[node.inputs[1]].is_constant:
        return None
    w = g.tensors[node.inputs[1]].value
    if w.ndim < 3 or any(k != 1 for k in w.shape[2:]) or any(p != 0 for p in node.attrs.get("pads", ())):
        return None
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    if len(node.inputs) > 2 and node.inputs[2]:
        b = g.tensors[node.inputs[2]]
        if not b.is_constant:
            return None
        bias = b.value.astype(np.float64)
    else:
        bias = np.zeros(w.shape[0])
    return w.reshape(w.shape[0], w.shape[1]).astype(np.float64), bias


def _unit_stride(node: Node) -> bool:
    return all(s == 1 for s in node.attrs.get("strides", ()))


def run(g: Graph) -> Graph:
    producers, consumers = g.producers(), g.consumers()
    removed: set[int] = set()
    for second in g.nodes:
        b = _pointwise(g, second)
        y = second.inputs[0] if b is not None else None
        first = producers.get(y) if y else None
        if first is None or id(first) in removed or len(consumers.get(y, [])) != 1 or y in g.outputs or \
                g.tensors[y].dtype != np.float32:
            continue  # (an fp16 model rounds y to its type between the two: the fold would skip that)
        a = _pointwise(g, first)
        if a is None or not _unit_stride(first):
            continue
        (w1, b1), (w2, b2) = a, b
        (r, c), m = w1.shape, w2.shape[0]
        if c * m > r * (c + m):
            continue  # a bottleneck: the pair does less arithmetic than its product would
        w_dtype = g.tensors[second.inputs[1]].value.dtype
        kernel = g.tensors[second.inputs[1]].value.shape[2:]
        weights = (w2 @ w1).reshape((m, c) + kernel).astype(w_dtype)
        bias = (w2 @ b1 + b2).astype(w_dtype)
        second.inputs = [first.inputs[0], add_constant(g, second.inputs[1] + "/folded", weights),
                         add_constant(g, second.inputs[1] + "/bias/folded", bias)]
        del g.tensors[y]
        removed.add(id(first))
    g.nodes = [n for n in g.nodes if id(n) not in removed]
    drop_unused_constants(g)
    return g
