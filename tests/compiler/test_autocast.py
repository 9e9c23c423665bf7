"""--auto-cast: every bundled model meets the documented error bound of each setting, and the listing shows the
casts where they belong (matmul operands narrowed in SBUF, PSUM still fp32)."""

from __future__ import annotations

import glob
import os

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
