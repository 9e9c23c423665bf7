"""LSTM, GRU and RNN, unrolled by the expand-recurrent pass: every direction, layout, initial state, sequence
lengths (at compile time and at run time), activation, clip and optional output, compared with onnxruntime.

onnxruntime refuses layout 1 (batch first), so a layout-1 model is compared with onnxruntime running the layout-0
node on the transposed input, its outputs transposed back: what the layout attribute means.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.errors import UnsupportedError
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import assert_close, compile_to_model, make_model

F = TensorProto.FLOAT
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
T, B, I, H = 5, 3, 4, 6
LENS = np.array([5, 2, 4], np.int32)  # a full row, a short one, one that ends one step early


def _model(op: str, direction: str = "forward", layout: int = 0, bias: bool = True, initial: bool = False,
           lens: str = "", peephole: bool = False, weights_at_run_time: bool = False,
           outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"), seed: int = 0, lengths: np.ndarray = LENS,
           **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One recurrent node and the inputs to run it on. `lens`: "" (none), "const" or "input" (`lengths` either
    way)."""
    rng = np.random.default_rng(seed)
    d, g = (2 if direction == "bidirectional" else 1), GATES[op]
    batch_first = layout == 1
    tensors = {"W": rng.standard_normal((d, g * H, I)) * 0.5, "R": rng.standard_normal((d, g * H, H)) * 0.5}
    if bias:
        tensors["B"] = rng.standard_normal((d, 2 * g * H)) * 0.5
    if lens:
        tensors["sequence_lens"] = lengths
    state_shape = (B, d, H) if batch_first else (d, B, H)
    if initial:
        tensors["initial_h"] = rng.standard_normal(state_shape)
        if op == "LSTM":
            tensors["initial_c"] = rng.standard_normal(state_shape)
    if peephole:
        tensors["P"] = rng.standard_normal((d, 3 * H)) * 0.5
    tensors = {k: v.astype(np.int32 if k == "sequence_lens" else np.float32) for k, v in tensors.items()}
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"][:{"LSTM": 8, "GRU": 6, "RNN": 6}[op]]
    names = [n if n == "X" or n in tensors else "" for n in order]
    while names[-1] == "":
        names.pop()
    run_time = {k for k in tensors if weights_at_run_time or (k == "sequence_lens" and lens == "input")}
    feeds = {"X": rng.standard_normal((B, T, I) if batch_first else (T, B, I)).astype(np.float32)}
    feeds.update({k: tensors[k] for k in run_time})
    shapes = {"Y": [B, T, d, H] if batch_first else [T, d, B, H], "Y_h": list(state_shape), "Y_c": list(state_shape)}
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")[:3 if op == "LSTM" else 2]]
    while outs[-1] == "":
        outs.pop()
    node = helper.make_node(op, names, outs, name="rec", hidden_size=H, direction=direction, layout=layout, **attrs)
    model = make_model([node], {k: (list(v.shape), TensorProto.INT32 if v.dtype == np.int32 else F)
                                for k, v in feeds.items()},
                       {o: (shapes[o], F) for o in outs if o}, {k: v for k, v in tensors.items() if k not in run_time},
                       opset=14)
    return model, feeds


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs; for layout 1, of the layout-0 node on the transposed input and states."""
    node = model.graph.node[0]
    if not any(a.name == "layout" and a.i == 1 for a in node.attribute):
        return onnxruntime_outputs(model, feeds)
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    next(a for a in twin.graph.node[0].attribute if a.name == "layout").i = 0
    swap = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
    for t in twin.graph.initializer:
        if t.name in swap:
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t).transpose(swap[t.name]), t.name))
    for v in [*twin.graph.input, *twin.graph.output]:
        dims = v.type.tensor_type.shape.dim
        if len(dims) == 4:  # Y: [B, T, D, H] -> [T, D, B, H]
            order = (1, 2, 0, 3)
        elif v.name in ("X", "initial_h", "initial_c", "Y_h", "Y_c"):  # [B, D, H] -> [D, B, H] (X: [B, T, I])
            order = (1, 0, 2)
        else:
            continue
        sizes = [dims[k].dim_value for k in order]
        for k, n in enumerate(sizes):
            dims[k].dim_value = n
    outs = onnxruntime_outputs(twin, {k: v.transpose(swap[k]) if k in swap else v for k, v in feeds.items()})
    return {k: v.transpose((2, 0, 1, 3)) if v.ndim == 4 else v.transpose(1, 0, 2) for k, v in outs.items()}


def _check(tmp: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    expected = _reference(model, feeds)
    ours = compile_to_model(model, tmp).run(feeds, check_races=True)
    assert_close(ours, expected, rtol=1e-5)
    return ours


@pytest.mark.parametrize("op", GATES)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_every_direction_and_layout_with_initial_states(tmp, op, direction, layout):
    _check(tmp, *_model(op, direction, layout, initial=True))


@pytest.mark.parametrize("op", GATES)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", ["const", "input"])
def test_sequence_lengths_zero_the_padding_and_keep_the_last_valid_state(tmp, op, direction, lens):
    model, feeds = _model(op, direction, lens=lens, initial=True)
    ours = _check(tmp, model, feeds)
    y = ours["Y"]
    for b, n in enumerate(LENS):  # the comparison above holds this already; said here as ONNX states it
        assert np.all(y[n:, :, b] == 0) and np.all(y[:n, :, b] != 0)


def test_a_row_of_length_zero_known_at_compile_time(tmp):
    _check(tmp, *_model("LSTM", "bidirectional", initial=True, lens="const", lengths=np.array([0, 5, 3], np.int32)))


def test_sequence_lengths_at_run_time_batch_first(tmp):
    _check(tmp, *_model("LSTM", "bidirectional", layout=1, lens="input", initial=True, peephole=True))


@pytest.mark.parametrize("op", GATES)
def test_sequence_lengths_at_run_time_are_read_at_run_time(tmp, op):
    """One bundle, three sets of lengths: the masks come from the input, not from values seen at compile time; a
    row of length 0 gets zero states (not its initial ones), as onnxruntime gives it."""
    model, feeds = _model(op, "bidirectional", lens="input", initial=True)
    compiled = compile_to_model(model, tmp)
    for lens in (LENS, np.array([1, 5, 3], np.int32), np.array([0, 5, 3], np.int32)):
        run = {**feeds, "sequence_lens": lens}
        assert_close(compiled.run(run), onnxruntime_outputs(model, run), rtol=1e-5)


@pytest.mark.parametrize("op", GATES)
def test_weights_given_at_run_time(tmp, op):
    _check(tmp, *_model(op, "bidirectional", initial=True, peephole=op == "LSTM", weights_at_run_time=True))


def test_weights_and_states_given_at_run_time_batch_first(tmp):
    """The initial states of layout 1, [B, D, H], sliced per direction on their second axis at run time."""
    _check(tmp, *_model("LSTM", "bidirectional", layout=1, initial=True, weights_at_run_time=True))


@pytest.mark.parametrize("op", GATES)
def test_without_bias_or_initial_state(tmp, op):
    _check(tmp, *_model(op, "bidirectional", bias=False))


@pytest.mark.parametrize("activation, alpha, beta", [
    ("Relu", None, None), ("Tanh", None, None), ("Sigmoid", None, None), ("Affine", 0.7, 0.3),
    ("LeakyRelu", 0.2, None), ("ThresholdedRelu", 0.4, None), ("ScaledTanh", 1.5, 0.6),
    ("HardSigmoid", 0.3, 0.4), ("Elu", 0.8, None), ("Softsign", None, None), ("Softplus", None, None),
    ("LeakyRelu", None, None), ("HardSigmoid", None, None), ("Elu", None, None),  # onnxruntime's defaults
])
def test_every_rnn_activation(tmp, activation, alpha, beta):
    attrs: dict[str, object] = {"activations": [activation]}
    if alpha is not None:
        attrs["activation_alpha"] = [alpha]
    if beta is not None:
        attrs["activation_beta"] = [beta]
    _check(tmp, *_model("RNN", initial=True, **attrs))


def test_alphas_are_consumed_by_the_functions_that_take_them(tmp):
    """Bidirectional LSTM, f/g/h per direction: only LeakyRelu, HardSigmoid and Affine read alpha (and the last two
    beta), in that order."""
    _check(tmp, *_model("LSTM", "bidirectional", initial=True, activations=[
        "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Softsign", "Affine"],
        activation_alpha=[0.1, 0.25, 0.5], activation_beta=[0.45, -0.2]))


def test_gru_activations(tmp):
    _check(tmp, *_model("GRU", "bidirectional", initial=True,
                        activations=["HardSigmoid", "Relu", "Sigmoid", "ScaledTanh"],
                        activation_alpha=[0.25, 0.9], activation_beta=[0.5, 1.1]))


@pytest.mark.parametrize("op", GATES)
def test_clip_bounds_every_activation_input(tmp, op):
    _check(tmp, *_model(op, "bidirectional", initial=True, lens="const", clip=0.4))


@pytest.mark.parametrize("peephole", [False, True])
def test_lstm_input_forget_and_peepholes(tmp, peephole):
    _check(tmp, *_model("LSTM", "bidirectional", initial=True, peephole=peephole, input_forget=1))


def test_lstm_peepholes_with_clip_and_lengths(tmp):
    _check(tmp, *_model("LSTM", "reverse", initial=True, peephole=True, clip=0.5, lens="input"))


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("bias", [False, True])
def test_gru_linear_before_reset(tmp, direction, bias):
    _check(tmp, *_model("GRU", direction, bias=bias, initial=True, linear_before_reset=1))


@pytest.mark.parametrize("outputs", [("Y",), ("Y_h",), ("Y_c",), ("Y", "Y_c")])
def test_optional_outputs(tmp, outputs):
    _check(tmp, *_model("LSTM", "bidirectional", layout=1, initial=True, outputs=outputs))


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_a_batch_first_input_is_projected_in_its_own_order(tmp, op):
    """torch's batch_first export: a Transpose of X [B, T, I] feeds a layout-0 node. The input projection takes X's
    rows as they lie, each step reading every T-th row, rather than a time-major copy of X made in rows of I
    elements (16-byte DMA pieces here); the answer matches onnxruntime."""
    from runtime.profile import small_pieces_by_node

    model, feeds = _model(op, "bidirectional", lens="const", initial=True)
    x = model.graph.input[0]
    x.name = "X_batch_first"
    dims = x.type.tensor_type.shape.dim
    dims[0].dim_value, dims[1].dim_value = B, T
    model.graph.node.insert(0, helper.make_node("Transpose", ["X_batch_first"], ["X"], perm=[1, 0, 2]))
    feeds = {"X_batch_first": feeds["X"].transpose(1, 0, 2).copy()}
    assert "Transpose" not in [n.op for n in prepare(model, Options()).nodes]
    assert small_pieces_by_node(compile_model(model)) == {}
    ours = compile_to_model(model, tmp).run(feeds, check_races=True)
    assert_close(ours, onnxruntime_outputs(model, feeds), rtol=1e-5)


def test_unrolled_into_matmuls_and_activations():
    """One input projection per direction over every step, then per step a matmul per gate, whose Add and
    activation fuse-epilogues folds in: no recurrent node is left for lowering."""
    model, _ = _model("LSTM")
    ops = [n.op for n in prepare(model, Options(stop_after="expand-recurrent")).nodes]
    assert "LSTM" not in ops
    assert ops.count("MatMul") == 1 + (T - 1) * 4  # the first step's state is the zero constant: its matmuls fold
    fused = [n.op for n in prepare(model, Options()).nodes]
    assert fused.count("MatMulEpilogue") == 1 + (T - 1) * 4 and "MatMul" not in fused
    assert fused.count("Sigmoid") == 3  # the first step's i, f and o gates, which have no matmul
    assert fused.count("Add") == T  # the cell's f*c + i*c~: the gates' Adds are in the matmuls, none at step 0


def test_an_unknown_activation_is_refused_naming_the_node():
    model, _ = _model("RNN", activations=["Swish"])
    with pytest.raises(UnsupportedError, match="'rec' \\(RNN\\): activation 'Swish' cannot be unrolled"):
        compile_model(model)


def test_list_operators_and_analyze_report_them(tmp, capsys):
    """list-operators names the three ops; analyze accepts a model of them (the model's LSTM, then the ops it
    unrolls into) and names a node it cannot unroll, with the reason."""
    from neuronx_cc_lite.cli import main

    assert main(["-q", "list-operators"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert {"LSTM", "GRU", "RNN"} <= listed
    onnx.save(_model("LSTM", "bidirectional", lens="input")[0], f"{tmp}/lstm.onnx")
    assert main(["-q", "analyze", f"{tmp}/lstm.onnx"]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 nodes of the model supported (100.0%)" in out and "LSTM                              1  yes" in out
    onnx.save(_model("GRU", activations=["Sigmoid", "Swish"])[0], f"{tmp}/gru.onnx")
    assert main(["-q", "analyze", f"{tmp}/gru.onnx"]) == 1
    assert "unsupported: rec (GRU): activation 'Swish' cannot be unrolled" in capsys.readouterr().out
