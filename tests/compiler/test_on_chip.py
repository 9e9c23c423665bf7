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


def test_a_pooled_vector_reaches_the_classifier_on_chip(tmp):
    """A CNN's head: global average pool, Flatten, Gemm. The pool writes its result with the channels on
    partitions, which is K on partitions for the Gemm: the classifier reads it where it lies. (It used to be
    stored to HBM one element per partition and turned back on PE: 64 transfers of 64 bytes in a row at the end
    of ResNet-50, 35 us of its 448.)"""
    from isa.operand import Mem
    from neuronx_cc_lite.compiler import Options, compile_model

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((40, 512)) / 20).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    model = make_model([helper.make_node("ReduceMean", ["x"], ["p"], axes=[2, 3], keepdims=1),
                        helper.make_node("Flatten", ["p"], ["f"], axis=1),
                        helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1)],
                       {"x": ([1, 512, 7, 7], TensorProto.FLOAT)}, {"y": ([1, 40], TensorProto.FLOAT)},
                       {"w": w, "b": b})
    for options in (None, Options(auto_cast="matmult")):
        bundle = compile_model(model, options)
        stored = [i for core in bundle.cores for s in core.values() for i, node in zip(s.instructions, s.nodes)
                  if node.startswith("ReduceMean") and i.op == "dma_copy" and i.args["dst"].mem is Mem.HBM]
        turned = [i for core in bundle.cores for s in core.values() for i in s.instructions if i.op == "nc_transpose"]
        assert not stored and not turned, (len(stored), len(turned))
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)
