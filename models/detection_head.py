"""An SSDlite-style detector as torchvision's exports write it, built in code (seeded random weights):

    python models/detection_head.py det.onnx

A small convolutional backbone, a box head and a class head over anchors (the chip's part), then the
post-processing whose output sizes depend on the scores (the host's part, compiled with `--fallback host`; it is
not among the models of models/ that compile whole, so it is written where it is asked for):

    scores = Sigmoid(class head)                       [1, C, N]   (C classes, N anchors)
    boxes  = anchor corners + deltas                   [1, N, 4]   (y1, x1, y2, x2)
    best   = ReduceMax(scores, classes); TopK(best, K0) -> the K0 best anchors     (static k: the chip's TopK)
    keep   = NonZero(best > threshold)                 how many pass depends on the scores
    picked = NonMaxSuppression(boxes, scores, ...)     [S, 3]
    TopK(picked scores, min(S, 10))                    k depends on S
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
SIZE, CLASSES, ANCHORS = 16, 3, 2  # image SIZE x SIZE; the feature map is SIZE / 4 square, ANCHORS per cell


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}/Constant", value=numpy_helper.from_array(value))


def detection_head(seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    cells = SIZE // 4
    n = cells * cells * ANCHORS
    grid = (np.arange(cells, dtype=np.float32) + 0.5) / cells
    cy, cx = np.meshgrid(grid, grid, indexing="ij")
    sizes = np.array([0.2, 0.4], np.float32)[:ANCHORS]
    centres = np.stack([cy, cx], -1).reshape(cells * cells, 1, 2).repeat(ANCHORS, 1).reshape(n, 2)
    half = np.tile(sizes, cells * cells).reshape(n, 1).repeat(2, 1) / 2
    weights = {
        "conv1.w": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        "conv1.b": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "conv2.w": (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32),
        "conv2.b": (rng.standard_normal(16) * 0.1).astype(np.float32),
        "box.w": (rng.standard_normal((ANCHORS * 4, 16, 3, 3)) * 0.05).astype(np.float32),
        "box.b": np.zeros(ANCHORS * 4, np.float32),
        "cls.w": (rng.standard_normal((ANCHORS * CLASSES, 16, 3, 3)) * 0.3).astype(np.float32),
        "cls.b": (rng.standard_normal(ANCHORS * CLASSES) * 0.5 - 1.0).astype(np.float32),
        "anchors.lo": (centres - half).reshape(1, n, 2).astype(np.float32),
        "anchors.hi": (centres + half).reshape(1, n, 2).astype(np.float32),
    }
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], name="/backbone/conv1", strides=[2, 2],
                         **conv),
        helper.make_node("Relu", ["c1"], ["r1"], name="/backbone/relu1"),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], name="/backbone/conv2", strides=[2, 2],
                         **conv),
        helper.make_node("Relu", ["c2"], ["features"], name="/backbone/relu2"),
        # heads: [1, A*k, h, w] -> [1, h, w, A*k] -> [1, N, k]
        helper.make_node("Conv", ["features", "box.w", "box.b"], ["box_map"], name="/head/box", **conv),
        helper.make_node("Transpose", ["box_map"], ["box_nhwc"], name="/head/box_t", perm=[0, 2, 3, 1]),
        _const("box_shape", np.array([1, n, 4], np.int64)),
        helper.make_node("Reshape", ["box_nhwc", "box_shape"], ["deltas"], name="/head/box_reshape"),
        helper.make_node("Conv", ["features", "cls.w", "cls.b"], ["cls_map"], name="/head/cls", **conv),
        helper.make_node("Transpose", ["cls_map"], ["cls_nhwc"], name="/head/cls_t", perm=[0, 2, 3, 1]),
        _const("cls_shape", np.array([1, n, CLASSES], np.int64)),
        helper.make_node("Reshape", ["cls_nhwc", "cls_shape"], ["logits"], name="/head/cls_reshape"),
        helper.make_node("Sigmoid", ["logits"], ["probs"], name="/head/sigmoid"),
        helper.make_node("Transpose", ["probs"], ["scores"], name="/head/scores", perm=[0, 2, 1]),
        # decode: corners = anchor corners + deltas (y1, x1 | y2, x2)
        _const("split_sizes", np.array([2, 2], np.int64)),
        helper.make_node("Split", ["deltas", "split_sizes"], ["d_lo", "d_hi"], name="/decode/split", axis=2),
        helper.make_node("Add", ["anchors.lo", "d_lo"], ["lo"], name="/decode/lo"),
        helper.make_node("Add", ["anchors.hi", "d_hi"], ["hi"], name="/decode/hi"),
        helper.make_node("Concat", ["lo", "hi"], ["boxes"], name="/decode/boxes", axis=2),
        # the K0 best anchors by their best class (a static k: the chip's TopK)
        helper.make_node("ReduceMax", ["probs"], ["best"], name="/post/best", axes=[2], keepdims=0),
        _const("k0", np.array([8], np.int64)),
        helper.make_node("TopK", ["best", "k0"], ["top_scores", "top_anchors"], name="/post/topk_anchors", axis=1),
        # how many anchors pass the threshold: NonZero's output size depends on the scores
        _const("threshold", np.array(0.3, np.float32)),
        helper.make_node("Greater", ["best", "threshold"], ["passing"], name="/post/passing"),
        helper.make_node("NonZero", ["passing"], ["passing_at"], name="/post/nonzero"),
        # non-maximum suppression per class
        _const("max_per_class", np.array([5], np.int64)),
        _const("iou", np.array([0.5], np.float32)),
        _const("min_score", np.array([0.3], np.float32)),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_per_class", "iou", "min_score"],
                         ["selected"], name="/post/nms"),
        # the scores of the picked boxes, and the best ten of them: TopK's k depends on how many NMS kept
        helper.make_node("GatherND", ["scores", "selected"], ["picked_scores"], name="/post/picked_scores"),
        _const("column2", np.array([2], np.int64)),
        helper.make_node("Gather", ["selected", "column2"], ["picked_col"], name="/post/picked_col", axis=1),
        helper.make_node("Squeeze", ["picked_col", "column2_axis"], ["picked_anchor"], name="/post/squeeze"),
        _const("column2_axis", np.array([1], np.int64)),
        helper.make_node("Shape", ["picked_scores"], ["picked_count"], name="/post/count"),
        _const("ten", np.array([10], np.int64)),
        helper.make_node("Min", ["picked_count", "ten"], ["k"], name="/post/k"),
        helper.make_node("TopK", ["picked_scores", "k"], ["det_scores", "det_order"], name="/post/topk_dets",
                         axis=0),
        helper.make_node("Gather", ["picked_anchor", "det_order"], ["det_anchor"], name="/post/det_anchor",
                         axis=0),
        _const("zero", np.array(0, np.int64)),
        helper.make_node("Gather", ["boxes", "zero"], ["boxes0"], name="/post/boxes0", axis=0),
        helper.make_node("Gather", ["boxes0", "det_anchor"], ["det_boxes"], name="/post/det_boxes", axis=0),
    ]
    # Constants first, so that every node reads what is defined before it
    nodes = [n for n in nodes if n.op_type == "Constant"] + [n for n in nodes if n.op_type != "Constant"]
    graph = helper.make_graph(
        nodes, "ssdlite_head", [helper.make_tensor_value_info("image", F32, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("boxes", F32, [1, n, 4]),
         helper.make_tensor_value_info("top_scores", F32, [1, 8]),
         helper.make_tensor_value_info("top_anchors", I64, [1, 8]),
         helper.make_tensor_value_info("passing_at", I64, [2, "passing"]),
         helper.make_tensor_value_info("det_scores", F32, ["detections"]),
         helper.make_tensor_value_info("det_boxes", F32, ["detections", 4])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python models/detection_head.py OUTPUT.onnx")
    onnx.save(detection_head(), sys.argv[1])
    print(f"wrote {sys.argv[1]}")


if __name__ == "__main__":
    main()
