"""Expand operators the compiler has no lowering for into their ONNX function bodies.

Many ONNX operators (Attention, the losses, Swish, ...) are defined by the standard as a function of simpler
operators. When the lowering registry has no entry for such an op, this pass replaces the node by the body that
ONNX's schema gives (taking the body for the model's opset, and the context-dependent body where the definition
depends on the input types), renaming the body's internal values under the node's name and substituting the
attributes it refers to. Expanded nodes keep the opset their body was written for. Expansion repeats until every
node has a lowering or no function.

A body that holds a subgraph (Range's Loop, AffineGrid's If) is not expanded: the device runs no subgraph op, so
the node stays as it is, for the fold after this pass to evaluate once its inputs are known (a Range over computed
shapes), or for lowering to name as unsupported.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from neuronx_cc_lite.frontend import attr_value
from neuronx_cc_lite.ir import Graph, Node, Tensor
from neuronx_cc_lite.ops.registry import lowerings
from neuronx_cc_lite.passes.fold_constants import fold_nodes, to_onnx_node

MAX_ROUNDS = 8  # function bodies nest a few levels at most; the bound stops a body that expands into itself


def _value_type(t: Tensor) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(t.dtype), t.shape)


def _body(node: Node, g: Graph) -> tuple[onnx.FunctionProto, onnx.defs.OpSchema] | None:
    found = _function(node, g)
    if found is None or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                            for inner in found[0].node for a in inner.attribute):
        return None
    return found


def _function(node: Node, g: Graph) -> tuple[onnx.FunctionProto, onnx.defs.OpSchema] | None:
    try:
        schema = onnx.defs.get_schema(node.op, g.opset_of(node), node.domain or "")
    except onnx.defs.SchemaError:
        return None
    proto = onnx.FunctionProto()
    versions = [v for v in schema.function_opset_versions if v <= g.opset_of(node)]
    if versions:
        proto.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        return proto, schema
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= g.opset_of(node)]
    if not versions:
        return None
    if any(i and (g.tensors[i].shape is None or g.tensors[i].dtype is None) for i in node.inputs):
        return None
    types = [_value_type(g.tensors[i]).SerializeToString() if i else onnx.TypeProto().SerializeToString()
             for i in node.inputs]
    with_defaults = _with_default_attrs(node, schema)
    proto.ParseFromString(schema.get_context_dependent_function_with_opset_version(
        max(versions), to_onnx_node(with_defaults).SerializeToString(), types))
    return proto, schema


def _with_default_attrs(node: Node, schema: onnx.defs.OpSchema) -> Node:
    attrs = dict(node.attrs)
    for name, a in schema.attributes.items():
        if name not in attrs and a.default_value.name:
            attrs[name] = attr_value(a.default_value)
    return Node(node.op, node.name, node.inputs, node.outputs, attrs, node.domain, node.opset)


def _expand(node: Node, g: Graph, body: onnx.FunctionProto, schema: onnx.defs.OpSchema) -> list[Node]:
    node = _with_default_attrs(node, schema)
    prefix = f"{node.name}/"
    names: dict[str, str] = {}
    for formal, actual in zip(body.input, node.inputs):
        names[formal] = actual
    for formal, actual in zip(body.output, node.outputs):
        if actual:
            names[formal] = actual
    rename = lambda n: "" if not n else names.get(n, prefix + n)  # noqa: E731
    opset = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), g.opset_of(node))
    expanded = []
    for index, inner in enumerate(body.node):
        attrs: dict[str, Any] = {}
        for a in inner.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in node.attrs:
                    attrs[a.name] = node.attrs[a.ref_attr_name]
                continue
            attrs[a.name] = attr_value(a)
        name = f"{prefix}{inner.name or inner.op_type + '_' + str(index)}"
        expanded.append(Node(inner.op_type, name, [rename(i) for i in inner.input],
                             [rename(o) for o in inner.output], attrs, inner.domain, opset))
    for n in expanded:
        for out in n.outputs:
            if out and out not in g.tensors:
                g.tensors[out] = Tensor(out, None, None)  # type: ignore[arg-type]  # settled by fold-function-bodies
    return expanded


def run(g: Graph) -> Graph:
    for _ in range(MAX_ROUNDS):
        changed = False
        nodes: list[Node] = []
        for node in g.nodes:
            found = None if node.op in lowerings() else _body(node, g)
            if found is None:
                nodes.append(node)
                continue
            nodes.extend(_expand(node, g, *found))
            changed = True
        g.nodes = nodes
        if not changed:
            break
        # the new values' types, so that a later round can expand context-dependent bodies (which need their input
        # types): folded, as a body's shape arithmetic (a Reshape's computed target) settles the shapes after it
        g.nodes = fold_nodes(g.nodes, g)
    return g
