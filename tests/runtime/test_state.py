"""Device state: tensors a bundle keeps in HBM across runs (runtime/state.py), compiled with `state=`."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import neuronx_cc_lite
import runtime
from isa import assembly
from isa import bundle as bundle_format
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.cli import main
from runtime.errors import InputError, LoadError
from tests.conftest import make_model


def _accumulator(scale: float = 2.0) -> object:
    """acc' = acc + x (state), y = acc' * scale."""
    nodes = [helper.make_node("Add", ["acc", "x"], ["acc_next"]), helper.make_node("Mul", ["acc_next", "k"], ["y"])]
    return make_model(nodes, {"acc": ([4, 8], TensorProto.FLOAT), "x": ([4, 8], TensorProto.FLOAT)},
                      {"acc_next": ([4, 8], TensorProto.FLOAT), "y": ([4, 8], TensorProto.FLOAT)},
                      {"k": np.full((1,), scale, np.float32)})


def _cache_writer() -> object:
    """cache' = ScatterND(cache, [[row]], update) (state), total = ReduceSum(cache')."""
    nodes = [helper.make_node("ScatterND", ["cache", "row", "update"], ["cache_next"]),
             helper.make_node("ReduceSum", ["cache_next"], ["total"], keepdims=0)]
    return make_model(nodes, {"cache": ([16, 8], TensorProto.FLOAT), "row": ([1, 1], TensorProto.INT64),
                              "update": ([1, 8], TensorProto.FLOAT)},
                      {"cache_next": ([16, 8], TensorProto.FLOAT), "total": ([], TensorProto.FLOAT)})


def test_state_persists_across_runs_and_never_crosses_to_the_host():
    b = neuronx_cc_lite.compile(_accumulator(), state={"acc": "acc_next"}, cache=False)
    assert [t.name for t in b.inputs] == ["x"] and [t.name for t in b.outputs] == ["y"]
    assert [t.name for t in b.state] == ["acc"]
    model = runtime.load(b)
    xs = np.random.default_rng(0).standard_normal((3, 4, 8)).astype(np.float32)
    for k in range(3):
        y = model.run({"x": xs[k]})["y"]
        np.testing.assert_allclose(y, 2 * xs[:k + 1].sum(0), rtol=1e-6)
        assert model.last_io == runtime.IoBytes(4 * 8 * 4, 4 * 8 * 4)  # x in, y out: nothing of the state
    assert model.state.bytes_to_host == 0 and model.state.bytes_to_device == 0
    np.testing.assert_allclose(model.state.read("acc"), xs.sum(0), rtol=1e-6)
    assert model.state.bytes_to_host == 4 * 8 * 4
    model.state.reset()
    np.testing.assert_array_equal(model.run({"x": xs[0]})["y"], 2 * xs[0])
    model.state.write("acc", np.ones((4, 8), np.float32))
    np.testing.assert_allclose(model.run({"x": xs[1]})["y"], 2 * (1 + xs[1]), rtol=1e-6)


def test_two_bundles_share_one_state():
    adds = runtime.load(neuronx_cc_lite.compile(_accumulator(2.0), state={"acc": "acc_next"}, cache=False))
    other = runtime.load(neuronx_cc_lite.compile(_accumulator(3.0), state={"acc": "acc_next"}, cache=False),
                         state=adds.state)
    x = np.ones((4, 8), np.float32)
    adds.run({"x": x})
    np.testing.assert_array_equal(other.run({"x": x})["y"], np.full((4, 8), 6.0))  # (1 + 1) * 3: it saw the first
    alone = runtime.load(neuronx_cc_lite.compile(_accumulator(3.0), state={"acc": "acc_next"}, cache=False))
    np.testing.assert_array_equal(alone.run({"x": x})["y"], np.full((4, 8), 3.0))  # state of its own, zeroed


def test_scatter_into_state_writes_in_place():
    """The cache is updated where it lies: no copy of it is made, and only the written row changes."""
    b = neuronx_cc_lite.compile(_cache_writer(), state={"cache": "cache_next"}, cache=False)
    kinds = {t.name: t.kind for t in b.hbm_tensors}
    assert kinds["cache"] == "state" and "cache_next" not in kinds
    model = runtime.load(b)
    rng = np.random.default_rng(1)
    expected = np.zeros((16, 8), np.float32)
    for row in (3, 0, 15, 3):
        update = rng.standard_normal((1, 8)).astype(np.float32)
        expected[row] = update[0]
        total = model.run({"row": np.array([[row]]), "update": update})["total"]
        np.testing.assert_allclose(total, expected.sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(model.state.read("cache"), expected)


def test_state_survives_the_listing_and_the_file(tmp):
    b = neuronx_cc_lite.compile(_accumulator(), state={"acc": "acc_next"}, cache=False)
    again = assembly.assemble(assembly.disassemble(b))
    assert bundle_format.to_bytes(again) == bundle_format.to_bytes(b)
    path = os.path.join(tmp, "acc.neff")
    bundle_format.write(b, path)
    assert bundle_format.read(path).state == b.state


def test_a_bundle_that_declares_state_otherwise_is_refused():
    first = runtime.load(neuronx_cc_lite.compile(_accumulator(), state={"acc": "acc_next"}, cache=False))
    wide = make_model([helper.make_node("Add", ["acc", "x"], ["acc_next"])],
                      {"acc": ([4, 16], TensorProto.FLOAT), "x": ([4, 16], TensorProto.FLOAT)},
                      {"acc_next": ([4, 16], TensorProto.FLOAT)})
    with pytest.raises(LoadError, match="state tensor 'acc'"):
        runtime.load(neuronx_cc_lite.compile(wide, state={"acc": "acc_next"}, cache=False), state=first.state)
    with pytest.raises(InputError, match="no state tensor 'nope'"):
        first.state.read("nope")
    with pytest.raises(InputError, match="shape"):
        first.state.write("acc", np.zeros((2, 2), np.float32))


def test_bad_state_pairs_are_named():
    reduced = make_model([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=1)],
                         {"x": ([4, 8], TensorProto.FLOAT)}, {"y": ([1, 1], TensorProto.FLOAT)})
    for model, state, match in ((reduced, {"x": "y"}, "differ"), (_accumulator(), {"acc": "nope"}, "an output")):
        with pytest.raises(CompileError, match=match) as e:
            neuronx_cc_lite.compile(model, state=state, cache=False)
        assert e.value.code == "NCC_OPTION"


def test_cli_compiles_and_runs_with_state(tmp, capsys):
    import onnx

    model_path, bundle = os.path.join(tmp, "acc.onnx"), os.path.join(tmp, "acc.neff")
    onnx.save(_accumulator(), model_path)
    assert main(["compile", model_path, "-o", bundle, "--state", "acc=acc_next", "--no-cache"]) == 0
    x = np.ones((4, 8), np.float32)
    np.savez(os.path.join(tmp, "in.npz"), x=x)
    np.savez(os.path.join(tmp, "s0.npz"), acc=np.full((4, 8), 5.0, np.float32))
    assert main(["run", bundle, "--inputs", os.path.join(tmp, "in.npz"), "--outputs", os.path.join(tmp, "out.npz"),
                 "--state-in", os.path.join(tmp, "s0.npz"), "--state-out", os.path.join(tmp, "s1.npz")]) == 0
    np.testing.assert_array_equal(np.load(os.path.join(tmp, "out.npz"))["y"], np.full((4, 8), 12.0))
    np.testing.assert_array_equal(np.load(os.path.join(tmp, "s1.npz"))["acc"], np.full((4, 8), 6.0))
    capsys.readouterr()
    assert main(["info", bundle]) == 0
    assert "state         acc: float32[4, 8]" in capsys.readouterr().out


def test_state_pieces_live_on_their_ranks():
    """A state tensor sharded as a --tp bundle would place it: a piece per rank, read back whole."""
    from isa.bundle import Placement, TensorInfo

    info = TensorInfo("cache", (4, 3), "float32", "fp32",
                      (Placement(0, 0, 0, 0, 2), Placement(1, 64, 0, 2, 4)))
    state = runtime.DeviceState()
    state.declare(info)
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    state.write("cache", value)
    np.testing.assert_array_equal(state.piece_array("cache", Placement(1, 999, 0, 2, 4)).view(np.float32),
                                  value[2:].reshape(-1))  # found by its slice and rank, wherever a bundle puts it
    np.testing.assert_array_equal(state.read("cache"), value)
    only_rank_0 = runtime.DeviceState(local=lambda rank: rank == 0)  # an MPI process holding rank 0
    only_rank_0.declare(info)
    assert only_rank_0.bytes_to_device == 0 and len(only_rank_0._pieces) == 1
