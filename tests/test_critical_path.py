"""The critical path of a traced run (runtime/critical_path.py), and `profile`'s lines about it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.cli import main
from neuronx_cc_lite.reference import seeded_inputs
from isa.streams import StreamId
from runtime.critical_path import critical_path
from tests.conftest import compile_to_model, make_model

SLACK_NS = 1e-6


def _matmul_chain(n: int):
    """x @ w0 @ w1 ... @ w{n-1}: each product needs the one before it evacuated from PSUM."""
    rng = np.random.default_rng(0)
    weights = {f"w{k}": (rng.standard_normal((64, 64)) / 8).astype(np.float32) for k in range(n)}
    nodes = [helper.make_node("MatMul", [f"t{k}", f"w{k}"], [f"t{k + 1}"]) for k in range(n)]
    return make_model(nodes, {"t0": ([64, 64], TensorProto.FLOAT)}, {f"t{n}": ([64, 64], TensorProto.FLOAT)},
                      weights)


def _traced(model, tmp):
    m = compile_to_model(model, tmp)
    m.run(seeded_inputs(m.inputs), trace=True)
    ops = {(s.core, s.name): s.ops for s in m.simulator.streams}
    return m.last_run, ops


def test_the_chain_accounts_for_the_latency_link_by_link(tmp):
    """Each instruction on the path starts after the one before it ends, and follows it on its stream or waits on
    a semaphore the one before it brought to the value it waits for; their time and the time between them add
    up to the run's latency."""
    stats, ops = _traced(_matmul_chain(6), tmp)
    path = critical_path(stats.trace, ops)
    assert path.latency_ns == max(e.end for e in stats.trace)
    assert abs(sum(path.busy_ns.values()) + path.waiting_ns - path.latency_ns) < 1e-6
    assert path.events[-1].end == path.latency_ns and path.waiting_ns >= 0
    signals: dict[tuple[int, int], list] = {}
    for e in sorted(stats.trace, key=lambda e: e.end):
        signal = ops[e.core, e.stream][e.index].signal
        if signal is not None:
            signals.setdefault((e.core, signal), []).append(e)
    for before, after in zip(path.events, path.events[1:]):
        assert before.end <= after.start + SLACK_NS
        same_stream = (before.core, before.stream, before.index + 1) == (after.core, after.stream, after.index)
        released = any(signals[after.core, sem][value - 1] is before
                       for sem, value in ops[after.core, after.stream][after.index].waits
                       if 0 < value <= len(signals.get((after.core, sem), [])))
        assert same_stream or released


def test_a_chain_of_products_is_on_the_path_whole(tmp):
    """Six dependent products: each node's matmul and the evacuation after it lie on the path, in the nodes'
    order, between the load of the input and the store of the output."""
    stats, ops = _traced(_matmul_chain(6), tmp)
    path = critical_path(stats.trace, ops)
    steps = [(StreamId.parse(e.stream).engine.name, op.mnemonic, op.node)
             for e, op in ((e, ops[e.core, e.stream][e.index]) for e in path.events)]
    assert steps[0][:2] == ("DMA", "dma_copy") and steps[-1][:2] == ("DMA", "dma_copy")
    products = [node for _, mnemonic, node in steps if mnemonic == "nc_matmul"]
    assert products == [f"MatMul_{k}" for k in range(6)]
    for k, (engine, mnemonic, node) in enumerate(steps[:-1]):
        if mnemonic == "nc_matmul":  # the PSUM bank leaves on ScalarE or VectorE before the next product
            assert steps[k + 1][0] in ("ACT", "DVE") and steps[k + 1][2] == node
    assert {name for name, _ in path.nodes} == {f"MatMul_{k}" for k in range(6)}


def test_profile_prints_the_critical_path(tmp, capsys):
    model = _matmul_chain(4)
    path = f"{tmp}/chain.onnx"
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    assert main(["-q", "compile", path, "-o", f"{tmp}/m.neff"]) == 0
    capsys.readouterr()
    assert main(["-q", "profile", f"{tmp}/m.neff", "--json", f"{tmp}/s.json"]) == 0
    out = capsys.readouterr().out
    with open(f"{tmp}/s.json") as f:
        s = json.load(f)
    assert s["critical_instructions"] >= 8 and s["critical_nodes"]
    assert abs(sum(s["critical_busy_us"].values()) + s["critical_waiting_us"] - s["latency_us"]) < 1e-3
    line = next(line for line in out.splitlines() if line.startswith("critical path"))
    assert f"{s['critical_instructions']} instructions" in line
    assert f"{s['critical_waiting_us']:.1f} us between them" in line
    assert s["critical_nodes"][0]["node"] in out


def test_over_ranks_the_path_runs_through_the_collectives(tmp):
    """BERT at --tp 2: the path stays on the rank of the last event and takes the all-reduces that ordered it (a
    collective's instruction is on a collective stream of that rank), whose time it counts."""
    import onnx

    from neuronx_cc_lite.compiler import Options
    from tests.conftest import MODELS_DIR

    model = onnx.load(f"{MODELS_DIR}/bert_modern.onnx")
    m = compile_to_model(model, tmp, Options(tp=2))
    m.run(seeded_inputs(m.inputs), trace=True)
    ops = {(s.core, s.name): s.ops for s in m.simulator.streams}
    path = critical_path(m.last_run.trace, ops)
    assert len({e.core for e in path.events}) == 1
    collectives = [e for e in path.events if ops[e.core, e.stream][e.index].collective is not None]
    assert collectives and all("AllReduce" in ops[e.core, e.stream][e.index].node for e in collectives)
    assert path.busy_ns[StreamId.parse(collectives[0].stream).engine.name] >= sum(e.end - e.start for e in collectives)
    assert abs(sum(path.busy_ns.values()) + path.waiting_ns - path.latency_ns) < 1e-6


def test_the_paths_transfers_by_what_they_move(tmp):
    """The chain of products starts with the input's load and ends with the output's store: the path's transfers
    name them as inputs and outputs, and together take the DMA time the path spends (runtime/profile.py
    path_transfers)."""
    from runtime.profile import path_transfers

    m = compile_to_model(_matmul_chain(6), tmp)
    m.run(seeded_inputs(m.inputs), trace=True)
    ops = {(s.core, s.name): s.ops for s in m.simulator.streams}
    path = critical_path(m.last_run.trace, ops)
    found = path_transfers(m.bundle, path)
    assert sum(ns for _, ns, _ in found) == pytest.approx(path.busy_ns["DMA"])
    what = {w: n for w, _, n in found}
    assert what.get("inputs and outputs", 0) >= 2, found
    assert set(what) <= {"inputs and outputs", "weights", "on chip", "between operators through HBM"}
