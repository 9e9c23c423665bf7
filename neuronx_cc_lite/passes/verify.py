"""The verifier run between passes: a failure names the pass that broke the graph and the node."""

from __future__ import annotations

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph


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
            t = g.tensors[name]
            if require_static and (t.shape is None or t.dtype is None):
                raise CompileError("NCC_SHAPE_DYNAMIC", f"the shape of {name!r} is not static after constant "
                                   "folding; pin the model's input shapes with --input-shape", node.name, node.op)
            defined.add(name)
    for name in g.outputs:
        if name not in defined:
            fail(f"graph output {name!r} is never defined")
