"""Build the quantized example models in models/ with onnxruntime's quantizer (seeded weights and calibration data,
no downloads).

    python models/build_quantized.py       # writes models/cnn_qdq.onnx, models/attention_int8.onnx,
                                           # models/cnn_qoperator.onnx

- cnn_qdq: a small CNN on a [1,3,16,16] image (Conv 3x3 to 8 channels + Relu, MaxPool 2x2, Conv 3x3 to 16
  channels + Relu, a residual Add of a 1x1 Conv, GlobalAveragePool, Flatten, Gemm to 10 logits) quantized by
  `quantize_static` in QDQ format: uint8 activations, int8 weights per output channel, calibrated (MinMax) on 8
  seeded standard-normal images. Every float op sits between DequantizeLinear and QuantizeLinear pairs.
- cnn_qoperator: a CNN with a LeakyRelu branch and a Sigmoid-gated one, concatenated, a residual Add, AveragePool,
  GlobalAveragePool and a Gemm, quantized by `quantize_static` in QOperator format (the same types): onnxruntime's
  com.microsoft contrib ops QLinearLeakyRelu, QLinearSigmoid, QLinearMul, QLinearConcat, QLinearAdd,
  QLinearAveragePool, QLinearGlobalAveragePool and QGemm around QLinearConv.
- attention_int8: a transformer-style block on [1,8,32] (Q/K/V projections, scaled dot-product attention with
  Softmax, output projection, a residual, a Relu MLP 32 -> 64 -> 32) quantized by `quantize_dynamic`: each MatMul
  with a constant weight becomes DynamicQuantizeLinear of its input, MatMulInteger with the int8 weight, and a
  Cast and Mul by the two scales; the activation-by-activation MatMuls stay in fp32.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                      quantize_static)

from common import save

OPSET = 17
IMAGE = (1, 3, 16, 16)
TOKENS = (1, 8, 32)


def _model(name: str, nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="neuronx-cc-lite models/build_quantized.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _cnn_float(rng: np.random.Generator) -> onnx.ModelProto:
    def conv(cout: int, cin: int, k: int) -> np.ndarray:
        return (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k))).astype(np.float32)

    weights = {"conv1.weight": conv(8, 3, 3), "conv1.bias": rng.uniform(-0.1, 0.1, 8).astype(np.float32),
               "conv2.weight": conv(16, 8, 3), "conv2.bias": rng.uniform(-0.1, 0.1, 16).astype(np.float32),
               "skip.weight": conv(16, 8, 1), "skip.bias": np.zeros(16, np.float32),
               "fc.weight": (rng.standard_normal((10, 16)) / 4).astype(np.float32),
               "fc.bias": rng.uniform(-0.1, 0.1, 10).astype(np.float32)}
    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], name="conv2", pads=[1] * 4),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["p1", "skip.weight", "skip.bias"], ["s"], name="skip"),
        helper.make_node("Add", ["r2", "s"], ["sum"], name="residual"),
        helper.make_node("GlobalAveragePool", ["sum"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
    ]
    return _model("cnn_qdq", nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, IMAGE)],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], weights)


def _gated_cnn_float(rng: np.random.Generator) -> onnx.ModelProto:
    """A CNN whose every op has a QOperator form: two branches (LeakyRelu; Sigmoid gating by Mul), concatenated,
    a residual Add, an AveragePool, GlobalAveragePool and a Gemm."""
    def conv(cout: int, cin: int, k: int) -> np.ndarray:
        return (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k))).astype(np.float32)

    weights = {"stem.weight": conv(8, 3, 3), "stem.bias": rng.uniform(-0.1, 0.1, 8).astype(np.float32),
               "left.weight": conv(8, 8, 3), "left.bias": rng.uniform(-0.1, 0.1, 8).astype(np.float32),
               "gate.weight": conv(8, 8, 1), "gate.bias": rng.uniform(-0.1, 0.1, 8).astype(np.float32),
               "mix.weight": conv(16, 16, 1), "mix.bias": rng.uniform(-0.1, 0.1, 16).astype(np.float32),
               "fc.weight": (rng.standard_normal((10, 16)) / 4).astype(np.float32),
               "fc.bias": rng.uniform(-0.1, 0.1, 10).astype(np.float32)}
    nodes = [
        helper.make_node("Conv", ["input", "stem.weight", "stem.bias"], ["c0"], name="stem", pads=[1] * 4),
        helper.make_node("Relu", ["c0"], ["r0"], name="stem_relu"),
        helper.make_node("Conv", ["r0", "left.weight", "left.bias"], ["c1"], name="left", pads=[1] * 4),
        helper.make_node("LeakyRelu", ["c1"], ["l1"], name="left_act", alpha=0.1),
        helper.make_node("Conv", ["r0", "gate.weight", "gate.bias"], ["c2"], name="gate"),
        helper.make_node("Sigmoid", ["c2"], ["s2"], name="gate_act"),
        helper.make_node("Mul", ["r0", "s2"], ["gated"], name="gated"),
        helper.make_node("Concat", ["l1", "gated"], ["both"], name="concat", axis=1),
        helper.make_node("Conv", ["both", "mix.weight", "mix.bias"], ["c3"], name="mix"),
        helper.make_node("Add", ["c3", "both"], ["sum"], name="residual"),
        helper.make_node("AveragePool", ["sum"], ["pooled"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["pooled"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
    ]
    return _model("cnn_qoperator", nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, IMAGE)],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], weights)


def _attention_float(rng: np.random.Generator) -> onnx.ModelProto:
    d, hidden = TOKENS[2], 2 * TOKENS[2]

    def linear(fan_in: int, fan_out: int) -> np.ndarray:
        return rng.uniform(-1, 1, (fan_in, fan_out)).astype(np.float32) / np.sqrt(fan_in).astype(np.float32)

    weights = {"wq": linear(d, d), "wk": linear(d, d), "wv": linear(d, d), "wo": linear(d, d),
               "w1": linear(d, hidden), "b1": rng.uniform(-0.1, 0.1, hidden).astype(np.float32),
               "w2": linear(hidden, d),
               "scale": np.asarray(1 / np.sqrt(d), np.float32)}
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"], name="context"),
        helper.make_node("MatMul", ["context", "wo"], ["attn"], name="o_proj"),
        helper.make_node("Add", ["x", "attn"], ["h"], name="residual"),
        helper.make_node("MatMul", ["h", "w1"], ["u"], name="fc1"),
        helper.make_node("Add", ["u", "b1"], ["ub"], name="fc1_bias"),
        helper.make_node("Relu", ["ub"], ["a"], name="relu"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    return _model("attention_int8", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, TOKENS)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, TOKENS)], weights)


class _Images(CalibrationDataReader):
    """8 seeded standard-normal images, one per call, as quantize_static's calibration asks for them."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.batches = iter([{"input": rng.standard_normal(IMAGE).astype(np.float32)} for _ in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _quantized(model: onnx.ModelProto, quantize) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    """`quantize(input_path, output_path)` applied to `model` through temporary files, as the quantizer needs."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "quantized.onnx")
        onnx.save(model, src)
        quantize(src, dst)
        out = onnx.load(dst)
    out.producer_name = model.producer_name
    out.producer_version = ""
    onnx.checker.check_model(out)
    return out


def cnn_qdq() -> onnx.ModelProto:
    return _quantized(_cnn_float(np.random.default_rng(0)), lambda src, dst: quantize_static(
        src, dst, _Images(1), quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8, reduce_range=True))


def cnn_qoperator() -> onnx.ModelProto:
    return _quantized(_gated_cnn_float(np.random.default_rng(2)), lambda src, dst: quantize_static(
        src, dst, _Images(3), quant_format=QuantFormat.QOperator, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, reduce_range=True))


def attention_int8() -> onnx.ModelProto:
    return _quantized(_attention_float(np.random.default_rng(0)), lambda src, dst: quantize_dynamic(
        src, dst, weight_type=QuantType.QInt8, reduce_range=True))


def build() -> dict[str, onnx.ModelProto]:
    return {"cnn_qdq": cnn_qdq(), "attention_int8": attention_int8(), "cnn_qoperator": cnn_qoperator()}


def main() -> None:
    save(build())


if __name__ == "__main__":
    main()
