"""The graph IR: one node type, one tensor type, static shapes, constants as numpy arrays.

Its text form (`print_graph`) is what `--dump-ir-after` shows:

    %y: float32[1,10] = Gemm(%x, %fc.weight, %fc.bias) {transB=1}    # /fc/Gemm
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import onnx


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    value: np.ndarray | None = None  # set for constants (initializers, folded values)
    # a constant that is a model's parameter (a float initializer or Constant of more than one element) or computed
    # from one: its values are what training left, so a rewrite may not count on them being what an untrained
    # export holds (zeros, ones), where a constant of the graph's structure (a mask of zeros) it may
    learned: bool = False

    @property
    def is_constant(self) -> bool:
        return self.value is not None

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact: np.prod wraps past 2^63 (to 0, skipping the HBM check)


@dataclass
class Node:
    op: str
    name: str
    inputs: list[str]  # "" marks an absent optional input
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    opset: int | None = None  # the opset whose semantics the node follows, when not the graph's (function bodies)


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    tensors: dict[str, Tensor]
    inputs: list[str]
    outputs: list[str]
    opset: int
    # the model's own nodes, name -> op, as imported: the passes name every node they make after the model node it
    # came from (model_node_of), so that what runs can be reported by the model's operators
    model_ops: dict[str, str] = field(default_factory=dict)
    # device state (a KV cache): input name -> the graph output that holds its value for the next run. The bundle
    # keeps the input in HBM across runs and writes that output into it (in place where the op allows)
    state: dict[str, str] = field(default_factory=dict)

    def opset_of(self, node: Node) -> int:
        return node.opset if node.opset is not None else self.opset

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    def fresh(self, name: str) -> str:
        """`name`, or `name.N` for the first N that no tensor of the graph has."""
        candidate, n = name, 1
        while candidate in self.tensors:
            candidate, n = f"{name}.{n}", n + 1
        return candidate

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    users.setdefault(name, []).append(node)
        return users

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs}


def subgraphs(node: Node) -> list[onnx.GraphProto]:
    """The node's subgraph attributes (an If's branches, a Loop's or Scan's body)."""
    values = [x for v in node.attrs.values() for x in (v if isinstance(v, tuple) else (v,))]
    return [x for x in values if isinstance(x, onnx.GraphProto)]


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """The names a subgraph (and the subgraphs nested in it) reads from the scopes around it."""
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {
        o for n in graph.node for o in n.output}
    reads = {i for n in graph.node for i in n.input if i} | {o.name for o in graph.output}
    for n in graph.node:
        for a in n.attribute:
            for sub in (*([a.g] if a.type == onnx.AttributeProto.GRAPH else []), *a.graphs):
                reads |= outer_reads(sub)
    return reads - local


def upstream(graph: onnx.GraphProto, names: list[str], stop: frozenset[str] = frozenset()) -> set[str]:
    """`names` and every value of `graph` they are computed from (inputs, initializers and values from outside
    among them, where the walk stops; it stops too at the outputs of the ops named in `stop`)."""
    producers = {o: n for n in graph.node for o in n.output if n.op_type not in stop}
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in producers:
            stack.extend(i for i in producers[name].input if i)
    return seen


def add_constant(g: Graph, name: str, value: np.ndarray) -> str:
    """A new constant tensor of the graph holding `value`, named `name` (underscores added until it is new)."""
    while name in g.tensors:
        name += "_"
    g.tensors[name] = Tensor(name, tuple(value.shape), value.dtype, value)
    return name


def drop_unused_constants(g: Graph) -> None:
    """Remove the constants nothing reads: no node's input, no graph output, nothing an If branch or a Loop or Scan
    body reads from outside (inlining a body makes those inputs again)."""
    used = {i for n in g.nodes for i in n.inputs} | set(g.outputs) | set(g.inputs) | {
        name for n in g.nodes for sub in subgraphs(n) for name in outer_reads(sub)}
    g.tensors = {name: t for name, t in g.tensors.items() if name in used or not t.is_constant}


def _format_attr(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor<{value.dtype}{list(value.shape)}>"
    if isinstance(value, onnx.GraphProto):  # an If's branch, a Loop's body: its size, not its text
        return f"graph<{value.name}: {len(value.node)} nodes>"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def format_tensor_type(t: Tensor) -> str:
    return f"{t.dtype}[{','.join(map(str, t.shape))}]"


def print_graph(g: Graph) -> str:
    lines = [f"graph {g.name} (opset {g.opset})"]
    for name in g.inputs:
        lines.append(f"  input %{name}: {format_tensor_type(g.tensors[name])}")
    constants = [t for t in g.tensors.values() if t.is_constant]
    for t in constants:
        lines.append(f"  const %{t.name}: {format_tensor_type(t)}")
    for node in g.nodes:
        outs = ", ".join(f"%{o}: {format_tensor_type(g.tensors[o])}" for o in node.outputs if o in g.tensors)
        args = ", ".join(f"%{i}" if i else "_" for i in node.inputs)
        attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in sorted(node.attrs.items()))
        text = f"  {outs} = {node.op}({args})" + (f" {{{attrs}}}" if attrs else "")
        lines.append(f"{text:<100}# {node.name}")
    lines.append("  return " + ", ".join(f"%{o}" for o in g.outputs))
    return "\n".join(lines) + "\n"


def model_node_of(name: str, model_nodes: Mapping[str, object] | set[str]) -> str | None:
    """The model node a node after the passes came from: every pass names a node it makes after the node it
    replaces, as that name or that name, "/" and more (expand-quantization's "q/Div1", an unrolled Loop's
    "loop/iter2/..."), so it is the node's own name or its longest such prefix that is a model node's."""
    prefix = name
    while prefix:
        if prefix in model_nodes:
            return prefix
        cut = prefix.rfind("/")
        if cut <= 0:
            return None
        prefix = prefix[:cut]
    return None
