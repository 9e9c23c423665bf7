"""CumSum along a sequence axis on the Tensor engine (lower/cumsum_pe.py): blocks of 128 steps on partitions, a
triangle of ones within a block and all-ones over a running carry of the earlier blocks, matching onnxruntime;
other CumSums keep the scan along the free axis."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import compile_model
from tests.conftest import assert_close, make_model, run_both

F = TensorProto.FLOAT


def cumsum(shape: list[int], axis: int, **attrs):
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], **attrs)
    return make_model([node], {"x": (shape, F)}, {"y": (shape, F)}, {"axis": np.array(axis, np.int64)})


def _ops(model) -> set[str]:
    return {i.op for core in compile_model(model).cores for s in core.values() for i in s.instructions}


@pytest.mark.parametrize("shape,axis", [([1, 300, 96], 1), ([2, 200, 40], 1), ([300, 64], 0), ([3, 130, 2, 5], 1),
                                         ([1, 1100, 24], 1)])
def test_sequence_cumsum_on_pe_matches(tmp, shape, axis):
    model = cumsum(shape, axis)
    assert "nc_matmul" in _ops(model)
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)


def test_each_block_takes_two_matmuls_whatever_comes_before_it():
    """The earlier blocks reach a block through one carry (summed on GpSimd), not one matmul per earlier block:
    1,100 steps are 9 blocks, 17 matmuls (the first block has no carry), where a matmul per earlier block was 45."""
    bundle = compile_model(cumsum([1, 1100, 24], 1))
    matmuls = sum(i.op == "nc_matmul" for core in bundle.cores for s in core.values() for i in s.instructions)
    assert matmuls == 2 * 9 - 1


@pytest.mark.parametrize("attrs", [{"reverse": 1}, {"exclusive": 1}])
def test_reverse_and_exclusive_keep_the_free_axis_scan(tmp, attrs):
    model = cumsum([1, 200, 16], 1, **attrs)
    assert "nc_matmul" not in _ops(model)
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)


def test_a_cumprod_along_rows_is_a_product_not_a_sum(tmp):
    """CumProd shares the scan's lowering but not the PE path, whose ones-matrices sum (onnxruntime has no CumProd
    kernel here: numpy is the reference)."""
    from tests.conftest import compile_to_model

    node = helper.make_node("CumProd", ["x", "axis"], ["y"])
    model = make_model([node], {"x": ([6, 3], F)}, {"y": ([6, 3], F)}, {"axis": np.array(0, np.int64)}, opset=26)
    x = np.random.default_rng(0).uniform(0.5, 1.5, (6, 3)).astype(np.float32)
    np.testing.assert_allclose(compile_to_model(model, tmp).run({"x": x})["y"], np.cumprod(x, axis=0), rtol=1e-6)
