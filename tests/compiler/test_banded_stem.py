"""A packed stem over few output channels with bands of output rows on the partitions (lower/banded_stem.py):
against onnxruntime (exact to bf16 operands, as auto-cast rounds them), with a short last group of bands, a band
at each padded edge, batches, a residual, and HardSwish reading the bank."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from isa.operand import Mem

from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
from tests.compiler.one_node import bf16_operands, streams
from tests.compiler.test_conv import conv
from tests.conftest import assert_close, compile_to_model, make_model

BF16 = Options(auto_cast="matmult", auto_cast_type="bf16")

STEMS = {  # (case, partitions a matmul contracts over: phases x shifts x channels x bands, outputs on: channels x
    # bands)
    # MobileNetV3's stem at a smaller size: 12 x 80 outputs, 6 bands of 2 rows (rows of 160 fp32: 640 bytes), its
    # taps not packed (stem_packing: three copies of the window, a transfer each per channel and phase, would wait
    # longer for the DMA latency than the passes they save take: 6.80 us packed, 5.71 not), both row phases on
    # partitions of their own (stem_phases): 6 passes, not 9
    "3x3-stride2": (dict(n=1, c=3, spatial=[24, 160], m=16, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                    36, 96),
    # an odd number of input rows: the last band's phase 1 ends a row before its phase 0 (its last row a fill)
    "3x3-stride2-odd-rows": (dict(n=1, c=3, spatial=[63, 226], m=16, kernel=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]), 48, 128),
    # 13 x 150 outputs, two images: 4 bands of a row (32 output channels), the last group of one band (unpacked:
    # 11.79 us, packed 13.12)
    "odd-rows-batch2": (dict(n=2, c=3, spatial=[13, 150], m=32, kernel=[3, 3], pads=[1, 1, 1, 1]), 12, 128),
    # a 5x5 stem without bias, padding 2 (two bands at each edge read padding rows)
    "5x5-no-bias": (dict(n=1, c=2, spatial=[20, 140], m=12, kernel=[5, 5], pads=[2, 2, 2, 2], bias=False),
                    100, 120),
}


def _exact_to_bf16_operands(model, tmp, rtol=1e-5):
    compiled = compile_to_model(model, tmp, BF16)
    inputs = seeded_inputs(compiled.inputs)
    assert_close(compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs), rtol=rtol)


@pytest.mark.parametrize("case, contracted, outputs", STEMS.values(), ids=STEMS.keys())
def test_banded_stem(tmp, case, contracted, outputs):
    model = conv("Conv", **case)
    pe = compile_model(model, BF16).cores[0]["PE"].instructions
    assert {(i.args["moving"].num_partitions, i.args["dst"].num_partitions) for i in pe} == {(contracted, outputs)}
    _exact_to_bf16_operands(model, tmp)


def test_a_banded_stem_takes_each_tap_for_all_its_bands():
    """MobileNetV3's stem shape: 112 x 112 outputs over 16 channels, 8 bands of 2 rows a group of matmuls: 7
    groups over 1,792 columns, where 28 banks of 4 rows on 16 partitions took 3 passes each (taps packed: three
    copies of the window each) over 12,544. Each band's rows in their two phases (stride 2) on 24 partitions
    each: a pass reads kernel rows 0 and 1 of a column, another row 2, 6 passes a group where they were 9."""
    model = conv("Conv", n=1, c=3, spatial=[224, 224], m=16, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    pe = compile_model(model, BF16).cores[0]["PE"].instructions
    assert len(pe) == 7 * 6
    assert {(i.args["moving"].num_partitions, i.args["dst"].num_partitions) for i in pe} == {(48, 128)}


def test_a_stem_of_four_bands_loads_one_copy_of_its_window_in_bf16():
    """MobileNetV2's stem (3x3, stride 2, RGB to 32 channels at 224 x 224, 4 bands of 2 rows): three shifted
    copies of each group's window took 2 passes where one copy takes 6, but loaded the input 4.5 times in
    transfers of 9 KB, each waiting for the DMA latency (388 transfers; the stem's node 28.15 us, unpacked 15.47:
    stem_packing). In fp32, where PE runs at a quarter of the rate, the copies still pay: 28 passes."""
    model = conv("Conv", n=1, c=3, spatial=[224, 224], m=32, kernel=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])
    pe = compile_model(model, BF16).cores[0]["PE"].instructions
    assert len(pe) == 14 * 6  # 14 groups of 4 bands of 2 rows, 6 passes each
    assert {(i.args["moving"].num_partitions, i.args["dst"].num_partitions) for i in pe} == {(24, 128)}
    assert len(streams(model, BF16)["DMA"]) < 250
    fp32 = compile_model(model).cores[0]["PE"].instructions
    assert len(fp32) == 14 * 2 and {i.args["moving"].num_partitions for i in fp32} == {72}


def _stem_block(epilogue: list, residual: bool = False) -> object:
    rng = np.random.default_rng(3)
    weights = {"w": rng.standard_normal((16, 3, 3, 3)).astype(np.float32),
               "b": rng.standard_normal(16).astype(np.float32)}
    inputs = {"x": ([1, 3, 20, 160], TensorProto.FLOAT)}
    if residual:
        inputs["r"] = ([1, 16, 10, 80], TensorProto.FLOAT)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]), *epilogue]
    return make_model(nodes, inputs, {"y": ([1, 16, 10, 80], TensorProto.FLOAT)}, weights)


def test_banded_stem_hard_swish_reads_the_bank(tmp):
    """The bias added by PE (its rows repeated for each band) and HardSwish on the bank."""
    _exact_to_bf16_operands(_stem_block([helper.make_node("HardSwish", ["c"], ["y"])]), tmp)


def test_banded_stem_adds_a_residual_then_relu(tmp):
    _exact_to_bf16_operands(_stem_block([helper.make_node("Add", ["c", "r"], ["s"]),
                                         helper.make_node("Relu", ["s"], ["y"])], residual=True), tmp)


def test_banded_stem_is_right_under_random_interleaving(tmp):
    """The edge fills span every band's partitions and the loads of the other bands write over them: ordered by
    semaphores alone."""
    model = conv("Conv", **STEMS["5x5-no-bias"][0])
    compiled = compile_to_model(model, tmp, BF16)
    inputs = seeded_inputs(compiled.inputs)
    reference = onnxruntime_outputs(bf16_operands(model), inputs)
    for seed in range(2):
        assert_close(compiled.run(inputs, policy="random", seed=seed), reference, rtol=1e-5)


def _stem_then_depthwise(dw_stride: int) -> object:
    """MobileNetV3's first layers: the stem (3 -> 16, 3x3, stride 2) with HardSwish, then a 3x3 depthwise
    convolution over its 16 channels with Relu, at 224 x 224."""
    rng = np.random.default_rng(5)
    weights = {"w": rng.standard_normal((16, 3, 3, 3)).astype(np.float32),
               "b": rng.standard_normal(16).astype(np.float32),
               "d": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
               "e": rng.standard_normal(16).astype(np.float32)}
    out = 112 // dw_stride
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("Conv", ["h", "d", "e"], ["g"], group=16, strides=[dw_stride] * 2, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["g"], ["y"])]
    return make_model(nodes, {"x": ([1, 3, 224, 224], TensorProto.FLOAT)},
                      {"y": ([1, 16, out, out], TensorProto.FLOAT)}, weights)


def _moves_on_chip(model, options) -> int:
    """The SBUF-to-SBUF transfers of the compiled model."""
    return sum(1 for s in compile_model(model, options).cores[0].values() for i in s.instructions
               if i.op == "dma_copy" and i.args["dst"].mem is Mem.SBUF and i.args["src"].mem is Mem.SBUF)


@pytest.mark.parametrize("policy", ["clock", "random"])
def test_a_stem_computes_into_its_depthwise_readers_windows(tmp, policy):
    """The stem's bands are the depthwise convolution's (4 rows a band: two groups of 8 bands, the fewest rows
    computed), its epilogue writes each band's window rows on that band's partitions: nothing moves between the
    two layers, where each window was two SBUF-to-SBUF transfers (the window's top row, above the image, zeroed
    after the stem wrote it). Exact to bf16 operands, onnxruntime's result in fp32; under a random order of the
    engines too."""
    model = _stem_then_depthwise(2)
    assert _moves_on_chip(model, BF16) == 0
    dw = [i for i in compile_model(model, BF16).cores[0]["PE"].instructions  # (the stem contracts over 24 rows)
          if i.args["stationary"].num_partitions == 128]
    assert max(i.args["dst"].free_size for i in dw) == 4 * 56 and len(dw) == 2 * 9
    compiled = compile_to_model(model, tmp, BF16)
    inputs = seeded_inputs(compiled.inputs)
    assert_close(compiled.run(inputs, policy=policy, seed=1), onnxruntime_outputs(bf16_operands(model), inputs),
                 rtol=1e-5)
    compiled = compile_to_model(model, tmp, Options())
    assert_close(compiled.run(inputs, policy=policy, seed=1), onnxruntime_outputs(model, inputs), rtol=1e-4)


def test_a_stem_stores_its_rows_when_a_later_band_reads_padding(tmp):
    """A stride-1 depthwise convolution's last output row reads the padding below the image, in a band other than
    its group's first (on partitions the engines cannot start a fill at): the stem stores its rows and the
    depthwise convolution loads its windows, as before."""
    model = _stem_then_depthwise(1)
    assert _moves_on_chip(model, BF16) > 0
    _exact_to_bf16_operands(model, tmp)
