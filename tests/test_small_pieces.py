"""DMA pieces under 512 bytes where a partition's data is longer (isa/costs.small_pieces): the profile counts them,
and the models of models/ and the exporter families, all free of them (benchmarks/small_pieces.py takes the census),
stay free: a transposing copy once cut a Transpose into 4-byte pieces; the last three cut were ViT's patch embedding
(16-element patch rows, now lower/patches.py), the Llama layer's grouped keys (256-byte head rows stored by a copy,
now a view) and lstm_tagger's batch-first input (64-byte rows reordered, now projected in its own order)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from isa.costs import small_pieces
from isa.dtypes import DType
from isa.instructions import make
from isa.operand import Mem, Operand
from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.frontend import load_model
from runtime.profile import small_pieces_by_node
from tests.conftest import MODELS_DIR, assert_close, make_model, run_both
from tests.runtime.helpers import hbm, sbuf

CLEAN = ["attention_int8", "bert_hf", "bert_legacy", "bert_modern", "cnn_ops", "cnn_qdq", "cnn_qoperator",
         "gpt_legacy", "gpt_modern", "gru_classifier", "lstm_tagger", "mlp_small", "mlp_odd", "mlp_wide",
         "refine_loop", "resnet_small"]
CLEAN_FAMILIES = ["bert_base", "bert_large", "distilbert", "resnet18", "resnet50", "gpt2", "mobilenet_v3",
                  "unet_block", "scan", "llama_layer", "vit"]


def test_a_transposing_copy_is_all_small_pieces():
    """[64, 64] fp32 read by columns: one piece per element, 256 bytes of each row moved 4 at a time."""
    dst = Operand(Mem.HBM, DType.fp32, 0, 64, 0, ((64, 1),), 64)  # rows of 64, contiguous
    src = Operand(Mem.HBM, DType.fp32, 0, 64, 1 << 20, ((64, 64),), 1)  # the same walked down columns
    instr = make("dma_copy", dst=dst, src=src)
    assert small_pieces(instr) == 64 * 64


def test_whole_rows_and_short_rows_are_not_small():
    whole = make("dma_copy", dst=sbuf(128, 1024), src=hbm(0, 128, 1024))
    short = make("dma_copy", dst=sbuf(128, 16), src=hbm(0, 128, 16))  # 64 B is all a row has
    assert small_pieces(whole) == 0 and small_pieces(short) == 0


@pytest.mark.parametrize("name", CLEAN)
def test_models_free_of_small_pieces_stay_free(name):
    found = small_pieces_by_node(compile_model(os.path.join(MODELS_DIR, f"{name}.onnx")))
    assert found == {}, sorted(found.items(), key=lambda r: -r[1])[:5]


@pytest.mark.slow
@pytest.mark.parametrize("cast", ["bf16", "fp32"])
@pytest.mark.parametrize("name", CLEAN_FAMILIES)
def test_exporter_families_free_of_small_pieces_stay_free(name, cast):
    """The exporter families of benchmarks/exports.py (dynamo) that cut no small piece, as benchmarks/families.py
    compiles them."""
    pytest.importorskip("transformers")
    from benchmarks.exports import export
    from benchmarks.families import CASTS

    found = small_pieces_by_node(compile_model(load_model(export(name)), Options(**CASTS[cast])))
    assert found == {}, sorted(found.items(), key=lambda r: -r[1])[:5]


@pytest.mark.parametrize("case", [
    dict(n=2, c=3, m=8, kernel=[3, 3], pads=[1, 1, 1, 1]),  # few channels: the taps of a row share PE rows
    dict(n=1, c=3, m=8, kernel=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3]),  # a stem: no row phases (conv.py)
    dict(n=1, c=16, m=16, kernel=[3, 3], group=16, strides=[2, 2], pads=[1, 1, 1, 1]),  # depthwise, stride 2
    dict(n=1, c=40, m=24, kernel=[3, 5], pads=[1, 2, 1, 2], dilations=[1, 2]),  # a tap per matmul
], ids=["3x3-packed-batch2", "7x7-stem", "depthwise-stride2", "dilated"])
def test_convolution_windows_of_short_rows_load_whole_rows(tmp, case):
    """Rows of 20 fp32 (80 bytes): the windows hold the input's rows whole, one run per load (lower/windows.py),
    where their padded rows were a piece each; the answer matches onnxruntime."""
    from tests.compiler.one_node import check
    from tests.compiler.test_conv import conv

    model = conv("Conv", spatial=[12, 20], **case)
    assert small_pieces_by_node(compile_model(model)) == {}
    check(model, tmp)


def _grouped_query_attention(seq: int = 128, width: int = 256, heads: int = 8, kv_heads: int = 2,
                             head: int = 64) -> onnx.ModelProto:
    """Attention whose keys and values have fewer heads than its queries, repeated as transformers' repeat_kv
    writes it (Unsqueeze, Expand, Reshape), after an elementwise op in token-major rows (RoPE's in a Llama)."""
    rng = np.random.default_rng(0)
    weights = {"wq": rng.standard_normal((width, heads * head)), "wk": rng.standard_normal((width, kv_heads * head)),
               "wv": rng.standard_normal((width, kv_heads * head))}
    weights = {k: (v / 32).astype(np.float32) for k, v in weights.items()}
    weights.update({"q_shape": np.array([1, seq, heads, head]), "kv_shape": np.array([1, seq, kv_heads, head]),
                    "axes": np.array([2]), "repeat": np.array([1, kv_heads, heads // kv_heads, seq, head]),
                    "heads_shape": np.array([1, heads, seq, head]),
                    "cos": np.cos(rng.standard_normal((1, seq, 1, head))).astype(np.float32)})
    node = helper.make_node
    nodes = [node("MatMul", ["x", "wq"], ["q2"]), node("Reshape", ["q2", "q_shape"], ["q3"]),
             node("Transpose", ["q3"], ["q"], perm=[0, 2, 1, 3])]
    for t in ("k", "v"):
        nodes += [node("MatMul", ["x", f"w{t}"], [f"{t}2"]), node("Reshape", [f"{t}2", "kv_shape"], [f"{t}3"]),
                  node("Mul", [f"{t}3", "cos"], [f"{t}c"]),
                  node("Transpose", [f"{t}c"], [f"{t}h"], perm=[0, 2, 1, 3]),
                  node("Unsqueeze", [f"{t}h", "axes"], [f"{t}u"]), node("Expand", [f"{t}u", "repeat"], [f"{t}e"]),
                  node("Reshape", [f"{t}e", "heads_shape"], [f"{t}r"])]
    nodes += [node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]), node("MatMul", ["q", "kt"], ["s"]),
              node("Softmax", ["s"], ["p"], axis=-1), node("MatMul", ["p", "vr"], ["y"])]
    return make_model(nodes, {"x": ([1, seq, width], TensorProto.FLOAT)},
                      {"y": ([1, heads, seq, head], TensorProto.FLOAT)}, weights)


def test_grouped_keys_are_read_as_views_of_their_rows(tmp):
    """The Unsqueeze of repeat_kv only inserts an axis: a view of the keys' head-major view, whose 256-byte head
    rows each query head's matmul reads a row per partition, where a copy stored them to HBM a 256-byte piece
    each (a Llama layer's 512); the answer matches onnxruntime."""
    model = _grouped_query_attention()
    assert small_pieces_by_node(compile_model(model)) == {}
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-5)


def test_an_input_read_down_its_columns_loads_whole_rows(tmp):
    """a + b^T: the transposed input read as the sum's tiles want it would be a DMA piece per element (131,072);
    its rows are loaded whole and turned on the Tensor engine instead (relayout.load_transposed), as GPT-2's
    token-major embeddings beside its feature-major first projection. The answer matches onnxruntime."""
    nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]), helper.make_node("Add", ["a", "bt"], ["y"])]
    model = make_model(nodes, {"a": ([256, 512], TensorProto.FLOAT), "b": ([512, 256], TensorProto.FLOAT)},
                       {"y": ([256, 512], TensorProto.FLOAT)})
    assert small_pieces_by_node(compile_model(model)) == {}
    ours, ref = run_both(model, tmp)
    np.testing.assert_array_equal(ours["y"], ref["y"])


def test_a_transpose_output_is_free_of_small_pieces():
    node = helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])
    model = make_model([node], {"x": ([512, 384], TensorProto.FLOAT)}, {"y": ([384, 512], TensorProto.FLOAT)})
    assert small_pieces_by_node(compile_model(model)) == {}


def test_a_repeated_input_is_loaded_once_per_partition(tmp):
    """x - m with m [256, 1] (a mean, a mask column) repeated along the free axis: loaded as one element per
    partition and read with stride 0, not one 4-byte piece per element; the answer matches onnxruntime."""
    node = helper.make_node("Sub", ["x", "m"], ["y"])
    model = make_model([node], {"x": ([256, 512], TensorProto.FLOAT), "m": ([256, 1], TensorProto.FLOAT)},
                       {"y": ([256, 512], TensorProto.FLOAT)})
    assert small_pieces_by_node(compile_model(model)) == {}
    ours, ref = run_both(model, tmp)
    np.testing.assert_array_equal(ours["y"], ref["y"])


def test_a_scalar_given_at_run_time_is_loaded_once_per_partition(tmp):
    """x * s with s a run-time scalar (a dynamic quantization's scale): one element per partition, read with
    stride 0, not one 4-byte piece per element; the answer matches onnxruntime."""
    node = helper.make_node("Mul", ["x", "s"], ["y"])
    model = make_model([node], {"x": ([256, 512], TensorProto.FLOAT), "s": ([], TensorProto.FLOAT)},
                       {"y": ([256, 512], TensorProto.FLOAT)})
    assert small_pieces_by_node(compile_model(model)) == {}
    ours, ref = run_both(model, tmp)
    np.testing.assert_array_equal(ours["y"], ref["y"])


def test_an_outer_product_of_masks_matches(tmp):
    """And of a [S, 1] column and a [1, S] row, as exported attention masks combine a causal and a padding mask."""
    node = helper.make_node("And", ["a", "b"], ["y"])
    model = make_model([node], {"a": ([1, 1, 128, 1], TensorProto.BOOL), "b": ([1, 1, 1, 128], TensorProto.BOOL)},
                       {"y": ([1, 1, 128, 128], TensorProto.BOOL)})
    assert small_pieces_by_node(compile_model(model)) == {}
    ours, ref = run_both(model, tmp)
    np.testing.assert_array_equal(ours["y"], ref["y"])


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT32])
def test_a_where_between_constant_scalars_loads_neither(tmp, dtype):
    """Where(mask, 0, -inf) as an exported attention mask builds it (and the integer case): the scalars are filled
    on chip once and read with stride 0, not loaded one element per DMA piece; the answer matches onnxruntime."""
    np_type = {TensorProto.FLOAT: np.float32, TensorProto.INT32: np.int32}[dtype]
    low = -np.inf if dtype == TensorProto.FLOAT else -70000
    node = helper.make_node("Where", ["c", "a", "b"], ["y"])
    model = make_model([node], {"c": ([2, 1, 16, 16], TensorProto.BOOL)}, {"y": ([2, 1, 16, 16], dtype)},
                       {"a": np.array(0, np_type), "b": np.array(low, np_type)})
    assert small_pieces_by_node(compile_model(model)) == {}
    ours, ref = run_both(model, tmp)
    np.testing.assert_array_equal(ours["y"], ref["y"])


def _windows_after_layer_norm(side: int = 14, window: int = 7, channels: int = 96) -> onnx.ModelProto:
    """Swin's window partition straight after its LayerNorm, with no Pad between (a Pad of nothing is dropped):
    [1, side, side, C] -> windows of window x window tokens -> a Linear."""
    rng = np.random.default_rng(0)
    n = side // window
    weights = {"g": (1 + rng.standard_normal(channels) / 4).astype(np.float32),
               "b": (rng.standard_normal(channels) / 4).astype(np.float32),
               "w": (rng.standard_normal((channels, channels)) / 16).astype(np.float32),
               "split": np.array([1, n, window, n, window, channels]),
               "merged": np.array([n * n, window * window, channels])}
    node = helper.make_node
    nodes = [node("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1),
             node("Reshape", ["h", "split"], ["h6"]), node("Transpose", ["h6"], ["hw"], perm=[0, 1, 3, 2, 4, 5]),
             node("Reshape", ["hw", "merged"], ["windows"]), node("MatMul", ["windows", "w"], ["y"])]
    return make_model(nodes, {"x": ([1, side, side, channels], TensorProto.FLOAT)},
                      {"y": ([n * n, window * window, channels], TensorProto.FLOAT)}, weights)


def test_windows_of_a_layer_norm_move_runs_of_features(tmp):
    """The LayerNorm's home holds its features on the partitions; the windows' copy once went on those partitions
    too, to map onto the home, and stored each token's 96 features a piece each (18,816 pieces here, 301,056 in
    Swin-T's first stage: 637 us). The copy moves runs of features; the answer matches onnxruntime."""
    model = _windows_after_layer_norm()
    assert small_pieces_by_node(compile_model(model)) == {}
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)
