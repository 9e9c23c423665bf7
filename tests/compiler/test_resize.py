"""Resize against onnxruntime: nearest (every nearest_mode and coordinate_transformation_mode), linear and cubic
(antialias, exclude_outside), from scales or sizes, the axes and keep_aspect_ratio_policy of opset 18, and
tf_crop_and_resize with its roi and extrapolation value."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from runtime.profile import small_pieces_by_node
from tests.compiler.one_node import F32, check, one_node, streams
from tests.conftest import make_model


def resize(shape: list[int], scales: list[float] | None = None, sizes: list[int] | None = None,
           dtype: int = F32, roi: list[float] | None = None, **attrs: object):
    weights, order = {}, ["x", "", "", ""]
    if roi is not None:
        weights["roi"] = np.array(roi, np.float32)
        order[1] = "roi"
    if scales is not None:
        weights["scales"] = np.array(scales, np.float32)
        order[2] = "scales"
    if sizes is not None:
        weights["sizes"] = np.array(sizes, np.int64)
        order[3] = "sizes"
    while not order[-1]:
        order.pop()
    return one_node("Resize", {"x": (shape, dtype)}, weights, order=order, opset=19, **attrs)


NEAREST = {
    "upsample-2": dict(scales=[1, 1, 2, 2]),
    "asymmetric-floor": dict(scales=[1, 1, 2, 3], coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    "downsample": dict(scales=[1, 1, 0.6, 0.5]),
    "align-corners-prefer-ceil": dict(sizes=[2, 3, 11, 5], coordinate_transformation_mode="align_corners",
                                      nearest_mode="round_prefer_ceil"),
    "pytorch-half-pixel-ceil": dict(sizes=[2, 3, 11, 5], coordinate_transformation_mode="pytorch_half_pixel",
                                    nearest_mode="ceil"),
    "half-pixel-symmetric": dict(scales=[1, 1, 1.7, 0.6], coordinate_transformation_mode="half_pixel_symmetric"),
    "axes-not-larger": dict(sizes=[5, 6], axes=[3, 2], keep_aspect_ratio_policy="not_larger"),
    "batch-axis": dict(scales=[2, 1, 1, 1]),
    "tf-crop-and-resize": dict(sizes=[2, 3, 5, 6], roi=[0, 0, 0.2, -0.3, 1, 1, 0.9, 1.4],
                               coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-7.0),
}

INTERPOLATING = {
    "linear-upsample": dict(scales=[1, 1, 2, 2], mode="linear"),
    "linear-align-corners": dict(scales=[1, 1, 2, 2], mode="linear", coordinate_transformation_mode="align_corners"),
    "linear-asymmetric": dict(scales=[1, 1, 2, 2], mode="linear", coordinate_transformation_mode="asymmetric"),
    "linear-pytorch-half-pixel": dict(sizes=[2, 3, 13, 1], mode="linear",
                                      coordinate_transformation_mode="pytorch_half_pixel"),
    "linear-half-pixel-symmetric": dict(scales=[1, 1, 0.6, 1.7], mode="linear",
                                        coordinate_transformation_mode="half_pixel_symmetric"),
    "linear-width-only": dict(scales=[1, 1, 1, 2], mode="linear"),
    "linear-height-only": dict(scales=[1, 1, 3, 1], mode="linear"),
    "linear-not-smaller": dict(sizes=[5, 6], axes=[3, 2], mode="linear", keep_aspect_ratio_policy="not_smaller"),
    "linear-antialias": dict(scales=[1, 1, 0.5, 0.4], mode="linear", antialias=1),
    "cubic": dict(scales=[1, 1, 2, 2], mode="cubic"),
    "cubic-exclude-outside": dict(scales=[1, 1, 0.5, 0.7], mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5),
    "cubic-antialias": dict(scales=[1, 1, 0.5, 0.4], mode="cubic", antialias=1),
    "linear-tf-crop-and-resize": dict(sizes=[5, 7], axes=[2, 3], roi=[0.1, -0.2, 0.8, 1.3], mode="linear",
                                      coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=5.0),
}


@pytest.mark.parametrize("case", NEAREST.values(), ids=NEAREST.keys())
def test_nearest(tmp, case):
    check(resize([2, 3, 7, 9], mode="nearest", **case), tmp)


def test_nearest_rows_past_one_tile(tmp):
    """130 channels: the on-chip copy loads and stores its rows in two tiles of partitions."""
    check(resize([2, 130, 5, 6], mode="nearest", scales=[1, 1, 2, 1.5]), tmp)


def test_nearest_of_bytes(tmp):
    check(resize([1, 3, 5, 4], [1, 1, 2, 3], dtype=TensorProto.UINT8), tmp)


@pytest.mark.parametrize("case", INTERPOLATING.values(), ids=INTERPOLATING.keys())
def test_interpolating(tmp, case):
    check(resize([2, 3, 16, 18], **case), tmp)


@pytest.mark.parametrize("shape, scales", [
    ([1, 130, 20, 30], [1, 1, 0.5, 0.5]),  # images packed several to a tile
    ([1, 2, 200, 150], [1, 1, 1.5, 2.0]),  # rows and columns past one tile, two PSUM banks of columns
    ([2, 3, 30], [1, 1, 2.5]),  # rank 3: the width only
], ids=["130-channels", "large", "1d"])
def test_linear_sizes(tmp, shape, scales):
    check(resize(shape, scales, mode="linear"), tmp)


def test_resize_engines():
    """Linear: two matmuls on PE, evacuated by ACT. Nearest: each image's rows loaded whole, replicated by on-chip
    copies (stride 0 along the repeats), stored whole: no DMA piece under 512 bytes (HBM to HBM, an upscale by 2
    moved two elements a piece)."""
    linear = streams(resize([1, 3, 7, 9], [1, 1, 2, 2], mode="linear"))
    assert set(linear["PE"]) == {"nc_matmul"} and set(linear["ACT"]) == {"activation"}
    nearest = resize([1, 3, 20, 30], [1, 1, 2, 2])
    engines = streams(nearest)
    assert "PE" not in engines and {op for name, ops in engines.items() if name != "DMA" for op in ops} == {"tensor_copy"}
    assert small_pieces_by_node(compile_model(nearest)) == {}


@pytest.mark.parametrize("model, message", [
    (resize([1, 3, 4, 4], [1, 1, 2, 2], dtype=TensorProto.UINT8, mode="linear"), "floating point only"),
    (resize([1, 3, 4, 4], [1, 2, 1, 1], mode="linear"), "an axis other than the last two"),
    (make_model([helper.make_node("Resize", ["x", "", "scales"], ["y"])],
                {"x": ([1, 1, 2, 2], F32), "scales": ([4], F32)}, {"y": ([1, 1, 4, 4], F32)}, opset=19),
     "input 2 \\('scales'\\) must be a compile-time constant"),
])
def test_unsupported_resizes_say_why(model, message):
    with pytest.raises(UnsupportedError, match=message):
        compile_model(model)
