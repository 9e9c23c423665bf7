"""BitShift and the bitwise operators on 32-bit integers (all 32 bits matter), against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import compile_to_model, make_model

TYPES = {"int32": TensorProto.INT32, "uint32": TensorProto.UINT32}


OPS = [("BitShift", {"direction": "LEFT"}), ("BitShift", {"direction": "RIGHT"}), ("BitwiseAnd", {}),
       ("BitwiseOr", {}), ("BitwiseXor", {}), ("BitwiseNot", {})]
CASES = [(op, attrs, dtype) for op, attrs in OPS for dtype in TYPES
         if not (op == "BitShift" and dtype == "int32")]  # BitShift takes unsigned types before opset 26


@pytest.mark.parametrize("op, attrs, dtype", CASES,
                         ids=[f"{op}{attrs.get('direction', '')}-{dtype}" for op, attrs, dtype in CASES])
def test_bit_operators_on_32_bits(tmp_path, op, attrs, dtype):
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (6, 7), dtype=np.int64).astype(dtype)
    if op == "BitShift":  # the amount: [0, 32), as ONNX requires
        y = rng.integers(0, 32, (6, 7)).astype(dtype)
    else:
        y = rng.integers(info.min, info.max, (6, 7), dtype=np.int64).astype(dtype)
    names = ["x"] if op == "BitwiseNot" else ["x", "y"]
    inputs = {"x": x, "y": y} if len(names) == 2 else {"x": x}
    model = make_model([helper.make_node(op, names, ["z"], **attrs)],
                       {name: ([6, 7], TYPES[dtype]) for name in names}, {"z": ([6, 7], TYPES[dtype])}, opset=18)
    ours = compile_to_model(model, tmp_path).run(inputs)
    np.testing.assert_array_equal(ours["z"], onnxruntime_outputs(model, inputs)["z"])
