"""Fold constants and shape arithmetic: every node whose inputs are all known at compile time is evaluated here,
with onnx's reference implementation, and replaced by its value; Shape and Size of a tensor whose shape is static
become constants too. Shapes that ONNX inference left open (a Reshape whose target shape was computed) are then
inferred again node by node, now that their inputs are constants.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node, Tensor

# Folding a node whose result is larger than this would grow the bundle for nothing: it runs on the device.
MAX_FOLDED_ELEMENTS = 1 << 22
_NEVER_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
               "Bernoulli", "If", "Loop", "Scan"}


def _attribute(name: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    return helper.make_attribute(name, list(value) if isinstance(value, tuple) else value)


def to_onnx_node(node: Node) -> onnx.NodeProto:
    proto = helper.make_node(node.op, node.inputs, node.outputs, name=node.name, domain=node.domain or None)
    proto.attribute.extend(_attribute(k, v) for k, v in node.attrs.items())
    return proto


def _value_info(t: Tensor) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(t.name, helper.np_dtype_to_tensor_dtype(t.dtype), t.shape)


def evaluate(node: Node, g: Graph, opset: int) -> list[np.ndarray]:
    """Run one node on its constant inputs with onnx.reference."""
    consts = [g.tensors[i] for i in node.inputs if i]
    model = helper.make_model(
        helper.make_graph([to_onnx_node(node)], "fold", [],
                          [helper.make_tensor_value_info(o, 0, None) for o in node.outputs if o],
                          [numpy_helper.from_array(t.value, t.name) for t in consts]),
        opset_imports=[helper.make_opsetid(node.domain or "", opset)])
    return ReferenceEvaluator(model).run(None, {})


def infer_node(node: Node, g: Graph) -> None:
    try:
        schema = onnx.defs.get_schema(node.op, g.opset_of(node), node.domain or "")
    except onnx.defs.SchemaError:
        raise CompileError("NCC_UNSUPPORTED", f"no ONNX schema for {node.op} in opset {g.opset_of(node)}", node.name,
                           node.op) from None
    types = {i: _value_info(g.tensors[i]).type for i in node.inputs if i}
    data = {i: numpy_helper.from_array(g.tensors[i].value, i) for i in node.inputs
            if i and g.tensors[i].is_constant}
    try:
        inferred = onnx.shape_inference.infer_node_outputs(schema, to_onnx_node(node), types, data)
    except Exception as e:  # onnx raises its own InferenceError and ValueErrors
        raise CompileError("NCC_SHAPE_INFERENCE", f"shape inference fails: {str(e).strip().splitlines()[0]}",
                           node.name, node.op) from None
    for name, tp in inferred.items():
        t = g.tensors[name]
        tt = tp.tensor_type
        if all(d.HasField("dim_value") for d in tt.shape.dim) and tt.HasField("shape"):
            t.shape = tuple(int(d.dim_value) for d in tt.shape.dim)
        if tt.elem_type:
            t.dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))


def _foldable(node: Node, g: Graph) -> bool:
    if node.op in _NEVER_FOLD or node.domain not in ("", "ai.onnx"):
        return False
    if node.op in ("Shape", "Size"):
        t = g.tensors[node.inputs[0]]
        return t.shape is not None
    return all(g.tensors[i].is_constant for i in node.inputs if i)


def _fold_shape(node: Node, g: Graph) -> list[np.ndarray]:
    shape = g.tensors[node.inputs[0]].shape
    if node.op == "Size":
        return [np.array(int(np.prod(shape)), dtype=np.int64)]
    start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
    return [np.array(shape[start:end], dtype=np.int64)]


def run(g: Graph) -> Graph:
    kept = []
    for node in g.nodes:
        if _foldable(node, g):
            if node.op in ("Shape", "Size"):
                values = _fold_shape(node, g)
            else:
                try:
                    values = evaluate(node, g, g.opset_of(node))
                except Exception as e:
                    raise CompileError("NCC_FOLD", f"cannot evaluate at compile time: {e}", node.name,
                                       node.op) from None
            if all(np.asarray(v).size <= MAX_FOLDED_ELEMENTS for v in values):
                for name, value in zip(node.outputs, values):
                    value = np.asarray(value)
                    g.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
                continue
        if any(g.tensors[o].shape is None for o in node.outputs if o):
            if all(g.tensors[i].shape is not None for i in node.inputs if i):
                infer_node(node, g)
        kept.append(node)
    g.nodes = kept
    used = {i for n in g.nodes for i in n.inputs} | set(g.outputs) | set(g.inputs)
    g.tensors = {name: t for name, t in g.tensors.items() if name in used or not t.is_constant}
    return g
