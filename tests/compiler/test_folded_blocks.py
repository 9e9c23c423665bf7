"""An elementwise operator on a tensor whose rows span several blocks of 128 partitions, each block's box a few
elements a partition (lower/tiling.py layout_boxes, FOLD_BELOW): the blocks side by side in one box, so one
instruction covers them, not one a block. A classifier's hidden layer of 1,024 features for one row (MobileNetV3's
head) and a decode step's hidden state are such tensors; with a hundred rows a block's box is long enough alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from isa.assembly import disassemble
from neuronx_cc_lite.compiler import compile_model
from tests.compiler.one_node import check
from tests.conftest import make_model


def _head(rows: int) -> object:
    """[rows, 512] @ [512, 1024] -> HardSwish -> @ [1024, 64]: the HardSwish's input is laid out feature-major
    (the second matmul contracts over its features), 1,024 features on 8 blocks of partitions."""
    rng = np.random.default_rng(4)
    weights = {"w1": rng.standard_normal((512, 1024)).astype(np.float32) / 16,
               "w2": rng.standard_normal((1024, 64)).astype(np.float32) / 32}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("HardSwish", ["h"], ["a"], name="hs"),
             helper.make_node("MatMul", ["a", "w2"], ["y"])]
    return make_model(nodes, {"x": ([rows, 512], TensorProto.FLOAT)}, {"y": ([rows, 64], TensorProto.FLOAT)},
                      weights)


@pytest.mark.parametrize("rows, instructions", [(1, 2), (100, 2 * 8)])
def test_an_elementwise_op_takes_all_blocks_of_a_short_row_at_once(tmp, rows, instructions):
    """One row: the HardSwish is one ScalarE and one VectorE instruction over [128, 8]; a hundred rows: a pair a
    block of 128 features, each over the hundred. onnxruntime's result both ways."""
    model = _head(rows)
    listing = disassemble(compile_model(model)).splitlines()
    assert sum(1 for line in listing if line.endswith("; hs")) == instructions
    check(model, tmp)
