"""Reductions of a broadcast: reduce the tensor before it was expanded.

An Expand is a view (lower/movement.py): the axes it repeats cost nothing until something reads every element.
A reduction over a repeated axis does, though it only sees each value again: ReduceSum of x expanded to
[50000, 50000] read 2.5e9 elements (minutes of compile, for 150,000 pieces) where x has 50,000. So, with x padded
to the Expand's rank and `repeats` the product of the reduced axes that the Expand repeats (x has 1 there):

    ReduceSum(Expand(x)), ReduceL1, ReduceSumSquare   = repeats * the same reduction of x
    ReduceMean(Expand(x)), ReduceMax, ReduceMin        = the same reduction of x

over the same axes (keepdims), then expanded over the axes it keeps that the Expand repeats, and reshaped when the
reduction drops its axes. Float tensors only: an integer sum times `repeats` could leave the range that the
integer-exactness check (integer_ranges.py) proved for the original.
"""

from __future__ import annotations

import math

import numpy as np

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.ops.attributes import reduced_axes
from neuronx_cc_lite.passes.writer import Writer

OPSET = 18  # every Reduce* takes its axes as an input
TIMES_REPEATS = frozenset({"ReduceSum", "ReduceL1", "ReduceSumSquare"})
SAME = frozenset({"ReduceMean", "ReduceMax", "ReduceMin"})
PLAIN_OVER_ONE = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"})


def _rewrite(node: Node, expand: Node, g: Graph) -> list[Node] | None:
    """The nodes computing `node` (a reduction of `expand`'s output) from `expand`'s input, or None."""
    x, out = g.tensors[expand.inputs[0]], g.tensors[node.outputs[0]]
    wide = g.tensors[expand.outputs[0]].shape
    if x.shape is None or wide is None or out.shape is None or not np.issubdtype(x.dtype, np.floating):
        return None
    axes = reduced_axes(node, g)  # () is every axis, or none with noop_with_empty_axes
    if axes is None or not axes and node.attrs.get("noop_with_empty_axes", 0):
        return None
    axes = axes or tuple(range(len(wide)))
    if any(not 0 <= a < len(wide) for a in axes):
        return None  # left to the lowering's own check
    padded = (1,) * (len(wide) - len(x.shape)) + tuple(x.shape)
    repeats = math.prod(wide[a] for a in axes if padded[a] == 1)
    if repeats == 1:
        return None  # nothing repeated is reduced
    w = Writer(g, node, OPSET)
    source = expand.inputs[0] if padded == tuple(x.shape) else w.add(
        "Reshape", [expand.inputs[0], w.const(padded, np.int64)])
    kept = tuple(1 if a in axes else n for a, n in enumerate(wide))
    steps: list[tuple[str, str | None, dict[str, int]]] = []
    # over axes where x has one value, a sum, mean, max or min of it is x (an L1 or a sum of squares is not)
    if any(padded[a] > 1 for a in axes) or node.op not in PLAIN_OVER_ONE:
        steps.append((node.op, w.const(axes, np.int64), {"keepdims": 1}))
    if node.op in TIMES_REPEATS:
        steps.append(("Mul", w.const(repeats, x.dtype), {}))
    if kept != tuple(1 if a in axes else n for a, n in enumerate(padded)):
        steps.append(("Expand", w.const(kept, np.int64), {}))
    if tuple(out.shape) != kept:  # keepdims=0
        steps.append(("Reshape", w.const(tuple(out.shape), np.int64), {}))
    steps = steps or [("Identity", None, {})]
    value = source
    for k, (op, operand, attrs) in enumerate(steps):  # the last step writes the node's output
        value = w.add(op, [value] + ([operand] if operand else []), node.outputs[0] if k == len(steps) - 1 else None,
                      **attrs)
    return w.folded()


def run(g: Graph) -> Graph:
    producers = {out: n for n in g.nodes for out in n.outputs}
    nodes: list[Node] = []
    for node in g.nodes:
        source = producers.get(node.inputs[0]) if node.inputs else None
        rewritten = None
        if node.op in TIMES_REPEATS | SAME and node.domain in ("", "ai.onnx") and source is not None and \
                source.op == "Expand" and source.domain in ("", "ai.onnx"):
            rewritten = _rewrite(node, source, g)
        nodes.extend(rewritten if rewritten is not None else [node])
    g.nodes = nodes
    return g
