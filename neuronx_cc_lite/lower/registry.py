"""The registry of op lowerings, keyed by ONNX op name (default domain).

Each entry has the lowering itself and a `check` that says, before anything is lowered, why a node cannot be
(an attribute value, a dtype, an opset), so that `analyze` and the compiler report every unsupported node at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neuronx_cc_lite.integer_ranges import integer_ranges
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.lower.context import Check, Lower, device_dtype


@dataclass(frozen=True)
class Lowering:
    op: str
    lower: Lower
    check: Check | None
    since: int  # the first opset whose semantics the lowering implements
    constant_inputs: tuple[int, ...] = ()  # inputs the compiler needs at compile time (axes, shapes, pads, ...)
    # every output element is a copy of an input element (a view, a transpose, a slice, a gather): such outputs of
    # graph inputs and weights could be made by DMA from HBM to HBM, without passing through SBUF (the roofline)
    moves_data: bool = False
    # each output element is a function of the same-index elements of its inputs, broadcast (numpy's rules): such
    # an op commutes with a transpose of all its operands (passes/sink_transposes.py)
    elementwise: bool = False
    # the output has the first input's shape and type: said here for the ops ONNX's shape inference leaves open
    # (GroupNormalization, a function without an inference of its own)
    shaped_like_input: bool = False


LOWERINGS: dict[str, Lowering] = {}
# Ops the compiler's own passes create (fused operators), in the compiler's domain.
INTERNAL_DOMAIN = "ai.neuronx_cc_lite"
INTERNAL_OPS = {"MatMulEpilogue", "ConvEpilogue", "GroupNormActivation", "PatchEmbedding", "AllReduce", "AllGather",
                "ReduceScatter", "SaturatingCast"}


# Ops without a lowering that a pass removes when it can (an If whose condition folds, a NonZero over constants):
# the pass registers why it kept a node, so that analyze and compile say that rather than "not supported".
KEPT_BY_PASSES: dict[str, Check] = {}


def kept_by_pass(*ops: str):  # type: ignore[no-untyped-def]
    def register(fn: Check) -> Check:
        for op in ops:
            assert op not in KEPT_BY_PASSES and op not in LOWERINGS, f"{op} is kept by two passes or lowered"
            KEPT_BY_PASSES[op] = fn
        return fn

    return register


def lowering(*ops: str, check: Check | None = None, since: int = 1,  # type: ignore[no-untyped-def]
             constant_inputs: tuple[int, ...] = (), moves_data: bool = False, elementwise: bool = False,
             shaped_like_input: bool = False):
    def register(fn: Lower) -> Lower:
        for op in ops:
            assert op not in LOWERINGS, f"two lowerings for {op}"
            LOWERINGS[op] = Lowering(op, fn, check, since, constant_inputs, moves_data, elementwise,
                                     shaped_like_input)
        return fn

    return register


def why_unsupported(node: Node, g: Graph) -> str | None:
    """None when the node can be lowered, else the reason it cannot."""
    internal = node.domain == INTERNAL_DOMAIN and node.op in INTERNAL_OPS
    if node.domain not in ("", "ai.onnx") and not internal:
        return f"domain {node.domain!r} is not supported"
    entry = LOWERINGS.get(node.op)
    if entry is None:
        kept = KEPT_BY_PASSES.get(node.op)
        return (kept(node, g) if kept else None) or f"operator {node.op} is not supported"
    if g.opset_of(node) < entry.since:
        return f"{node.op} is supported from opset {entry.since}; the node is opset {g.opset_of(node)}"
    for name in (*node.inputs, *node.outputs):
        t = g.tensors.get(name) if name else None
        if t is not None and t.dtype is not None and device_dtype(np.dtype(t.dtype)) is None:
            return f"tensor {name!r} has element type {t.dtype}, which the device does not hold"
    for i in entry.constant_inputs:
        if len(node.inputs) > i and node.inputs[i] and not g.tensors[node.inputs[i]].is_constant:
            return f"input {i} ({node.inputs[i]!r}) must be a compile-time constant"
    unheld = integer_ranges(g).why_unheld(node)  # an int64 result past int32, which the device holds it in
    return unheld or (entry.check(node, g) if entry.check else None)


# Inputs of ops without a lowering of their own (a pass expands them; the version converter makes Upsample a
# Resize) that are needed at compile time, as a lowering's constant inputs are: sizes and shapes, a Compress's
# condition, a DFT's length and axis, Upsample's scales
PASS_CONSTANT_INPUTS: dict[str, tuple[int, ...]] = {
    "Compress": (1,), "ReverseSequence": (1,), "DFT": (1, 2), "CenterCropPad": (1,), "HannWindow": (0,),
    "HammingWindow": (0,), "BlackmanWindow": (0,), "Upsample": (1,)}


def compile_time_values(nodes: list[tuple[str, list[str]]]) -> set[str]:
    """The values some lowering or expansion needs at compile time (axes, shapes, sizes, a Compress's condition).
    `nodes`: (op, inputs) pairs."""
    found = set()
    for op, inputs in nodes:
        entry = LOWERINGS.get(op)
        for i in entry.constant_inputs if entry else PASS_CONSTANT_INPUTS.get(op, ()):
            if len(inputs) > i and inputs[i]:
                found.add(inputs[i])
    return found


def unsupported_nodes(g: Graph) -> list[tuple[str, str, str]]:
    return [(n.name, n.op, reason) for n in g.nodes if (reason := why_unsupported(n, g)) is not None]
