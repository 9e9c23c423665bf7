"""The registry of op lowerings, keyed by ONNX op name (default domain).

Each entry has the lowering itself and a `check` that says, before anything is lowered, why a node cannot be
(an attribute value, a dtype, an opset), so that `analyze` and the compiler report every unsupported node at once.
It also carries the op's facts that the passes reason with before anything is lowered: its kind (partitioning,
layout and transpose sinking read it) and how a fused matmul or convolution applies it (passes/fuse_epilogues.py),
so that no pass keeps a table of op names of its own.

The entries are declared next to each lowering, with `@lowering` (neuronx_cc_lite/lower/), and that package
imports all of its modules: the registry stands below the passes and the lowerings alike, and is complete once
`neuronx_cc_lite.lower` is imported. `lowerings()` imports it first, so a pass, partitioning or the command line
that reads the registry sees every op whatever it imported before; code inside lower/ may read `LOWERINGS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from isa.functions import ActFunc
from neuronx_cc_lite.integer_ranges import integer_ranges
from neuronx_cc_lite.ir import Graph, Node
from neuronx_cc_lite.ops.dtypes import device_dtype, floats_only
from neuronx_cc_lite.ops.traits import FusedActivation, OpKind

if TYPE_CHECKING:  # what a lowering is handed (the type only: the registry does not depend on lower/)
    from neuronx_cc_lite.lower.context import LowerCtx

Lower = Callable[["LowerCtx", Node], None]  # appends the node's instructions to the program being built
Check = Callable[[Node, Graph], "str | None"]  # why the node cannot be lowered, or None


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
    kind: OpKind = OpKind.OTHER
    # the output has the first input's shape and type: said here for the ops ONNX's shape inference leaves open
    # (GroupNormalization, a function without an inference of its own)
    shaped_like_input: bool = False
    fused: FusedActivation | None = None  # as the activation of a fused matmul or convolution
    # every input and output is held in a float type (ops/dtypes.py floats_only): checked before `check`, for the
    # ops whose every node must be; those floats-only but for some nodes (an integer Abs) say so in `check`
    floats: bool = False


# Filled by the @lowering of each module in neuronx_cc_lite/lower/ as it is imported: outside lower/, read it
# through lowerings().
LOWERINGS: dict[str, Lowering] = {}
# Ops the compiler's own passes create (fused operators), in the compiler's domain.
INTERNAL_DOMAIN = "ai.neuronx_cc_lite"
INTERNAL_OPS = {"MatMulEpilogue", "ConvEpilogue", "GroupNormActivation", "PatchEmbedding", "AllReduce", "AllGather",
                "ReduceScatter", "SaturatingCast", "Silu"}


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
             constant_inputs: tuple[int, ...] = (), moves_data: bool = False, kind: OpKind = OpKind.OTHER,
             shaped_like_input: bool = False, fused: dict[str, FusedActivation] | None = None, floats: bool = False):
    """Register `fn` as the lowering of `ops`, with their facts; `fused`: per op, how a fused matmul or
    convolution applies it (the ops it names only)."""
    def register(fn: Lower) -> Lower:
        for op in ops:
            assert op not in LOWERINGS and op not in KEPT_BY_PASSES, f"two lowerings for {op}, or a pass keeps it"
            LOWERINGS[op] = Lowering(op, fn, check, since, constant_inputs, moves_data, kind, shaped_like_input,
                                     (fused or {}).get(op), floats)
        assert not set(fused or ()) - set(ops), "a fused activation for an op not registered here"
        return fn

    return register


def lowerings() -> dict[str, Lowering]:
    """Every op's entry, keyed by op name: the lowering modules, which register themselves, imported first."""
    import neuronx_cc_lite.lower  # noqa: F401  (the one import of lower/ here: it fills LOWERINGS)

    return LOWERINGS


def kind_of(op: str) -> OpKind:
    """The op's kind (OTHER for an op without a lowering)."""
    entry = lowerings().get(op)
    return entry.kind if entry is not None else OpKind.OTHER


def ops_of_kind(kind: OpKind) -> frozenset[str]:
    return frozenset(op for op, entry in lowerings().items() if entry.kind is kind)


def fused_function(activation: str) -> ActFunc:
    """ScalarE's function for a fused node's `activation` attribute ("": none; "Gelu/tanh": Gelu's tanh
    approximation; "HardSigmoid/unclamped": its reader clamps it): a copy where there is none, or where a hard one
    follows on the evacuated block."""
    if activation == "Gelu/tanh":
        return ActFunc.gelu_apprx_tanh
    entry = lowerings().get(activation.split("/")[0])
    func = entry.fused.func if entry is not None and entry.fused is not None else None
    return func or ActFunc.copy


def fused_activations(convolution: bool = False) -> dict[str, FusedActivation]:
    """The ops a fused matmul (or, with `convolution`, a fused convolution) may apply as its activation."""
    return {op: entry.fused for op, entry in lowerings().items()
            if entry.fused is not None and (entry.fused.in_convolutions or not convolution)}


def why_unsupported(node: Node, g: Graph) -> str | None:
    """None when the node can be lowered, else the reason it cannot."""
    internal = node.domain == INTERNAL_DOMAIN and node.op in INTERNAL_OPS
    if node.domain not in ("", "ai.onnx") and not internal:
        return f"domain {node.domain!r} is not supported"
    entry = lowerings().get(node.op)
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
    return unheld or (entry.floats and floats_only(node, g)) or (entry.check(node, g) if entry.check else None)


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
        entry = lowerings().get(op)
        for i in entry.constant_inputs if entry else PASS_CONSTANT_INPUTS.get(op, ()):
            if len(inputs) > i and inputs[i]:
                found.add(inputs[i])
    return found


def unsupported_nodes(g: Graph) -> list[tuple[str, str, str]]:
    return [(n.name, n.op, reason) for n in g.nodes if (reason := why_unsupported(n, g)) is not None]
