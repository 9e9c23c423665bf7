"""Writing the nodes that replace one node: each value and node named under the replaced node's name, the values
untyped until ONNX's shape inference settles them (`folded`: constant folding and inference, node by node), so an
expansion states only what it computes, not the shapes of its steps."""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor


class Writer:
    def __init__(self, g: Graph, node: Node, opset: int) -> None:
        self.g, self.node, self.opset, self.count = g, node, opset, 0
        self.nodes: list[Node] = []

    def _fresh(self, stem: str) -> str:
        self.count += 1
        name = f"{self.node.name}/{stem}{self.count}"
        while name in self.g.tensors:
            name += "_"
        return name

    def add(self, op: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        """A node of ONNX's domain (in the writer's opset) computing `out` (default: a new value) from `inputs`."""
        name = out or self._fresh(op.lower())
        if out is None:
            self.g.tensors[name] = Tensor(name, None, None)  # type: ignore[arg-type]  # settled by `folded`
        self.nodes.append(Node(op, f"{self.node.name}/{op}{self.count}", inputs, [name], attrs, "", self.opset))
        return name

    def const(self, value: object, dtype: type | np.dtype = np.float32) -> str:
        array = np.asarray(value, dtype=dtype)
        name = self._fresh("const")
        self.g.tensors[name] = Tensor(name, tuple(array.shape), array.dtype, array)
        return name

    def folded(self) -> list[Node]:
        """The nodes written, constants folded and every value's type and shape inferred."""
        from neuronx_cc_lite.passes import fold_constants

        return fold_constants.fold_nodes(self.nodes, self.g)
