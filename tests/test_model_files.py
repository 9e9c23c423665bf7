"""Every model in models/ is valid ONNX and runs in onnxruntime to finite outputs on seeded, valid inputs.

This is about the model files alone; compiling them and comparing with onnxruntime is
tests/compiler/test_models.py.
"""

from __future__ import annotations

import glob
import os
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.conftest import MODELS_DIR
from neuronx_cc_lite.ir import outer_reads
from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs

MODELS = sorted(glob.glob(os.path.join(MODELS_DIR, "*.onnx")))
LEGACY = [p for p in MODELS if p.endswith("_legacy.onnx")]


def model_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """seeded_inputs for the float inputs; integer inputs made valid for what they feed: an attention_mask gets
    rows of ones then zeros (row 0 all ones, the others padded, at least one one per row), the indices of a
    Gather into a weight table (token ids) are uniform over the table's rows, a recurrent node's sequence lengths
    run from 1 to its steps."""
    infos = [SimpleNamespace(name=i.name, shape=tuple(d.dim_value for d in i.type.tensor_type.shape.dim),
                             dtype=np.dtype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)))
             for i in model.graph.input]
    inputs = seeded_inputs(infos, seed)
    rng = np.random.default_rng(seed + 1)
    tables = {t.name: t.dims for t in model.graph.initializer}
    for info in infos:
        if not np.issubdtype(info.dtype, np.integer):
            continue
        if "mask" in info.name:
            rows, cols = info.shape
            lengths = rng.integers(1, max(cols, 2), rows)
            lengths[0] = cols
            inputs[info.name] = (np.arange(cols)[None, :] < lengths[:, None]).astype(info.dtype)
            continue
        recurrent = [n for n in model.graph.node
                     if n.op_type in ("LSTM", "GRU", "RNN") and n.input[4:5] == [info.name]]
        if recurrent:  # sequence lengths: 1 to the steps of X (time first), one row full
            steps = next(i for i in infos if i.name == recurrent[0].input[0]).shape[0]
            inputs[info.name] = rng.integers(1, steps + 1, info.shape).astype(info.dtype)
            inputs[info.name][0] = steps
            continue
        gathers = [n for n in model.graph.node if n.op_type == "Gather" and n.input[1] == info.name]
        sizes = [tables[n.input[0]][next((a.i for a in n.attribute if a.name == "axis"), 0)]
                 for n in gathers if n.input[0] in tables]
        assert sizes, f"no rule for valid values of integer input {info.name}"
        inputs[info.name] = rng.integers(0, min(sizes), info.shape).astype(info.dtype)
    return inputs


def test_models_are_there():
    names = {os.path.basename(p) for p in MODELS}
    assert {"resnet_small.onnx", "cnn_ops.onnx", "bert_legacy.onnx", "bert_modern.onnx", "gpt_legacy.onnx",
            "gpt_modern.onnx", "lstm_tagger.onnx", "gru_classifier.onnx", "cnn_qdq.onnx",
            "attention_int8.onnx", "refine_loop.onnx", "bert_hf.onnx"} <= names


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_model_passes_the_checker(path):
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert {w.name for w in model.graph.initializer}.isdisjoint(i.name for i in model.graph.input)


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_every_node_output_is_used(path):
    """No dead ends: each node output feeds a node or is a graph output (an optional output left out is no
    output: the GRU's Y in gru_classifier)."""
    graph = onnx.load(path).graph
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output} | {
        name for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
        for name in outer_reads(a.g)}  # read in a subgraph: refine_loop's If result, in its Loop body
    dead = [f"{n.name}: {o}" for n in graph.node for o in n.output if o and o not in used]  # "": not asked for
    assert not dead


@pytest.mark.parametrize("path", MODELS, ids=os.path.basename)
def test_model_runs_in_onnxruntime(path):
    model = onnx.load(path)
    for seed in range(2):
        outputs = onnxruntime_outputs(model, model_inputs(model, seed))
        assert list(outputs) == [o.name for o in model.graph.output]
        for declared in model.graph.output:
            y = outputs[declared.name]
            assert y.shape == tuple(d.dim_value for d in declared.type.tensor_type.shape.dim), declared.name
            assert y.dtype == helper.tensor_dtype_to_np_dtype(declared.type.tensor_type.elem_type), declared.name
            assert np.isfinite(y).all(), declared.name
            assert y.size == 1 or np.ptp(y) > 0, f"{declared.name} is constant"


def test_integer_inputs_are_valid():
    model = onnx.load(os.path.join(MODELS_DIR, "bert_legacy.onnx"))
    vocab = next(numpy_helper.to_array(t).shape[0] for t in model.graph.initializer
                 if t.name == "embeddings.word_embeddings.weight")
    for seed in range(4):
        inputs = model_inputs(model, seed)
        assert inputs["input_ids"].dtype == np.int64 and 0 <= inputs["input_ids"].min()
        assert inputs["input_ids"].max() < vocab
        mask = inputs["attention_mask"]
        assert set(np.unique(mask)) <= {0, 1} and (mask.sum(axis=1) >= 1).all() and (mask == 0).any()


@pytest.mark.parametrize("path", LEGACY, ids=os.path.basename)
def test_legacy_and_modern_forms_agree(path):
    """The two exporter forms of a network carry the same weights and compute the same function."""
    legacy, modern = onnx.load(path), onnx.load(path.replace("_legacy.onnx", "_modern.onnx"))
    inputs = model_inputs(legacy)
    a, b = onnxruntime_outputs(legacy, inputs), onnxruntime_outputs(modern, inputs)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-5, err_msg=name)
