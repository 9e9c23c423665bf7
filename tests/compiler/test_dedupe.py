"""dedupe-loads (codegen/dedupe.py): identical loads are made once, unless keeping the first load's tile alive
until the second would fill SBUF (a chain of elementwise operators over a tensor larger than SBUF that each read
`x` failed with NCC_SBUF_FULL when every load of `x` was merged)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, compile_model
from tests.compiler.one_node import check
from tests.conftest import make_model

F = TensorProto.FLOAT


def five_op_chain(n: int):
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Add", ["a", "x"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["c"]), helper.make_node("Mul", ["c", "b"], ["d"]),
             helper.make_node("Sub", ["d", "x"], ["y"])]
    return make_model(nodes, {"x": ([n, n], F)}, {"y": ([n, n], F)})


def test_chain_over_a_tensor_larger_than_sbuf_compiles():
    """[2048, 2048] fp32 is 128 KiB a partition, two thirds of trn1's SBUF: x cannot stay whole beside the rest."""
    bundle = compile_model(five_op_chain(2048))
    assert bundle.cores


def test_chain_matches_onnxruntime(tmp):
    check(five_op_chain(256), tmp)


def _loads_after(model, stage: str) -> int:
    seen: dict[str, str] = {}
    compile_model(model, Options(dump_ir_after=frozenset({stage})), dump=lambda name, text: seen.setdefault(name, text))
    return sum(line.split()[2:3] in (["dma_copy"], ["tensor_copy"]) for line in seen[stage].splitlines()
               if line[:1] == " ")


def test_loads_close_together_are_still_merged():
    """Three MatMuls read one input as their moving operand: after keep-on-chip each loads it; dedupe-loads keeps
    one load. (Read as the stationary side, the input is loaded and turned once for all three when lowered.)"""
    nodes = [helper.make_node("MatMul", [f"w{i}", "x"], [f"y{i}"]) for i in range(3)]
    rng = np.random.default_rng(0)
    weights = {f"w{i}": rng.standard_normal((64, 128)).astype(np.float32) for i in range(3)}
    model = make_model(nodes, {"x": ([128, 64], F)}, {f"y{i}": ([64, 64], F) for i in range(3)}, weights)
    before, after = _loads_after(model, "keep-on-chip"), _loads_after(model, "dedupe-loads")
    assert after <= before - 2, (before, after)
