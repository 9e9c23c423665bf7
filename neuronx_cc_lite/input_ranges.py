"""The values each integer input may take: the range the operators that read it accept, found on the graph the
compiler lowers and recorded in the bundle (stats["input_ranges"]) so that generated inputs are valid ones
(reference.seeded_inputs): token ids below the vocabulary size, shift amounts below the type's width.

    for each integer graph input:
        follow its values through the operators that only move them (reshapes, transposes, slices, concats,
        casts, ...) to the operators that read them as indices or amounts, and intersect what those accept:
            Gather indices     [0, size of the gathered axis)   (negative ids count from the end: left out)
            BitShift amount    [0, bits of the type)
An input that no such operator reads is not recorded: any value is valid for it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from neuronx_cc_lite.ir import Graph, Node

# Operators whose outputs hold only values of these inputs (by position; None: every input).
_MOVES: dict[str, tuple[int, ...] | None] = {
    "Identity": (0,), "Reshape": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": (0,), "Transpose": (0,),
    "Expand": (0,), "Tile": (0,), "Slice": (0,), "Split": (0,), "Cast": (0,), "Concat": None, "Gather": (0,),
}


def _gather_indices(node: Node, g: Graph) -> tuple[int, int]:
    shape = g.tensors[node.inputs[0]].shape
    return 0, shape[int(node.attrs.get("axis", 0)) % len(shape)]


def _shift_amount(node: Node, g: Graph) -> tuple[int, int]:
    return 0, 8 * np.dtype(g.tensors[node.inputs[0]].dtype).itemsize


# Operators that read an input's values as more than data: (op, input position) -> the range they accept.
_READS: dict[tuple[str, int], Callable[[Node, Graph], tuple[int, int]]] = {
    ("Gather", 1): _gather_indices,
    ("BitShift", 1): _shift_amount,
}


def input_ranges(g: Graph) -> dict[str, list[int]]:
    """{integer input: [low, high)} for the inputs some operator constrains."""
    users = g.consumers()
    ranges = {}
    for name in g.inputs:
        if not np.issubdtype(g.tensors[name].dtype, np.integer):
            continue
        accepted: tuple[int, int] | None = None
        seen, todo = {name}, [name]
        while todo:
            value = todo.pop()
            for node in users.get(value, []):
                for position in (p for p, used in enumerate(node.inputs) if used == value):
                    moves = _MOVES.get(node.op, ())
                    if moves is None or position in moves:
                        todo += [o for o in node.outputs if o and o not in seen]
                        seen.update(node.outputs)
                    elif (node.op, position) in _READS:
                        low, high = _READS[node.op, position](node, g)
                        accepted = (low, high) if accepted is None else (max(low, accepted[0]),
                                                                         min(high, accepted[1]))
        if accepted is not None:
            ranges[name] = list(accepted)
    return ranges
