"""Tensor and data parallelism: every rank's program run together on the simulated chips matches onnxruntime;
the cuts are Megatron's (per-rank work shrinks, one AllReduce per pair); grouped-query attention with more ranks
than key/value heads; refusals name the node and the dimension; the moves between placements are exact."""

from __future__ import annotations

import logging
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.ir import Graph, Tensor
from neuronx_cc_lite.partition import partition, split_projections, whole_weights
from neuronx_cc_lite.partition.placement import PARTIAL, REPLICATED, Placement, Shard
from neuronx_cc_lite.partition.plan import Plan, choose, propagate
from neuronx_cc_lite.partition.ranks import _Builder
from neuronx_cc_lite.reference import bundle_inputs, onnxruntime_outputs

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
TRANSFORMERS = ("bert_legacy", "bert_modern", "gpt_legacy", "gpt_modern")


def _model(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(MODELS, f"{name}.onnx"))


def _check(model: onnx.ModelProto, **options: object) -> dict[str, np.ndarray]:
    bundle = compile_model(model, Options(**options))  # type: ignore[arg-type]
    inputs = bundle_inputs(bundle)
    got = runtime.load(bundle).run(inputs)
    expected = onnxruntime_outputs(model, inputs)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()),
                                   err_msg=f"{name} at {options}")
    return got


@pytest.mark.parametrize("model,options", [
    ("gpt_modern", {"tp": 2}),
    ("bert_legacy", {"tp": 4}),
    ("gpt_legacy", {"tp": 8, "target": "trn2", "lnc": 1}),
    ("bert_modern", {"dp": 2, "tp": 2, "target": "trn2", "lnc": 2}),
])
def test_models_match_onnxruntime(model: str, options: dict) -> None:
    _check(_model(model), **options)


@pytest.mark.slow
@pytest.mark.parametrize("model", TRANSFORMERS)
@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("target,lnc", [("trn1", None), ("trn2", 1), ("trn2", 2)])
def test_every_model_every_split(model: str, tp: int, target: str, lnc: int | None) -> None:
    _check(_model(model), tp=tp, target=target, lnc=lnc)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert_legacy", "bert_modern"])
def test_data_parallel_matches_one_rank(model: str) -> None:
    one = _check(_model(model))
    split = _check(_model(model), dp=2)
    for name in one:
        np.testing.assert_array_equal(split[name], one[name])  # each rank computes its rows as one rank would


def test_ranks_have_no_races() -> None:
    """Every access the collectives make is ordered by semaphores against the DMAs around them, on every rank,
    under seeded random interleavings too."""
    bundle = compile_model(_model("gpt_modern"), Options(tp=2))
    model = runtime.load(bundle)
    inputs = bundle_inputs(bundle)
    expected = onnxruntime_outputs(_model("gpt_modern"), inputs)["out"]
    for seed in range(2):
        got = model.run(inputs, policy="random", seed=seed, check_races=True)["out"]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_all_reduces_between_on_chip_tensors_run_sbuf_to_sbuf() -> None:
    """BERT's all-reduces join tensors kept on chip: each runs on SBUF homes, laid out as the matmul before it
    wrote its partial sums (feature-major), with no HBM round trip; gpt_modern's second one writes a graph output,
    which stays in HBM with its src. Both match onnxruntime, with no race under random interleavings."""
    for name, memories in (("bert_modern", ["SBUF"] * 4), ("gpt_modern", ["SBUF", "HBM"])):
        bundle = compile_model(_model(name), Options(tp=2))
        for streams in bundle.cores:
            ccs = streams["CC"].instructions
            assert [i.args["src"].mem.name for i in ccs] == memories
            assert all(i.args["dst"].mem is i.args["src"].mem for i in ccs)
        model = runtime.load(bundle)
        inputs = bundle_inputs(bundle)
        expected = onnxruntime_outputs(_model(name), inputs)
        got = model.run(inputs, policy="random", seed=1, check_races=True)
        for k, want in expected.items():
            np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_megatron_cuts_and_work_per_rank() -> None:
    """4 heads over 8 ranks: Q and K in 4 head blocks (each on 2 ranks), V and the FFN's first layer 8 ways; one
    AllReduce per attention block and per FFN, nothing gathered; each rank does an eighth of the matmul work or
    a little more (the scores of a head computed on both its ranks)."""
    g = split_projections.run(prepare(os.path.join(MODELS, "bert_modern.onnx"), Options()))
    plan = choose(g, 8)
    layer = "/encoder/layer.0"
    assert plan.decisions[f"{layer}/attention/self/query/MatMul"] == Shard(-1, 4, 2)
    assert plan.decisions[f"{layer}/attention/self/key/MatMul"] == Shard(-1, 4, 2)
    assert plan.decisions[f"{layer}/attention/self/value/MatMul"] == Shard(-1, 8, 1)
    assert plan.decisions[f"{layer}/intermediate/dense/MatMul"] == Shard(-1, 8, 1)
    kinds = [m.kind for m in plan.moves if m.kind != "slice"]
    assert kinds == ["all_reduce"] * 4  # 2 layers x (attention, FFN)
    one = compile_model(_model("bert_modern"), Options())
    two = compile_model(_model("bert_modern"), Options(tp=2))
    assert max(two.stats["rank_flops"]) < 0.55 * one.stats["model_flops"]
    assert all(len(core["PE"].instructions) < len(one.cores[0]["PE"].instructions) for core in two.cores)
    assert two.groups == [(0, 1)] and len(two.cores) == 2 and sum(len(c["CC"].instructions) for c in two.cores) == 8
    four = compile_model(_model("bert_modern"), Options(tp=4))
    # ranks 1..3 differ only in their weights' bytes: one schedule, one set of streams (compile time)
    assert four.cores[1] is four.cores[2] is four.cores[3] and four.cores[0] is not four.cores[1]
    assert len({bytes(s.data) for s in four.weights if s.rank in (1, 2) and len(s.data) > 64}) > 1


def _gqa(q_heads: int = 8, kv_heads: int = 2, head: int = 8, seq: int = 16) -> onnx.ModelProto:
    """One attention block with grouped-query attention: K and V have kv_heads heads, each read by
    q_heads / kv_heads query heads (repeated with Unsqueeze, Expand, Reshape as exporters write it)."""
    rng = np.random.default_rng(0)
    hidden, group = q_heads * head, q_heads // kv_heads
    weights = {"wq": (hidden, hidden), "wk": (hidden, kv_heads * head), "wv": (hidden, kv_heads * head),
               "wo": (hidden, hidden)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32), k)
             for k, s in weights.items()]

    def const(name: str, value: list[int]) -> None:
        inits.append(numpy_helper.from_array(np.array(value, np.int64), name))

    const("q_shape", [1, seq, q_heads, head])
    const("kv_shape", [1, seq, kv_heads, head])
    const("rep_shape", [1, kv_heads, group, seq, head])
    const("heads_shape", [1, q_heads, seq, head])
    const("out_shape", [1, seq, hidden])
    const("axis2", [2])
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(head), np.float32), "scale"))
    nodes = [helper.make_node("LayerNormalization", ["x", "ln_w", "ln_b"], ["h"], axis=-1)]
    inits += [numpy_helper.from_array(np.ones(hidden, np.float32), "ln_w"),
              numpy_helper.from_array(np.zeros(hidden, np.float32), "ln_b")]
    for name, heads, shape in (("q", q_heads, "q_shape"), ("k", kv_heads, "kv_shape"), ("v", kv_heads, "kv_shape")):
        nodes += [helper.make_node("MatMul", ["h", f"w{name}"], [f"{name}_flat"]),
                  helper.make_node("Reshape", [f"{name}_flat", shape], [f"{name}_split"]),
                  helper.make_node("Transpose", [f"{name}_split"], [f"{name}_heads"], perm=[0, 2, 1, 3])]
    for name in ("k", "v"):
        nodes += [helper.make_node("Unsqueeze", [f"{name}_heads", "axis2"], [f"{name}_1"]),
                  helper.make_node("Expand", [f"{name}_1", "rep_shape"], [f"{name}_rep"]),
                  helper.make_node("Reshape", [f"{name}_rep", "heads_shape"], [f"{name}_all"])]
    nodes += [helper.make_node("Transpose", ["k_all"], ["k_t"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q_heads", "k_t"], ["scores"]),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
              helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v_all"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "out_shape"], ["ctx_flat"]),
              helper.make_node("MatMul", ["ctx_flat", "wo"], ["proj"]),
              helper.make_node("Add", ["proj", "x"], ["y"])]
    graph = helper.make_graph(nodes, "gqa", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("tp", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_grouped_query_attention_with_more_ranks_than_kv_heads(tp: int) -> None:
    model = _gqa()
    _check(model, tp=tp)
    ranks = partition(prepare(model, Options()), tp, 1)
    for r in ranks:  # each rank holds one of the 2 key/value heads (8 columns), 4 / tp ranks per head
        (k_weight,) = [t for n, t in r.graph.tensors.items() if n.startswith("wk")]
        assert k_weight.shape == (64, 8)
        (q_weight,) = [t for n, t in r.graph.tensors.items() if n.startswith("wq")]
        assert q_weight.shape == (64, 64 // tp)


def _embedding_and_head(vocab: int = 8192, hidden: int = 128) -> onnx.ModelProto:
    """Token ids -> a 4 MiB embedding table -> LayerNorm -> a head back to the vocabulary (an LM head)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "table"),
             numpy_helper.from_array((rng.standard_normal((hidden, vocab)) / np.sqrt(hidden)).astype(np.float32),
                                     "head"),
             numpy_helper.from_array(np.ones(hidden, np.float32), "g"),
             numpy_helper.from_array(np.zeros(hidden, np.float32), "b")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("LayerNormalization", ["e", "g", "b"], ["h"], axis=-1),
             helper.make_node("MatMul", ["h", "head"], ["logits"])]
    graph = helper.make_graph(nodes, "lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8, vocab])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_embedding_by_vocabulary_and_head_by_vocabulary() -> None:
    """The table is cut by rows (each rank zeros the ids outside its rows, one AllReduce sums them), the head by
    vocabulary columns, its output left where it was computed: a placement per rank."""
    model = _embedding_and_head()
    _check(model, tp=2)
    bundle = compile_model(model, Options(tp=2))
    assert [len(c["CC"].instructions) for c in bundle.cores] == [1, 1]
    table = 8192 * 128 * 4
    assert all(sum(len(s.data) for s in bundle.weights if s.rank == r) < 0.6 * 2 * table for r in (0, 1))
    (logits,) = bundle.outputs
    assert [(p.rank, p.axis, p.start, p.stop) for p in logits.placements] == [(0, 2, 0, 4096), (1, 2, 4096, 8192)]


def test_output_of_a_row_cut_pair_also_read_inside() -> None:
    """y, the partial sums of an MLP pair, is a model output and Softmax's input: one AllReduce serves both."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 128)).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((128, 64)) / 8).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"]), helper.make_node("Softmax", ["y"], ["z"], axis=-1)]
    graph = helper.make_graph(nodes, "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _check(model, tp=4)
    bundle = compile_model(model, Options(tp=4))
    assert [len(c["CC"].instructions) for c in bundle.cores] == [1] * 4


def _swiglu(tokens: int = 128, hidden: int = 64, inner: int = 256) -> onnx.ModelProto:
    """A Llama MLP: SiLU(x @ gate) * (x @ up) @ down. fuse-epilogues makes the product the up projection's epilogue,
    which reads the gate's SiLU: the gate, listed first, feeds a projection listed after it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((hidden, inner)) / 8).astype(np.float32), "w_gate"),
             numpy_helper.from_array((rng.standard_normal((hidden, inner)) / 8).astype(np.float32), "w_up"),
             numpy_helper.from_array((rng.standard_normal((inner, hidden)) / 16).astype(np.float32), "w_down")]
    nodes = [helper.make_node("MatMul", ["x", "w_gate"], ["gate"]), helper.make_node("Sigmoid", ["gate"], ["s"]),
             helper.make_node("Mul", ["gate", "s"], ["silu"]), helper.make_node("MatMul", ["x", "w_up"], ["up"]),
             helper.make_node("Mul", ["silu", "up"], ["h"]), helper.make_node("MatMul", ["h", "w_down"], ["y"])]
    graph = helper.make_graph(nodes, "swiglu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [tokens, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_gate_cut_once_the_projection_it_feeds_is_cut() -> None:
    """Judged alone, the gate's cut would be gathered for the up projection's epilogue, not cut yet; the next sweep
    cuts it beside the up projection. Each rank computes a quarter of both, and one AllReduce follows the down
    projection (the gate was computed whole on every rank, and sliced)."""
    model = _swiglu()
    g = split_projections.run(prepare(model, Options()))
    assert [n.op for n in g.nodes] == ["MatMulEpilogue", "MatMulEpilogue", "MatMul"]  # the order that hid the cut
    plan = choose(g, 4)
    assert plan.decisions == {g.nodes[0].name: Shard(-1, 4, 1), g.nodes[1].name: Shard(-1, 4, 1)}
    assert [m.kind for m in plan.moves] == ["all_reduce"]
    _check(model, tp=4)
    one = compile_model(model, Options())
    four = compile_model(model, Options(tp=4))
    assert max(four.stats["rank_flops"]) < 0.3 * one.stats["model_flops"]


def test_weights_whole_on_every_rank_are_named(caplog: pytest.LogCaptureFixture) -> None:
    """A plan that leaves the gate whole (its cut judged before the up projection's) reads its 2 MiB on every rank:
    whole_weights names it; the plan chosen leaves none, and --tp stays quiet. A head of 1,001 columns (7 x 11 x 13)
    cannot be cut 4 or 2 ways: a quarter of the weights read whole on every rank, and --tp warns."""
    g = split_projections.run(prepare(_swiglu(hidden=512, inner=1024), Options()))
    up = g.nodes[1].name
    lopsided = propagate(g, 4, {up: Shard(-1, 4, 1)})
    assert [(node.name, nbytes) for node, nbytes in whole_weights(g, lopsided)] == [(g.nodes[0].name, 512 * 1024 * 4)]
    assert whole_weights(g, choose(g, 4)) == []
    with caplog.at_level(logging.WARNING):
        compile_model(_swiglu(hidden=512, inner=1024), Options(tp=4))
    assert not [r for r in caplog.records if "whole on every rank" in r.getMessage()]
    rng = np.random.default_rng(0)
    model = _swiglu(hidden=512, inner=1024)
    model.graph.node.append(helper.make_node("MatMul", ["y", "head"], ["logits"], name="lm_head"))
    model.graph.initializer.append(numpy_helper.from_array((rng.standard_normal((512, 1001)) / 32).astype(np.float32),
                                                           "head"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("logits", TensorProto.FLOAT, [128, 1001]))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        compile_model(model, Options(tp=4))
    (warning,) = [r.getMessage() for r in caplog.records if "whole on every rank" in r.getMessage()]
    assert warning.startswith("--tp 4: 2.0 MiB of the 8.0 MiB of matmul weights") and "'lm_head' 2.0 MiB" in warning


def _fused_projections(hidden: int = 64, heads: int = 4, seq: int = 16, form: str = "slices") -> onnx.ModelProto:
    """Attention scores from one fused Q/K/V product and a SwiGLU from one fused gate/up product, as exports spell
    them: Phi-3's Q, K and V Sliced out of the last axis and its gate and up Split in two ("slices"), or Falcon's
    product Reshaped into heads and Split by head ("heads"). Plain MatMuls, no bias."""
    rng = np.random.default_rng(0)
    d = hidden // heads
    inits = [numpy_helper.from_array((rng.standard_normal((hidden, 3 * hidden)) / 8).astype(np.float32), "w_qkv"),
             numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / 8).astype(np.float32), "w_o"),
             numpy_helper.from_array((rng.standard_normal((hidden, 4 * hidden)) / 8).astype(np.float32), "w_gu"),
             numpy_helper.from_array((rng.standard_normal((2 * hidden, hidden)) / 16).astype(np.float32), "w_down"),
             numpy_helper.from_array(np.array([seq, heads, d], np.int64), "heads_shape"),
             numpy_helper.from_array(np.array([seq, hidden], np.int64), "rows_shape"),
             numpy_helper.from_array(np.array([seq, 3 * heads, d], np.int64), "qkv_heads"),
             numpy_helper.from_array(np.array([heads, heads, heads], np.int64), "by_head"),
             numpy_helper.from_array(np.array([-1], np.int64), "last")]
    for i in range(4):
        inits.append(numpy_helper.from_array(np.array([i * hidden], np.int64), f"at{i}"))
    nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"])]
    if form == "slices":
        nodes += [helper.make_node("Slice", ["qkv", f"at{i}", f"at{i + 1}", "last"], [f"{n}_rows"])
                  for i, n in enumerate("qkv")]
        nodes += [helper.make_node("Reshape", [f"{n}_rows", "heads_shape"], [n]) for n in "qkv"]
    else:
        nodes += [helper.make_node("Reshape", ["qkv", "qkv_heads"], ["qkv_h"]),
                  helper.make_node("Split", ["qkv_h", "by_head"], ["q", "k", "v"], axis=1)]
    nodes += [helper.make_node("Transpose", ["q"], ["qt"], perm=[1, 0, 2]),
              helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 2, 0]),
              helper.make_node("Transpose", ["v"], ["vt"], perm=[1, 0, 2]),
              helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[1, 0, 2]),
              helper.make_node("Reshape", ["ctx_t", "rows_shape"], ["ctx_rows"]),
              helper.make_node("MatMul", ["ctx_rows", "w_o"], ["attn"]),
              helper.make_node("Add", ["x", "attn"], ["h"]),
              helper.make_node("MatMul", ["h", "w_gu"], ["gu"]),
              helper.make_node("Split", ["gu"], ["gate", "up"], axis=-1, num_outputs=2),
              helper.make_node("Sigmoid", ["gate"], ["sg"]), helper.make_node("Mul", ["gate", "sg"], ["silu"]),
              helper.make_node("Mul", ["silu", "up"], ["act"]),
              helper.make_node("MatMul", ["act", "w_down"], ["mlp"]), helper.make_node("Add", ["h", "mlp"], ["y"])]
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("form", ["slices", "heads"])
def test_fused_projections_cut_apart(form: str) -> None:
    """split-projections gives each Slice or Split piece its own matmul, so every weight is cut and nothing read
    whole: before, the plain MatMuls (and the Slices, and the Split by head) kept the fused products whole on
    every rank. The MLP reads the attention's partial sums (no norm between): the gate is cut all the same."""
    model = _fused_projections(form=form)
    g = split_projections.run(prepare(model, Options()))
    products = [n for n in g.nodes if n.op in ("MatMul", "MatMulEpilogue") and n.inputs[1] in g.tensors
                and g.tensors[n.inputs[1]].is_constant]
    assert len(products) == 7  # Q, K, V, the output, gate, up, down
    plan = choose(g, 4)
    assert whole_weights(g, plan) == []
    assert {(m.kind, m.tensor) for m in plan.moves if m.kind != "slice"} == {("all_reduce", "h"), ("all_reduce", "y")}
    _check(model, tp=4)
    bundle = compile_model(model, Options(tp=4))
    assert [len(c["CC"].instructions) for c in bundle.cores] == [2] * 4  # h read by gate and up: one AllReduce


def test_refusals_name_the_node_and_dimension() -> None:
    with pytest.raises(CompileError) as e:
        compile_model(_model("bert_modern"), Options(tp=3))
    assert e.value.code == "NCC_OPTION" and "not divisible by 3" in str(e.value) and e.value.node
    with pytest.raises(CompileError) as e:
        compile_model(_model("gpt_modern"), Options(dp=2))
    assert e.value.code == "NCC_OPTION" and "dimension 0 of input 'hidden'" in str(e.value)
    with pytest.raises(CompileError) as e:
        compile_model(_model("gpt_modern"), Options(tp=512))
    assert e.value.code == "NCC_OPTION" and "holds at most 256" in str(e.value)
    with pytest.raises(CompileError) as e:
        compile_model(_model("gpt_modern"), Options(tp=2, lnc=2))
    assert e.value.code == "NCC_OPTION" and "--lnc" in str(e.value)


def test_one_rank_bundle_has_no_rank_flags() -> None:
    bundle = compile_model(_model("mlp_small"), Options())
    assert len(bundle.cores) == 1 and bundle.groups == [] and "tp" not in bundle.flags
    assert all(p.rank == 0 for t in bundle.inputs + bundle.outputs for p in t.placements)


# ---- the moves between placements, rank by rank, against numpy ------------------------------------------------

def _run_moves(b: _Builder, values: dict[str, np.ndarray], n: int, group_values: list[dict[str, np.ndarray]]
               ) -> None:
    """Evaluate the nodes a builder made (Slice, Reshape, Transpose, collectives) with numpy."""
    for node in b.nodes:
        x = values[node.inputs[0]]
        if node.op == "Slice":
            starts, ends, axes = (b.tensors[name].value for name in node.inputs[1:4])
            index = [slice(None)] * x.ndim
            for s, e, a in zip(starts, ends, axes):
                index[a] = slice(s, e)
            y = x[tuple(index)]
        elif node.op == "Reshape":
            y = x.reshape(b.tensors[node.inputs[1]].value)
        elif node.op == "Transpose":
            y = x.transpose(node.attrs["perm"])
        else:
            everyone = [v[node.inputs[0]] for v in group_values]
            if node.op == "AllGather":
                y = np.stack(everyone)
            elif node.op == "AllReduce":
                y = sum(everyone)
            else:
                total = sum(everyone).reshape(n, -1)[b.rank]
                y = total.reshape(b.tensors[node.outputs[0]].shape)
        values[node.outputs[0]] = y


@pytest.mark.parametrize("have,want", [
    (Placement((Shard(1, 4, 2),)), REPLICATED),  # 4 blocks, each on 2 ranks: gathered
    (Placement.of([Shard(0, 2, 4), Shard(2, 4, 1)]), REPLICATED),  # two axes: gathered and reordered
    (Placement((Shard(1, 4, 2),)), Placement((Shard(1, 8, 1),))),  # a local slice
    (Placement((Shard(2, 8, 1),)), Placement((Shard(1, 2, 1),))),  # another axis: gathered, then sliced
    (PARTIAL, REPLICATED),
    (PARTIAL, Placement((Shard(0, 8, 1),))),  # reduce-scatter
    (PARTIAL, Placement((Shard(2, 2, 4),))),  # all-reduce, then sliced
])
def test_moves_between_placements(have: Placement, want: Placement) -> None:
    n, shape = 8, (8, 8, 16)
    whole = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    g = Graph("moves", [], {"x": Tensor("x", shape, np.dtype(np.float32))}, ["x"], [], 13)
    plan = Plan(n, {})
    builders = [_Builder(g, plan, t, 0) for t in range(n)]
    values: list[dict[str, np.ndarray]] = []
    for t, b in enumerate(builders):
        if have.partial:
            local = whole / n if t else whole - whole / n * (n - 1)
        else:
            local = whole[tuple(slice(a, z) for a, z in have.box(shape, t))]
        values.append({"x": local})
        b.result = b.convert("x", have, want, shape)  # type: ignore[attr-defined]
    for step in range(max(len(b.nodes) for b in builders)):  # ranks in lock step: collectives see every rank
        for t, b in enumerate(builders):
            if step < len(b.nodes):
                node = b.nodes[step]
                mine = _Builder(g, plan, t, 0)
                mine.nodes, mine.tensors = [node], b.tensors
                _run_moves(mine, values[t], n, values)
    for t, b in enumerate(builders):
        expected = whole[tuple(slice(a, z) for a, z in want.box(shape, t))]
        np.testing.assert_allclose(values[t][b.result], expected, rtol=1e-5, atol=1e-5)  # type: ignore[attr-defined]


def test_the_schedule_prices_a_collective_on_its_group() -> None:
    """A rank's schedule times its all-reduce as the runtime will, on its whole replica group (24 inf2 ranks: set
    by compile_graph), not as a two-rank one: the program's dependency chain, one all-reduce of 4 MB, is the
    collective cost model's price for that group."""
    from isa.collectives import collective_cost, topology
    from isa.dtypes import DType
    from isa.functions import AluOp
    from isa.operand import Engine
    from isa.target import get_target
    from isa.tensor_kind import TensorKind
    from neuronx_cc_lite.codegen.schedule import dependency_chain_ns
    from neuronx_cc_lite.tile.program import HbmAccess, Program

    target = get_target("inf2")
    program = Program(target)
    rows, free = 128, 8192
    x, y = (program.hbm_tensor(name, rows * free * 4, TensorKind.SCRATCH, DType.fp32) for name in "xy")
    program.emit("all_reduce", Engine.CC, dst=HbmAccess(y, DType.fp32, rows, free, 0, ((free, 1),)),
                 src=HbmAccess(x, DType.fp32, rows, free, 0, ((free, 1),)), group=0, op=AluOp.add)
    two_ranks = dependency_chain_ns(program)
    program.groups, program.topology = [tuple(range(24))], topology(target, 1, 24)
    price = collective_cost("all_reduce", rows * free * 4, 4, tuple(range(24)), program.topology).ns
    assert dependency_chain_ns(program) == pytest.approx(price)
    assert price > 3 * two_ranks
