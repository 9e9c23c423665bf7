"""onnxruntime's QOperator contrib ops (expand-qoperator): each as its Q/DQ form, against onnxruntime's kernels.
The whole quantize_static QOperator CNN is models/cnn_qoperator.onnx (tests/compiler/test_models.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.errors import UnsupportedError
from neuronx_cc_lite.reference import onnxruntime_outputs

U8 = TensorProto.UINT8
SHAPE = [1, 4, 6, 6]


def _params(**values: float | int) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.asarray(v, np.float32 if isinstance(v, float) else np.uint8), k)
            for k, v in values.items()]


def _model(node: onnx.NodeProto, inputs: list[str], out_shape: list[int],
           params: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph([node], "qop", [helper.make_tensor_value_info(i, U8, SHAPE) for i in inputs],
                              [helper.make_tensor_value_info("y", U8, out_shape)], params)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


SCALES = dict(sa=0.05, za=120, sb=0.03, zb=131, sy=0.07, zy=125)
CASES = {
    "QLinearAdd": (["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["a", "b"], SHAPE, {}),
    "QLinearMul": (["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["a", "b"], SHAPE, {}),
    "QLinearSigmoid": (["a", "sa", "za", "sy", "zy"], ["a"], SHAPE, {}),
    "QLinearLeakyRelu": (["a", "sa", "za", "sy", "zy"], ["a"], SHAPE, {"alpha": 0.2}),
    "QLinearGlobalAveragePool": (["a", "sa", "za", "sy", "zy"], ["a"], [1, 4, 1, 1], {}),
    "QLinearGlobalAveragePool_nhwc": (["a", "sa", "za", "sy", "zy"], ["a"], [1, 1, 1, 6], {"channels_last": 1}),
    "QLinearAveragePool": (["a", "sa", "za", "sy", "zy"], ["a"], [1, 4, 3, 3],
                           {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "QLinearConcat": (["sy", "zy", "a", "sa", "za", "b", "sb", "zb"], ["a", "b"], [1, 8, 6, 6], {"axis": 1}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_op_is_onnxruntimes_or_a_step_from_it(case):
    ins, graph_inputs, out_shape, attrs = CASES[case]
    node = helper.make_node(case.removesuffix("_nhwc"), ins, ["y"], domain="com.microsoft", **attrs)
    model = _model(node, graph_inputs, out_shape, _params(**SCALES))
    compiled = runtime.load(compile_model(model))
    rng = np.random.default_rng(0)
    feeds = {i: rng.integers(0, 256, SHAPE).astype(np.uint8) for i in graph_inputs}
    ours, ref = compiled.run(feeds)["y"], onnxruntime_outputs(model, feeds)["y"]
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    steps = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
    # the same float values in another order (README: a quantized output is onnxruntime's or one step from it)
    assert steps.max() <= 1 and steps.mean() < 0.02, (case, steps.max(), steps.mean())


def test_a_contrib_op_without_an_expansion_is_refused_by_its_domain():
    node = helper.make_node("QLinearSoftmax", ["a", "sa", "za", "sy", "zy"], ["y"], domain="com.microsoft",
                            axis=-1, opset=13)
    model = _model(node, ["a"], SHAPE, _params(**SCALES))
    with pytest.raises(UnsupportedError, match="node 'QLinearSoftmax_0' \\(QLinearSoftmax\\): domain "
                                               "'com.microsoft' is not supported"):
        compile_model(model)
