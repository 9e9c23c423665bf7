"""Fold constants and shape arithmetic: every node whose inputs are all known at compile time is evaluated here
and replaced by its value; Shape and Size of a tensor whose shape is static become constants too. Shapes that ONNX
inference left open (a Reshape whose target shape was computed) are then inferred again node by node, now that
their inputs are constants.

A node is evaluated as a one-node model by onnxruntime (the project's reference), or by onnx.reference where
onnxruntime lacks the op or its opset (a result whose type or shape disagrees with shape inference counts as a
failure). Folding is an optimisation, never a gate: a node that neither evaluates, or whose result would be too
large, stays in the graph for the device, and lowering says whether it can run there.
"""

from __future__ import annotations

import math

from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from neuronx_cc_lite.declared import declared, is_declared
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Node, Tensor, drop_unused_constants, subgraphs
from neuronx_cc_lite.ops.registry import kept_by_pass, lowerings
from neuronx_cc_lite.reference import onnxruntime_session

# Folding a node whose result is larger than this would grow the bundle for nothing: it runs on the device.
MAX_FOLDED_ELEMENTS = 1 << 22
_NEVER_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
               "Bernoulli", "If", "Loop", "Scan"}


def _attribute(name: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    return helper.make_attribute(name, list(value) if isinstance(value, tuple) else value)


def to_onnx_node(node: Node) -> onnx.NodeProto:
    """The node as ONNX has it. An empty list attribute is left out: its type is lost on import (frontend.attr_value
    makes lists tuples), and ONNX cannot write an untyped one."""
    proto = helper.make_node(node.op, node.inputs, node.outputs, name=node.name, domain=node.domain or None)
    proto.attribute.extend(_attribute(k, v) for k, v in node.attrs.items() if not (isinstance(v, tuple) and not v))
    return proto


def _value_info(t: Tensor) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(t.name, helper.np_dtype_to_tensor_dtype(t.dtype), t.shape)


def known_value(t: Tensor) -> np.ndarray | None:
    """The tensor's value when compile time knows it: a constant's, or an empty tensor's (a static shape with a
    zero dimension holds no element to wait for, whoever makes it). Not an empty string tensor: a graph input the
    device cannot hold would stay behind its folded reader."""
    if t.is_constant:
        return t.value
    if t.shape is not None and t.dtype is not None and 0 in t.shape and np.dtype(t.dtype) != np.object_:
        return np.zeros(t.shape, t.dtype)
    return None


# ops whose outputs depend on their input's shape and type only: they fold once the shape is static
_SHAPE_ONLY = {"EyeLike"}


def _one_node_model(node: Node, g: Graph) -> onnx.ModelProto:
    consts = {i: known_value(g.tensors[i]) for i in node.inputs if i}  # a node may read one constant twice
    if node.op in _SHAPE_ONLY:  # any values of the input's shape and type will do
        consts = {i: np.zeros(g.tensors[i].shape, g.tensors[i].dtype) if v is None else v for i, v in consts.items()}
    outputs = [onnx.ValueInfoProto(name=o) for o in node.outputs if o]  # typed by the evaluator
    graph = helper.make_graph([to_onnx_node(node)], "fold", [], outputs,
                              [numpy_helper.from_array(v, name) for name, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain or "", g.opset_of(node))])


def _with_onnxruntime(model: onnx.ModelProto) -> list[Any]:
    return onnxruntime_session(model, threads=1).run(None, {})


def _with_reference(model: onnx.ModelProto) -> list[Any]:
    return ReferenceEvaluator(model).run(None, {})


# In order of trust: onnxruntime is the reference the project checks against; onnx.reference covers what it lacks.
EVALUATORS: tuple[Callable[[onnx.ModelProto], list[Any]], ...] = (_with_onnxruntime, _with_reference)


def evaluate(node: Node, g: Graph) -> list[np.ndarray] | None:
    """The node's outputs (the non-empty ones, in order) computed from its constant inputs, or None when no
    evaluator computes them with the types and shapes that shape inference expects."""
    model = _one_node_model(node, g)
    expected = [g.tensors[o] for o in node.outputs if o]
    for run in EVALUATORS:
        try:
            values = run(model)
        except Exception:  # noqa: BLE001 - each library raises its own types for an op or opset it lacks
            continue
        if len(values) == len(expected) and all(_agrees(v, t) for v, t in zip(values, expected)):
            return [np.asarray(v) for v in values]
    return None


def _agrees(value: Any, t: Tensor) -> bool:
    if not isinstance(value, (np.ndarray, np.generic)):  # a sequence or an optional: not a tensor constant
        return False
    value = np.asarray(value)
    return (t.dtype is None or value.dtype == t.dtype) and (t.shape is None or value.shape == tuple(t.shape))


@kept_by_pass("NonZero", "Unique", "NonMaxSuppression")
def why_kept(node: Node, g: Graph) -> str:
    return ("produces a data-dependent shape: how many elements it outputs depends on the values of its inputs, "
            "known only at run time (it compiles when its inputs are constants, as it then folds)")


def infer_node(node: Node, g: Graph) -> None:
    """The node's output types and static shapes, from ONNX's shape inference; a node of another domain than ONNX's
    (onnxruntime's com.microsoft) has no schema here and keeps untyped outputs, for lowering to refuse by domain."""
    if node.domain not in ("", "ai.onnx"):
        return
    try:
        schema = onnx.defs.get_schema(node.op, g.opset_of(node), node.domain or "")
    except onnx.defs.SchemaError:
        raise CompileError("NCC_UNSUPPORTED", f"no ONNX schema for {node.op} in opset {g.opset_of(node)}", node.name,
                           node.op) from None
    types = {i: _value_info(g.tensors[i]).type for i in node.inputs if i}
    data = {i: numpy_helper.from_array(g.tensors[i].value, i) for i in node.inputs
            if i and g.tensors[i].is_constant and not is_declared(g.tensors[i].value)}
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
    entry = lowerings().get(node.op)
    out = g.tensors[node.outputs[0]] if node.outputs and node.outputs[0] else None
    if entry is not None and entry.shaped_like_input and out is not None and out.shape is None:
        x = g.tensors[node.inputs[0]]
        out.shape, out.dtype = x.shape, x.dtype


def _foldable(node: Node, g: Graph) -> bool:
    if node.op in _NEVER_FOLD or node.domain not in ("", "ai.onnx"):
        return False
    if node.op in ("Shape", "Size"):
        t = g.tensors[node.inputs[0]]
        return t.shape is not None
    if node.op in _SHAPE_ONLY:
        t = g.tensors[node.inputs[0]]
        return t.shape is not None and t.dtype is not None
    return all(known_value(g.tensors[i]) is not None for i in node.inputs if i)


def _fold_shape(node: Node, g: Graph) -> list[np.ndarray]:
    shape = g.tensors[node.inputs[0]].shape
    if node.op == "Size":
        return [np.array(math.prod(shape), dtype=np.int64)]
    start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
    return [np.array(shape[start:end], dtype=np.int64)]


def _fold(node: Node, g: Graph) -> list[np.ndarray] | None:
    """The values of a foldable node's outputs, or None when it is better left to the device."""
    if node.op in ("Shape", "Size"):
        return _fold_shape(node, g)
    if any(g.tensors[o].shape is None for o in node.outputs if o):
        try:
            infer_node(node, g)  # the size check below needs the output shapes; inference sees constant inputs
        except CompileError:
            pass  # the evaluation may still succeed; the size check then falls to its result
    if any(_too_large(g.tensors[o].shape) for o in node.outputs if o):
        return None
    if any(is_declared(g.tensors[i].value) for i in node.inputs if i):  # a declared result of the inferred type
        outs = [g.tensors[o] for o in node.outputs if o]
        if any(t.shape is None or t.dtype is None for t in outs):
            return None
        return [declared(t.shape, t.dtype) for t in outs]
    values = evaluate(node, g)
    if values is None or any(_too_large(v.shape) for v in values):
        return None
    return values


def _too_large(shape: tuple[int, ...] | None) -> bool:
    return shape is not None and math.prod(shape) > MAX_FOLDED_ELEMENTS


def fold_nodes(nodes: list[Node], g: Graph) -> list[Node]:
    """Fold `nodes` (in order, reading and writing g's tensors): the nodes left for the device, their output shapes
    inferred where their inputs' are known. Used on the whole graph and on one unrolled loop iteration at a time."""
    kept = []
    for node in nodes:
        values = _fold(node, g) if _foldable(node, g) else None
        if values is not None:
            learned = any(g.tensors[i].learned for i in node.inputs if i)
            for name, value in zip([o for o in node.outputs if o], values):
                g.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value, learned)
            continue
        # a subgraph's types are settled by inlining it (inline-control-flow), not by inference through it
        if any(g.tensors[o].shape is None for o in node.outputs if o) and not subgraphs(node):
            if all(g.tensors[i].shape is not None for i in node.inputs if i):
                infer_node(node, g)
        kept.append(node)
    return kept


def run(g: Graph) -> Graph:
    g.nodes = fold_nodes(g.nodes, g)
    drop_unused_constants(g)
    return g
