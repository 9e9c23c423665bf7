"""RoiAlign: a Faster R-CNN-style box head (expand-roi-align: two batched matmuls by interpolation matrices)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime
from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.errors import UnsupportedError
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.compiler.one_node import rng_weights, streams
from tests.conftest import assert_close, make_model

F, I64 = TensorProto.FLOAT, TensorProto.INT64
# regions inside, across the border, past it (outside [-1, extent] on the left), and thinner than a pixel
ROIS = np.array([[0, 0, 19, 15], [2, 3, 10, 9], [-4, -3, 5, 4], [15, 10, 25, 20], [3, 3, 3.5, 3.2], [1, 1, 18, 2]],
                np.float32)


def box_head(batch: int = 2, opset: int = 17, **attrs: object) -> onnx.ModelProto:
    """Conv backbone features [batch, 8, 8, 10] -> RoiAlign 3x4 per region -> Flatten -> Gemm -> Relu -> Gemm:
    class logits per region."""
    roi = dict(output_height=3, output_width=4, sampling_ratio=2, spatial_scale=0.5)
    roi.update(attrs)
    weights = rng_weights(0, conv=(8, 3, 3, 3), fc1=(8 * 12, 32), fc2=(32, 5))
    nodes = [helper.make_node("Conv", ["image", "conv"], ["features"], name="backbone", pads=[1] * 4),
             helper.make_node("RoiAlign", ["features", "rois", "batch_index"], ["pooled"], name="roi_align", **roi),
             helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "fc1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("MatMul", ["hr", "fc2"], ["logits"], name="fc2")]
    return make_model(nodes, {"image": ([batch, 3, 8, 10], F), "rois": ([len(ROIS), 4], F),
                              "batch_index": ([len(ROIS)], I64)}, {"logits": ([len(ROIS), 5], F)}, weights, opset)


def _feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"image": rng.standard_normal((batch, 3, 8, 10)).astype(np.float32), "rois": ROIS,
            "batch_index": rng.integers(0, batch, len(ROIS)).astype(np.int64)}


@pytest.mark.parametrize("batch, opset, attrs", [
    (2, 17, {}),                                                    # half_pixel, the opset-16 default
    (1, 17, {"coordinate_transformation_mode": "output_half_pixel", "sampling_ratio": 3}),
    (2, 10, {"sampling_ratio": 1}),                                 # RoiAlign-10: output_half_pixel, no attribute
], ids=["half_pixel", "output_half_pixel_one_image", "opset10"])
def test_a_box_head_matches_onnxruntime(batch, opset, attrs):
    model = box_head(batch, opset, **attrs)
    compiled = runtime.load(compile_model(model))
    for seed in range(2):
        feeds = _feeds(batch, seed)
        assert_close(compiled.run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-4)


def test_the_sampling_runs_as_matmuls_on_pe():
    model = box_head()
    model.graph.node.pop(); model.graph.node.pop(); model.graph.node.pop(); model.graph.node.pop()
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("pooled", F, [len(ROIS), 8, 3, 4]))
    assert streams(model)["PE"].count("nc_matmul") >= 2


def test_max_mode_and_a_grid_per_region_are_named_or_run_on_the_host():
    for attrs, why in (({"mode": "max"}, "RoiAlign in max mode"), ({"sampling_ratio": 0}, "RoiAlign with sampling_ratio 0")):
        model = box_head(**attrs)
        with pytest.raises(UnsupportedError, match=f"node 'roi_align' \\(RoiAlign\\): {why}"):
            compile_model(model)
        b = compile_model(model, Options(fallback="host"))
        assert [p.kind for p in b.parts] == ["chip", "host", "chip"]
        feeds = _feeds(2)
        assert_close(runtime.load(b).run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-4)
