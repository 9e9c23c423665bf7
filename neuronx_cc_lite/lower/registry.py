"""The registry of op lowerings, keyed by ONNX op name (default domain).

Each entry has the lowering itself and a `check` that says, before anything is lowered, why a node cannot be
(an attribute value, a dtype, an opset), so that `analyze` and the compiler report every unsupported node at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import Check, Lower, device_dtype


@dataclass(frozen=True)
class Lowering:
    op: str
    lower: Lower
    check: Check | None
    since: int  # the first opset whose semantics the lowering implements


LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops: str, check: Check | None = None, since: int = 1):  # type: ignore[no-untyped-def]
    def register(fn: Lower) -> Lower:
        for op in ops:
            assert op not in LOWERINGS, f"two lowerings for {op}"
            LOWERINGS[op] = Lowering(op, fn, check, since)
        return fn

    return register


def why_unsupported(node: Node, g: Graph) -> str | None:
    """None when the node can be lowered, else the reason it cannot."""
    if node.domain not in ("", "ai.onnx"):
        return f"domain {node.domain!r} is not supported"
    entry = LOWERINGS.get(node.op)
    if entry is None:
        return f"operator {node.op} is not supported"
    if g.opset < entry.since:
        return f"{node.op} is supported from opset {entry.since}; the model uses opset {g.opset}"
    for name in (*node.inputs, *node.outputs):
        t = g.tensors.get(name) if name else None
        if t is not None and t.dtype is not None and device_dtype(np.dtype(t.dtype)) is None:
            return f"tensor {name!r} has element type {t.dtype}, which the device does not hold"
    return entry.check(node, g) if entry.check else None


def unsupported_nodes(g: Graph) -> list[tuple[str, str, str]]:
    return [(n.name, n.op, reason) for n in g.nodes if (reason := why_unsupported(n, g)) is not None]
