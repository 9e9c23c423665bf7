"""Remove what nothing uses: nodes none of whose results is read or returned, and the unused optional results of
the rest (a Dropout's mask, a LayerNormalization's statistics), which then need no shape and no instruction."""

from __future__ import annotations

from neuronx_cc_lite.ir import Graph


def run(g: Graph) -> Graph:
    wanted = set(g.outputs)
    kept = []
    for node in reversed(g.nodes):
        if not any(o in wanted for o in node.outputs if o):
            continue
        node.outputs = [o if o in wanted or i == 0 else "" for i, o in enumerate(node.outputs)]
        wanted.update(i for i in node.inputs if i)
        kept.append(node)
    g.nodes = kept[::-1]
    return g
