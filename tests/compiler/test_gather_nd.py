"""GatherND with indices given at run time (a graph input), against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import compile_to_model, make_model


def _run(tmp_path, data: np.ndarray, indices: np.ndarray, batch_dims: int = 0) -> None:
    onnx_type = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}[data.dtype]
    out_shape = list(indices.shape[:-1]) + list(data.shape[batch_dims + indices.shape[-1]:])
    node = helper.make_node("GatherND", ["data", "indices"], ["y"], batch_dims=batch_dims)
    model = make_model([node], {"data": (list(data.shape), onnx_type),
                                "indices": (list(indices.shape), TensorProto.INT64)}, {"y": (out_shape, onnx_type)})
    inputs = {"data": data, "indices": indices}
    ours = compile_to_model(model, tmp_path).run(inputs, check_races=True)
    np.testing.assert_array_equal(ours["y"], onnxruntime_outputs(model, inputs)["y"])


def _tuples(bounds: tuple[int, ...], count: int, seed: int) -> np.ndarray:
    """Index tuples into `bounds`, repeats allowed, some written negative."""
    rng = np.random.default_rng(seed)
    tuples = np.stack([rng.integers(0, n, count) for n in bounds], axis=-1)
    return np.where(rng.random(tuples.shape) < 0.4, tuples - np.array(bounds), tuples).astype(np.int64)


@pytest.mark.parametrize("k, count", [(3, 20), (2, 7), (1, 140)], ids=["elements", "rows", "slices-two-blocks"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_gather_nd(tmp_path, k, count, dtype):
    data = (np.random.default_rng(1).standard_normal((6, 5, 4)) * 50).astype(dtype)
    _run(tmp_path, data, _tuples(data.shape[:k], count, 2))


def test_gather_nd_with_batch_dims(tmp_path):
    """batch_dims 1: tuple (b, t) of the indices reads data[b, index[b, t]], a slice of 3 x 4."""
    data = np.random.default_rng(3).standard_normal((2, 5, 3, 4)).astype(np.float32)
    _run(tmp_path, data, _tuples((5,), 12, 4).reshape(2, 6, 1), batch_dims=1)


def test_an_index_outside_its_axis_stops_the_run(tmp_path):
    data = np.zeros((4, 6), np.float32)
    node = helper.make_node("GatherND", ["data", "indices"], ["y"])
    model = make_model([node], {"data": ([4, 6], TensorProto.FLOAT), "indices": ([1, 2], TensorProto.INT64)},
                       {"y": ([1], TensorProto.FLOAT)})
    with pytest.raises(runtime.AccessError, match="dma_gather index .* outside the table's 24 rows"):
        compile_to_model(model, tmp_path).run({"data": data, "indices": np.array([[0, 6]], np.int64)})
