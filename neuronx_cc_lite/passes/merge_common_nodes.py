"""Merge nodes that compute the same thing: the same op, with the same attributes, on the same inputs.

TorchScript writes BERT's attention mask once per layer: each layer's self-attention computes
Where(mask, 0, -inf-ish) from the one expanded mask and two Constant nodes of its own, 24 copies in BERT-large, each
a pass of its own and a tensor loaded and stored through HBM; the dynamo exporter computes it once. A later node
that repeats an earlier one (in the graph's order, which is topological) is dropped, and its readers read the
earlier node's results instead.

Inputs compare by name, except small constants, which compare by value (each layer's Constant nodes hold the same
numbers under different names); large ones are one tensor already where they are equal (merge-constants). Not
merged: ops with a random result (RandomNormal and the rest), a node with a subgraph (an If's branches, a Loop's
body), and a node any of whose results the graph returns (the output keeps its name).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuronx_cc_lite.declared import is_declared
from neuronx_cc_lite.ir import Graph, Node, subgraphs

# Ops whose every evaluation draws new values: two of them on the same inputs are not the same result.
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})
# Constants of at most this many elements compare by value; larger ones by name (merge-constants merged the copies
# of those worth merging, and comparing their bytes here would hash every weight of the model).
MAX_VALUE_ELEMENTS = 4096


def run(g: Graph) -> Graph:
    returned = set(g.outputs)
    first: dict[tuple, Node] = {}  # a node's key -> the first node with it
    same: dict[str, str] = {}  # a dropped node's result -> the first node's
    kept: list[Node] = []
    for node in g.nodes:
        node.inputs = [same.get(i, i) for i in node.inputs]
        key = _key(g, node)
        if key is None or any(o in returned for o in node.outputs):
            kept.append(node)
            continue
        earlier = first.setdefault(key, node)
        if earlier is node:
            kept.append(node)
            continue
        for mine, theirs in zip(node.outputs, earlier.outputs):
            if mine:
                same[mine] = theirs
                g.tensors.pop(mine, None)
    if same:
        g.nodes = kept
    return g


def _key(g: Graph, node: Node) -> tuple | None:
    """What the node computes, as a hashable key, or None when it is not to be merged."""
    if node.op in RANDOM_OPS or subgraphs(node) or not any(node.outputs):
        return None
    inputs = tuple(_input_key(g, name) for name in node.inputs)
    try:
        attrs = tuple(sorted((name, _value_key(value)) for name, value in node.attrs.items()))
    except TypeError:  # an attribute this pass cannot compare (a tensor of another kind): leave the node alone
        return None
    # (the number of results matters: an optional one absent in one node and present in the other)
    return node.domain, node.op, g.opset_of(node), attrs, inputs, len(node.outputs)


def _input_key(g: Graph, name: str) -> Any:
    t = g.tensors.get(name) if name else None
    if t is None or not t.is_constant or is_declared(t.value) or np.size(t.value) > MAX_VALUE_ELEMENTS:
        return name
    value = np.asarray(t.value)
    return "=", value.dtype.str, value.shape, value.tobytes()


def _value_key(value: Any) -> Any:
    if isinstance(value, float):
        return "float", repr(value)  # (-0.0 is not 0.0; nan equals nan)
    if isinstance(value, (int, str, bytes, bool)) or value is None:
        return type(value).__name__, value
    if isinstance(value, (tuple, list)):
        return tuple(_value_key(v) for v in value)
    if isinstance(value, np.ndarray):
        return "array", value.dtype.str, value.shape, value.tobytes()
    raise TypeError(type(value).__name__)
