"""Host partitions (`--fallback host`): the nodes the chip cannot run go to the CPU, as torch-neuronx's partitioner
sends unsupported operators to the framework.

    refusals(g)      every node the chip cannot run, with why: an operator, attribute or type without a lowering,
                     or a tensor whose shape is known only at run time (NonZero, NonMaxSuppression, a TopK whose
                     k is computed, and everything downstream of their outputs)
    host_nodes       those, and the nodes that read only what the host made (a launch would cost more than them)
    split(g, host)   the graph cut into parts that run one after another, alternately on the chip and on the host:
                     each node goes to the earliest part of its kind after every part that makes one of its
                     inputs, which gives the fewest parts that keep every node after its producers
    chip_graph       a chip part as a graph of its own (compiled as any graph)
    host_model       a host part as an ONNX model (the bundle carries its bytes; the runtime runs it with
                     onnxruntime)

A part's inputs are what it reads of the model's inputs and earlier parts' outputs (the constants it reads go
with it: a chip part's into its weights, a host part's into its initializers); its outputs are what later parts or
the model's outputs read of it. Without the flag the refusals are one error naming every node, grouped by
operator (`refusal`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from neuronx_cc_lite.errors import CompileError, UnsupportedError
from neuronx_cc_lite.ir import Graph, Node, outer_reads, subgraphs
from neuronx_cc_lite.passes.fold_constants import to_onnx_node

CHIP, HOST = "chip", "host"


@dataclass
class Part:
    kind: str  # CHIP or HOST
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def refusals(g: Graph) -> list[tuple[Node, str]]:
    """Every node the chip cannot run, and why. A shape that is not static comes first (the lowerings' checks read
    static shapes), except for the ops a pass keeps, which say why they stayed, and those of other domains."""
    from neuronx_cc_lite.ops.registry import KEPT_BY_PASSES, why_unsupported
    from neuronx_cc_lite.passes.verify import not_static

    found = []
    for n in g.nodes:
        # an op a pass keeps for a reason of its own (NonZero's data-dependent size) gives that reason, and one of
        # another domain its domain
        standard = n.domain in ("", "ai.onnx") and n.op not in KEPT_BY_PASSES
        why = (standard and not_static(n, g)) or why_unsupported(n, g)
        if why:
            found.append((n, why))
    return found


def refusal(found: list[tuple[Node, str]]) -> UnsupportedError:
    """One error naming every node the chip cannot run, grouped by operator: the nodes refused for themselves with
    their reasons, then how many nodes only read a shape one of them left to run time. One such node keeps the form
    of a node's error (`node 'x' (Op): why`). The code is NCC_SHAPE_DYNAMIC when some shape is left to run time
    (as the verifier before lowering reports it), else NCC_UNSUPPORTED."""
    causes = [(n, why) for n, why in found if not why.startswith(_INHERITED) or f"{n.op} node {n.name!r} " in why]
    downstream = Counter(n.op for n, why in found if why.startswith(_INHERITED) and (n, why) not in causes)
    dynamic = any(why.startswith(_INHERITED) or "data-dependent" in why for _, why in found)
    code = "NCC_SHAPE_DYNAMIC" if dynamic else "NCC_UNSUPPORTED"
    tail = ""
    if downstream:
        tail = (f"; and {sum(downstream.values())} node(s) reading shapes left to run time ("
                + ", ".join(f"{op} x{k}" for op, k in sorted(downstream.items())) + ")")
    tail += "; --fallback host runs them on the CPU"
    nodes = [(n.name, n.op, why) for n, why in found]
    if len(causes) == 1:
        (node, why), = causes
        return UnsupportedError(nodes, why + tail, code, node.name, node.op)
    by_op: dict[str, list[tuple[Node, str]]] = {}
    for n, why in causes:
        by_op.setdefault(n.op, []).append((n, why))
    groups = []
    for op, of_op in by_op.items():
        if len({why for _, why in of_op}) == 1:
            groups.append(f"{op} x{len(of_op)} ({', '.join(repr(n.name) for n, _ in of_op)}): {of_op[0][1]}")
        else:
            groups.append(f"{op} x{len(of_op)}: " + "; ".join(f"{n.name!r}: {why}" for n, why in of_op))
    return UnsupportedError(nodes, f"{len(causes)} node(s) of {len(by_op)} operator(s) the chip cannot run: "
                            + " | ".join(groups) + tail, code)


_INHERITED = "the shape of "  # passes.verify.not_static's reasons, which name the node the shape comes from


def host_nodes(g: Graph, found: list[tuple[Node, str]]) -> set[int]:
    """The indices of the nodes to run on the host: those the chip cannot run, and the ONNX nodes that read only
    what the host made (shape arithmetic on a host result, a Min of its count and a constant): on the chip each
    would be a part of its own, paying a launch and two copies for a few instructions."""
    refused = {id(n) for n, _ in found}
    host: set[int] = set()
    made_on_host: set[str] = set()
    for k, n in enumerate(g.nodes):
        reads = [name for name in _reads(n) if not g.tensors[name].is_constant]
        follows = bool(reads) and all(name in made_on_host for name in reads) and n.domain in ("", "ai.onnx")
        if id(n) in refused or follows:
            host.add(k)
            made_on_host.update(o for o in n.outputs if o)
    return host


def split(g: Graph, host: set[int]) -> list[Part]:
    """The parts of g, in the order they run; `host`: the indices of the nodes that run on the CPU.

    Part 0 is on the chip, part 1 on the host, and so on alternately (a part may be empty and is then dropped).
    A node goes to the first part of its kind that comes after every part holding a producer of its inputs."""
    producer: dict[str, int] = {}
    stage: list[int] = []
    for k, n in enumerate(g.nodes):
        kind = 1 if k in host else 0
        s = kind
        for name in _reads(n):
            if name in producer:
                p = stage[producer[name]]
                s = max(s, p if p % 2 == kind else p + 1)
        stage.append(s)
        for out in n.outputs:
            if out:
                producer[out] = k
    parts = [Part(HOST if s % 2 else CHIP) for s in range(max(stage, default=0) + 1)]
    for n, s in zip(g.nodes, stage):
        parts[s].nodes.append(n)
    parts = [p for p in parts if p.nodes]
    later: set[str] = set(g.outputs)
    for p in reversed(parts):
        made = {o for n in p.nodes for o in n.outputs if o}
        p.outputs = [o for n in p.nodes for o in n.outputs if o and o in later]
        reads = list(dict.fromkeys(name for n in p.nodes for name in _reads(n)))
        p.inputs = [name for name in reads if name not in made and not g.tensors[name].is_constant]
        later |= set(p.inputs)
    return parts


def _reads(n: Node) -> list[str]:
    """The names a node reads: its inputs and what its subgraphs read from around them."""
    return [*(i for i in n.inputs if i), *sorted(set().union(*(outer_reads(b) for b in subgraphs(n))))]


def chip_graph(g: Graph, part: Part, k: int) -> Graph:
    names = {*part.inputs, *part.outputs, *(x for n in part.nodes for x in (*_reads(n), *n.outputs) if x)}
    return Graph(f"{g.name}.part{k}", list(part.nodes), {name: g.tensors[name] for name in names},
                 list(part.inputs), list(part.outputs), g.opset, g.model_ops)


def host_model(g: Graph, part: Part, k: int) -> bytes:
    """The part as an ONNX model of the graph's opset (its constants as initializers), serialised."""
    for n in part.nodes:
        if n.opset is not None and n.opset != g.opset:
            raise CompileError("NCC_UNSUPPORTED", f"it would run on the host, but follows opset {n.opset} where the "
                               f"model is opset {g.opset}", n.name, n.op)
        if n.domain.startswith("ai.neuronx_cc_lite"):
            raise CompileError("NCC_UNSUPPORTED", "it would run on the host, but is an operator of the compiler's "
                               "own (it comes from a pass); compile without --fallback host to see why the chip "
                               "cannot run it", n.name, n.op)
    reads = {name for n in part.nodes for name in _reads(n)}
    constants = [numpy_helper.from_array(np.asarray(g.tensors[name].value), name) for name in sorted(reads)
                 if g.tensors[name].is_constant]
    graph = helper.make_graph([to_onnx_node(n) for n in part.nodes], f"{g.name}.part{k}", [_value_info(g, name) for name in part.inputs],
                              [_value_info(g, name) for name in part.outputs], constants)
    domains = sorted({n.domain for n in part.nodes if n.domain not in ("", "ai.onnx")})
    opsets = [helper.make_opsetid("", g.opset), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="neuronx-cc-lite --fallback host")
    model.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    return model.SerializeToString(deterministic=True)


def _value_info(g: Graph, name: str) -> onnx.ValueInfoProto:
    t = g.tensors[name]
    if t.dtype is None:  # onnxruntime infers it
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)),
                                         list(t.shape) if t.shape is not None else None)
