"""Weights declared but not present (neuronx_cc_lite/declared.py): a model compiled from its shapes alone gives the
program its weights would give, timed the same, with none of their bytes; the runtime refuses to run it. The
graph that models/llama_shapes.py builds is checked with values against onnxruntime."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import runtime
from isa.target import TARGETS
from neuronx_cc_lite.declared import Absent, contiguous, declared, is_declared
from neuronx_cc_lite.generate.generator import Generator
from runtime.profile import timed_run
from tests.conftest import MODELS_DIR

sys.path.insert(0, MODELS_DIR)
from llama_shapes import CONFIGS, build  # noqa: E402

TINY = CONFIGS["llama3-tiny"]


def test_a_declared_array_costs_one_element_and_keeps_its_shape():
    w = declared((128256, 4096), np.float32)  # Llama-3's embedding: 2.1 GB were it present
    assert w.strides == (0, 0)  # every element the one zero
    cut = contiguous(w[:, 128:256].T).astype(np.float16)  # np.ascontiguousarray would copy out its elements
    assert is_declared(cut) and cut.shape == (128, 128256) and cut.dtype == np.float16
    both = np.concatenate([w[:, :8], w[:, :4]], axis=1)
    assert is_declared(both) and both.shape == (128256, 12)
    assert is_declared(w * 2.0) and (w * np.float16(2)).dtype == np.float32
    data = cut.tobytes()
    assert isinstance(data, Absent) and len(data) == 128 * 128256 * 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama_shapes")
    paths = {}
    for kind in ("declared", "random"):
        paths[kind] = str(folder / f"{kind}.onnx")
        onnx.save(build(TINY, declared=kind == "declared"), paths[kind])
    return paths


def test_the_llama_graph_matches_onnxruntime(tiny):
    """The random-weight Llama-3 (tiny config): a prefill of 5 tokens and 5 decode steps through the device's KV
    cache give onnxruntime's logits (onnxruntime fed its own growing cache)."""
    prompt = [3, 17, 42, 9, 100]
    out = Generator(tiny["random"], max_length=16, cache=False).generate(prompt, 6)
    session = ort.InferenceSession(tiny["random"])
    empty = np.zeros((1, TINY.kv_heads, 0, TINY.head_size), np.float32)
    past = {f"past_key_values.{i}.{k}": empty for i in range(TINY.layers) for k in ("key", "value")}
    ids = prompt
    for step in range(6):
        start = len(prompt) + step - len(ids)
        feeds = {"input_ids": np.array([ids], np.int64),
                 "attention_mask": np.ones((1, start + len(ids)), np.int64),
                 "position_ids": np.arange(start, start + len(ids), dtype=np.int64)[None], **past}
        logits, *present = session.run(None, feeds)
        expected = logits[0, -1]
        np.testing.assert_allclose(out.logits[step], expected, rtol=1e-4, atol=1e-4)
        assert out.tokens[step] == int(np.argmax(expected))
        past = dict(zip(past, present))
        ids = [out.tokens[step]]


@pytest.mark.parametrize("tp", [1, 2])
def test_declared_weights_give_the_same_program_and_time_without_the_bytes(tiny, tp):
    """The decode step of the declared model: the same instruction streams and timeline as the random one's, its
    weights' bytes counted and left out, and a load refused."""
    bundles = {kind: Generator(path, max_length=32, tp=tp, cache=False).bundle("decode", 1, True)
               for kind, path in tiny.items()}
    got, want = bundles["declared"], bundles["random"]
    assert got.flags["weights"] == "declared" and "weights" not in want.flags
    for mine, theirs in zip(got.cores, want.cores, strict=True):
        assert mine.keys() == theirs.keys()
        for name in mine:
            assert mine[name].instructions == theirs[name].instructions, name
    present = sum(len(s.data) for s in want.weights)
    kept = sum(len(s.data) for s in got.weights)  # constants the compiler makes (masks, RoPE tables) stay
    assert got.stats["declared_weight_bytes"] + kept == present
    assert got.stats["declared_weight_bytes"] >= TINY.parameters * 4 * 0.9
    target = TARGETS["trn1"]
    assert timed_run(got, target).last_run.elapsed_ns == timed_run(want, target).last_run.elapsed_ns > 0
    with pytest.raises(runtime.LoadError, match="declared weights"):
        runtime.load(got)
