"""The Chrome/Perfetto trace of a run (runtime.profile.chrome_trace): a named process per core, a named thread per
stream in engine order, instruction details in args, and semaphore hand-offs as flow arrows."""

from __future__ import annotations

import copy
import os
import re

import onnx
import pytest

import runtime
from isa import bundle as bundle_format
from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.reference import bundle_inputs
from runtime.profile import chrome_trace
from tests.conftest import MODELS_DIR

ENGINE_ORDER = ["PE", "ACT", "DVE", "POOL", "SP"]


def _traced(bundle: bundle_format.Bundle, tmp: str) -> dict:
    path = os.path.join(tmp, "m.neff")
    bundle_format.write(bundle, path)
    model = runtime.load(path)
    model.run(bundle_inputs(model.bundle, 0), trace=True)
    return chrome_trace(model)


@pytest.fixture(scope="module")
def mlp_bundle() -> bundle_format.Bundle:
    return compile_model(onnx.load(os.path.join(MODELS_DIR, "mlp_odd.onnx")))


def _metadata(events: list[dict], name: str) -> dict:
    """(pid,) or (pid, tid) -> args of the metadata events called `name`."""
    found = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == name:
            key = (e["pid"], e["tid"]) if "tid" in e else (e["pid"],)
            assert key not in found, f"two {name} events for {key}"
            found[key] = e["args"]
    return found


def _stream_rank(name: str) -> tuple[int, int]:
    """Where a stream belongs: the engines in their fixed order, then the DMA queues by number."""
    if name in ENGINE_ORDER:
        return ENGINE_ORDER.index(name), 0
    match = re.fullmatch(r"DMA(\d+)", name)
    assert match, f"unexpected thread name {name!r}"
    return len(ENGINE_ORDER), int(match.group(1))


def test_every_core_is_a_named_process_and_every_stream_a_sorted_named_thread(mlp_bundle, tmp):
    trace = _traced(mlp_bundle, tmp)
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    processes = _metadata(events, "process_name")
    threads = _metadata(events, "thread_name")
    sort_index = _metadata(events, "thread_sort_index")
    assert processes == {(1,): {"name": "core 0"}}  # pid 0 is the kernel's swapper in Perfetto
    used = {(e["pid"], e["tid"]) for e in slices}
    assert all(isinstance(pid, int) and isinstance(tid, int) and tid > 0 for pid, tid in used)
    assert used <= set(threads) and set(threads) == set(sort_index)
    by_index = [threads[key]["name"] for key in sorted(threads, key=lambda k: sort_index[k]["sort_index"])]
    assert by_index[:4] == ["PE", "ACT", "DVE", "POOL"]
    assert by_index == sorted(by_index, key=_stream_rank)
    assert [n for n in by_index if n.startswith("DMA")] == [f"DMA{q}" for q in range(16)]
    # The tids run in the same order, for viewers that sort by tid.
    assert by_index == [threads[key]["name"] for key in sorted(threads, key=lambda k: k[1])]
    assert {threads[(e["pid"], e["tid"])]["name"] for e in slices if e["name"] == "nc_matmul"} == {"PE"}


def test_args_give_operands_bytes_node_and_the_semaphores_waited_on(mlp_bundle, tmp):
    events = _traced(mlp_bundle, tmp)["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    matmul = next(e for e in slices if e["name"] == "nc_matmul" and e["args"]["node"] == "/l0/MatMul")
    assert matmul["args"]["operands"]["dst"].startswith("fp32 PSUM[")
    assert set(matmul["args"]["operands"]) == {"dst", "stationary", "moving"}
    assert matmul["args"]["bytes_read"] > 0 and matmul["args"]["bytes_written"] > 0
    loads = [e for e in slices if e["cat"] == "DMA"]
    assert loads and all(e["args"]["hbm_bytes"] > 0 for e in loads)
    threads = _metadata(events, "thread_name")
    by_place = {(threads[e["pid"], e["tid"]]["name"], e["args"]["index"]): e for e in slices}
    waiting = [e for e in slices if "waits" in e["args"]]
    assert waiting
    for e in waiting:
        assert e["args"]["semaphore"] in e["args"]["waits"]
        stream, index, mnemonic = re.fullmatch(r"(\w+) #(\d+) (\w+)", e["args"]["released_by"]).groups()
        releaser = by_place[stream, int(index)]
        assert releaser["name"] == mnemonic
        assert releaser["args"]["signal"] == e["args"]["semaphore"].split(">=")[0]
        assert releaser["ts"] + releaser["dur"] <= e["ts"] + 1e-9


def test_semaphore_hand_offs_are_flow_arrows_from_signal_to_the_wait(mlp_bundle, tmp):
    events = _traced(mlp_bundle, tmp)["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and starts.keys() == finishes.keys()
    assert len(starts) == sum(e["ph"] == "s" for e in events)  # ids are unique

    def enclosing(point: dict) -> dict:
        found = [e for e in slices if (e["pid"], e["tid"]) == (point["pid"], point["tid"])
                 and e["ts"] < point["ts"] < e["ts"] + e["dur"]]
        assert len(found) == 1, point
        return found[0]

    for flow_id, start in starts.items():
        finish = finishes[flow_id]
        assert finish["bp"] == "e" and finish["cat"] == start["cat"] == "semaphore"
        assert finish["name"] == start["name"] and finish["pid"] == start["pid"]
        assert finish["tid"] != start["tid"]
        source, target = enclosing(start), enclosing(finish)
        assert source["args"]["signal"] == start["name"]
        assert any(w.startswith(start["name"] + ">=") for w in target["args"]["waits"])
        assert source["ts"] + source["dur"] <= target["ts"] + 1e-9  # the wait released after the signal
    # Every wait on another stream's semaphore has its arrow.
    cross = sum(1 for e in slices for w in e["args"].get("waits", ()))
    assert len(starts) <= cross


def test_each_core_is_its_own_process(mlp_bundle, tmp):
    """Two cores (the same program twice): two processes, flows never cross between them."""
    two = copy.copy(mlp_bundle)
    two.cores = [mlp_bundle.cores[0], mlp_bundle.cores[0]]
    events = _traced(two, tmp)["traceEvents"]
    assert _metadata(events, "process_name") == {(1,): {"name": "core 0"}, (2,): {"name": "core 1"}}
    assert {v["sort_index"] for v in _metadata(events, "process_sort_index").values()} == {0, 1}
    slices = [e for e in events if e["ph"] == "X"]
    assert sum(e["pid"] == 1 for e in slices) == sum(e["pid"] == 2 for e in slices) > 0
    flows = [e for e in events if e["ph"] in "sf"]
    for pid in (1, 2):
        ids = {e["id"] for e in flows if e["pid"] == pid}
        assert ids and all(e["pid"] == pid for e in flows if e["id"] in ids)
