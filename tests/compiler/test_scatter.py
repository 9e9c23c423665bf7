"""ScatterND, ScatterElements and TensorScatter with indices given at run time (graph inputs), against
onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import compile_to_model, make_model

ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64,
              np.float16: TensorProto.FLOAT16, np.uint8: TensorProto.UINT8}


def _model(op: str, data: np.ndarray, indices: np.ndarray, updates: np.ndarray, **attrs: object):
    types = {name: ONNX_TYPES[a.dtype.type] for name, a in (("data", data), ("indices", indices),
                                                             ("updates", updates))}
    node = helper.make_node(op, ["data", "indices", "updates"], ["y"], **attrs)
    return make_model([node], {name: (list(a.shape), types[name]) for name, a in
                               (("data", data), ("indices", indices), ("updates", updates))},
                      {"y": (list(data.shape), types["data"])}, opset=18)  # 18: reductions max and min


def _check(tmp_path, op: str, data: np.ndarray, indices: np.ndarray, updates: np.ndarray, **attrs: object) -> None:
    model = _model(op, data, indices, updates, **attrs)
    inputs = {"data": data, "indices": indices, "updates": updates}
    ours = compile_to_model(model, tmp_path).run(inputs, check_races=True)
    np.testing.assert_array_equal(ours["y"], onnxruntime_outputs(model, inputs)["y"])


def _values(shape: tuple[int, ...], dtype: type, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 50).astype(dtype)


def _distinct_tuples(shape: tuple[int, ...], count: int, seed: int) -> np.ndarray:
    """`count` distinct index tuples into `shape`, some written negative (counted from the end)."""
    rng = np.random.default_rng(seed)
    flat = rng.choice(int(np.prod(shape)), count, replace=False)
    tuples = np.stack(np.unravel_index(flat, shape), axis=-1).astype(np.int64)
    negative = rng.random(tuples.shape) < 0.4
    return np.where(negative, tuples - np.array(shape), tuples)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float16, np.uint8])
@pytest.mark.parametrize("data_shape, k, count", [
    ((4, 5, 6), 3, 17),  # k = rank: single elements
    ((4, 5, 6), 1, 3),  # k < rank: slices of 5 x 6
    ((6, 7, 3), 2, 9),  # rows of 3
    ((300, 2), 1, 150),  # more than a block of 128 tuples
], ids=["elements", "slices", "rows", "two-blocks"])
def test_scatter_nd(tmp_path, dtype, data_shape, k, count):
    data = _values(data_shape, dtype, 1)
    indices = _distinct_tuples(data_shape[:k], count, 2)
    updates = _values((count, *data_shape[k:]), dtype, 3)
    _check(tmp_path, "ScatterND", data, indices, updates)


def test_scatter_nd_batched_index_tuples(tmp_path):
    """Indices of shape (2, 3, k): the tuples' own leading axes, the updates' too."""
    data = _values((5, 4, 3), np.float32, 4)
    indices = _distinct_tuples((5, 4), 6, 5).reshape(2, 3, 2)
    _check(tmp_path, "ScatterND", data, indices, _values((2, 3, 3), np.float32, 6))


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_scatter_elements_on_each_axis(tmp_path, dtype, axis):
    rng = np.random.default_rng(7)
    data = _values((4, 5, 6), dtype, 8)
    idx_shape = [3, 4, 5]
    size = data.shape[axis]
    idx_shape[axis] = size  # along the axis: a permutation per line, so no two updates meet
    perms = np.argsort(rng.random(idx_shape), axis=axis)
    indices = np.where(rng.random(idx_shape) < 0.4, perms - size, perms).astype(np.int64)
    _check(tmp_path, "ScatterElements", data, indices, _values(tuple(idx_shape), dtype, 9), axis=axis)


def test_scatter_elements_beyond_one_block(tmp_path):
    data = _values((3, 200), np.float32, 10)
    indices = np.argsort(np.random.default_rng(11).random((3, 200)), axis=1).astype(np.int64)
    _check(tmp_path, "ScatterElements", data, indices, _values((3, 200), np.float32, 12), axis=1)


def test_scatter_opset_10(tmp_path):
    """Scatter, ScatterElements' name before opset 11."""
    data = _values((3, 3), np.float32, 13)
    indices, updates = np.array([[1, 0, 2], [0, 2, 1]], np.int64), _values((2, 3), np.float32, 14)
    model = _model("Scatter", data, indices, updates, axis=0)
    model.opset_import[0].version = 10
    inputs = {"data": data, "indices": indices, "updates": updates}
    ours = compile_to_model(model, tmp_path).run(inputs)
    np.testing.assert_array_equal(ours["y"], onnxruntime_outputs(model, inputs)["y"])


def test_an_index_outside_its_axis_stops_the_run(tmp_path):
    """(0, 6) would land on the next row's element (1, 0) were the tuple not checked part by part."""
    data = np.zeros((4, 6), np.float32)
    model = _model("ScatterND", data, np.array([[0, 6]], np.int64), np.ones(1, np.float32))
    compiled = compile_to_model(model, tmp_path)
    with pytest.raises(runtime.AccessError, match="dma_scatter index .* outside the table's 24 rows"):
        compiled.run({"data": data, "indices": np.array([[0, 6]], np.int64), "updates": np.ones(1, np.float32)})


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_reductions_accumulate_equal_indices_in_order(tmp_path, reduction):
    """Each update combined with what its row holds when its turn comes: equal indices accumulate."""
    data = _values((5, 3), np.float32, 15)
    indices = np.array([[1], [-1], [1], [4], [0], [1]], np.int64)  # row 1 three times, row 4 twice
    _check(tmp_path, "ScatterND", data, indices, _values((6, 3), np.float32, 16), reduction=reduction)
    elements = np.array([[0, 2, 0], [1, 0, 0], [-5, 2, 2]], np.int64)
    _check(tmp_path, "ScatterElements", data, elements, _values((3, 3), np.float32, 17), axis=0,
           reduction=reduction)


def test_a_reduction_past_its_limit_is_refused_naming_the_node(tmp_path):
    data = np.zeros((4, 6), np.float32)
    model = _model("ScatterElements", data, np.zeros((200, 6), np.int64), np.ones((200, 6), np.float32),
                   reduction="add")
    model.graph.node[0].name = "accumulate"
    with pytest.raises(CompileError, match=r"NCC_UNSUPPORTED.*'accumulate' \(ScatterElements\): "
                                           r"ScatterElements with 1200 index rows is not supported"):
        compile_to_model(model, tmp_path)


@pytest.mark.parametrize("shape, seq, axis", [((2, 3, 8, 4), 3, -2), ((3, 10, 2, 5), 4, 1), ((70, 2, 6, 3), 2, 2)],
                         ids=["heads", "axis-1", "blocks"])
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(tmp_path, shape, seq, axis, mode):
    """A KV cache update at run-time write indices (the circular ones past the end, so that they wrap)."""
    rng = np.random.default_rng(18)
    cache = rng.standard_normal(shape).astype(np.float32)
    upd_shape = list(shape)
    upd_shape[axis] = seq
    update = rng.standard_normal(upd_shape).astype(np.float32)
    length = shape[axis]
    writes = rng.integers(0, length - seq + 1 if mode == "linear" else length, shape[0]).astype(np.int64)
    node = helper.make_node("TensorScatter", ["cache", "update", "writes"], ["y"], axis=axis, mode=mode)
    model = make_model([node], {"cache": (list(shape), TensorProto.FLOAT), "update": (upd_shape, TensorProto.FLOAT),
                                "writes": ([shape[0]], TensorProto.INT64)}, {"y": (list(shape), TensorProto.FLOAT)},
                       opset=24)
    inputs = {"cache": cache, "update": update, "writes": writes}
    ours = compile_to_model(model, tmp_path).run(inputs, check_races=True)
    np.testing.assert_array_equal(ours["y"], onnxruntime_outputs(model, inputs)["y"])


def test_tensor_scatter_without_write_indices_writes_from_the_start(tmp_path):
    rng = np.random.default_rng(19)
    cache, update = rng.standard_normal((2, 6, 3)).astype(np.float32), rng.standard_normal((2, 2, 3)).astype(np.float32)
    node = helper.make_node("TensorScatter", ["cache", "update"], ["y"], axis=1)
    model = make_model([node], {"cache": ([2, 6, 3], TensorProto.FLOAT), "update": ([2, 2, 3], TensorProto.FLOAT)},
                       {"y": ([2, 6, 3], TensorProto.FLOAT)}, opset=24)
    inputs = {"cache": cache, "update": update}
    ours = compile_to_model(model, tmp_path).run(inputs, check_races=True)
    np.testing.assert_array_equal(ours["y"], onnxruntime_outputs(model, inputs)["y"])
