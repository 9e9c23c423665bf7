"""Helpers for the op tests of tests/compiler: one-node models whose output shapes ONNX infers, compared with
onnxruntime, and the engine listing of a compiled model."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

from isa.assembly import disassemble
from neuronx_cc_lite.compiler import Options, compile_model
from tests.conftest import assert_close, make_model, run_both

F32 = TensorProto.FLOAT


def one_node(op: str, inputs: dict[str, tuple[list[int], int]], weights: dict[str, np.ndarray] | None = None,
             outputs: tuple[str, ...] = ("y",), ranks: tuple[int, ...] | None = None, opset: int = 17,
             order: list[str] | None = None, **attrs: object) -> onnx.ModelProto:
    """A model of one node reading `order` (default: the inputs, then the weights; "" for an absent input).
    Outputs get symbolic dimensions of the given ranks (default: the first input's), which shape inference
    settles; their element type is the first input's."""
    weights = weights or {}
    names = order if order is not None else [*inputs, *weights]
    first_shape, first_type = next(iter(inputs.values()))
    ranks = ranks or (len(first_shape),) * len(outputs)
    outs = {name: ([f"{name}_{k}" for k in range(rank)], first_type) for name, rank in zip(outputs, ranks)}
    node = helper.make_node(op, names, list(outputs), **attrs)
    return make_model([node], inputs, outs, weights, opset=opset)


def check(model: onnx.ModelProto, tmp: str, rtol: float = 1e-4, seed: int = 0, policy: str = "clock") -> None:
    """Compile, run on the simulated chip and compare every output with onnxruntime."""
    ours, ref = run_both(model, tmp, seed=seed, policy=policy)
    assert_close(ours, ref, rtol=rtol)


def streams(model: onnx.ModelProto, options: Options | None = None) -> dict[str, list[str]]:
    """The mnemonics each engine runs ("PE", "ACT", "DVE", "POOL"; "DMA" for all queues), from the listing."""
    found: dict[str, list[str]] = {}
    name = ""
    for line in disassemble(compile_model(model, options)).splitlines():
        if line.startswith(".stream "):
            name = line.split()[1]
            name = "DMA" if name.startswith("DMA") else name
        elif name and line[:1] == " ":
            found.setdefault(name, []).append(line.split()[1])
    return found


def rng_weights(seed: int, **shapes: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def bf16_operands(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as --auto-cast matmult bf16 computes it: the operands of each Conv, MatMul and Gemm rounded to
    bf16, the rest in fp32 (check's cast-own reference, neuronx_cc_lite/reference.py)."""
    from neuronx_cc_lite.reference import cast_only_model

    rounded = cast_only_model(model, "matmult", "bf16")
    assert rounded is not None, "bf16 needs opset 13"
    return rounded
