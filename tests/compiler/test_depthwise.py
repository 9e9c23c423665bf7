"""Depthwise convolution with bands of output rows on the partitions (lower/depthwise.py): against onnxruntime
with short last bands, strides, batches, no bias, and the epilogues (residual and Relu; HardSwish reading the bank
under auto-cast)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from onnx import TensorProto, helper

from isa.assembly import disassemble
from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
from tests.compiler.one_node import bf16_operands, check
from tests.compiler.test_conv import conv
from tests.conftest import assert_close, compile_to_model, make_model

BANDED = {  # (case, partitions a tap's matmul covers: bands x channels)
    # 30 x 16 outputs: 4 bands of 8 rows, the last of 6
    "pads": (dict(n=1, c=16, spatial=[30, 16], m=16, kernel=[3, 3], group=16, pads=[1, 1, 1, 1]), 64),
    # 30 x 10 outputs, two images: 3 bands of 13 rows, the last of 4
    "stride2-batch2": (dict(n=2, c=32, spatial=[60, 20], m=32, kernel=[3, 3], group=32, strides=[2, 2],
                            pads=[0, 1, 1, 0]), 96),
    # 40 x 12 outputs: two groups of 3 bands of 11 rows, the second with one band of 7
    "5x5-no-bias": (dict(n=1, c=40, spatial=[40, 12], m=40, kernel=[5, 5], group=40, pads=[2, 2, 2, 2],
                         bias=False), 120),
}


@pytest.mark.parametrize("case, partitions", BANDED.values(), ids=BANDED.keys())
def test_banded_depthwise(tmp, case, partitions):
    model = conv("Conv", **case)
    pe = compile_model(model).cores[0]["PE"].instructions
    assert {i.args["moving"].num_partitions for i in pe} == {partitions}
    check(model, tmp)


def _depthwise_block(epilogue: list) -> "object":
    rng = np.random.default_rng(6)
    weights = {"w": (rng.standard_normal((16, 1, 3, 3)) * 2).astype(np.float32),
               "b": rng.standard_normal(16).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=16, pads=[1, 1, 1, 1]), *epilogue]
    return make_model(nodes, {"x": ([1, 16, 26, 16], TensorProto.FLOAT)},
                      {"y": ([1, 16, 26, 16], TensorProto.FLOAT)}, weights)


def test_banded_depthwise_adds_a_residual_then_relu(tmp):
    check(_depthwise_block([helper.make_node("Add", ["c", "x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]),
          tmp)


def test_banded_depthwise_hard_swish_reads_the_bank_under_auto_cast(tmp):
    """The bias added by PE (its rows repeated for each band) and HardSwish on the bank: exact to bf16 operands."""
    model = _depthwise_block([helper.make_node("HardSwish", ["c"], ["y"])])
    compiled = compile_to_model(model, tmp, Options(auto_cast="matmult", auto_cast_type="bf16"))
    inputs = seeded_inputs(compiled.inputs)
    assert_close(compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs), rtol=1e-5)


def _tensor_sizes(model, options=None) -> dict[str, int]:
    """The bytes of each HBM tensor of the compiled model, from its listing."""
    return {t["name"]: t["size"] for t in (json.loads(line.split(" ", 1)[1]) for line in
                                           disassemble(compile_model(model, options)).splitlines()
                                           if line.startswith(".tensor "))}


@pytest.mark.parametrize("policy", ["clock", "random"])
def test_depthwise_weights_load_without_their_zeros(tmp, policy):
    """600 channels of a 5x5 depthwise convolution: five tiles through the ring of four diagonal tiles
    (Program.diagonals), each tile's taps one skewed DMA onto the diagonals of a tile zeroed once. HBM holds the
    weights as the model does, 600 x 25 of them; under a random order of the engines (a missing semaphore between
    a tile's reuse and the matmuls reading it would show) the result is onnxruntime's. In fp32 VectorE takes a
    share of the taps: each channel's row has a 1 after its taps, the identity through which PE adds that share."""
    model = conv("Conv", n=1, c=600, spatial=[7, 7], m=600, kernel=[5, 5], group=600, pads=[2, 2, 2, 2])
    sizes = _tensor_sizes(model)
    assert [size for name, size in sizes.items() if name.endswith("/taps")] == [600 * (25 + 1) * 4]
    check(model, tmp, policy=policy)


def test_depthwise_transposed_and_of_two_kernel_sizes(tmp):
    """A depthwise ConvTranspose (taps read flipped) beside a 3x3 and a 5x5 depthwise convolution: three rings'
    worth of diagonals, each tile's from its own taps."""
    rng = np.random.default_rng(3)
    c = 140
    weights = {"w3": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
               "w5": rng.standard_normal((c, 1, 5, 5)).astype(np.float32),
               "wt": rng.standard_normal((c, 1, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w3"], ["a"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w5"], ["b"], group=c, pads=[2, 2, 2, 2]),
             helper.make_node("ConvTranspose", ["b", "wt"], ["y"], group=c, strides=[2, 2], pads=[1, 1, 1, 1])]
    model = make_model(nodes, {"x": ([1, c, 9, 8], TensorProto.FLOAT)}, {"y": ([1, c, 17, 15], TensorProto.FLOAT)},
                       weights)
    check(model, tmp)


def _vector_taps(model, options=None) -> tuple[int, int]:
    """(the convolution's matmuls on PE, its taps on VectorE)."""
    core = compile_model(model, options).cores[0]
    vector = [i for i in core["DVE"].instructions if i.op in ("tensor_scalar", "scalar_tensor_tensor")
              and i.args["src"].mem.name == "SBUF" and i.args["dst"].mem.name in ("PSUM", "SBUF")]
    return len(core["PE"].instructions), len(vector)


SHARED = {  # VectorE takes a share of the taps where PE runs at fp32's quarter rate
    # 240 channels at 14 x 14, as MobileNetV3's 5x5 layers: two tiles of 128 and 112 channels
    "5x5": dict(n=1, c=240, spatial=[14, 14], m=240, kernel=[5, 5], group=240, pads=[2, 2, 2, 2]),
    # 16 channels at 56 x 56, stride 2: banded (lower_banded_depthwise)
    "banded-stride2": dict(n=1, c=16, spatial=[56, 56], m=16, kernel=[3, 3], group=16, strides=[2, 2],
                           pads=[1, 1, 1, 1]),
    # 7 x 7 outputs: rows short enough that the taps along them write only the outputs they reach
    "flat-7x7": dict(n=1, c=200, spatial=[7, 7], m=200, kernel=[5, 5], group=200, pads=[2, 2, 2, 2], bias=False),
}


@pytest.mark.parametrize("policy", ["clock", "random"])
@pytest.mark.parametrize("case", SHARED.values(), ids=SHARED.keys())
def test_vector_engine_takes_a_share_of_the_taps_in_fp32(tmp, case, policy):
    """VectorE's taps accumulate in PSUM beside PE's, its last writes the share to SBUF and PE adds it through the
    identity diagonal; in fp32 the share is taken, in bf16 (PE four times faster) not; the result is
    onnxruntime's under a random order of the engines too."""
    model = conv("Conv", **case)
    matmuls, shared = _vector_taps(model)
    assert shared > 0
    bf16_matmuls, bf16_shared = _vector_taps(model, Options(auto_cast="matmult", auto_cast_type="bf16"))
    assert bf16_shared == 0 and bf16_matmuls > matmuls
    check(model, tmp, policy=policy)


@pytest.mark.parametrize("policy", ["clock", "random"])
@pytest.mark.parametrize("channels", [96, 200])
def test_an_expansion_writes_inside_the_depthwise_window(tmp, channels, policy):
    """A 1x1 expansion's output, kept on chip, loaded into a 5x5 depthwise convolution's windows (rows of 14 lie
    whole in them): over 96 channels its home is loaded whole and becomes the window's run between the padding;
    over 200 each channel tile's part goes from the expansion's tile to its window's run (codegen/on_chip.py). The
    expansion's epilogue writes inside the windows and no copy moves it; onnxruntime's result, under a random
    order of the engines too (the padding's fills beside the epilogue's writes)."""
    rng = np.random.default_rng(1)
    weights = {"w1": rng.standard_normal((channels, 32, 1, 1)).astype(np.float32),
               "w2": rng.standard_normal((channels, 1, 5, 5)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["e"]), helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], group=channels, pads=[2, 2, 2, 2])]
    model = make_model(nodes, {"x": ([1, 32, 14, 14], TensorProto.FLOAT)},
                       {"y": ([1, channels, 14, 14], TensorProto.FLOAT)}, weights)
    streams = compile_model(model).cores[0]
    assert not [i for s in streams.values() for i in s.instructions if i.op == "tensor_copy"]
    check(model, tmp, policy=policy)


@pytest.mark.parametrize("policy", ["clock", "random"])
@pytest.mark.parametrize("kernel, stride, pad", [(5, 1, 2), (3, 2, 1)])
def test_a_depthwise_window_over_whole_images_has_no_padding(tmp, kernel, stride, pad, policy):
    """Under auto-cast (PE takes every tap), a depthwise convolution over whole 14 x 14 images reads its input as
    it lies (windows.tight_window): each tap adds to the outputs whose input is inside the image, the centre tap
    first (it reaches all of them); no fill of padding, and the 1x1 expansion before it writes where the taps
    read, no copy between them. Exact to bf16 operands, under a random order of the engines too (small integers
    into the expansion, whose sums bf16 then holds exactly, whatever their order: a sum rounded to bf16 may
    otherwise land on the other side of a rounding boundary than onnxruntime's, one ulp of an intermediate)."""
    rng = np.random.default_rng(6)
    weights = {"w1": rng.integers(-2, 3, (96, 32, 1, 1)).astype(np.float32),
               "w2": rng.standard_normal((96, 1, kernel, kernel)).astype(np.float32)}
    out = (14 + 2 * pad - kernel) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w1"], ["e"]), helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], group=96, pads=[pad] * 4, strides=[stride] * 2)]
    model = make_model(nodes, {"x": ([1, 32, 14, 14], TensorProto.FLOAT)},
                       {"y": ([1, 96, out, out], TensorProto.FLOAT)}, weights)
    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    streams = compile_model(model, options).cores[0]
    ops = [i.op for s in streams.values() for i in s.instructions]
    assert "tensor_copy" not in ops and not [i for s in streams.values() for i in s.instructions
                                             if i.op == "memset" and i.args["dst"].num_partitions == 96]
    taps = [i for i in streams["PE"].instructions if i.args["stationary"].num_partitions == 96]
    assert len(taps) == kernel * kernel and taps[0].args["dst"].free_size == out * out
    assert min(i.args["dst"].free_size for i in taps) < out * out  # (the corner taps reach fewer outputs)
    compiled = compile_to_model(model, tmp, options)
    inputs = {"x": rng.integers(-2, 3, (1, 32, 14, 14)).astype(np.float32)}
    assert_close(compiled.run(inputs, policy=policy, seed=2), onnxruntime_outputs(bf16_operands(model), inputs),
                 rtol=1e-5)


@pytest.mark.parametrize("pool", ["ReduceMean", "GlobalAveragePool"])
@pytest.mark.parametrize("size, fused", [(48, True), (50, False)])
def test_a_spatial_mean_of_banded_depthwise_outputs(tmp, size, fused, pool):
    """A ReduceMean over the rows and columns of a banded depthwise convolution's output, or a GlobalAveragePool
    (a squeeze-and-excitation pooling, as the two exporters write it): with every band of 3 rows whole (48 rows),
    each group's epilogue gives its partitions' sums as it evacuates the bank, and PE adds the bands of every group
    into the channels' sums (one fp32 matmul of a column a group); with 50 rows the last band is cut and the mean
    reads the output back. onnxruntime's result both ways, in fp32 and exact to bf16 operands."""
    rng = np.random.default_rng(8)
    weights = {"w": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
               "b": rng.standard_normal(16).astype(np.float32),
               "axes": np.array([2, 3], np.int64)}
    mean = helper.make_node("ReduceMean", ["y", "axes"], ["m"]) if pool == "ReduceMean" else \
        helper.make_node("GlobalAveragePool", ["y"], ["m"])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=16, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"]), mean]
    model = make_model(nodes, {"x": ([1, 16, size, size], TensorProto.FLOAT)},
                       {"y": ([1, 16, size, size], TensorProto.FLOAT), "m": ([1, 16, 1, 1], TensorProto.FLOAT)},
                       weights, opset=18)
    pe = compile_model(model).cores[0]["PE"].instructions
    sums = [i for i in pe if i.args["moving"].free_size == 1 and i.args["moving"].dtype.name == "fp32"]
    assert bool(sums) == fused
    check(model, tmp)
    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    compiled = compile_to_model(model, tmp, options)
    inputs = seeded_inputs(compiled.inputs)
    assert_close(compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs), rtol=1e-5)


def _remainder_block(channels: int, hard: bool) -> "object":
    """A depthwise 3x3 convolution over `channels` at 24 x 24 and its bias, then a residual Add and a Relu, or a
    HardSwish (which reads the bank, PE adding the bias)."""
    rng = np.random.default_rng(8)
    weights = {"w": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32),
               "b": rng.standard_normal(channels).astype(np.float32)}
    after = [helper.make_node("HardSwish", ["c"], ["y"])] if hard else \
        [helper.make_node("Add", ["c", "x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=channels, pads=[1, 1, 1, 1]), *after]
    shape = [1, channels, 24, 24]
    return make_model(nodes, {"x": (shape, TensorProto.FLOAT)}, {"y": (shape, TensorProto.FLOAT)}, weights)


@pytest.mark.parametrize("hard", [False, True], ids=["residual-relu", "hard-swish"])
@pytest.mark.parametrize("options", [None, Options(auto_cast="matmult", auto_cast_type="bf16")], ids=["fp32", "bf16"])
def test_the_last_tile_of_few_channels_takes_bands(tmp, options, hard):
    """144 channels: the first 128 a diagonal per tap over the image's 576 columns, the last 16 in 4 bands of 6
    rows on 64 partitions, a tap's matmul over 144 columns (lower/depthwise.py remainder_bands), where they took
    a 128-column pass like the first tile's; its bias (a column, or rows PE adds), residual and outputs those of
    channels 128 .. 143."""
    model = _remainder_block(144, hard)
    pe = compile_model(model, options).cores[0]["PE"].instructions
    columns: dict[int, int] = {}  # PE's columns, by the partitions a matmul reads
    for i in pe:
        p = i.args["moving"].num_partitions
        if p <= 3:  # the bias added by PE: its rows against ones
            continue
        if p != 128:
            assert p == i.args["dst"].num_partitions == 64
        columns[p] = columns.get(p, 0) + math.prod(n for n, _ in i.args["moving"].dims)
    # (per tap the first tile's 576 columns against the bands' 144; in fp32 VectorE takes a share of the taps)
    assert 0 < 3 * columns[64] < columns[128]
    if options is None:
        check(model, tmp)
    else:
        compiled = compile_to_model(model, tmp, options)
        inputs = seeded_inputs(compiled.inputs)
        assert_close(compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs), rtol=1e-5)
