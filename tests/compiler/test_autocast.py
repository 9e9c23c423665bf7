"""--auto-cast: every bundled model meets the documented error bound of each setting, and the listing shows the
casts where they belong (matmul operands narrowed in SBUF, PSUM still fp32)."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest

from isa.assembly import disassemble
from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.precision import error_bound
from neuronx_cc_lite.reference import error_over_rms, onnxruntime_outputs, seeded_inputs
from tests.conftest import MODELS_DIR, compile_to_model, gemm_model

QUANTIZATION_OPS = {"QuantizeLinear", "DynamicQuantizeLinear"}
# A quantized model turns any perturbation of a value near a rounding tie into a whole quantization step, so no
# bound in units of the narrow type's roundoff holds for it (README, "Quantized models"); its integer products
# stay exact under auto-cast (tests/compiler/test_quantization.py).
MODELS = [p for p in sorted(glob.glob(os.path.join(MODELS_DIR, "*.onnx")))
          if not QUANTIZATION_OPS & {n.op_type for n in onnx.load(p).graph.node}]
SETTINGS = [("matmult", "bf16"), ("matmult", "fp16"), ("matmult", "fp8_e4m3"), ("all", "bf16"), ("all", "fp16")]


@pytest.mark.parametrize("mode, cast", SETTINGS, ids=lambda v: v)
@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_model_within_documented_bound(tmp, path, mode, cast):
    model = onnx.load(path)
    compiled = compile_to_model(model, tmp, Options(auto_cast=mode, auto_cast_type=cast))
    inputs = seeded_inputs(compiled.inputs)
    ours, ref = compiled.run(inputs), onnxruntime_outputs(model, inputs)
    bound = error_bound(mode, cast)
    for name in ref:
        assert error_over_rms(ours[name], ref[name]) <= bound, name


def test_auto_cast_changes_the_answer_a_little():
    """Not a no-op: bf16 operands move the result off the fp32 one, by less than the bound."""
    model = gemm_model(7, 300, 129)
    ours = {}
    for mode in ("none", "matmult"):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            compiled = compile_to_model(model, tmp, Options(auto_cast=mode))
            ours[mode] = compiled.run(seeded_inputs(compiled.inputs))["y"]
    err = error_over_rms(ours["matmult"], ours["none"])
    assert 1e-4 < err <= error_bound("matmult", "bf16")


def test_matmul_operands_are_narrowed_and_psum_stays_fp32():
    listing = disassemble(compile_model(gemm_model(7, 129, 300), Options(auto_cast="matmult")), data=False)
    matmuls = [line for line in listing.splitlines() if "nc_matmul" in line]
    assert matmuls
    for line in matmuls:
        assert "dst=fp32 PSUM" in line and "stationary=bf16 SBUF" in line and "moving=bf16 SBUF" in line
    casts = [line for line in listing.splitlines() if "dma_copy dst=bf16 SBUF" in line and "src=fp32 HBM" in line]
    assert casts, "the operands are cast by the DMA that loads them"


def test_all_holds_weights_in_the_cast_type():
    """The matrix is stored in the cast type; the bias the matmul adds on PE is stored exactly either way (three
    bf16 rows summing to its fp32 values)."""
    # (100 rows: with a few, the weights would be stationary and the bias a column, lower/matmul.py)
    fp32 = compile_model(gemm_model(100, 129, 300))
    narrow = compile_model(gemm_model(100, 129, 300), Options(auto_cast="all", auto_cast_type="fp8_e4m3"))
    size = lambda b, kind: sum(t.size for t in b.hbm_tensors if t.kind == "weight" and kind in t.name)  # noqa
    assert size(narrow, "KxN") * 4 == size(fp32, "KxN") > 0
    assert size(narrow, "rows") == size(fp32, "rows") == 3 * 300 * 2
    assert narrow.flags["auto_cast"] == "all" and narrow.flags["auto_cast_type"] == "fp8_e4m3"


# Bundled models whose matmult operands are the model's own MatMul, Gemm and Conv operands as they stand (no batch
# norm folded into a weight first, no scale moved into a product, no recurrent or Loop body, nothing quantized)
AS_THEY_STAND = ["mlp_small", "mlp_wide", "mlp_odd", "bert_hf", "bert_modern", "cnn_ops"]


@pytest.mark.parametrize("name", AS_THEY_STAND)
def test_matmult_rounds_what_the_cast_only_reference_rounds(tmp, name):
    """Under --auto-cast matmult the compiled model is onnxruntime with the operands of MatMul, Gemm and Conv
    rounded to bf16 (check's "cast own" reference, reference.cast_only_model) up to fp32 summation order: a
    product left in fp32, or a value rounded that auto-cast keeps, moves it by ~1e-3 of the output's rms."""
    from neuronx_cc_lite.reference import cast_only_model

    model = onnx.load(os.path.join(MODELS_DIR, f"{name}.onnx"))
    compiled = compile_to_model(model, tmp, Options(auto_cast="matmult", auto_cast_type="bf16"))
    inputs = seeded_inputs(compiled.inputs)
    ours = compiled.run(inputs)
    rounded = onnxruntime_outputs(cast_only_model(model, "matmult", "bf16"), inputs, optimize=False)
    for out in rounded:
        assert error_over_rms(ours[out], rounded[out]) <= 1e-4, out


def _two_readers():  # type: ignore[no-untyped-def]
    """x -> Conv -> Relu -> r, and r read by two dense convolutions whose results are added."""
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((16, 8, 3, 3)).astype(np.float32),
               "w2": rng.standard_normal((16, 16, 3, 3)).astype(np.float32),
               "w3": rng.standard_normal((16, 16, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["r", "w3"], ["c"]),
             helper.make_node("Add", ["b", "c"], ["y"])]
    return make_model(nodes, {"x": ([1, 8, 20, 20], TensorProto.FLOAT)}, {"y": ([1, 16, 20, 20], TensorProto.FLOAT)},
                      weights)


def test_a_value_only_dense_convolutions_read_is_held_in_the_matmul_type(tmp):
    """Under --auto-cast matmult a convolution rounds its input to bf16 as it loads it, so a value only dense
    convolutions read is held in bf16 (half the SBUF a home takes: EfficientNet-B0's 112 x 112 activations spilled in
    fp32); not one a depthwise convolution reads (measured slower so: MobileNetV3 80.4 -> 81.3 us), nor a
    residual; the answer is onnxruntime's with the convolutions' operands rounded."""
    from neuronx_cc_lite.compiler import prepare
    from neuronx_cc_lite.lower.layout import only_multiplied
    from neuronx_cc_lite.reference import cast_only_model

    model = _two_readers()
    g = prepare(model, Options(auto_cast="matmult"))
    assert only_multiplied(g, g.consumers(), "r")
    depthwise = _two_readers()
    depthwise.graph.node[2].attribute.append(onnx.helper.make_attribute("group", 16))
    depthwise.graph.initializer[1].CopyFrom(onnx.numpy_helper.from_array(
        np.ones((16, 1, 3, 3), np.float32), "w2"))
    g = prepare(depthwise, Options(auto_cast="matmult"))
    assert not only_multiplied(g, g.consumers(), "r")
    compiled = compile_to_model(model, tmp, Options(auto_cast="matmult"))
    x = np.random.default_rng(1).standard_normal((1, 8, 20, 20)).astype(np.float32)
    ref = onnxruntime_outputs(cast_only_model(model, "matmult", "bf16"), {"x": x}, optimize=False)["y"]
    assert error_over_rms(compiled.run({"x": x})["y"], ref) <= 1e-4
