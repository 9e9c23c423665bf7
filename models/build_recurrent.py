"""Build the example recurrent models in models/ in the form torch.onnx exports nn.LSTM and nn.GRU (seeded random
weights, no downloads).

    python models/build_recurrent.py       # writes models/lstm_tagger.onnx, models/gru_classifier.onnx

- lstm_tagger: token ids [2, 4] (batch first) -> Gather from an embedding table -> Transpose to time first ->
  a bidirectional LSTM (zero initial states as constants, as the exporter writes them) whose Y [T, 2, B, H] is
  transposed and reshaped to [T, B, 2H], as between stacked layers -> Transpose to batch first -> a MatMul + Add
  per token: a tagger's logits [2, 4, 6].
- gru_classifier: padded features [8, 3, 12] (time first) and their lengths (int32, the exporter's
  sequence_lens from a packed sequence) -> one forward GRU with linear_before_reset=1 (PyTorch's GRU), of which
  only Y_h is read -> Squeeze -> Gemm: a classifier's logits [3, 5].

Both are small on purpose: unrolled, every step is a handful of instructions, and the race sweep over models/
drops the waits of each one in turn.
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
                              producer_name="neuronx-cc-lite models/build_recurrent.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _uniform(rng: np.random.Generator, hidden: int, shape: tuple[int, ...]) -> np.ndarray:
    """PyTorch's initialisation of recurrent weights: uniform in +-1/sqrt(hidden)."""
    bound = 1 / np.sqrt(hidden)
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def lstm_tagger(batch: int = 2, steps: int = 4, vocab: int = 40, embed: int = 16, hidden: int = 20,
                tags: int = 6, layers: int = 1, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weights = {"embedding.weight": rng.standard_normal((vocab, embed)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["embedding.weight", "tokens"], ["embedded"], name="/embedding/Gather"),
             helper.make_node("Transpose", ["embedded"], ["x0"], name="/Transpose", perm=[1, 0, 2])]
    weights["h0"] = np.zeros((2, batch, hidden), np.float32)
    weights["c0"] = np.zeros((2, batch, hidden), np.float32)
    x, width = "x0", embed
    for layer in range(layers):
        p = f"/lstm/l{layer}"
        weights[f"{p}/W"] = _uniform(rng, hidden, (2, 4 * hidden, width))
        weights[f"{p}/R"] = _uniform(rng, hidden, (2, 4 * hidden, hidden))
        weights[f"{p}/B"] = _uniform(rng, hidden, (2, 8 * hidden))
        nodes += [
            helper.make_node("LSTM", [x, f"{p}/W", f"{p}/R", f"{p}/B", "", "h0", "c0"], [f"{p}/Y"], name=f"{p}/LSTM",
                             hidden_size=hidden, direction="bidirectional"),
            helper.make_node("Transpose", [f"{p}/Y"], [f"{p}/Yt"], name=f"{p}/Transpose", perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"{p}/Yt", "seq_shape"], [f"{p}/out"], name=f"{p}/Reshape"),
        ]
        x, width = f"{p}/out", 2 * hidden
    weights["seq_shape"] = np.array([steps, batch, 2 * hidden], np.int64)
    weights["fc.weight"] = _uniform(rng, width, (width, tags))
    weights["fc.bias"] = _uniform(rng, width, (tags,))
    nodes += [helper.make_node("Transpose", [x], ["batch_first"], name="/fc/Transpose", perm=[1, 0, 2]),
              helper.make_node("MatMul", ["batch_first", "fc.weight"], ["fc"], name="/fc/MatMul"),
              helper.make_node("Add", ["fc", "fc.bias"], ["logits"], name="/fc/Add")]
    return _model("lstm_tagger", nodes, [helper.make_tensor_value_info("tokens", TensorProto.INT64, [batch, steps])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, steps, tags])], weights)


def gru_classifier(batch: int = 3, steps: int = 8, features: int = 12, hidden: int = 24, classes: int = 5,
                   seed: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weights = {"/gru/W": _uniform(rng, hidden, (1, 3 * hidden, features)),
               "/gru/R": _uniform(rng, hidden, (1, 3 * hidden, hidden)),
               "/gru/B": _uniform(rng, hidden, (1, 6 * hidden)),
               "axes": np.array([0], np.int64),
               "fc.weight": _uniform(rng, hidden, (classes, hidden)),
               "fc.bias": _uniform(rng, hidden, (classes,))}
    nodes = [helper.make_node("GRU", ["features", "/gru/W", "/gru/R", "/gru/B", "lengths"], ["", "h_n"],
                              name="/gru/GRU", hidden_size=hidden, linear_before_reset=1),
             helper.make_node("Squeeze", ["h_n", "axes"], ["last"], name="/Squeeze"),
             helper.make_node("Gemm", ["last", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm", transB=1)]
    inputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, [steps, batch, features]),
              helper.make_tensor_value_info("lengths", TensorProto.INT32, [batch])]
    return _model("gru_classifier", nodes, inputs,
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])], weights)


def build() -> dict[str, onnx.ModelProto]:
    return {"lstm_tagger": lstm_tagger(), "gru_classifier": gru_classifier()}


def main() -> None:
    save(build())


if __name__ == "__main__":
    main()
