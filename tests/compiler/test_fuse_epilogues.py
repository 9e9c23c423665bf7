"""fuse-epilogues: what joins a matmul keeps its meaning."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from isa.functions import AluOp
from tests.compiler.one_node import bf16_operands, check
from tests.conftest import make_model


def test_gemm_bias_then_a_scaling(tmp):
    """(A @ B + C) / s: C joins before the scaling, so it is scaled with the product (QDQ models quantize a
    Gemm's output as a Div by its scale)."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((10, 16)).astype(np.float32), "c": rng.standard_normal(10).astype(np.float32),
               "s": np.asarray(4.0, np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["t"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("Div", ["t", "s"], ["y"])]
    check(make_model(nodes, {"x": ([3, 16], TensorProto.FLOAT)}, {"y": ([3, 10], TensorProto.FLOAT)}, weights), tmp)


def _se_block(c: int = 8) -> onnx.ModelProto:
    """MobileNetV3's block: a convolution then HardSwish (an expansion to c channels); squeeze-and-excitation: the
    pooled values through a 1x1 convolution and Relu, another and HardSigmoid (torch's slope 1/6), the gate scaling
    the expanded values; a 1x1 projection of the gated values. Weights wide enough that the values cross both
    clamps of both activations."""
    rng = np.random.default_rng(3)
    weights = {"w": (rng.standard_normal((c, 4, 3, 3)) * 2).astype(np.float32),
               "b": rng.standard_normal(c).astype(np.float32),
               "w2": rng.standard_normal((4, c, 1, 1)).astype(np.float32),
               "b2": rng.standard_normal(4).astype(np.float32),
               "w3": (rng.standard_normal((c, 4, 1, 1)) * 3).astype(np.float32),
               "b3": rng.standard_normal(c).astype(np.float32),
               "w4": rng.standard_normal((5, c, 1, 1)).astype(np.float32),
               "b4": rng.standard_normal(5).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("GlobalAveragePool", ["h"], ["p"]),
             helper.make_node("Conv", ["p", "w2", "b2"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "w3", "b3"], ["c3"]),
             helper.make_node("HardSigmoid", ["c3"], ["g"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["h", "g"], ["m"]),
             helper.make_node("Conv", ["m", "w4", "b4"], ["y"])]
    return make_model(nodes, {"x": ([1, 4, 6, 7], TensorProto.FLOAT)}, {"y": ([1, 5, 6, 7], TensorProto.FLOAT)},
                      weights)


@pytest.mark.parametrize("channels, scalings", [(8, 1), (200, 2), (300, 2)])
def test_a_squeeze_and_excitation_block_fuses_into_its_convolutions(tmp, channels, scalings):
    """Each hard activation becomes the epilogue of the convolution before it (its slope and offset kept), the
    gate's Mul the projection's input scale. The gate's clamp at 1 moves to the projection, which clamps and scales
    its weights' rows (no minimum of its own is left): every full K tile of 128 channels in one VectorE instruction
    (the gate read as a column per K tile along the tile's rows), a short last one in one more. The result is
    onnxruntime's (the gate crosses both clamps)."""
    from neuronx_cc_lite.compiler import compile_model
    from neuronx_cc_lite.frontend import import_model
    from neuronx_cc_lite.passes import run_pipeline

    model = _se_block(channels)
    g = run_pipeline(import_model(model))
    fused = [(n.op, n.attrs.get("activation"), n.attrs.get("activation_alpha")) for n in g.nodes]
    assert ("ConvEpilogue", "HardSwish", None) in fused
    assert ("ConvEpilogue", "HardSigmoid/unclamped", pytest.approx(1 / 6)) in fused
    assert not {"HardSwish", "HardSigmoid", "Mul"} & {n.op for n in g.nodes}
    projection = next(n for n in g.nodes if n.op == "ConvEpilogue" and n.inputs[1] == "w4")
    assert (projection.inputs[0], projection.inputs[4]) == ("h", "g")
    assert projection.attrs.get("scale_max") == 1.0
    instructions = [i for s in compile_model(model).cores[0].values() for i in s.instructions]
    clamps = [i for i in instructions if i.op == "tensor_scalar" and i.args["op0"] is AluOp.minimum]
    scaled = [i for i in instructions if i.op == "scalar_tensor_tensor" and i.args["op0"] is AluOp.minimum and
              i.args["src"].dims[-1][1] == 0]  # (the gate's column read along the weights' rows)
    assert (clamps, len(scaled)) == ([], scalings)
    check(model, tmp)


def test_an_input_scale_of_several_images_is_not_fused(tmp):
    """Over a batch each image has its own gate, and one set of scaled weights cannot serve them all: the Mul
    stays."""
    rng = np.random.default_rng(4)
    weights = {"w": rng.standard_normal((3, 4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Conv", ["m", "w"], ["y"])]
    model = make_model(nodes, {"x": ([2, 4, 3, 3], TensorProto.FLOAT), "s": ([2, 4, 1, 1], TensorProto.FLOAT)},
                       {"y": ([2, 3, 3, 3], TensorProto.FLOAT)}, weights)
    from neuronx_cc_lite.frontend import import_model
    from neuronx_cc_lite.passes import run_pipeline

    assert "Mul" in {n.op for n in run_pipeline(import_model(model)).nodes}
    check(model, tmp)


def test_under_auto_cast_a_hard_activation_reads_the_bank(tmp):
    """With bf16 matmuls PE adds the bias as it accumulates (three bf16 rows summing to the fp32 bias) and the
    hard activations read the PSUM bank, with no evacuation of their own: exact to bf16 operands and fp32
    arithmetic elsewhere, and one more matmul per bank."""
    from neuronx_cc_lite.compiler import Options
    from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
    from tests.compiler.one_node import streams
    from tests.conftest import assert_close, compile_to_model

    rng = np.random.default_rng(5)
    weights = {"w": (rng.standard_normal((8, 4, 1, 1)) * 2).astype(np.float32),
               "b": (rng.standard_normal(8) * 3).astype(np.float32),
               "w2": (rng.standard_normal((6, 8, 1, 1)) * 2).astype(np.float32),
               "b2": rng.standard_normal(6).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("Conv", ["h", "w2", "b2"], ["c2"]),
             helper.make_node("HardSigmoid", ["c2"], ["y"], alpha=0.2, beta=0.4)]
    model = make_model(nodes, {"x": ([1, 4, 6, 7], TensorProto.FLOAT)}, {"y": ([1, 6, 6, 7], TensorProto.FLOAT)},
                       weights)
    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    compiled = compile_to_model(model, tmp, options)
    inputs = seeded_inputs(compiled.inputs)
    ours, ref = compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs)
    y = ref["y"]
    assert y.min() == 0.0 and y.max() == 1.0 and ((y > 0) & (y < 1)).any()  # both clamps of HardSigmoid and between
    assert_close(ours, ref, rtol=1e-5)
    engines = streams(model, options)
    assert engines["PE"].count("nc_matmul") == 4  # two convolutions, each one bank and its bias


def _guarded_softmax(shape: tuple[int, ...], mask: np.ndarray) -> onnx.ModelProto:
    """torch's scaled_dot_product_attention as the dynamo exporter writes its probabilities: the mask added, the
    Softmax, then Where(IsNaN(p), 0, p), so that a row masked whole is zeros rather than NaN."""
    weights = {"mask": mask.astype(np.float32), "zero": np.asarray(0.0, np.float32)}
    nodes = [helper.make_node("Add", ["x", "mask"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["y"])]
    return make_model(nodes, {"x": (list(shape), TensorProto.FLOAT)}, {"y": (list(shape), TensorProto.FLOAT)},
                      weights)


@pytest.mark.parametrize("length", [40, 9000], ids=["row-in-a-tile", "streamed-rows"])
def test_a_nan_guard_joins_its_softmax(tmp, length):
    """The IsNaN and the Where become the Softmax's own guard (one VectorE pass): rows masked whole (all -inf: NaN
    from the Softmax) come out zeros, the others as the Softmax gives them; a row longer than a tile too."""
    from neuronx_cc_lite.frontend import import_model
    from neuronx_cc_lite.passes import run_pipeline
    from neuronx_cc_lite.reference import onnxruntime_outputs
    from tests.conftest import assert_close, compile_to_model

    mask = np.zeros((3, length))
    mask[1] = -np.inf  # a row masked whole
    mask[2, ::3] = -np.inf  # a row masked in part
    model = _guarded_softmax((2, 3, length), mask)
    g = run_pipeline(import_model(model))
    assert [(n.op, n.attrs.get("nan_to_zero")) for n in g.nodes if n.op != "Add"] == [("Softmax", 1)]
    compiled = compile_to_model(model, tmp)
    x = np.random.default_rng(0).standard_normal((2, 3, length)).astype(np.float32)
    x[1, 0, 5] = np.nan  # a NaN input: its row NaN from the Softmax, zeros after the guard
    ours, ref = compiled.run({"x": x}), onnxruntime_outputs(model, {"x": x})
    assert np.isfinite(ours["y"]).all() and (ours["y"][:, 1] == 0).all() and (ours["y"][1, 0] == 0).all()
    assert_close(ours, ref, rtol=1e-5)


@pytest.mark.parametrize("rows, fused", [(128, True), (1, False)])
def test_a_gate_joins_a_projection_of_a_row_block_or_more(rows, fused):
    """(x W1 + b) * g joins the projection as its gate (MatMulEpilogue's fifth input) over a partition block of
    rows or more; a one-row product (a decode step's) keeps its Mul (fuse_epilogues.GATE_ROWS)."""
    from neuronx_cc_lite.frontend import import_model
    from neuronx_cc_lite.passes import run_pipeline

    rng = np.random.default_rng(2)
    weights = {"w": rng.standard_normal((32, 64)).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["q"]),
             helper.make_node("Sigmoid", ["x2"], ["g"]), helper.make_node("Mul", ["q", "g"], ["y"])]
    model = make_model(nodes, {"x": ([rows, 32], TensorProto.FLOAT), "x2": ([rows, 64], TensorProto.FLOAT)},
                       {"y": ([rows, 64], TensorProto.FLOAT)}, weights)
    ops = [n.op for n in run_pipeline(import_model(model)).nodes]
    assert ("Mul" not in ops) == fused, ops


@pytest.mark.parametrize("channels, side, epilogues", [(300, 7, 1), (300, 14, 3), (200, 14, 2)])
def test_output_tiles_of_a_small_block_share_one_epilogue(tmp, channels, side, epilogues):
    """A 1x1 convolution to 300 channels (three output tiles) over 7x7 pixels with a HardSwish: the tiles' banks lie
    side by side in one, and the hard activation runs once over them all (one ScalarE relu and one VectorE
    product, where each tile took its own), exact to bf16 operands; over 14x14 pixels each tile keeps its own: 196
    columns a tile are enough for an instruction to run efficiently, and apart the first tile's reader starts
    sooner (two tiles would fit a bank; three would not)."""
    from neuronx_cc_lite.compiler import Options
    from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
    from tests.compiler.one_node import streams
    from tests.conftest import assert_close, compile_to_model

    rng = np.random.default_rng(6)
    weights = {"w": (rng.standard_normal((channels, 24, 1, 1)) * 2).astype(np.float32),
               "b": (rng.standard_normal(channels) * 3).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("HardSwish", ["c"], ["y"])]
    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    model = make_model(nodes, {"x": ([1, 24, side, side], TensorProto.FLOAT)},
                       {"y": ([1, channels, side, side], TensorProto.FLOAT)}, weights)
    engines = streams(model, options)
    assert engines["ACT"].count("activation") == epilogues
    assert engines["DVE"].count("scalar_tensor_tensor") == epilogues
    compiled = compile_to_model(model, tmp, options)
    inputs = seeded_inputs(compiled.inputs)
    ours, ref = compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs)
    assert (ref["y"] < 0).any() and (ref["y"] > 3).any()  # both sides of HardSwish's clamps
    assert_close(ours, ref, rtol=1e-5)


def _hard_after_product(op: str, rows: int, k: int, n: int, hard: str, then_gemm: bool = False) -> onnx.ModelProto:
    """A Gemm (with C) or MatMul (+ a bias row) then HardSwish or HardSigmoid, optionally read by one more Gemm (a
    MobileNetV3 classifier: 576 -> 1024 HardSwish -> 1000). Weights wide enough to cross both clamps."""
    rng = np.random.default_rng(8)
    weights = {"w": (rng.standard_normal((n, k) if op == "Gemm" else (k, n)) * 0.5).astype(np.float32),
               "b": (rng.standard_normal(n) * 3).astype(np.float32),
               "w2": rng.standard_normal((10, n)).astype(np.float32)}
    attrs = {"alpha": 0.3} if hard == "HardSigmoid" else {}
    if op == "Gemm":
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["p"], transB=1)]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]), helper.make_node("Add", ["q", "b"], ["p"])]
    nodes.append(helper.make_node(hard, ["p"], ["h"], **attrs))
    if then_gemm:
        nodes.append(helper.make_node("Gemm", ["h", "w2"], ["y"], transB=1))
    else:
        del weights["w2"]
        nodes[-1].output[0] = "y"
    return make_model(nodes, {"x": ([rows, k], TensorProto.FLOAT)}, {"y": ([rows, 10 if then_gemm else n],
                                                                           TensorProto.FLOAT)}, weights)


@pytest.mark.parametrize("op, rows, k, n, hard, then_gemm", [
    ("Gemm", 1, 96, 1024, "HardSwish", True),  # a classifier's hidden layer, feature-major, its blocks side by side
    ("MatMul", 200, 64, 48, "HardSigmoid", False),  # rows on partitions
    ("Gemm", 130, 40, 300, "HardSwish", False),
], ids=["classifier-hidden", "rows-hard-sigmoid", "gemm-two-row-blocks"])
def test_a_hard_activation_joins_its_product(tmp, op, rows, k, n, hard, then_gemm):
    """HardSwish or HardSigmoid after a MatMul or Gemm joins it (MatMulEpilogue), applied to the evacuated result
    in place: the fused model matches onnxruntime's, with values on both sides of both clamps."""
    from neuronx_cc_lite.compiler import Options, prepare
    from neuronx_cc_lite.reference import onnxruntime_outputs

    model = _hard_after_product(op, rows, k, n, hard, then_gemm)
    assert hard not in [node.op for node in prepare(model, Options()).nodes]
    check(model, tmp)
    alone = _hard_after_product(op, rows, k, n, hard)  # the activation's own output: where the clamps fall
    x = np.random.default_rng(0).standard_normal((rows, k)).astype(np.float32)
    y = onnxruntime_outputs(alone, {"x": x})["y"]
    assert (y == 0).any() and ((y == 1) if hard == "HardSigmoid" else (y > 3)).any()


def test_a_classifiers_hidden_hard_swish_runs_once_over_its_blocks(tmp):
    """Under auto-cast, a one-row hidden layer of 1,024 features with a HardSwish, read by the next Gemm: its eight
    blocks of 128 share one bank, and the bias and the HardSwish (ScalarE's relu, VectorE's product) run once over
    all of them, where unfused each block took a relu and a product of its own (ACT: 9 activations, DVE: 9). The
    HardSwish reads the product in fp32 and the hidden layer (bf16 on chip: only a matmul reads it) is rounded
    once, after it: exact to the bf16 operands (rounded before the HardSwish too, 2.1e-3 of the rms off)."""
    import ml_dtypes

    from neuronx_cc_lite.compiler import Options
    from tests.compiler.one_node import streams
    from tests.conftest import compile_to_model

    model = _hard_after_product("Gemm", 1, 96, 1024, "HardSwish", then_gemm=True)
    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    engines = streams(model, options)
    assert engines["ACT"].count("activation") == 2  # the relu, the next Gemm's evacuation
    assert engines["DVE"].count("scalar_tensor_tensor") == 2  # the bias over the bank, the HardSwish's product
    w = {i.name: onnx.numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}

    def bf16(a: np.ndarray) -> np.ndarray:
        return a.astype(ml_dtypes.bfloat16).astype(np.float64)

    x = np.random.default_rng(0).standard_normal((1, 96)).astype(np.float32)
    p = bf16(x) @ bf16(w["w"]).T + w["b"]
    y = bf16(p * np.clip(p / 6 + 0.5, 0, 1)) @ bf16(w["w2"]).T
    ours = compile_to_model(model, tmp, options).run({"x": x})["y"]
    assert np.abs(ours - y).max() < 1e-5 * np.sqrt((y ** 2).mean())


def _conv_then(activation: list[str], opset: int = 17, bounds: tuple[float | None, float | None] = (0.0, 6.0),
               depthwise: bool = False) -> onnx.ModelProto:
    """A 3x3 convolution (or a depthwise one) with a bias, then ReLU6 (a Clip, MobileNetV2's) or SiLU (x *
    Sigmoid(x), EfficientNet's), weights wide enough that the values cross both of the Clip's bounds."""
    rng = np.random.default_rng(5)
    c = 24
    weights = {"w": (rng.standard_normal((c, 1 if depthwise else 8, 3, 3)) * 2).astype(np.float32),
               "b": rng.standard_normal(c).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=c if depthwise else 1)]
    if activation == ["Clip"] and opset >= 11:
        names = []
        for name, bound in zip(("lo", "hi"), bounds):
            if bound is not None:
                weights[name] = np.asarray(bound, np.float32)
            names.append(name if bound is not None else "")
        nodes.append(helper.make_node("Clip", ["c", *names], ["y"]))
    elif activation == ["Clip"]:
        nodes.append(helper.make_node("Clip", ["c"], ["y"], **{k: v for k, v in zip(("min", "max"), bounds)
                                                                if v is not None}))
    else:
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    return make_model(nodes, {"x": ([1, c if depthwise else 8, 20, 20], TensorProto.FLOAT)},
                      {"y": ([1, c, 20, 20], TensorProto.FLOAT)}, weights, opset=opset)


@pytest.mark.parametrize("activation, opset, bounds, depthwise", [
    (["Clip"], 17, (0.0, 6.0), False), (["Clip"], 17, (0.0, 6.0), True), (["Clip"], 17, (None, 1.5), False),
    (["Clip"], 6, (-1.0, 2.0), False), (["Sigmoid", "Mul"], 17, (None, None), False),
    (["Sigmoid", "Mul"], 17, (None, None), True),
], ids=["relu6", "relu6-depthwise", "max-only", "opset6-attributes", "silu", "silu-depthwise"])
def test_relu6_and_silu_join_their_convolution(tmp, activation, opset, bounds, depthwise):
    """A Clip after a convolution is its epilogue's activation (one VectorE instruction over the bank, its bounds
    carried as activation_min / activation_max); x * Sigmoid(x) is a Silu (canonicalize), ScalarE's function as the
    bank leaves PSUM: neither is a node of its own, and the result is onnxruntime's."""
    from neuronx_cc_lite.compiler import Options, prepare
    from neuronx_cc_lite.reference import onnxruntime_outputs

    model = _conv_then(activation, opset, bounds, depthwise)
    nodes = prepare(model, Options()).nodes
    assert [n.op for n in nodes] == ["ConvEpilogue"]
    assert nodes[0].attrs["activation"] == ("Clip" if activation == ["Clip"] else "Silu")
    check(model, tmp)
    x = np.random.default_rng(0).standard_normal((1, 24 if depthwise else 8, 20, 20)).astype(np.float32)
    y = onnxruntime_outputs(model, {"x": x})["y"]
    if activation == ["Clip"]:  # values at each bound there is
        assert all(bound is None or (y == np.float32(bound)).any() for bound in bounds)


def test_relu6_and_silu_join_a_matmul():
    """Gemm -> Clip(0, 6) and MatMul -> x * Sigmoid(x) (a Llama MLP's gate) are MatMulEpilogues with those
    activations, and compute onnxruntime's answer; a Sigmoid read by more than the Mul stays itself."""
    from neuronx_cc_lite.compiler import Options, prepare
    from tests.conftest import run_both, assert_close

    rng = np.random.default_rng(2)
    weights = {"w": (rng.standard_normal((64, 96)) * 0.5).astype(np.float32), "lo": np.asarray(0.0, np.float32),
               "hi": np.asarray(6.0, np.float32), "v": rng.standard_normal((64, 32)).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"]), helper.make_node("Clip", ["g", "lo", "hi"], ["y"]),
             helper.make_node("MatMul", ["x", "v"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Mul", ["m", "s"], ["z"])]
    model = make_model(nodes, {"x": ([40, 64], TensorProto.FLOAT)},
                       {"y": ([40, 96], TensorProto.FLOAT), "z": ([40, 32], TensorProto.FLOAT)}, weights)
    fused = prepare(model, Options()).nodes
    assert sorted(n.attrs.get("activation") for n in fused) == ["Clip", "Silu"], [n.op for n in fused]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)
    nodes[-1] = helper.make_node("Mul", ["m", "s"], ["z0"])
    nodes.append(helper.make_node("Add", ["z0", "s"], ["z"]))  # the Sigmoid read twice: no Silu
    twice = make_model(nodes, {"x": ([40, 64], TensorProto.FLOAT)},
                       {"y": ([40, 96], TensorProto.FLOAT), "z": ([40, 32], TensorProto.FLOAT)}, weights)
    assert "Sigmoid" in [n.op for n in prepare(twice, Options()).nodes]


def _channels_last_block() -> onnx.ModelProto:
    """ConvNeXt's residual step: the stream r is a channels-last tensor z permuted to channels first (and read by a
    convolution too); a Linear over z plus its bias, permuted back to channels first, is added to r."""
    rng = np.random.default_rng(5)
    c = 16
    weights = {"w": (rng.standard_normal((c, c)) / 4).astype(np.float32),
               "b": rng.standard_normal(c).astype(np.float32),
               "k": rng.standard_normal((c, 1, 3, 3)).astype(np.float32)}
    back = [0, 3, 1, 2]
    nodes = [helper.make_node("Transpose", ["z"], ["r"], perm=back),
             helper.make_node("Conv", ["r", "k"], ["d"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("MatMul", ["z", "w"], ["p"]),
             helper.make_node("Add", ["p", "b"], ["pb"]),
             helper.make_node("Transpose", ["pb"], ["t"], perm=back),
             helper.make_node("Add", ["r", "t"], ["y"])]
    shape = [1, c, 6, 5]
    return make_model(nodes, {"z": ([1, 6, 5, c], TensorProto.FLOAT)},
                      {"y": (shape, TensorProto.FLOAT), "d": (shape, TensorProto.FLOAT)}, weights)


def test_a_residual_added_after_both_permutes_joins_the_product(tmp):
    """Add(T(z), T(z W + b)) is T(z W + b + z): the Linear's epilogue adds z as its residual, one Transpose is left
    after it, and T(z) stays for the convolution."""
    from neuronx_cc_lite.compiler import Options, prepare

    nodes = prepare(_channels_last_block(), Options(stop_after="fuse-epilogues")).nodes
    assert [n.op for n in nodes] == ["Transpose", "Conv", "MatMulEpilogue", "Transpose"]
    assert nodes[2].inputs[3] == "z"
    check(_channels_last_block(), tmp)
