"""Fold a constant scale of each output column after a matrix product into the product's constant weights.

    MatMul(A, W) -> [Add a bias row b] -> Mul by a constant row s   becomes   MatMul(A, W s) -> [Add b s]

(A @ W + b) * s = A @ (W diag(s)) + b * s. ConvNeXt's blocks end with such a scale (its "layer scale", one value a
channel after the second linear layer), which was a pass of its own over every block's output: at the first stage
a GpSimdE pass over 96 x 3,136 values on the network's critical path, before the residual's add.

Taken where W is a constant matrix ([K, N]), b and s are constant rows over its N columns (or scalars), the values
between are read by the next node alone, are no graph outputs and are fp32 (an fp16 model rounds them to their
type between ops). The products are taken in float64 and keep W's and b's element types.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, add_constant, drop_unused_constants
from neuronx_cc_lite.passes.fuse_epilogues import bias_row, other_input, sole_user


def run(g: Graph) -> Graph:
    consumers = g.consumers()

    def sole(name: str, op: str) -> Node | None:
        user = sole_user(g, consumers, name)
        return user if user is not None and user.op == op and user.domain in ("", "ai.onnx") else None

    removed: set[int] = set()
    for mm in g.nodes:
        if mm.op != "MatMul" or mm.domain not in ("", "ai.onnx") or len(mm.inputs) != 2:
            continue
        w = g.tensors[mm.inputs[1]]
        if not w.is_constant or w.value.ndim != 2 or w.value.dtype.kind != "f":
            continue
        y = mm.outputs[0]
        shape = g.tensors[y].shape
        if shape is None:
            continue  # (a shape known only at run time)
        add = sole(y, "Add")
        bias = bias_row(g, other_input(add, y), shape) if add is not None else None
        if add is not None and bias is None:
            add = None  # (an Add of something else: the scale, if any, would not follow the product)
        scaled = add.outputs[0] if add is not None else y
        mul = sole(scaled, "Mul")
        scale = bias_row(g, other_input(mul, scaled), shape) if mul is not None else None
        if mul is None or scale is None or g.tensors[mul.outputs[0]].shape != g.tensors[scaled].shape:
            continue
        mm.inputs = [mm.inputs[0], add_constant(g, f"{mm.inputs[1]}/scaled",
                                                (w.value.astype(np.float64) * scale).astype(w.value.dtype))]
        last = mm
        if add is not None:
            b = g.tensors[other_input(add, y)]
            add.inputs = [y, add_constant(g, f"{b.name}/scaled",
                                          (bias.astype(np.float64) * scale).astype(b.value.dtype))]
            last = add
        # the Mul's readers read the product (or its bias's sum) instead
        del g.tensors[last.outputs[0]]
        last.outputs = [mul.outputs[0]]
        removed.add(id(mul))
    g.nodes = [node for node in g.nodes if id(node) not in removed]
    drop_unused_constants(g)
    return g
