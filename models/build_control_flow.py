"""Build the control-flow example in models/ (seeded random weights, no downloads).

    python models/build_control_flow.py    # writes models/refine_loop.onnx

- refine_loop: what exporters write for a model with a shape check and a fixed-step refinement. An If on the
  feature width (Shape -> Gather -> Greater, as torch.onnx writes `if x.shape[1] > 8`) picks a projection branch
  (MatMul + Add) over a pass-through; a Loop of 4 steps (its trip count an initializer) then refines a state,
  h = 0.5 h + 0.5 tanh(h W + p), its body reading W and p from outside, and returns the last state and each
  step's row means as a scan output. The compiler folds the If and unrolls the Loop (inline-control-flow).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import save

OPSET = 17
BATCH, WIDTH, STEPS = 2, 16, 4
F = TensorProto.FLOAT


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"/{name}/Constant", value=numpy_helper.from_array(value))


def refine_loop(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    bound = 1 / np.sqrt(WIDTH)
    weights = {"proj.weight": rng.uniform(-bound, bound, (WIDTH, WIDTH)).astype(np.float32),
               "proj.bias": rng.uniform(-bound, bound, WIDTH).astype(np.float32),
               "step.weight": rng.uniform(-bound, bound, (WIDTH, WIDTH)).astype(np.float32),
               "steps": np.array(STEPS, np.int64)}
    wide = helper.make_graph(
        [helper.make_node("MatMul", ["x", "proj.weight"], ["xw"], name="/proj/MatMul"),
         helper.make_node("Add", ["xw", "proj.bias"], ["projected"], name="/proj/Add")],
        "wide", [], [helper.make_tensor_value_info("projected", F, [BATCH, WIDTH])])
    narrow = helper.make_graph([helper.make_node("Identity", ["x"], ["passed"], name="/pass/Identity")],
                               "narrow", [], [helper.make_tensor_value_info("passed", F, [BATCH, WIDTH])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="/step/cond"),
         helper.make_node("MatMul", ["h_in", "step.weight"], ["hw"], name="/step/MatMul"),
         helper.make_node("Add", ["hw", "p"], ["pre"], name="/step/Add"),
         helper.make_node("Tanh", ["pre"], ["act"], name="/step/Tanh"),
         _const("half", np.array(0.5, np.float32)),
         helper.make_node("Add", ["h_in", "act"], ["sum"], name="/step/Add_1"),
         helper.make_node("Mul", ["sum", "half"], ["h_out"], name="/step/Mul"),
         helper.make_node("ReduceMean", ["h_out"], ["mean"], name="/step/ReduceMean", axes=[1], keepdims=0)],
        "step",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, [BATCH, WIDTH])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", F, [BATCH, WIDTH]),
         helper.make_tensor_value_info("mean", F, [BATCH])])
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="/Shape"),
             _const("one", np.array(1, np.int64)),
             helper.make_node("Gather", ["shape", "one"], ["width"], name="/Gather", axis=0),
             _const("eight", np.array(8, np.int64)),
             helper.make_node("Greater", ["width", "eight"], ["is_wide"], name="/Greater"),
             helper.make_node("If", ["is_wide"], ["p"], name="/If", then_branch=wide, else_branch=narrow),
             helper.make_node("Loop", ["steps", "", "x"], ["state", "means"], name="/Loop", body=body)]
    graph = helper.make_graph(nodes, "refine_loop", [helper.make_tensor_value_info("x", F, [BATCH, WIDTH])],
                              [helper.make_tensor_value_info("state", F, [BATCH, WIDTH]),
                               helper.make_tensor_value_info("means", F, [STEPS, BATCH])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="neuronx-cc-lite models/build_control_flow.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def build() -> dict[str, onnx.ModelProto]:
    return {"refine_loop": refine_loop()}


def main() -> None:
    save(build())


if __name__ == "__main__":
    main()
