"""The Python front door: neuronx_cc_lite.compile with keyword options, runtime.load of a path or a Bundle, the
ONNX backend's keyword checks, and the type-hint markers."""

from __future__ import annotations

import importlib.resources
import os
import re

import numpy as np
import pytest
from onnx import TensorProto, helper

import neuronx_cc_lite
import neuronx_cc_lite.backend as backend
import runtime
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import assert_close, make_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gemm() -> object:
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                      {"x": ([4, 16], TensorProto.FLOAT)}, {"y": ([4, 8], TensorProto.FLOAT)}, {"w": w})


def test_compile_takes_keyword_options_and_writes_the_bundle(tmp):
    model = _gemm()
    path = os.path.join(tmp, "m.neff")
    bundle = neuronx_cc_lite.compile(model, target="trn2", auto_cast="matmult", optimize=1, output=path)
    assert bundle.target == "trn2" and bundle.flags["auto_cast"] == "matmult" and bundle.flags["optimize"] == 1
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    from_bundle, from_file = runtime.load(bundle).run({"x": x}), runtime.load(path).run({"x": x})
    np.testing.assert_array_equal(from_bundle["y"], from_file["y"])
    assert_close(from_bundle, onnxruntime_outputs(model, {"x": x}), rtol=0.07)  # bf16 operands


def test_compile_options_are_keywords_only_and_checked():
    with pytest.raises(TypeError):
        neuronx_cc_lite.compile(_gemm(), "trn1")  # type: ignore[misc]
    with pytest.raises(CompileError, match="NCC_TARGET"):
        neuronx_cc_lite.compile(_gemm(), target="trn9")
    with pytest.raises(CompileError, match="NCC_OPTION"):
        neuronx_cc_lite.compile(_gemm(), auto_cast="sometimes")


def test_the_backend_refuses_unknown_keywords():
    with pytest.raises(TypeError, match="auto_cats"):
        backend.prepare(_gemm(), auto_cats="matmult")
    rep = backend.prepare(_gemm(), auto_cast="matmult")
    assert rep.run([np.ones((4, 16), np.float32)])[0].shape == (4, 8)


@pytest.mark.parametrize("package", ["neuronx_cc_lite", "runtime", "isa"])
def test_packages_carry_the_typed_marker(package):
    assert importlib.resources.files(package).joinpath("py.typed").is_file()


@pytest.mark.parametrize("kwargs, error, says", [
    ({"input_shapes": [1, 2]}, TypeError, "input_shapes must be a mapping"),
    ({"input_shapes": {"x": "3,100"}}, TypeError, "input_shapes['x'] must be a sequence"),
    ({"input_values": 3}, TypeError, "input_values must be a mapping"),
    ({"output": "."}, ValueError, "output='.': a directory, not a regular file"),
    ({"output": 3}, TypeError, "output must be a path"),
    ({"cache_size": -1}, ValueError, "cache_size must be a number of bytes"),
])
def test_wrong_argument_types_name_the_argument(kwargs, error, says):
    with pytest.raises(error, match=re.escape(says)):
        neuronx_cc_lite.compile("models/mlp_odd.onnx", **kwargs)
    with pytest.raises(TypeError, match="model must be a path or an onnx.ModelProto"):
        neuronx_cc_lite.compile(42)
