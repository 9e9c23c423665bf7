"""The verifier run between passes: a failure names the pass that broke the graph and the node."""

from __future__ import annotations

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node, subgraphs
from neuronx_cc_lite.ops.registry import KEPT_BY_PASSES


def verify(g: Graph, after: str, require_static: bool = False) -> None:
    def fail(message: str, node: str | None = None) -> None:
        raise CompileError("NCC_VERIFY", f"after pass {after!r}: {message}", node)

    defined = set(g.inputs) | {name for name, t in g.tensors.items() if t.is_constant}
    for name in g.inputs:
        if name not in g.tensors:
            fail(f"input {name!r} has no tensor")
    for node in g.nodes:
        for name in node.inputs:
            if name and name not in defined:
                fail(f"reads {name!r} before anything defines it", node.name)
        for name in node.outputs:
            if not name:
                continue
            if name in defined:
                fail(f"redefines {name!r}", node.name)
            if name not in g.tensors:
                fail(f"output {name!r} has no tensor", node.name)
            defined.add(name)
        reason = not_static(node, g) if require_static else None
        if reason:
            raise CompileError("NCC_SHAPE_DYNAMIC", reason, node.name, node.op)
    for name in g.outputs:
        if name not in defined:
            fail(f"graph output {name!r} is never defined")
    for name, after_run in g.state.items():
        if name not in g.inputs or after_run not in g.outputs:
            fail(f"state {name!r} must be an input and its next value {after_run!r} an output")
        t, u = g.tensors[name], g.tensors[after_run]
        if u.shape is not None and (t.shape != u.shape or t.dtype != u.dtype):  # known once shapes are folded
            fail(f"state {name!r} and its next value {after_run!r} differ in shape or type")


def not_static(node: Node, g: Graph) -> str | None:
    """None when every tensor the node reads or writes has a static shape and a type, else why one has not.

    The frontend insists on static input shapes, so a shape still open here was decided by some node from values
    known only at run time, or came out of a subgraph that shape inference cannot see through: the reason names
    that node, the first one upstream whose own inputs are all static."""
    name = next((n for n in (*node.inputs, *node.outputs) if n and not _is_static(g, n)), None)
    if name is None:
        return None
    producers = g.producers()
    origin = producers[name] if name in producers else node
    while True:
        upstream = next((i for i in origin.inputs if i and not _is_static(g, i) and i in producers), None)
        if upstream is None:
            break
        origin = producers[upstream]
    kept = KEPT_BY_PASSES.get(origin.op)
    why = kept(origin, g) if kept else None
    if why:
        cause = f"{origin.op} node {origin.name!r} stays for run time: {why}"
    elif subgraphs(origin):
        cause = f"it comes out of the subgraph of {origin.op} node {origin.name!r}, which shape inference cannot " \
                "see through"
    else:
        cause = f"{origin.op} node {origin.name!r} computes it from values known only at run time"
    return f"the shape of {name!r} is not static after constant folding: {cause} (every model input's shape is " \
        "static already)"


def _is_static(g: Graph, name: str) -> bool:
    t = g.tensors[name]
    return t.shape is not None and t.dtype is not None
