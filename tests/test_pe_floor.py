"""benchmarks/pe_floor.py, the floor under a batch-1 convolution network's latency that the README's account of
MobileNetV3 rests on: its arithmetic on a model small enough to count by hand."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from benchmarks.pe_floor import SE_STEPS, floor
from isa.target import get_target
from tests.conftest import make_model


def test_the_floor_counts_a_depthwise_convolution_and_a_squeeze_as_written(tmp):
    """A 3x3 depthwise convolution over 128 channels at 8x8 (73,728 multiply-adds, 576 a partition) then a
    squeeze-and-excitation gate (a mean, two 1x1 convolutions, HardSigmoid, the Mul)."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((128, 1, 3, 3)).astype(np.float32),
               "w1": rng.standard_normal((32, 128, 1, 1)).astype(np.float32),
               "w2": rng.standard_normal((128, 32, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["d"], group=128, pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["d"], ["p"]),
             helper.make_node("Conv", ["p", "w1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["e"]),
             helper.make_node("HardSigmoid", ["e"], ["g"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["d", "g"], ["y"])]
    path = os.path.join(tmp, "m.onnx")
    onnx.save(make_model(nodes, {"x": ([1, 128, 8, 8], TensorProto.FLOAT)}, {"y": ([1, 128, 8, 8], TensorProto.FLOAT)},
                         weights), path)
    target = get_target("trn1")
    f = floor(path, "trn1")
    assert f["depthwise_diagonal_us"] == pytest.approx(9 * 64 / target.pe_ghz / 1000)  # a tile, 9 taps, 64 columns
    assert f["depthwise_bf16_us"] == pytest.approx(576 / (target.pe_ghz + target.dve_ghz * target.dve_lanes_16bit)
                                                   / 1000)
    # the squeeze (128 -> 32) and the excitation (32 -> 128) of one row: min(64 x output blocks, outputs) cycles
    assert f["other_us"] == pytest.approx((32 + 64) / target.pe_ghz / 1000)
    assert f["squeezes"] == 1 and f["se_chain_us"] == pytest.approx(SE_STEPS * f["step_ns"] / 1000)
    assert 0.1 < f["step_ns"] / 1000 < 0.5  # a dependent one-element instruction and a hand-off: ~0.2 us
