"""Shared helpers: small ONNX models built in code, and compile -> run -> compare with onnxruntime."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

# the simulator's matmuls are small: with two BLAS threads each on a 2-core machine, parallel test processes make
# OpenBLAS spin against each other (seconds per run); set before numpy loads OpenBLAS
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# the compile cache of the CLI and the Python API lives in a directory of this run's, never the user's
os.environ["NEURONX_CC_LITE_CACHE"] = tempfile.mkdtemp(prefix="ncc-cache-")
atexit.register(shutil.rmtree, os.environ["NEURONX_CC_LITE_CACHE"], True)

import numpy as np  # noqa: E402
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from isa import bundle as bundle_format  # noqa: E402
from neuronx_cc_lite.compiler import Options, compile_model  # noqa: E402
from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs  # noqa: E402
import runtime  # noqa: E402

MODELS_DIR = os.path.join(ROOT, "models")


def make_model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[list[int], int]],
               outputs: dict[str, tuple[list[int] | None, int]], weights: dict[str, np.ndarray] | None = None,
               opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(k, t, s) for k, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(k, t, s) for k, (s, t) in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (weights or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def gemm_model(m: int, k: int, n: int, trans_b: bool = False, bias: bool = True, seed: int = 0,
               op: str = "Gemm", **attrs: float) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    weights = {"w": w}
    ins = ["x", "w"]
    if op == "Gemm":
        if bias:
            weights["b"] = rng.standard_normal(n).astype(np.float32)
            ins.append("b")
        node = helper.make_node("Gemm", ins, ["y"], transB=int(trans_b), **attrs)
    else:
        node = helper.make_node("MatMul", ins, ["y"])
    return make_model([node], {"x": ([m, k], TensorProto.FLOAT)}, {"y": ([m, n], TensorProto.FLOAT)}, weights)


def compile_to_model(model: onnx.ModelProto, tmp_path, options: Options | None = None) -> runtime.Model:
    """Compile, write the bundle to disk, load it back: the runtime sees only the file."""
    b = compile_model(model, options)
    path = os.path.join(tmp_path, "model.neff")
    bundle_format.write(b, path)
    return runtime.load(path)


def run_both(model: onnx.ModelProto, tmp_path, seed: int = 0, options: Options | None = None,
             policy: str = "clock") -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(ours, onnxruntime's) outputs on the same seeded inputs."""
    compiled = compile_to_model(model, tmp_path, options)
    inputs = seeded_inputs(compiled.inputs, seed)
    return compiled.run(inputs, policy=policy), onnxruntime_outputs(model, inputs)


def assert_close(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], rtol: float,
                 atol: float | None = None) -> None:
    """Every output within rtol of onnxruntime's, element by element, with an absolute floor of rtol times the
    output's root-mean-square value unless `atol` is given: two correct fp32 dot products of length K that sum
    in different orders differ by about sqrt(K) * 6e-8 * |typical term|, which is large next to an output that
    cancels to near zero; an element that is wrong by a typical product or more still fails."""
    assert ours.keys() == ref.keys()
    for name in ref:
        assert ours[name].shape == ref[name].shape, name
        assert ours[name].dtype == ref[name].dtype, name
        expected = ref[name].astype(np.float64)
        expected = expected[np.isfinite(expected)]  # an inf or NaN would make the floor inf or NaN: no check at all
        floor = atol if atol is not None else rtol * float(np.sqrt(np.mean(expected**2))) if expected.size else 0
        np.testing.assert_allclose(ours[name], ref[name], rtol=rtol, atol=floor, err_msg=name)


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)
