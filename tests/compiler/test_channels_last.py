"""ConvNeXt's blocks, as transformers exports them: a depthwise convolution (channels first, [1, C, H, W]), a permute
to channels last, LayerNorm over C, two Linears with GELU between, a per-channel scale, a permute back and the
residual Add, then a downsampling convolution of stride 2. Each permute is a view of what the other side lays out
(a convolution's output is LayerNorm's input read a feature at a time; LayerNorm's output laid out feature-major
is the next convolution's channels-first input), so no DMA of the chain moves an element at a time."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, compile_model, prepare
from runtime.profile import small_pieces_by_node
from tests.compiler.one_node import check, rng_weights
from tests.conftest import make_model

C, HW = 32, 16  # 16 fp32 a row, 1 KiB a channel's image: a load of whole channels has no piece under 512 bytes


def convnext_stage(blocks: int = 2) -> onnx.ModelProto:
    """`blocks` ConvNeXt blocks on [1, C, HW, HW], then the downsampling (LayerNorm, Conv 2x2 stride 2 to 2C)."""
    weights: dict[str, np.ndarray] = {}
    nodes = []
    x = "x"
    for b in range(blocks):
        w = rng_weights(b, dw=(C, 1, 7, 7), dwb=(C,), g=(C,), beta=(C,), w1=(C, 4 * C), b1=(4 * C,), w2=(4 * C, C),
                        b2=(C,), scale=(C,))
        weights.update({f"{k}{b}": v for k, v in w.items()})
        nodes += [
            helper.make_node("Conv", [x, f"dw{b}", f"dwb{b}"], [f"conv{b}"], group=C, kernel_shape=[7, 7],
                             pads=[3, 3, 3, 3]),
            helper.make_node("Transpose", [f"conv{b}"], [f"last{b}"], perm=[0, 2, 3, 1]),
            helper.make_node("LayerNormalization", [f"last{b}", f"g{b}", f"beta{b}"], [f"norm{b}"], axis=-1),
            helper.make_node("MatMul", [f"norm{b}", f"w1{b}"], [f"up{b}"]),
            helper.make_node("Add", [f"up{b}", f"b1{b}"], [f"upb{b}"]),
            helper.make_node("Gelu", [f"upb{b}"], [f"act{b}"], domain=""),
            helper.make_node("MatMul", [f"act{b}", f"w2{b}"], [f"down{b}"]),
            helper.make_node("Add", [f"down{b}", f"b2{b}"], [f"downb{b}"]),
            helper.make_node("Mul", [f"downb{b}", f"scale{b}"], [f"scaled{b}"]),
            helper.make_node("Transpose", [f"scaled{b}"], [f"first{b}"], perm=[0, 3, 1, 2]),
            helper.make_node("Add", [x, f"first{b}"], [f"res{b}"]),
        ]
        x = f"res{b}"
    weights.update(rng_weights(9, gd=(C,), bd=(C,), wd=(2 * C, C, 2, 2), bdd=(2 * C,)))
    nodes += [helper.make_node("Transpose", [x], ["last"], perm=[0, 2, 3, 1]),
              helper.make_node("LayerNormalization", ["last", "gd", "bd"], ["normd"], axis=-1),
              helper.make_node("Transpose", ["normd"], ["first"], perm=[0, 3, 1, 2]),
              helper.make_node("Conv", ["first", "wd", "bdd"], ["grid"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("Conv", ["grid", "dwd", "dwdb"], ["y"], group=2 * C, kernel_shape=[7, 7],
                               pads=[3, 3, 3, 3])]
    weights.update(rng_weights(10, dwd=(2 * C, 1, 7, 7), dwdb=(2 * C,)))
    model = make_model(nodes, {"x": ([1, C, HW, HW], TensorProto.FLOAT)},
                       {"y": ([1, 2 * C, HW // 2, HW // 2], TensorProto.FLOAT)}, weights, opset=20)
    return model


def test_a_convnext_stage_moves_no_element_at_a_time(tmp):
    """Before: LayerNorm read the convolution's output a token at a time (an element a piece), the depthwise
    convolution read LayerNorm's output and the residual sum channels first from their channels-last rows (another),
    and the downsampling, made a PatchEmbedding, wrote patch rows that the next convolution read channels first."""
    model = convnext_stage()
    assert small_pieces_by_node(compile_model(model)) == {}
    assert "PatchEmbedding" not in [n.op for n in prepare(model, Options()).nodes]
    check(model, tmp, rtol=1e-4)


def test_a_convnext_stage_in_bf16(tmp):
    model = convnext_stage(blocks=1)
    assert small_pieces_by_node(compile_model(model, Options(auto_cast="matmult"))) == {}


def test_feature_major_layer_norm_takes_no_scalar_engine_table(tmp):
    """LayerNorm over the partitions computes its rstd with VectorE's power, (sum + H eps)^-0.5 with sqrt(H) in
    gamma: ScalarE, which runs the block's GELU, never switches to rsqrt's table. A large epsilon, so that it counts,
    and gamma and beta that are not 1 and 0; against onnxruntime."""
    from isa.functions import ActFunc

    model = convnext_stage(blocks=1)
    for node in model.graph.node:
        if node.op_type == "LayerNormalization":
            node.attribute.append(helper.make_attribute("epsilon", 0.5))
    bundle = compile_model(model)
    functions = {i.args["func"] for i in bundle.cores[0]["ACT"].instructions if i.op == "activation"}
    assert ActFunc.rsqrt not in functions and ActFunc.gelu in functions
    check(model, tmp)
