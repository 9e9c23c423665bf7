"""A static-cache export (its present is its past with the new rows written by TensorScatter, positions and the
write index given as inputs) generates the tokens onnxruntime gives fed the whole cache step by step."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.generate.generator import Generator

VOCABULARY, WIDTH, LENGTH = 48, 16, 24


def static_decoder() -> onnx.ModelProto:
    """One attention layer over a cache of LENGTH positions: k, v written at write_indices; a key is seen when its
    slot is at most the query's position and the mask holds it."""
    rng = np.random.default_rng(0)
    w = {name: (rng.standard_normal(shape) * scale).astype(np.float32) for name, shape, scale in (
        ("embed", (VOCABULARY, WIDTH), 1.0), ("place", (64, WIDTH), 1.0), ("wq", (WIDTH, WIDTH), 0.5),
        ("wk", (WIDTH, WIDTH), 0.5), ("wv", (WIDTH, WIDTH), 0.5), ("wo", (WIDTH, VOCABULARY), 0.5))}
    w["heads"] = np.array([1, 1, -1, WIDTH], np.int64)
    w["flat"] = np.array([1, -1, WIDTH], np.int64)
    w["slots"] = np.arange(LENGTH, dtype=np.int64).reshape(1, 1, 1, LENGTH)
    w["last"] = np.array([1, 1, -1, 1], np.int64)
    w["scale"] = np.array(1 / np.sqrt(WIDTH), np.float32)
    w["low"] = np.array(-1e9, np.float32)
    n = helper.make_node
    nodes = [
        n("Gather", ["embed", "input_ids"], ["e"]), n("Gather", ["place", "position_ids"], ["p"]),
        n("Add", ["e", "p"], ["x"]),
        *[m for name in "qkv" for m in (n("MatMul", ["x", f"w{name}"], [f"{name}2"]),
                                         n("Reshape", [f"{name}2", "heads"], [name]))],
        n("TensorScatter", ["past_key_values.0.key", "k", "write_indices"], ["present.0.key"], axis=2),
        n("TensorScatter", ["past_key_values.0.value", "v", "write_indices"], ["present.0.value"], axis=2),
        n("Transpose", ["present.0.key"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["raw"]), n("Mul", ["raw", "scale"], ["scores"]),
        n("Reshape", ["position_ids", "last"], ["query_at"]),
        n("LessOrEqual", ["slots", "query_at"], ["causal"]), n("Cast", ["attention_mask"], ["held"], to=9),
        n("And", ["causal", "held"], ["seen"]), n("Where", ["seen", "scores", "low"], ["masked"]),
        n("Softmax", ["masked"], ["attn"], axis=-1), n("MatMul", ["attn", "present.0.value"], ["mixed"]),
        n("Reshape", ["mixed", "flat"], ["y"]), n("Add", ["y", "x"], ["h"]), n("MatMul", ["h", "wo"], ["logits"]),
    ]
    cache = [1, 1, LENGTH, WIDTH]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "tokens"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, LENGTH]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "tokens"]),
              helper.make_tensor_value_info("write_indices", TensorProto.INT64, [1]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, cache),
              helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, cache)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "tokens", VOCABULARY]),
               helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, cache),
               helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, cache)]
    graph = helper.make_graph(nodes, "static_decoder", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])


def onnxruntime_greedy(model: onnx.ModelProto, prompt: list[int], new: int) -> list[int]:
    """Token by token, the host holding the cache and feeding it back whole."""
    session = ort.InferenceSession(model.SerializeToString())
    cache = {f"past_key_values.0.{kv}": np.zeros((1, 1, LENGTH, WIDTH), np.float32) for kv in ("key", "value")}
    tokens, out = list(prompt), []
    for at in range(len(prompt) + new - 1):
        feeds = {"input_ids": np.array([[tokens[at]]]), "position_ids": np.array([[at]]),
                 "write_indices": np.array([at]), "attention_mask": (np.arange(LENGTH) <= at)[None].astype(np.int64),
                 **cache}
        logits, k, v = session.run(None, feeds)
        cache = {"past_key_values.0.key": k, "past_key_values.0.value": v}
        if at >= len(prompt) - 1:
            tokens.append(int(np.argmax(logits[0, -1])))
            out.append(tokens[-1])
    return out


def test_static_cache_export_generates_onnxruntime_tokens(tmp):
    model = static_decoder()
    onnx.checker.check_model(model)
    path = os.path.join(tmp, "static.onnx")
    onnx.save(model, path)
    prompt = [7, 3, 30, 11]
    generator = Generator(path, buckets=[8])
    assert generator.max_length == LENGTH  # the export's own
    for sampling in ("greedy", "top-k"):  # the device's pick, and the host's (top_k=1 is greedy too)
        out = generator.generate(prompt, 10, sampling=sampling, top_k=1)
        assert out.tokens == onnxruntime_greedy(model, prompt, 10)
    with pytest.raises(CompileError, match="must be 24"):
        Generator(path, max_length=32)
