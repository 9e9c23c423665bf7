"""`analyze`: which of the model's own operators the compiler supports, before compiling.

The report is about the nodes of the model as the user wrote it (Gemm, QuantizeLinear, an If and the nodes of its
branches), not the graph the passes make of it (MatMulEpilogue, SaturatingCast). Support is decided on that graph,
as compile decides it, and carried back: every node a pass makes is named after the model node it came from (the
node's own name, or that name, "/" and more: expand-quantization's "q/Div1", an unrolled Loop's "loop/iter2/..."),
so an unsupported node belongs to the model node whose name is the longest such prefix of its own. A node inside
an If, Loop or Scan body shares the verdict of the node that holds it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
import onnx

from neuronx_cc_lite.ir import Graph, Node, model_node_of


@dataclass(frozen=True)
class ModelNode:
    op: str
    holder: str  # the name of the top-level node it is (or whose body holds it)


@dataclass
class Report:
    model_nodes: list[ModelNode]
    unsupported: list[tuple[Node, str, str]]  # (node after the passes, why, the model node it came from)
    compiled_ops: Counter[str]  # the graph after the passes, by op

    @property
    def bad_holders(self) -> set[str]:
        return {holder for _, _, holder in self.unsupported}

    def text(self) -> str:
        counts = Counter(n.op for n in self.model_nodes)
        bad = Counter(n.op for n in self.model_nodes if n.holder in self.bad_holders)
        lines = [f"{'op':<28} {'count':>6}  supported"]
        for op, count in sorted(counts.items()):
            verdict = "yes" if not bad[op] else "no" if bad[op] == count else f"{count - bad[op]} of {count}"
            lines.append(f"{op:<28} {count:>6}  {verdict}")
        total, failing = len(self.model_nodes), sum(bad.values())
        share = 100.0 * (total - failing) / total if total else 100.0
        lines.append(f"{total - failing} of {total} nodes of the model supported ({share:.1f}%)")
        lines.append(f"compiled as {sum(self.compiled_ops.values())} nodes after the passes: "
                     + ", ".join(f"{op} {k}" for op, k in sorted(self.compiled_ops.items())))
        for node, why, holder in self.unsupported:
            came_from = "" if holder == node.name else f" (from {holder})"
            lines.append(f"unsupported: {node.name} ({node.op}){came_from}: {why}")
        return "\n".join(lines) + "\n"


def model_nodes(graph: Graph) -> list[ModelNode]:
    """The model's nodes as imported (Constants are values, not nodes), with those of every subgraph body."""
    found = []
    for n in graph.nodes:
        found.append(ModelNode(n.op, n.name))
        for value in n.attrs.values():
            for body in value if isinstance(value, tuple) else (value,):
                if isinstance(body, onnx.GraphProto):
                    found.extend(ModelNode(op, n.name) for op in _body_ops(body))
    return found


def _body_ops(body: onnx.GraphProto) -> list[str]:
    ops = []
    for n in body.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            continue
        ops.append(n.op_type)
        for a in n.attribute:
            for sub in (*a.graphs, *([a.g] if a.HasField("g") else [])):
                ops.extend(_body_ops(sub))
    return ops


def holder_of(name: str, holders: set[str]) -> str:
    """The model node a node after the passes came from (ir.model_node_of), or, for a node no pass named after
    a model node, the node itself."""
    return model_node_of(name, holders) or name


def analyze(nodes: list[ModelNode], after_passes: Graph, reasons: list[tuple[Node, str]]) -> Report:
    """The report, from the model's nodes (read before the passes ran: they rewrite the graph in place), the graph
    after the passes and the reason each unsupported node of it has."""
    holders = {n.holder for n in nodes}
    unsupported = [(node, why, holder_of(node.name, holders)) for node, why in reasons]
    return Report(nodes, unsupported, Counter(n.op for n in after_passes.nodes))


def split_text(after_passes: Graph, refused: list[tuple[Node, str]]) -> str:
    """How `--fallback host` cuts the graph: its parts in the order they run, each with its operators and what
    it reads and makes."""
    from neuronx_cc_lite.partition.host import host_nodes, split

    parts = split(after_passes, host_nodes(after_passes, refused))
    lines = [f"with --fallback host: {len(parts)} parts, run in turn"]
    for k, p in enumerate(parts):
        ops = ", ".join(f"{op} {n}" for op, n in sorted(Counter(n.op for n in p.nodes).items()))
        where = "chip" if p.kind == "chip" else "host (onnxruntime)"
        lines.append(f"part {k}: {where}, {len(p.nodes)} nodes: {ops}")
        lines.append(f"    reads {', '.join(p.inputs) or 'nothing'}; makes {', '.join(p.outputs)}")
    return "\n".join(lines) + "\n"
