"""BitCast: the input's bytes read as the output's type, whatever produced them (here an op on the engines), and
refused where the device holds a type in other bytes (float64 as fp32)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from tests.conftest import compile_to_model, make_model


def test_bitcast_reads_the_bits_of_a_computed_value(tmp):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("BitCast", ["r"], ["bits"], to=TensorProto.INT32),
             helper.make_node("BitCast", ["i"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["f", "x"], ["y"])]
    model = make_model(nodes, {"x": ([3, 40], TensorProto.FLOAT), "i": ([3, 40], TensorProto.INT32)},
                       {"bits": ([3, 40], TensorProto.INT32), "y": ([3, 40], TensorProto.FLOAT)}, opset=26)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    i = rng.standard_normal((3, 40)).astype(np.float32).view(np.int32)
    out = compile_to_model(model, tmp).run({"x": x, "i": i})
    np.testing.assert_array_equal(out["bits"], np.maximum(x, 0).view(np.int32))
    np.testing.assert_array_equal(out["y"], i.view(np.float32) + x)


def test_bitcast_of_a_type_held_in_other_bytes_is_refused():
    model = make_model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT64)],
                       {"x": ([4], TensorProto.DOUBLE)}, {"y": ([4], TensorProto.INT64)}, opset=26)
    with pytest.raises(UnsupportedError, match="BitCast of float64, which the device holds as fp32"):
        compile_model(model)
