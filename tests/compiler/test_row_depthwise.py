"""Depthwise convolution with each channel's rows on the partitions (lower/row_depthwise.py): against onnxruntime
with a short last group, batches, no bias, asymmetric "same" padding, fused activations, bf16 operands, and an
input and output that stay on chip (each group's rows fanned out of its channels' partitions and gathered back,
SBUF to SBUF); and the layers it leaves to the diagonals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from isa.operand import Mem
from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
from tests.compiler.one_node import bf16_operands, check
from tests.compiler.test_conv import conv
from tests.conftest import assert_close, compile_to_model, make_model

ROWS = {  # (case, channels a group: 128 // rows); over 64 channels (fewer share the partitions as bands)
    # 7x7 over 28 x 28: 4 channels a group, 18 groups, the bias added by PE
    "7x7": (dict(n=1, c=72, spatial=[28, 28], m=72, kernel=[7, 7], group=72, pads=[3, 3, 3, 3]), 4),
    # 66 channels over 30 rows: 16 groups of 4 and one of 2 (in a bank of its own), two images, no bias
    "short-group-batch2-no-bias": (dict(n=2, c=66, spatial=[30, 40], m=66, kernel=[5, 5], group=66,
                                        pads=[2, 2, 2, 2], bias=False), 4),
    # an even kernel: "same" padding two rows above and three below
    "6x5-asymmetric": (dict(n=1, c=70, spatial=[20, 24], m=70, kernel=[6, 5], group=70, pads=[2, 2, 3, 2]), 6),
}


def _takes_rows(model, options=None) -> bool:
    """Whether the convolution took the rows: its weights laid out as bands (else the diagonals' taps)."""
    needed = compile_model(model, options).stats["needed_bytes"]
    assert needed, "no depthwise weights"
    return any(name.endswith("/bands") for name in needed)


@pytest.mark.parametrize("case, g", ROWS.values(), ids=ROWS.keys())
def test_rows_on_partitions(tmp, case, g):
    """Each group's matmuls cover g channels' rows (fewer for a short last group), one a kernel column (and the
    bias's, when there is one)."""
    model = conv("Conv", **case)
    pe = compile_model(model).cores[0]["PE"].instructions
    rows, kw = case["spatial"][0], case["kernel"][1]
    groups = case["n"] * -(-case["c"] // g)
    assert len(pe) == groups * (kw + case.get("bias", True))
    assert max(i.args["moving"].num_partitions for i in pe) == g * rows
    check(model, tmp)


def test_rows_under_auto_cast_are_exact_to_bf16_operands(tmp):
    model = conv("Conv", **ROWS["7x7"][0])
    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    assert _takes_rows(model, options)
    compiled = compile_to_model(model, tmp, options)
    inputs = seeded_inputs(compiled.inputs)
    assert_close(compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs), rtol=1e-5)


def _block(epilogue: list, c: int = 96, size: int = 32, kernel: int = 7):
    """A 1x1 convolution -> the depthwise convolution -> the epilogue: the depthwise convolution's input stays on
    chip with a channel a partition, as its producer computed it."""
    rng = np.random.default_rng(3)
    weights = {"p": (rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)).astype(np.float32),
               "w": rng.standard_normal((c, 1, kernel, kernel)).astype(np.float32),
               "b": rng.standard_normal(c).astype(np.float32)}
    pad = kernel // 2
    nodes = [helper.make_node("Conv", ["x", "p"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"], ["c"], group=c, pads=[pad] * 4), *epilogue]
    shape = [1, c, size, size]
    return make_model(nodes, {"x": (shape, TensorProto.FLOAT)}, {"y": (shape, TensorProto.FLOAT)}, weights)


def test_rows_fan_out_of_an_input_on_chip_and_gather_back(tmp):
    """The 1x1 convolution's output stays in SBUF with a channel a partition: each group's window is filled by a
    transfer from 4 partitions to 128 (a row each); the results go back the other way into the next 1x1
    convolution's input, which stays on chip too. Nothing goes through HBM but the model's input, output and
    weights."""
    model = _block([helper.make_node("Conv", ["c", "p"], ["y"])])
    compiled = compile_model(model)
    assert compiled.stats["through_hbm"] == 0 and compiled.stats["kept_on_chip"] == 2
    transfers = [i for q, s in compiled.cores[0].items() if q.startswith("DMA") for i in s.instructions]
    on_chip = [(i.args["dst"], i.args["src"]) for i in transfers
               if i.args["dst"].mem is Mem.SBUF and i.args["src"].mem is Mem.SBUF]
    assert any(d.num_partitions == 32 * s.num_partitions for d, s in on_chip)  # fanned out
    assert any(s.num_partitions == 32 * d.num_partitions for d, s in on_chip)  # gathered back
    check(model, tmp)


@pytest.mark.parametrize("activation", ["Relu", "HardSwish"])
def test_rows_apply_the_fused_activation(tmp, activation):
    """The convolution's Relu (a ScalarE function) or HardSwish (after the evacuation) fused into its epilogue."""
    model = _block([helper.make_node(activation, ["c"], ["y"])])
    assert _takes_rows(model)
    check(model, tmp)


LEFT = {  # layers the diagonals keep
    "stride2": dict(n=1, c=72, spatial=[28, 28], m=72, kernel=[7, 7], group=72, pads=[3, 3, 3, 3],
                    strides=[2, 2]),
    "not-same": dict(n=1, c=72, spatial=[28, 28], m=72, kernel=[7, 7], group=72, pads=[2, 2, 2, 2]),
    # MobileNetV2's 144-channel 3x3 layer at 56 x 56: the transfers in and out cost about what the rows save
    "3x3-56": dict(n=1, c=144, spatial=[56, 56], m=144, kernel=[3, 3], group=144, pads=[1, 1, 1, 1]),
}


@pytest.mark.parametrize("case", LEFT.values(), ids=LEFT.keys())
def test_layers_the_rows_leave_to_the_diagonals(case):
    assert not _takes_rows(conv("Conv", **case))
