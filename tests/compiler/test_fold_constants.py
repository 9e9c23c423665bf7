"""Constant folding (passes/fold_constants.py): what folds, with which evaluator, and that a node that does not fold
stays for the device instead of stopping the compile. Every folded value is compared with onnxruntime or numpy."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, prepare
from neuronx_cc_lite.passes import fold_constants
from tests.conftest import assert_close, make_model, run_both

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _plus_x(nodes: list[onnx.NodeProto], value: tuple[str, list[int], int], shape: list[int],
            weights: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    """`nodes` compute `value` (name, shape, element type) from constants; the model returns it, and x plus it as
    float, so that onnxruntime checks the folded value itself and its use on the device."""
    name, value_shape, value_type = value
    tail = [helper.make_node("Cast", [name], ["value_f"], to=F32), helper.make_node("Add", ["x", "value_f"], ["y"])]
    return make_model(nodes + tail, {"x": (shape, F32)}, {"y": (shape, F32), name: (value_shape, value_type)},
                      weights, opset=opset)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op for n in prepare(model, Options()).nodes]


def _folded(model: onnx.ModelProto, name: str) -> np.ndarray:
    value = prepare(model, Options()).tensors[name].value
    assert value is not None, f"{name} was not folded"
    return value


def test_range_over_constants_becomes_a_constant_not_a_loop(tmp):
    model = _plus_x([helper.make_node("Range", ["start", "limit", "delta"], ["r"])], ("r", [5], I64), [2, 5],
                    {"start": np.array(3, np.int64), "limit": np.array(-7, np.int64),
                     "delta": np.array(-2, np.int64)})
    assert _ops(model) == ["Add"]
    np.testing.assert_array_equal(_folded(model, "r"), np.arange(3, -7, -2))
    assert_close(*run_both(model, tmp), rtol=0, atol=0)


def test_range_over_a_computed_shape_folds(tmp):
    """The positions of a dynamic-axes export: Range(0, Shape(x)[1], 1), with x's shape pinned."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
             helper.make_node("Range", ["zero", "length", "one"], ["positions"])]
    model = _plus_x(nodes, ("positions", [7], I64), [3, 7],
                    {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)})
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "sequence"
    options = Options(input_shapes={"x": (3, 7)})
    graph = prepare(model, options)
    assert [n.op for n in graph.nodes] == ["Add"]
    np.testing.assert_array_equal(graph.tensors["positions"].value, np.arange(7))
    assert_close(*run_both(model, tmp, options=options), rtol=0, atol=0)


def test_gather_elements_over_a_1_by_n_buffer_folds(tmp):
    """The token-type buffer of a BERT export: data (1, 512), indices (1, 128). onnx.reference fails on it (it
    gathers with np.choose, which takes a few dozen choices at most); the folded value is numpy's
    take_along_axis."""
    data = (np.arange(512, dtype=np.int64) % 3).reshape(1, 512)
    indices = np.random.default_rng(0).integers(0, 512, (1, 128)).astype(np.int64)
    model = _plus_x([helper.make_node("GatherElements", ["data", "indices"], ["token_type"], axis=1)],
                    ("token_type", [1, 128], I64), [1, 128], {"data": data, "indices": indices})
    assert _ops(model) == ["Add"]
    np.testing.assert_array_equal(_folded(model, "token_type"), np.take_along_axis(data, indices, axis=1))
    assert_close(*run_both(model, tmp), rtol=0, atol=0)


def test_dequantize_linear_below_opset_19_folds(tmp):
    """onnx.reference implements DequantizeLinear from opset 19 only; an opset-13 model still folds it."""
    q = np.array([0, 1, 2, 3, 128, 200, 250, 255], np.uint8)
    model = _plus_x([helper.make_node("DequantizeLinear", ["q", "scale", "zero_point"], ["w"])], ("w", [8], F32), [8],
                    {"q": q, "scale": np.array(0.25, np.float32), "zero_point": np.array(3, np.uint8)}, opset=13)
    assert _ops(model) == ["Add"]
    np.testing.assert_array_equal(_folded(model, "w"), (q.astype(np.float32) - 3) * np.float32(0.25))
    assert_close(*run_both(model, tmp), rtol=0, atol=0)


def _failing(model: onnx.ModelProto) -> list[np.ndarray]:
    raise RuntimeError("no kernel")


def test_a_node_no_evaluator_folds_stays_for_the_device(tmp, monkeypatch):
    monkeypatch.setattr(fold_constants, "EVALUATORS", (_failing, _failing))
    rng = np.random.default_rng(1)
    model = make_model([helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Add", ["x", "ab"], ["y"])],
                       {"x": ([4, 6], F32)}, {"y": ([4, 6], F32)},
                       {"a": rng.standard_normal((4, 6)).astype(np.float32),
                        "b": rng.standard_normal((4, 6)).astype(np.float32)})
    assert _ops(model) == ["Mul", "Add"]
    assert_close(*run_both(model, tmp), rtol=1e-6)


def test_onnx_reference_evaluates_what_onnxruntime_cannot(monkeypatch):
    monkeypatch.setattr(fold_constants, "EVALUATORS", (_failing, fold_constants._with_reference))
    model = _plus_x([helper.make_node("Range", ["start", "limit", "delta"], ["r"])], ("r", [4], I64), [4],
                    {"start": np.array(0, np.int64), "limit": np.array(4, np.int64), "delta": np.array(1, np.int64)})
    np.testing.assert_array_equal(_folded(model, "r"), np.arange(4))


def test_a_result_too_large_to_fold_is_never_computed(monkeypatch):
    """The output shape that shape inference gives is checked before the node runs."""
    calls = []
    monkeypatch.setattr(fold_constants, "MAX_FOLDED_ELEMENTS", 15)
    monkeypatch.setattr(fold_constants, "EVALUATORS", (lambda m: calls.append(m) or _failing(m),))
    model = make_model([helper.make_node("Expand", ["one", "shape"], ["ones"]),
                        helper.make_node("Add", ["x", "ones"], ["y"])],
                       {"x": ([2, 8], F32)}, {"y": ([2, 8], F32)},
                       {"one": np.ones((1, 1), np.float32), "shape": np.array([2, 8], np.int64)})
    assert _ops(model) == ["Expand", "Add"]
    assert calls == []



def test_a_range_too_large_to_fold_runs_on_the_device(tmp, monkeypatch):
    """GpSimdE's iota and one tensor_scalar: start + i * delta."""
    monkeypatch.setattr(fold_constants, "MAX_FOLDED_ELEMENTS", 15)
    for dtype, start, limit, delta in ((np.int64, 3, -40, -2), (np.float32, 0.5, 9.0, 0.25)):
        onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        n = int(np.ceil((limit - start) / delta))
        model = _plus_x([helper.make_node("Range", ["start", "limit", "delta"], ["r"])], ("r", [n], onnx_type), [2, n],
                        {"start": np.array(start, dtype), "limit": np.array(limit, dtype),
                         "delta": np.array(delta, dtype)})
        # (a Cast of float32 to float32 changes nothing: drop-no-ops takes it out)
        assert _ops(model) == (["Range", "Add"] if dtype is np.float32 else ["Range", "Cast", "Add"])
        ours, ref = run_both(model, tmp)
        np.testing.assert_array_equal(ours["r"], np.arange(start, limit, delta, dtype=dtype))
        assert_close(ours, ref, rtol=0, atol=0)


def test_eyelike_folds_from_its_input_shape(tmp):
    model = _plus_x([helper.make_node("EyeLike", ["x"], ["eye"], k=1, dtype=TensorProto.INT32)],
                    ("eye", [3, 4], TensorProto.INT32), [3, 4], {})
    assert _ops(model) == ["Add"]
    np.testing.assert_array_equal(_folded(model, "eye"), np.eye(3, 4, k=1, dtype=np.int32))
    assert_close(*run_both(model, tmp), rtol=0, atol=0)
