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


def _row(g: Graph, name: str, n: int) -> np.ndarray | None:
    """The constant as a float64 row of n values (a scalar repeated), when it is one."""
    t = g.tensors.get(name)
    if t is None or not t.is_constant or t.value.dtype.kind != "f":
        return None
    shape = t.value.shape
    if any(k != 1 for k in shape[:-1]) or (shape and shape[-1] not in (1, n)):
        return None
    return np.broadcast_to(t.value.astype(np.float64).reshape(-1), (n,))


def _other(node: Node, name: str) -> str | None:
    """The input of a two-input node that is not `name` (None when both are)."""
    if len(node.inputs) != 2 or name not in node.inputs or node.inputs[0] == node.inputs[1]:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def run(g: Graph) -> Graph:
    consumers = g.consumers()

    def sole(name: str, op: str) -> Node | None:
        users = consumers.get(name, [])
        if len(users) != 1 or name in g.outputs or g.tensors[name].dtype != np.float32:
            return None
        user = users[0]
        return user if user.op == op and user.domain in ("", "ai.onnx") else None

    removed: set[int] = set()
    for mm in g.nodes:
        if mm.op != "MatMul" or mm.domain not in ("", "ai.onnx") or len(mm.inputs) != 2:
            continue
        w = g.tensors[mm.inputs[1]]
        if not w.is_constant or w.value.ndim != 2 or w.value.dtype.kind != "f":
            continue
        n = w.value.shape[1]
        y = mm.outputs[0]
        add = sole(y, "Add")
        bias = _row(g, _other(add, y) or "", n) if add is not None else None
        if add is not None and bias is None:
            add = None  # (an Add of something else: the scale, if any, would not follow the product)
        scaled = add.outputs[0] if add is not None else y
        mul = sole(scaled, "Mul")
        other = _other(mul, scaled) if mul is not None else None
        scale = _row(g, other, n) if other else None
        if mul is None or scale is None or g.tensors[mul.outputs[0]].shape != g.tensors[scaled].shape:
            continue
        mm.inputs = [mm.inputs[0], add_constant(g, f"{mm.inputs[1]}/scaled",
                                                (w.value.astype(np.float64) * scale).astype(w.value.dtype))]
        last = mm
        if add is not None:
            b = g.tensors[_other(add, y)]
            add.inputs = [y, add_constant(g, f"{b.name}/scaled", (bias * scale).astype(b.value.dtype))]
            last = add
        # the Mul's readers read the product (or its bias's sum) instead
        del g.tensors[last.outputs[0]]
        last.outputs = [mul.outputs[0]]
        removed.add(id(mul))
    g.nodes = [node for node in g.nodes if id(node) not in removed]
    drop_unused_constants(g)
    return g
