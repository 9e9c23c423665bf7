"""HBM-to-HBM copies that transpose (a Transpose that is a graph output, a transposing Tile/DepthToSpace copy) go
through SBUF and the Tensor engine in blocks, so that no DMA moves element-sized pieces; they match onnxruntime
bit for bit (a transpose moves values unchanged), on partial blocks and with batch axes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from isa.costs import dma_cost
from isa.target import get_target
from neuronx_cc_lite.compiler import compile_model
from tests.conftest import compile_to_model, make_model, run_both


def _transpose(shape: list[int], perm: list[int], dtype: int = TensorProto.FLOAT):
    out = [shape[p] for p in perm]
    node = helper.make_node("Transpose", ["x"], ["y"], perm=perm)
    return make_model([node], {"x": (shape, dtype)}, {"y": (out, dtype)})


CASES = [([300, 200], [1, 0]),          # partial blocks on both axes
         ([3, 96, 160], [0, 2, 1]),     # a batch axis
         ([64, 5, 130], [2, 1, 0]),     # the middle axis stays; the outer two swap
         ([2, 40, 3, 48], [0, 3, 2, 1])]


@pytest.mark.parametrize("shape,perm", CASES)
def test_transposing_copy_matches_exactly(tmp, shape, perm):
    ours, ref = run_both(_transpose(shape, perm), tmp)
    np.testing.assert_array_equal(ours["y"], ref["y"])


def test_bf16_transpose_matches_numpy(tmp):
    """onnxruntime takes no bf16 inputs from numpy: numpy's transpose is the reference."""
    compiled = compile_to_model(_transpose([256, 384], [1, 0], TensorProto.BFLOAT16), tmp)
    x = np.random.default_rng(0).standard_normal((256, 384)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], x.T)


def _smallest_run(model) -> float:
    """The fewest bytes per DMA piece over the bundle's transfers."""
    bundle, target = compile_model(model), get_target("trn1")
    worst = float("inf")
    for core in bundle.cores:
        for stream in core.values():
            for instr in stream.instructions:
                if instr.spec.cycles is None and not instr.spec.collective:
                    cost = dma_cost(instr, target)
                    pieces = cost.fixed_ns / target.dma_piece_ns
                    worst = min(worst, cost.bytes / max(pieces, 1))
    return worst


def test_large_transpose_moves_long_runs():
    """[1024, 1024] fp32: through PE every DMA moves runs of 2 KiB; element by element it moved 4 bytes."""
    assert _smallest_run(_transpose([1024, 1024], [1, 0])) >= 512


def test_small_transpose_stays_one_dma():
    """Below MIN_ELEMENTS the element-wise DMA is cheaper than the blocks' fixed costs: no PE transposes."""
    bundle = compile_model(_transpose([16, 24], [1, 0]))
    ops = {i.op for core in bundle.cores for s in core.values() for i in s.instructions}
    assert "nc_transpose" not in ops


def rope_after_projection(seq: int = 128, heads: int = 4, dim: int = 64):
    """x @ Wq -> [seq, heads, dim] -> q*cos + cat(-q2, q1)*sin, as a Llama export's RoPE reads its projection."""
    rng = np.random.default_rng(1)
    hidden = heads * dim
    shape = np.array([seq, heads, dim], np.int64)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Reshape", ["q", "shape"], ["qh"]),
             helper.make_node("Slice", ["qh", "zero", "half", "last"], ["q1"]),
             helper.make_node("Slice", ["qh", "half", "end", "last"], ["q2"]),
             helper.make_node("Neg", ["q2"], ["n2"]),
             helper.make_node("Concat", ["n2", "q1"], ["rot"], axis=-1),
             helper.make_node("Mul", ["rot", "sin"], ["b"]),
             helper.make_node("Mul", ["qh", "cos"], ["a"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    weights = {"w": rng.standard_normal((hidden, hidden)).astype(np.float32) / 16, "shape": shape,
               "cos": rng.standard_normal((seq, 1, dim)).astype(np.float32),
               "sin": rng.standard_normal((seq, 1, dim)).astype(np.float32),
               "zero": np.array([0], np.int64), "half": np.array([dim // 2], np.int64),
               "end": np.array([dim], np.int64), "last": np.array([-1], np.int64)}
    return make_model(nodes, {"x": ([seq, hidden], TensorProto.FLOAT)},
                      {"y": ([seq, heads, dim], TensorProto.FLOAT)}, weights)


def test_rope_halves_and_their_concat_stay_on_chip(tmp):
    """The slices of each head and their Concat keep the projection's rows on partitions: no tensor of the
    layer goes through HBM (it did: the Concat's copies merged tokens and heads into rows)."""
    model = rope_after_projection()
    assert compile_model(model).stats["through_hbm"] == 0
    ours, ref = run_both(model, tmp)
    np.testing.assert_allclose(ours["y"], ref["y"], rtol=1e-4, atol=1e-4)


def test_a_transposing_copy_into_a_narrowed_operand_stores_the_narrow_type(tmp):
    """Under auto-cast a tensor only matmuls read is held in the matmul type; a Reshape that must copy its
    transposed input (ConvBERT's convolution heads: [1, 576, 32] turned, then split to [64, 32, 9]) makes it through
    the Tensor engine, and the store writes that narrow type (it wrote the source's fp32 past the tensor's end:
    NCC_VERIFY). The result is the product of the bf16-rounded operands."""
    from neuronx_cc_lite.compiler import Options
    from neuronx_cc_lite.reference import cast_only_model, onnxruntime_outputs

    rng = np.random.default_rng(0)
    weights = {"shape1": np.array([1, 32, 64, 9], np.int64), "shape2": np.array([64, 32, 9], np.int64),
               "w": rng.standard_normal((9, 16)).astype(np.float32)}
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["t", "shape1"], ["r1"]), helper.make_node("Reshape", ["r1", "shape2"], ["r2"]),
             helper.make_node("MatMul", ["r2", "w"], ["y"])]
    model = make_model(nodes, {"x": ([1, 576, 32], TensorProto.FLOAT)},  # a, an output too, stays fp32
                       {"y": ([64, 32, 16], TensorProto.FLOAT), "a": ([1, 576, 32], TensorProto.FLOAT)}, weights)
    compiled = compile_to_model(model, tmp, Options(auto_cast="matmult"))
    x = rng.standard_normal((1, 576, 32)).astype(np.float32)
    ours = compiled.run({"x": x})
    ref = onnxruntime_outputs(cast_only_model(model, "matmult", "bf16"), {"x": x}, optimize=False)
    np.testing.assert_allclose(ours["y"], ref["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ours["a"], 2 * x)
