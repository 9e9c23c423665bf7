"""Merge constants that hold the same values into one.

An export that shares a weight between layers names it once per use: TorchScript writes ALBERT's one shared layer
(whose weights its twelve layers all read) as twelve Identity nodes of each weight, which fold-constants turns into
twelve copies; each copy would then be an HBM tensor of its own, loaded by its own layer (ALBERT-base from
TorchScript: 357 MB of weights after the passes, for 47 MB the model holds). Readers of a copy read the first
constant of its values instead, and the copies, unread, are dropped.

Candidates are grouped by type, shape and a few elements at each end before their values are compared whole, so
different weights of one shape (every layer of a BERT) cost a few element comparisons, not a pass over their bytes.
Small constants (shapes, biases, norm weights) are left alone: copies of those cost nothing. A graph output stays as it is, and
so does a constant an If, Loop or Scan body reads from outside (the body keeps its own names).
"""

from __future__ import annotations

import numpy as np

from neuronx_cc_lite.declared import is_declared
from neuronx_cc_lite.ir import Graph, drop_unused_constants, outer_reads, subgraphs

# Constants of fewer elements are not merged: copies of a layer's bias or norm weights (a few thousand elements)
# cost nothing, and an untrained export's are all zeros or ones, which would merge across every layer
MIN_ELEMENTS = 1 << 16


def _ends(value: np.ndarray) -> bytes:
    flat = value.reshape(-1)
    return flat[:8].tobytes() + flat[-8:].tobytes()


def run(g: Graph) -> Graph:
    kept = set(g.outputs) | {name for n in g.nodes for sub in subgraphs(n) for name in outer_reads(sub)}
    groups: dict[tuple, list[str]] = {}  # (type, shape, ends) -> the distinct constants seen with that key
    same: dict[str, str] = {}  # a copy -> the constant its readers read instead
    for name, t in g.tensors.items():
        value = t.value if t.is_constant else None
        if value is None or is_declared(value) or value.size < MIN_ELEMENTS or name in kept:
            continue
        value = np.asarray(value)
        key = (value.dtype.str, value.shape, _ends(value))
        found = groups.setdefault(key, [])
        first = next((other for other in found if np.array_equal(np.asarray(g.tensors[other].value), value)), None)
        if first is None:
            found.append(name)
        else:
            same[name] = first
    if same:
        for node in g.nodes:
            node.inputs = [same.get(i, i) for i in node.inputs]
        drop_unused_constants(g)
    return g
