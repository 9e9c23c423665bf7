"""GroupNormalization (lower/group_norm.py) and the exporters' spellings of it that canonicalize turns into it
(passes/canonicalize.py), compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.errors import UnsupportedError
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.compiler.one_node import check, one_node, streams
from tests.conftest import assert_close, compile_to_model

F32 = TensorProto.FLOAT


def _group_norm(shape: tuple[int, ...], groups: int, constant: bool = True,  # type: ignore[no-untyped-def]
                seed: int = 0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    params = {"scale": rng.standard_normal(c).astype(np.float32), "bias": rng.standard_normal(c).astype(np.float32)}
    if constant:
        return one_node("GroupNormalization", {"x": (list(shape), F32)}, params, opset=21, num_groups=groups,
                        epsilon=1e-5)
    return one_node("GroupNormalization", {"x": (list(shape), F32), "scale": ([c], F32), "bias": ([c], F32)},
                    opset=21, num_groups=groups, epsilon=1e-5)


@pytest.mark.parametrize("shape, groups, constant", [
    ((1, 128, 16, 16), 32, True),  # a UNet's: four channels a group, the 128 channels one block
    ((3, 40, 10), 8, True),  # several images in one block of rows
    ((2, 6, 5, 7), 3, False),  # scale and bias computed at run time, a block reaching into the next image
    ((1, 300, 9), 3, False),  # 100 channels a group: blocks of 100 rows
    ((1, 384, 4, 4), 2, True),  # 192 channels a group: a group over two blocks, summed on PE across them
    ((2, 16, 5, 5), 16, True),  # a channel a group (InstanceNormalization's statistics)
    ((1, 4, 4500), 2, True),  # rows longer than a tile: read once for the statistics, once to apply them
])
def test_group_norm_matches_onnxruntime(tmp, shape, groups, constant):
    check(_group_norm(shape, groups, constant), tmp, rtol=1e-4)


def test_group_norm_statistics_keep_precision_far_from_zero(tmp):
    """Inputs around 300 with unit spread: the group variance is the mean of the row variances plus the spread
    of the row means, never a difference of large squares. The reference is numpy in float64: onnxruntime's own
    kernel is off by 0.06 here."""
    model = _group_norm((1, 64, 8, 8), 8)
    x = (300 + np.random.default_rng(1).standard_normal((1, 64, 8, 8))).astype(np.float32)
    ours = compile_to_model(model, tmp).run({"x": x})["y"]
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    grouped = x.astype(np.float64).reshape(1, 8, -1)
    normed = (grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-5)
    exact = normed.reshape(x.shape) * w["scale"].reshape(1, -1, 1, 1) + w["bias"].reshape(1, -1, 1, 1)
    np.testing.assert_allclose(ours, exact, rtol=0, atol=5e-4)


def test_group_norm_is_one_pass_on_chip():
    """Statistics by bn_stats, combined across partitions by PE; no reduction reloads the input."""
    found = streams(_group_norm((1, 64, 16, 16), 16))
    assert "bn_stats" in found["DVE"] and "nc_matmul" in found["PE"]
    assert "tensor_reduce" not in found.get("DVE", []) + found.get("POOL", [])


def _exported(activation: bool, seed: int = 0):  # type: ignore[no-untyped-def]
    """GroupNorm(8, 32) [+ SiLU] as torch.onnx writes it: Reshape to [N, G, -1], InstanceNormalization with ones
    and zeros per group, Reshape back, Mul and Add of [C, 1, 1] constants, then x * Sigmoid(x)."""
    rng = np.random.default_rng(seed)
    n, c, h, w, g = 2, 32, 6, 6, 8
    weights = {
        "split": np.array([0, g, -1], np.int64), "ones": np.ones(g, np.float32), "zeros": np.zeros(g, np.float32),
        "shape": np.array([n, c, h, w], np.int64), "gamma": rng.standard_normal((c, 1, 1)).astype(np.float32),
        "beta": rng.standard_normal((c, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "split"], ["grouped"]),
             helper.make_node("InstanceNormalization", ["grouped", "ones", "zeros"], ["normed"], epsilon=1e-5),
             helper.make_node("Reshape", ["normed", "shape"], ["back"]),
             helper.make_node("Mul", ["back", "gamma"], ["scaled"]),
             helper.make_node("Add", ["scaled", "beta"], ["gn" if activation else "y"])]
    if activation:
        nodes += [helper.make_node("Sigmoid", ["gn"], ["gate"]), helper.make_node("Mul", ["gn", "gate"], ["y"])]
    graph = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("x", F32, [n, c, h, w])],
                              [helper.make_tensor_value_info("y", F32, [n, c, h, w])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("activation, op", [(False, "GroupNormalization"), (True, "GroupNormActivation")])
def test_exported_group_norm_becomes_one_op(tmp, activation, op):
    model = _exported(activation)
    ops = [n.op for n in prepare(model, Options()).nodes]
    assert ops == [op], ops
    check(model, tmp, rtol=1e-4)


def test_group_norm_activation_applies_in_one_scalar_engine_pass():
    """The affine of the group's statistics rides on the activation (scale and bias columns): no elementwise pass
    over the image before it, only the [rows, 1] columns' arithmetic."""
    from isa.operand import Operand
    from neuronx_cc_lite.compiler import compile_model

    bundle = compile_model(_exported(True))
    instrs = [i for core in bundle.cores for s in core.values() for i in s.instructions]
    assert all(i.args["dst"].free_size == 1 for i in instrs if i.op == "tensor_scalar")
    assert any(i.op == "activation" and isinstance(i.args["scale"], Operand) for i in instrs)


def test_group_norm_shared_result_is_not_fused(tmp):
    """A normalised value another node also reads stays an output of its own: the SiLU is not swallowed."""
    model = _exported(True)
    model.graph.output.append(helper.make_tensor_value_info("gn", F32, [2, 32, 6, 6]))
    ops = [n.op for n in prepare(model, Options()).nodes]
    assert "GroupNormalization" in ops and "GroupNormActivation" not in ops, ops
    check(model, tmp, rtol=1e-4)


def test_group_norm_scale_per_group_is_refused_naming_it():
    """A scale of one value per group (opset 18's meaning, which the checker does not catch at opset 21) would
    scale the wrong channels: refused with the node and the tensor named."""
    model = one_node("GroupNormalization", {"x": ([1, 8, 4, 4], F32)},
                     {"scale": np.ones(4, np.float32), "bias": np.zeros(4, np.float32)}, opset=21, num_groups=4)
    with pytest.raises(UnsupportedError, match="'scale' has shape \\[4\\], not \\[8\\]"):
        compile_model(model)
