"""Split attention into groups of heads when its scores would not stay on chip:

    S = MatMul[Epilogue](Q, K^T [, mask])  [-> Add | Sub | Mul | Div ...]  ->  P = Softmax(S, axis -1)
      ->  O = MatMul(P, V)                                                                   over [..., H, Sq, Sk]

becomes, for each group of heads h0 .. h1: Q, K^T and V (and a mask with a head axis) sliced to the group (views,
lower/movement.py), the same chain on the slices, and one Concat of the groups' O along the head axis, under O's
name. Lowering takes nodes in order, so a group's scores are made, normalised and read by its second matmul
before the next group's exist: they keep a home in SBUF (codegen/on_chip.py) instead of going to HBM and back
(seq 512 with 16 heads: 16 MiB of fp32 scores and as much again of probabilities, beyond the half of SBUF the
homes may take). A group holds as many heads as keep its scores within `budget` bytes.

It runs on each rank's graph (after partitioning, which cuts attention by heads and would see these slices as
moves between ranks), when the scores of all heads exceed the budget.
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.ops.registry import INTERNAL_DOMAIN

_FIRST = ("MatMul", "MatMulEpilogue")
_ELEMENTWISE = ("Add", "Sub", "Mul", "Div")


def run(g: Graph, budget: int, partitions: int = 128) -> Graph:
    users = g.consumers()
    chains = [c for c in (_attention(g, users, node) for node in g.nodes)
              if c is not None and _scores_bytes(g, c[0], partitions) > budget]
    # the groups' nodes go where the second matmul was: every input of the chain (V too) exists by then
    at_last = {id(c[-1]): c for c in chains}
    gone = {id(n) for c in chains for n in c[:-1]}
    nodes: list[Node] = []
    for node in g.nodes:
        if id(node) in at_last:
            nodes += _split(g, at_last[id(node)], budget, partitions)
        elif id(node) not in gone:
            nodes.append(node)
    g.nodes = nodes
    for chain in chains:
        for node in chain[:-1]:
            del g.tensors[node.outputs[0]]
    return g


def _scores_bytes(g: Graph, node: Node, partitions: int) -> int:
    """The SBUF the scores take on chip: in fp32, their rows (queries) on partitions, a block of `partitions` rows
    at a time, so that 49 rows (Swin's windows) take the room of 128."""
    t = g.tensors[node.outputs[0]]
    rows = t.shape[-2]
    return -(-rows // partitions) * partitions * (t.size // rows) * 4


def _sole_user(g: Graph, users: dict[str, list[Node]], name: str) -> Node | None:
    found = users.get(name, [])
    return found[0] if len(found) == 1 and name not in g.outputs else None


def _heads_of(g: Graph, name: str, heads: int) -> bool | None:
    """Whether an operand of the chain has the head axis (axis -3 of H), None when it has one of another size."""
    shape = g.tensors[name].shape if name else ()
    if len(shape) < 3 or shape[-3] == 1:
        return False
    return True if shape[-3] == heads else None


def _attention(g: Graph, users: dict[str, list[Node]], first: Node) -> list[Node] | None:
    """[first matmul, elementwise ops..., Softmax, second matmul] when `first` starts the chain in the module
    docstring (a scale or a mask may sit between the first matmul and the Softmax) with every head whole."""
    if first.op not in _FIRST or (first.op == "MatMulEpilogue") != (first.domain == INTERNAL_DOMAIN):
        return None
    shape = g.tensors[first.outputs[0]].shape
    if len(shape) < 3 or shape[-3] < 2:
        return None
    heads = shape[-3]
    if any(g.tensors[i].shape[:-2] != shape[:-2] for i in first.inputs[:2]) or \
            any(_heads_of(g, i, heads) is None for i in first.inputs[2:]):
        return None
    chain = [first]
    node = _sole_user(g, users, first.outputs[0])
    while node is not None and node.op in _ELEMENTWISE and g.tensors[node.outputs[0]].shape == shape and \
            all(_heads_of(g, i, heads) is not None for i in node.inputs if i != chain[-1].outputs[0]):
        chain.append(node)
        node = _sole_user(g, users, node.outputs[0])
    if node is None or node.op != "Softmax" or int(node.attrs.get("axis", -1)) % len(shape) != len(shape) - 1:
        return None
    chain.append(node)
    second = _sole_user(g, users, node.outputs[0])
    if second is None or second.op != "MatMul" or second.inputs[0] != node.outputs[0] or \
            g.tensors[second.inputs[1]].shape[:-2] != shape[:-2]:
        return None
    return chain + [second]


def _group(heads: int, per_head: int, budget: int) -> int:
    """The most heads whose scores fit the budget (one at least), dividing the heads evenly."""
    group = max(1, min(heads, budget // per_head))
    while heads % group:
        group -= 1
    return group


def _split(g: Graph, chain: list[Node], budget: int, partitions: int) -> list[Node]:
    first, last = chain[0], chain[-1]
    heads = g.tensors[first.outputs[0]].shape[-3]
    group = _group(heads, _scores_bytes(g, first, partitions) // heads, budget)
    out: list[Node] = []
    pieces = []
    for h0 in range(0, heads, group):
        tag = f"heads{h0}-{h0 + group - 1}"

        def cut(name: str) -> str:
            """`name` sliced to the group's heads, or itself when it has no head axis (a mask that broadcasts
            over the heads, an absent input)."""
            if not _heads_of(g, name, heads):
                return name
            axis = len(g.tensors[name].shape) - 3
            piece = _tensor(g, f"{name}/{tag}", name, group)
            bounds = [_constant(g, f"{piece}/{what}", [value])
                      for what, value in (("starts", h0), ("ends", h0 + group), ("axes", axis))]
            out.append(Node("Slice", f"{piece}/Slice", [name, *bounds], [piece]))
            return piece

        previous, whole = "", ""  # the group's piece of the last result, and that result's name
        for node in chain:
            inputs = [previous if whole and i == whole else cut(i) for i in node.inputs]
            whole = node.outputs[0]
            previous = _tensor(g, f"{whole}/{tag}", whole, group)
            out.append(Node(node.op, f"{node.name}/{tag}", inputs, [previous], dict(node.attrs), node.domain,
                            node.opset))
        pieces.append(previous)
    out.append(Node("Concat", f"{last.name}/heads", pieces, [last.outputs[0]],
                    {"axis": len(g.tensors[last.outputs[0]].shape) - 3}))
    return out


def _tensor(g: Graph, name: str, like: str, heads: int) -> str:
    """A tensor shaped as `like` with `heads` heads (its axis -3)."""
    t = g.tensors[like]
    shape = list(t.shape)
    shape[-3] = heads
    g.tensors[name] = Tensor(name, tuple(shape), t.dtype)
    return name


def _constant(g: Graph, name: str, values: list[int]) -> str:
    g.tensors[name] = Tensor(name, (len(values),), np.dtype(np.int64), np.array(values, np.int64))
    return name
