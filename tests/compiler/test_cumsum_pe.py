"""CumSum along a sequence axis on the Tensor engine (lower/cumsum_pe.py): blocks of 128 steps on partitions, a
triangle of ones within a block and all-ones over the earlier blocks, matching onnxruntime; other CumSums keep
the scan along the free axis."""

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


@pytest.mark.parametrize("shape,axis", [([1, 300, 96], 1), ([2, 200, 40], 1), ([300, 64], 0), ([3, 130, 2, 5], 1)])
def test_sequence_cumsum_on_pe_matches(tmp, shape, axis):
    model = cumsum(shape, axis)
    assert "nc_matmul" in _ops(model)
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)


@pytest.mark.parametrize("attrs", [{"reverse": 1}, {"exclusive": 1}])
def test_reverse_and_exclusive_keep_the_free_axis_scan(tmp, attrs):
    model = cumsum([1, 200, 16], 1, **attrs)
    assert "nc_matmul" not in _ops(model)
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)
