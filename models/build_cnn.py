"""Build the example CNNs in models/ (seeded random weights, no downloads).

    python models/build_cnn.py             # writes models/resnet_small.onnx, models/cnn_ops.onnx

- resnet_small: a torchvision-style ResNet on a [1,3,32,32] image, exported without folding the BatchNorms:
  stem Conv 3x3 (16 channels) + BatchNormalization + Relu + MaxPool 3x3/2; a basic block at 16 channels with
  the identity shortcut; a basic block down to 32 channels with stride 2 and a 1x1 Conv + BatchNormalization
  projection on the shortcut; GlobalAveragePool, Flatten, Gemm(transB=1) to 10 logits. Convs have no bias
  (bias=False before a BatchNorm), kaiming-normal weights (std sqrt(2 / fan_in)); the BatchNorms are in
  inference form (epsilon only) with non-trivial scale, bias, running mean and running variance.
- cnn_ops: the other CNN operators on a [1,8,16,16] input, three graph outputs:
  depthwise Conv (group 8, dilation 2) -> Clip(0, 6) -> AveragePool 3x3 (pads 1, count_include_pad=0)
  -> Pad(reflect) -> Conv 3x3 -> LeakyRelu -> ConvTranspose (stride 2) to [1,4,32,32];
  the AveragePool output also goes through Resize (nearest, scales 2 on H and W, the nn.Upsample form);
  Concat of both on channels [1,12,32,32] -> Split 2 + 10 (the first two channels and the next two are
  ConvTranspose outputs of both signs) -> HardSigmoid ("gate") and HardSwish ("swish");
  GlobalMaxPool of the Concat ("pooled").

Node and tensor names follow torch.onnx: "/layer1/layer1.0/conv1/Conv" producing
"/layer1/layer1.0/conv1/Conv_output_0"; parameters keep their state_dict names.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import save

OPSET = 17


class _Graph:
    """Nodes named the way torch.onnx names them: "<scope>/<Op>", then "<scope>/<Op>_1", ...; outputs
    "<node name>_output_<i>" unless given."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: dict[str, np.ndarray] = {}
        self._seen: dict[str, int] = {}

    def weight(self, name: str, value: np.ndarray) -> str:
        self.weights[name] = value
        return name

    def node(self, scope: str, op: str, inputs: list[str], outputs: list[str] | None = None, n_out: int = 1,
             **attrs) -> str | list[str]:
        base = f"{scope}/{op}"
        k = self._seen.get(base, 0)
        self._seen[base] = k + 1
        name = base if k == 0 else f"{base}_{k}"
        outs = outputs or [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0] if len(outs) == 1 else outs


def _model(name: str, g: _Graph, inputs: list, outputs: list) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in g.weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="neuronx-cc-lite models/build_cnn.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _kaiming(rng: np.random.Generator, c_out: int, c_in: int, k: int) -> np.ndarray:
    return (rng.standard_normal((c_out, c_in, k, k)) * np.sqrt(2.0 / (c_in * k * k))).astype(np.float32)


def _conv(g: _Graph, rng: np.random.Generator, scope: str, param: str, x: str, c_in: int, c_out: int, k: int,
          stride: int = 1) -> str:
    w = g.weight(f"{param}.weight", _kaiming(rng, c_out, c_in, k))
    return g.node(scope, "Conv", [x, w], dilations=[1, 1], group=1, kernel_shape=[k, k], pads=[k // 2] * 4,
                  strides=[stride, stride])


def _batch_norm(g: _Graph, rng: np.random.Generator, scope: str, param: str, x: str, c: int) -> str:
    """Inference-form BatchNormalization with the statistics of a trained layer: scale around 1, small biases,
    running means off zero and running variances between 0.5 and 2.5 (a kaiming conv of unit inputs gives
    variance about 2)."""
    names = [g.weight(f"{param}.weight", rng.uniform(0.6, 1.4, c).astype(np.float32)),
             g.weight(f"{param}.bias", (rng.standard_normal(c) * 0.1).astype(np.float32)),
             g.weight(f"{param}.running_mean", (rng.standard_normal(c) * 0.2).astype(np.float32)),
             g.weight(f"{param}.running_var", rng.uniform(0.5, 2.5, c).astype(np.float32))]
    return g.node(scope, "BatchNormalization", [x, *names], epsilon=1e-5)


def _basic_block(g: _Graph, rng: np.random.Generator, layer: str, x: str, c_in: int, c_out: int,
                 stride: int, index: int = 0) -> str:
    """torchvision BasicBlock: conv1-bn1-relu-conv2-bn2, + identity (or downsample.0/1 projection), relu."""
    scope, param = f"/{layer}/{layer}.{index}", f"{layer}.{index}"
    h = _conv(g, rng, f"{scope}/conv1", f"{param}.conv1", x, c_in, c_out, 3, stride)
    h = _batch_norm(g, rng, f"{scope}/bn1", f"{param}.bn1", h, c_out)
    h = g.node(f"{scope}/relu", "Relu", [h])
    h = _conv(g, rng, f"{scope}/conv2", f"{param}.conv2", h, c_out, c_out, 3)
    h = _batch_norm(g, rng, f"{scope}/bn2", f"{param}.bn2", h, c_out)
    shortcut = x
    if stride != 1 or c_in != c_out:
        shortcut = _conv(g, rng, f"{scope}/downsample/downsample.0", f"{param}.downsample.0", x, c_in, c_out, 1,
                         stride)
        shortcut = _batch_norm(g, rng, f"{scope}/downsample/downsample.1", f"{param}.downsample.1", shortcut,
                               c_out)
    h = g.node(scope, "Add", [h, shortcut])
    return g.node(f"{scope}/relu_1", "Relu", [h])


def resnet_small(seed: int = 10) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    g = _Graph()
    h = _conv(g, rng, "/conv1", "conv1", "image", 3, 16, 3)
    h = _batch_norm(g, rng, "/bn1", "bn1", h, 16)
    h = g.node("/relu", "Relu", [h])
    h = g.node("/maxpool", "MaxPool", [h], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               strides=[2, 2])                                                            # [1,16,16,16]
    h = _basic_block(g, rng, "layer1", h, 16, 16, 1)
    h = _basic_block(g, rng, "layer2", h, 16, 32, 2)                                      # [1,32,8,8]
    h = g.node("/avgpool", "GlobalAveragePool", [h])
    h = g.node("", "Flatten", [h], axis=1)
    bound = 1 / np.sqrt(32)
    w = g.weight("fc.weight", rng.uniform(-bound, bound, (10, 32)).astype(np.float32))
    b = g.weight("fc.bias", rng.uniform(-bound, bound, 10).astype(np.float32))
    g.node("/fc", "Gemm", [h, w, b], outputs=["logits"], alpha=1.0, beta=1.0, transB=1)
    return _model("resnet_small", g, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])])


def resnet18(seed: int = 12, image: int = 224) -> onnx.ModelProto:
    """torchvision's resnet18 (BasicBlock, [2, 2, 2, 2], 1000 classes) on a [1,3,image,image] input: for the
    benchmarks, not written to models/ (45 MB of weights)."""
    rng = np.random.default_rng(seed)
    g = _Graph()
    h = _conv(g, rng, "/conv1", "conv1", "image", 3, 64, 7, 2)
    h = g.node("/relu", "Relu", [_batch_norm(g, rng, "/bn1", "bn1", h, 64)])
    h = g.node("/maxpool", "MaxPool", [h], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               strides=[2, 2])
    c_in = 64
    for layer, c_out in enumerate((64, 128, 256, 512), start=1):
        for index in range(2):
            stride = 2 if index == 0 and layer > 1 else 1
            h = _basic_block(g, rng, f"layer{layer}", h, c_in, c_out, stride, index)
            c_in = c_out
    h = g.node("", "Flatten", [g.node("/avgpool", "GlobalAveragePool", [h])], axis=1)
    bound = 1 / np.sqrt(512)
    w = g.weight("fc.weight", rng.uniform(-bound, bound, (1000, 512)).astype(np.float32))
    b = g.weight("fc.bias", rng.uniform(-bound, bound, 1000).astype(np.float32))
    g.node("/fc", "Gemm", [h, w, b], outputs=["logits"], alpha=1.0, beta=1.0, transB=1)
    return _model("resnet18", g, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, image, image])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])])


def cnn_ops(seed: int = 11) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    g = _Graph()
    c = 8
    # depthwise 3x3, dilation 2 (a 5x5 footprint), pads 2: [1,8,16,16]
    w = g.weight("dw.weight", _kaiming(rng, c, 1, 3))
    b = g.weight("dw.bias", (rng.standard_normal(c) * 0.1).astype(np.float32))
    h = g.node("/dw", "Conv", ["x", w, b], dilations=[2, 2], group=c, kernel_shape=[3, 3], pads=[2, 2, 2, 2],
               strides=[1, 1])
    h = g.node("/relu6", "Clip", [h, g.weight("relu6.min", np.array(0.0, np.float32)),
                                  g.weight("relu6.max", np.array(6.0, np.float32))])
    pooled = g.node("/pool", "AveragePool", [h], ceil_mode=0, count_include_pad=0, kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1], strides=[1, 1])
    # reflect-pad then an unpadded 3x3 conv: [1,8,18,18] -> [1,8,16,16]
    h = g.node("/pad", "Pad", [pooled, g.weight("pad.pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))],
               mode="reflect")
    w = g.weight("conv.weight", _kaiming(rng, c, c, 3))
    b = g.weight("conv.bias", (rng.standard_normal(c) * 0.1).astype(np.float32))
    h = g.node("/conv", "Conv", [h, w, b], dilations=[1, 1], group=1, kernel_shape=[3, 3], pads=[0, 0, 0, 0],
               strides=[1, 1])
    h = g.node("/act", "LeakyRelu", [h], alpha=0.1)
    # ConvTranspose 4x4 stride 2 pads 1 doubles H and W: [1,4,32,32]; its weight is [C_in, C_out, k, k]
    w = (rng.standard_normal((c, 4, 4, 4)) * np.sqrt(2.0 / (c * 4))).astype(np.float32)
    up = g.node("/up", "ConvTranspose",
                [h, g.weight("up.weight", w), g.weight("up.bias", (rng.standard_normal(4) * 0.1).astype(np.float32))],
                dilations=[1, 1], group=1, kernel_shape=[4, 4], pads=[1, 1, 1, 1], strides=[2, 2])
    # nn.Upsample(scale_factor=2, mode="nearest"): [1,8,32,32]
    resized = g.node("/upsample", "Resize",
                     [pooled, "", g.weight("upsample.scales", np.array([1, 1, 2, 2], np.float32))],
                     coordinate_transformation_mode="asymmetric", mode="nearest", nearest_mode="floor")
    cat = g.node("", "Concat", [up, resized], axis=1)                                     # [1,12,32,32]
    first, second = g.node("", "Split", [cat, g.weight("split.sizes", np.array([2, 10], np.int64))], n_out=2,
                           axis=1)
    g.node("/gate", "HardSigmoid", [first], outputs=["gate"], alpha=1 / 6, beta=0.5)
    g.node("/swish", "HardSwish", [second], outputs=["swish"])
    g.node("/global_pool", "GlobalMaxPool", [cat], outputs=["pooled"])
    info = helper.make_tensor_value_info
    return _model("cnn_ops", g, [info("x", TensorProto.FLOAT, [1, c, 16, 16])],
                  [info("gate", TensorProto.FLOAT, [1, 2, 32, 32]), info("swish", TensorProto.FLOAT, [1, 10, 32, 32]),
                   info("pooled", TensorProto.FLOAT, [1, 12, 1, 1])])


def build() -> dict[str, onnx.ModelProto]:
    return {
        "resnet_small": resnet_small(),
        "cnn_ops": cnn_ops(),
    }


def main() -> None:
    save(build())


if __name__ == "__main__":
    main()
