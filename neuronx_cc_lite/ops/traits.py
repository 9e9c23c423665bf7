"""Facts about ONNX ops that the passes reason with before anything is lowered, kept with each op's lowering in
the registry (ops/registry.py): partitioning, layout, transpose sinking and epilogue fusion read them there
rather than keep tables of op names of their own. This module imports only the ISA, so that every layer may."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from isa.functions import ActFunc


class OpKind(enum.Enum):
    """What an op does to its operands' elements, as far as the passes that move or cut tensors care."""

    # each output element is a function of the same-index elements of its inputs, broadcast (numpy's rules): such
    # an op commutes with a transpose of all its operands (passes/sink_transposes.py), runs on any shards that line
    # up (partition/rules.py), and its output takes its input's layout (lower/layout.py)
    ELEMENTWISE = "elementwise"
    # the input's elements in their order under another shape (Reshape, Flatten, Squeeze, Unsqueeze): a shard
    # goes wherever its axis goes
    VIEW = "view"
    # a product contracting input 0's last axis with input 1's (Gemm: transA, transB): a shard of the contracted
    # axis gives partial sums, and the operands are laid out for PE
    MATMUL = "matmul"
    # reduces axes of input 0 (an attribute or input 1 names them): those axes must be whole
    REDUCTION = "reduction"
    OTHER = "other"


@dataclass(frozen=True)
class FusedActivation:
    """How a matmul's or a convolution's evacuation applies this activation op once passes/fuse_epilogues.py has
    fused it: ScalarE's `func` as the bank leaves PSUM, or, with `func` None, a hard activation (HardSwish,
    HardSigmoid) on the evacuated block (lower/activations.py hard_activation)."""

    func: ActFunc | None
    # a ConvEpilogue applies it too (lower/conv_epilogue.py); Gelu only follows a matmul (a transformer's MLP)
    in_convolutions: bool = True
