"""Build the example MLPs in models/ (seeded random weights, no downloads).

    python models/build_mlps.py            # writes models/*.onnx

- mlp_small: Flatten of a [2,1,8,8] image, Gemm 64->32, Relu, Gemm 32->10, the form torch.onnx gives nn.Linear.
- mlp_wide: a hidden layer of 640 (over one PSUM bank of 512 columns), batch 4.
- mlp_odd: sizes that are not multiples of 128 (100 -> 300 -> 129 -> 7, batch 3), written as MatMul + Add, with
  input normalisation (Sub, Div by broadcast constants), Sigmoid, Tanh and a final Mul.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import save

OPSET = 17


def _model(name: str, nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="neuronx-cc-lite models/build_mlps.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _linear(rng: np.random.Generator, fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
    bound = 1 / np.sqrt(fan_in)
    w = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
    b = rng.uniform(-bound, bound, (fan_out,)).astype(np.float32)
    return w, b


def gemm_mlp(name: str, batch: int, sizes: list[int], image: tuple[int, ...] | None = None,
             seed: int = 0) -> onnx.ModelProto:
    """Linear layers as Gemm(transB=1) with Relu between them; optionally Flatten an image input first."""
    rng = np.random.default_rng(seed)
    weights, nodes = {}, []
    x = "input"
    in_shape = [batch, *image] if image else [batch, sizes[0]]
    if image:
        nodes.append(helper.make_node("Flatten", [x], ["flat"], name="/flatten/Flatten", axis=1))
        x = "flat"
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        w, b = _linear(rng, fan_in, fan_out)
        weights[f"fc{i}.weight"], weights[f"fc{i}.bias"] = w, b
        y = "logits" if i == len(sizes) - 2 else f"fc{i}"
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [y], name=f"/fc{i}/Gemm",
                                      transB=1))
        if y != "logits":
            nodes.append(helper.make_node("Relu", [y], [f"relu{i}"], name=f"/relu{i}/Relu"))
            y = f"relu{i}"
        x = y
    return _model(name, nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, in_shape)],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, sizes[-1]])], weights)


def matmul_mlp(name: str, batch: int, sizes: list[int], seed: int = 1) -> onnx.ModelProto:
    """MatMul + Add layers with Sigmoid and Tanh, after a normalisation of the input by broadcast constants."""
    rng = np.random.default_rng(seed)
    weights = {"mean": rng.standard_normal(sizes[0]).astype(np.float32) * 0.1,
               "std": (1 + rng.random(sizes[0])).astype(np.float32),
               "out_scale": np.array(0.5, dtype=np.float32)}
    nodes = [helper.make_node("Sub", ["x", "mean"], ["centered"], name="/norm/Sub"),
             helper.make_node("Div", ["centered", "std"], ["h"], name="/norm/Div")]
    x = "h"
    acts = ["Sigmoid", "Tanh"]
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        w, b = _linear(rng, fan_in, fan_out)
        weights[f"l{i}.w"], weights[f"l{i}.b"] = w.T.copy(), b
        nodes.append(helper.make_node("MatMul", [x, f"l{i}.w"], [f"mm{i}"], name=f"/l{i}/MatMul"))
        nodes.append(helper.make_node("Add", [f"mm{i}", f"l{i}.b"], [f"lin{i}"], name=f"/l{i}/Add"))
        x = f"lin{i}"
        if i < len(sizes) - 2:
            act = acts[i % len(acts)]
            nodes.append(helper.make_node(act, [x], [f"act{i}"], name=f"/act{i}/{act}"))
            x = f"act{i}"
    nodes.append(helper.make_node("Mul", [x, "out_scale"], ["y"], name="/out/Mul"))
    return _model(name, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sizes[0]])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, sizes[-1]])], weights)


def build() -> dict[str, onnx.ModelProto]:
    return {
        "mlp_small": gemm_mlp("mlp_small", 2, [64, 32, 10], image=(1, 8, 8)),
        "mlp_wide": gemm_mlp("mlp_wide", 4, [256, 640, 10], seed=2),
        "mlp_odd": matmul_mlp("mlp_odd", 3, [100, 300, 129, 7]),
    }


def main() -> None:
    save(build())


if __name__ == "__main__":
    main()
