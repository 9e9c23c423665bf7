"""Values kept on chip (codegen/on_chip.py): a graph output copied from a tensor that got an SBUF home reads the
home (the ONNX node tests that end in a Reshape of a result failed with "never placed" before)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import assert_close, make_model, run_both


@pytest.mark.parametrize("shape, to", [((2, 3), [6]), ((4, 8, 16), [32, 16]), ((1,), [])])
def test_a_reshaped_result_is_a_graph_output(tmp, shape, to):
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape")],
                       {"x": (list(shape), TensorProto.FLOAT)}, {"y": (to, TensorProto.FLOAT)},
                       {"s": np.array(to, dtype=np.int64)})
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=0)
