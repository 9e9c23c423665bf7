"""Conv and ConvTranspose against onnxruntime: kernel sizes, strides, pads and auto_pad, dilations, groups
(depthwise included), bias or none, constant or run-time weights, 1-D / 2-D / 3-D, odd sizes."""

from __future__ import annotations

import pytest
from onnx import helper

from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.errors import UnsupportedError
from tests.compiler.one_node import F32, check, one_node, rng_weights, streams
from tests.conftest import make_model


def conv(op: str, n: int, c: int, spatial: list[int], m: int, kernel: list[int], group: int = 1,
         bias: bool = True, runtime_weights: bool = False, seed: int = 0, **attrs: object):
    w_shape = (m, c // group, *kernel) if op == "Conv" else (c, m // group, *kernel)
    weights = rng_weights(seed, w=w_shape, b=(m,))
    inputs = {"x": ([n, c, *spatial], F32)}
    if runtime_weights:
        inputs["w"] = (list(w_shape), F32)
        del weights["w"]
    if not bias:
        del weights["b"]
    order = ["x", "w"] + (["b"] if bias else [])
    return one_node(op, inputs, weights, order=order, group=group, **attrs)


CONV = {
    "3x3": dict(n=1, c=3, spatial=[7, 9], m=5, kernel=[3, 3]),
    "pads-batch2": dict(n=2, c=3, spatial=[7, 9], m=5, kernel=[3, 3], pads=[1, 1, 1, 1]),
    "stride2-asymmetric-pads": dict(n=1, c=4, spatial=[9, 7], m=6, kernel=[3, 2], strides=[2, 2], pads=[0, 1, 2, 0]),
    "dilated-grouped-runtime-w": dict(n=1, c=6, spatial=[11, 13], m=4, kernel=[3, 2], group=2, dilations=[2, 3],
                                      pads=[1, 2, 3, 0], runtime_weights=True),
    "same-upper": dict(n=1, c=2, spatial=[8, 9], m=3, kernel=[4, 3], strides=[3, 2], auto_pad="SAME_UPPER"),
    "same-lower": dict(n=2, c=2, spatial=[8, 9], m=3, kernel=[4, 3], strides=[3, 2], auto_pad="SAME_LOWER"),
    "valid": dict(n=1, c=3, spatial=[7, 9], m=2, kernel=[2, 4], strides=[2, 3], auto_pad="VALID"),
    "depthwise-130": dict(n=2, c=130, spatial=[7, 9], m=130, kernel=[3, 3], group=130, pads=[1, 2, 0, 1],
                          strides=[2, 1]),
    "depthwise-multiplier": dict(n=1, c=4, spatial=[7, 9], m=8, kernel=[3, 3], group=4, pads=[1, 1, 1, 1],
                                 runtime_weights=True),
    "groups-across-tiles": dict(n=1, c=150, spatial=[5, 6], m=60, kernel=[3, 3], group=3, pads=[1, 1, 1, 1]),
    # row phases (lower/conv.py packed_taps): an image stem, odd sizes, a stride past the kernel, batch
    "stem-7x7-stride2": dict(n=1, c=3, spatial=[33, 30], m=8, kernel=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3]),
    "stem-stride3-batch2": dict(n=2, c=3, spatial=[17, 16], m=5, kernel=[5, 3], strides=[3, 1], pads=[1, 1, 2, 0]),
    "stride-past-kernel": dict(n=1, c=3, spatial=[13, 11], m=4, kernel=[2, 3], strides=[4, 2], pads=[1, 0, 0, 1]),
    # taps packed in pairs over a hidden layer's channels (fp32: lower/conv.py _packing_pays), and in threes
    "packed-64-channels": dict(n=1, c=64, spatial=[12, 10], m=16, kernel=[3, 3], pads=[1, 1, 1, 1]),
    "packed-40-channels-stride2": dict(n=1, c=40, spatial=[11, 9], m=8, kernel=[3, 3], strides=[2, 2],
                                       pads=[1, 1, 1, 1]),
    "1x1-130-channels": dict(n=2, c=130, spatial=[7, 9], m=130, kernel=[1, 1], bias=False),
    "1x1-stride2": dict(n=1, c=5, spatial=[7, 9], m=3, kernel=[1, 1], strides=[2, 2]),
    "kernel-larger-than-input": dict(n=1, c=2, spatial=[5, 4], m=3, kernel=[7, 9], pads=[3, 4, 3, 4]),
    "many-blocks": dict(n=1, c=3, spatial=[40, 50], m=200, kernel=[3, 3], pads=[1, 1, 1, 1],
                        runtime_weights=True),
    "1d": dict(n=2, c=5, spatial=[30], m=7, kernel=[4], strides=[3], pads=[2, 1], bias=False),
    "1d-long": dict(n=1, c=4, spatial=[1500], m=8, kernel=[5], dilations=[3], pads=[6, 6]),
    "3d": dict(n=2, c=4, spatial=[5, 6, 7], m=3, kernel=[2, 3, 2], pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 1]),
}

CONV_TRANSPOSE = {
    "stride2-output-padding": dict(n=2, c=4, spatial=[5, 6], m=6, kernel=[3, 3], strides=[2, 2],
                                   pads=[1, 0, 1, 1], output_padding=[1, 0]),
    "grouped-runtime-w": dict(n=1, c=4, spatial=[5, 6], m=6, kernel=[3, 3], group=2, strides=[2, 3],
                              runtime_weights=True),
    "1d-dilated": dict(n=1, c=4, spatial=[7], m=3, kernel=[5], dilations=[2], pads=[4, 3]),
    "output-shape": dict(n=1, c=3, spatial=[4, 5], m=2, kernel=[4, 3], strides=[2, 2], output_shape=[9, 10]),
    "same-upper": dict(n=1, c=2, spatial=[3, 4], m=2, kernel=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    "130-channels": dict(n=1, c=130, spatial=[4, 5], m=5, kernel=[3, 3], bias=False),
    "depthwise": dict(n=1, c=6, spatial=[4, 5], m=6, kernel=[2, 2], group=6, strides=[2, 2]),
    "3d": dict(n=1, c=2, spatial=[3, 4, 3], m=3, kernel=[2, 2, 3], strides=[2, 1, 2], pads=[0, 1, 1, 1, 0, 0]),
}


@pytest.mark.parametrize("case", CONV.values(), ids=CONV.keys())
def test_conv(tmp, case):
    check(conv("Conv", **case), tmp)


@pytest.mark.parametrize("case", CONV_TRANSPOSE.values(), ids=CONV_TRANSPOSE.keys())
def test_conv_transpose(tmp, case):
    check(conv("ConvTranspose", **case), tmp)


def test_conv_is_right_under_random_interleaving(tmp):
    """The window memset, its DMA and the matmuls reading it are ordered by semaphores alone."""
    model = conv("Conv", **CONV["depthwise-130"])
    for seed in range(2):
        check(model, tmp, policy="random", seed=seed)


def test_conv_runs_on_the_tensor_engine():
    """Matmuls on PE into PSUM, evacuation with the bias on ACT, the padding memset wherever the scheduler has
    room for it, and (rows of 9 are short: the shifted copies of the window are whole rows, lower/windows.py) a
    select per row edge that zeroes what each copy's run carried past it: no other work."""
    engines = streams(conv("Conv", **CONV["pads-batch2"]))
    assert set(engines["PE"]) == {"nc_matmul"}
    assert set(engines["ACT"]) == {"activation"}
    assert {op for e in ("DVE", "POOL") for op in engines.get(e, [])} == {"memset", "affine_select"}
    assert engines["POOL"].count("affine_select") == 2  # the first copy's first column, the last copy's last
    # one matmul per row of taps (few input channels: the taps of a row share the PE rows), both images in one bank
    assert len(engines["PE"]) == 3


def test_a_strided_stem_folds_its_row_phases_into_one_pass():
    """A 7x7 stride-2 convolution over RGB to 64 channels (too many for bands of rows to share the partitions):
    in fp32, where the matmuls (a quarter of the bf16 rate) take well over the window loads, both row phases share
    each pass: 4 matmuls per bank of outputs instead of 7; in bf16 the loads would lose more than the matmuls
    gain, and each kernel row is a pass (lower/conv.py packed_taps). Rows shorter than an efficient DMA piece (64
    fp32) take no phases: a phase's rows would load a piece each. Over 16 channels, bands are taken before
    phases (lower/banded_stem.py): in fp32 6 bands of a row share each of 21 passes over seven copies of the
    window; in bf16 the copies would load longer than the passes they save (stem_packing: 20.35 us packed, 11.47
    not), so one copy, its two row phases on partitions of their own: 4 x 7 passes a group of bands."""
    model = conv("Conv", n=1, c=3, spatial=[32, 256], m=64, kernel=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3])
    banks = 4  # 64 x 128 outputs of 64 channels, 512 to a bank
    assert len(streams(model)["PE"]) == 4 * banks
    assert len(streams(model, Options(auto_cast="matmult"))["PE"]) == 7 * banks
    banded = conv("Conv", n=1, c=3, spatial=[32, 256], m=16, kernel=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3])
    assert len(streams(banded)["PE"]) == 7 * 3
    assert len(streams(banded, Options(auto_cast="matmult"))["PE"]) == 4 * 7 * 3
    short = conv("Conv", n=1, c=3, spatial=[64, 64], m=64, kernel=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3])
    assert len(streams(short)["PE"]) == 7 * 2


def test_a_hidden_layer_packs_tap_pairs_in_fp32_only(tmp):
    """A 3x3 convolution over 64 channels with rows of 640 bytes: in fp32 a second copy of the window on partitions
    64..127, moved one column, lets a pass take two taps of a row (6 passes per bank, not 9); in bf16 the extra
    load is not worth it. (Over rows shorter than an efficient DMA piece the copies would be cut a piece per row:
    no packing there.)"""
    model = conv("Conv", n=1, c=64, spatial=[6, 160], m=64, kernel=[3, 3], pads=[1, 1, 1, 1])
    fp32, bf16 = len(streams(model)["PE"]), len(streams(model, Options(auto_cast="matmult"))["PE"])
    assert fp32 * 9 == bf16 * 6
    check(model, tmp)


@pytest.mark.parametrize("op, shape, kernel, message", [
    ("Conv", [1, 1, 2, 2, 2, 2], [1, 1, 1, 1], "1-D, 2-D and 3-D convolutions only"),
    ("Conv", [1, 1, 7000], [7000], "does not fit an SBUF tile"),
    ("ConvTranspose", [1, 1, 2, 2, 2, 2], [1, 1, 1, 1], "1-D, 2-D and 3-D convolutions only"),
])
def test_unsupported_convolutions_say_why(op, shape, kernel, message):
    model = conv(op, shape[0], shape[1], shape[2:], 1, kernel, bias=False)
    with pytest.raises(UnsupportedError, match=message):
        compile_model(model)


@pytest.mark.parametrize("policy", ["clock", "random"])
def test_blocks_of_rows_read_their_input_as_it_lies(tmp, policy):
    """A 3x3 convolution over 28 x 28 outputs (two blocks of rows, a bank each) after a Relu kept on chip: each
    block's window is its input rows as they lie (windows.tight_window), the taps adding only to the outputs whose
    input is inside the image, so no fill of padding and no copy from the Relu's result into a padded window.
    onnxruntime's result, under a random order of the engines too."""
    weights = rng_weights(7, w=(64, 64, 3, 3), b=(64,))
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, {"x": ([1, 64, 28, 28], F32)}, {"y": ([1, 64, 28, 28], F32)}, weights)
    streams = compile_model(model).cores[0]
    ops = [i.op for s in streams.values() for i in s.instructions]
    assert "memset" not in ops and "tensor_copy" not in ops
    check(model, tmp, policy=policy)
