"""Drop the nodes whose result is one of their inputs, element for element: its readers read that input.

Exporters leave such nodes where their own graphs needed a step: TorchScript reshapes each BERT layer's attention
output [1, 16, 128, 64] to [1, 16, 128, 64] (lowered, a copy of its own, a GpSimdE pass a layer, which also kept
the Transpose and Reshape after it from reading the attention output directly) and casts a Llama RMSNorm's float
input and output to float (which kept canonicalize from seeing the RMSNorm); the dynamo exporter adds ViT's
attention scores to an attention mask of zeros, a pass over them a layer. Before canonicalize, whose patterns they
would break.

What is dropped: a view (Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Identity) or a Cast that keeps its
input's shape and type (a Transpose its axes' order too), a Pad of constant zeros on every side (Swin pads each
stage to whole windows, by nothing at 224 x 224), and an Add or Sub of constant zeros or a Mul or Div by constant
ones that does not broadcast its input larger. Not a constant that is a parameter or computed from one
(Tensor.learned: a bias, Swin's relative position bias): an untrained export holds zeros and ones there that a
trained model does not, and the benchmarks' models are untrained, so their figures would gain what a real model's
cannot. A node whose result the graph returns, or a subgraph reads, stays.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.declared import is_declared
from neuronx_cc_lite.ir import Graph, Node, outer_reads, subgraphs
from neuronx_cc_lite.passes.simplify_views import VIEWS

# ops whose result, when it has its first input's shape and type, is that input (a Transpose's axes kept in order)
SAME_SHAPE = VIEWS | {"Cast"}
# the input of each arithmetic op that its result equals when the other input is the constant: Add(x, 0) and
# Add(0, x), Sub(x, 0), Mul(x, 1) and Mul(1, x), Div(x, 1); (position of x, the constant's value)
IDENTITIES = {"Add": ((0, 0.0), (1, 0.0)), "Sub": ((0, 0.0),), "Mul": ((0, 1.0), (1, 1.0)), "Div": ((0, 1.0),)}


def run(g: Graph) -> Graph:
    kept = set(g.outputs) | {name for n in g.nodes for sub in subgraphs(n) for name in outer_reads(sub)}
    same: dict[str, str] = {}  # a dropped node's result -> the input it equals
    nodes = []
    for node in g.nodes:
        node.inputs = [same.get(i, i) for i in node.inputs]
        source = _unchanged_input(g, node) if node.outputs and node.outputs[0] not in kept else None
        if source is None:
            nodes.append(node)
        else:
            same[node.outputs[0]] = source
            del g.tensors[node.outputs[0]]
    g.nodes = nodes
    return g


def _unchanged_input(g: Graph, node: Node) -> str | None:
    """The input the node's result is, element for element, or None."""
    if node.domain not in ("", "ai.onnx") or (node.op not in SAME_SHAPE and node.op not in IDENTITIES and
                                               node.op != "Pad"):
        return None
    y = g.tensors[node.outputs[0]]
    if node.op == "Pad":  # pads given as an input (opset 11 on), every one zero: nothing added, nothing cut
        pads = g.tensors[node.inputs[1]] if len(node.inputs) > 1 and node.inputs[1] else None
        x = g.tensors[node.inputs[0]]
        if pads is None or not pads.is_constant or np.any(np.asarray(pads.value) != 0) or x.dtype != y.dtype:
            return None
        return node.inputs[0]
    if node.op in SAME_SHAPE:
        x = g.tensors[node.inputs[0]]
        if x.shape is None or x.shape != y.shape or x.dtype != y.dtype:
            return None
        perm = node.attrs.get("perm") if node.op == "Transpose" else None
        if node.op == "Transpose" and len(x.shape) > 1 and (perm is None or list(perm) != list(range(len(x.shape)))):
            return None
        return node.inputs[0]
    for position, unit in IDENTITIES[node.op]:
        x, c = (g.tensors[node.inputs[k]] for k in (position, 1 - position))
        if x.shape is not None and x.shape == y.shape and x.dtype == y.dtype and c.is_constant and \
                not c.learned and not is_declared(c.value) and np.all(np.asarray(c.value) == unit):
            return node.inputs[position]
    return None
