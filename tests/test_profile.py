"""`neuronx-cc-lite profile` and the summary behind it (runtime/profile.py); the inputs it generates, integers
inside the range the compiler records for them (neuronx_cc_lite/input_ranges.py)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from isa.costs import DmaCost
from isa.dtypes import DType
from isa.target import get_target
from neuronx_cc_lite.cli import main
from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.input_ranges import input_ranges
from neuronx_cc_lite.reference import bundle_inputs, onnxruntime_outputs
from runtime.profile import hbm_peak_gbps, roofline
from runtime.simulator import RunStats, TraceEvent
from tests.conftest import MODELS_DIR, compile_to_model, make_model

BERT = os.path.join(MODELS_DIR, "bert_modern.onnx")


def _cli(*args: str) -> int:
    return main(["-q", *args])


def _profile(tmp: str, model: str, capsys, *extra: str) -> tuple[str, dict]:
    neff = f"{tmp}/m.neff"
    assert _cli("compile", model, "-o", neff) == 0
    capsys.readouterr()
    assert _cli("profile", neff, "--json", f"{tmp}/summary.json", *extra) == 0
    with open(f"{tmp}/summary.json") as f:
        return capsys.readouterr().out, json.load(f)


def test_profile_prints_the_summary_and_writes_it_as_json(tmp, capsys):
    out, s = _profile(tmp, BERT, capsys)
    target = get_target("trn1")
    assert sorted(os.listdir(tmp)) == ["m.neff", "summary.json"]  # nothing half-written left beside them

    # The figures agree with their definitions and with the target's.
    latency_ns = s["latency_us"] * 1000
    assert s["peak_tflops"] == pytest.approx(target.pe_tflops(s["matmul_dtype"])) and s["matmul_dtype"] == "fp32"
    assert s["dma_gbps"] == target.core_dma_gbps and s["hbm_gbps"] == target.hbm_gbps
    assert s["mfu"] == pytest.approx(s["model_flops"] / (latency_ns * s["peak_tflops"] * 1000))
    assert s["mbu"] == pytest.approx(s["dma_hbm_pass_bytes"] / (latency_ns * s["dma_gbps"])) and s["mbu"] <= 1
    assert s["roofline_compute_us"] == pytest.approx(s["model_flops"] / (s["peak_tflops"] * 1e6))
    read, written, copies = s["roofline_read_bytes"], s["roofline_written_bytes"], s["roofline_copy_bytes"]
    assert s["roofline_bytes"] == read + written and copies == 0  # BERT's output is computed, not copied
    assert s["roofline_memory_us"] == pytest.approx(max(read + written - copies, read, written) / s["dma_gbps"]
                                                    / 1000)
    assert s["roofline_us"] == max(s["roofline_compute_us"], s["roofline_memory_us"])
    assert s["bound"] == ("compute" if s["roofline_compute_us"] >= s["roofline_memory_us"] else "memory")
    assert s["ratio"] == pytest.approx(s["latency_us"] / s["roofline_us"]) and s["ratio"] >= 1
    assert s["dma_average_bytes"] == pytest.approx(s["dma_bytes"] / s["dma_transfers"])
    assert 0 < s["dma_hbm_bytes"] <= 2 * s["dma_bytes"] and 0 < s["hbm_peak_gbps"] <= s["hbm_gbps"]
    assert set(s["engines"]) >= {"PE", "ACT", "DVE", "DMA"} and all(0 < v <= 1 for v in s["engines"].values())
    assert 1 <= s["dma_queues_used"] <= target.dma_queues
    assert s["spill_bytes"] >= 0 and s["scratch_bytes"] >= 0
    assert all(r["factor"] > 1 for r in s["reloads"])
    shares = [n["share"] for n in s["top_nodes"]]
    assert len(shares) == 8 and shares == sorted(shares, reverse=True) and sum(shares) <= 1 + 1e-9
    assert any("attention/self/MatMul" in n["node"] for n in s["top_nodes"])

    # The text says the same.
    lines = {line[:15].strip(): line[15:] for line in out.splitlines() if line[:15].strip()}
    assert set(lines) >= {"latency", "roofline", "MFU", "MBU", "engines", "DMA", "spilled", "top nodes"}
    assert lines["latency"].startswith(f"{s['latency_us']:.2f} us simulated, {s['ratio']:.2f}x the roofline")
    assert lines["roofline"].startswith(f"{s['roofline_us']:.2f} us, {s['bound']}-bound")
    assert lines["MFU"].startswith(f"{s['mfu']:.1%}") and lines["MBU"].startswith(f"{s['mbu']:.1%}")
    assert f"{s['dma_transfers']} transfers, {s['dma_bytes'] / 1e6:.2f} MB" in lines["DMA"]
    assert f"PE {s['engines']['PE']:.0%}" in lines["engines"]
    assert s["top_nodes"][0]["node"] in lines["top nodes"]


def test_profile_takes_inputs_and_top(tmp, capsys):
    rng = np.random.default_rng(1)
    np.savez(f"{tmp}/in.npz", input_ids=rng.integers(0, 100, (2, 16)), attention_mask=np.ones((2, 16), np.int64))
    out, s = _profile(tmp, BERT, capsys, "--inputs", f"{tmp}/in.npz", "--top", "3")
    assert len(s["top_nodes"]) == 3 and out.count(" us ") >= 3


def _gather_model(rows: tuple[int, ...], ids_shape: tuple[int, ...] = (4, 64)) -> onnx.ModelProto:
    """ids -> Reshape -> Gather from a table of rows[0] rows (and the raw ids into one of each other size);
    the gathered rows summed."""
    rng = np.random.default_rng(0)
    weights = {f"table{k}": rng.standard_normal((n, 16)).astype(np.float32) for k, n in enumerate(rows)}
    weights["shape"] = np.array([-1], np.int64)
    nodes = [helper.make_node("Reshape", ["ids", "shape"], ["flat"])]
    nodes += [helper.make_node("Gather", [f"table{k}", "flat" if k == 0 else "ids"], [f"g{k}"], axis=0)
              for k in range(len(rows))]
    nodes += [helper.make_node("ReduceSum", [f"g{k}"], [f"y{k}"], keepdims=0) for k in range(len(rows))]
    outputs = {f"y{k}": ([], TensorProto.FLOAT) for k in range(len(rows))}
    return make_model(nodes, {"ids": (list(ids_shape), TensorProto.INT64)}, outputs, weights)


def test_integer_inputs_are_drawn_below_the_rows_of_the_table_they_index(tmp):
    proto = _gather_model((37,))
    b = compile_model(proto)
    assert b.stats["input_ranges"] == {"ids": [0, 37]}
    inputs = bundle_inputs(b, seed=3)
    ids = inputs["ids"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 37
    assert ids.max() >= 8  # the whole table, not the small ids drawn for an input nothing constrains
    model = compile_to_model(proto, tmp)
    ours, expected = model.run(inputs), onnxruntime_outputs(proto, inputs)
    assert all(np.isfinite(v).all() for v in ours.values())
    np.testing.assert_allclose(ours["y0"], expected["y0"], rtol=1e-4)


def test_an_input_indexing_two_tables_stays_inside_both():
    assert compile_model(_gather_model((37, 20))).stats["input_ranges"] == {"ids": [0, 20]}


def test_unconstrained_integer_inputs_get_no_range():
    model = make_model([helper.make_node("Cast", ["n"], ["y"], to=TensorProto.FLOAT)],
                       {"n": ([3], TensorProto.INT32)}, {"y": ([3], TensorProto.FLOAT)})
    assert compile_model(model).stats["input_ranges"] == {}


def test_check_draws_ids_the_table_holds(tmp, capsys):
    """Five rows: ids drawn from the default 0..7 would fall off the table."""
    onnx.save(_gather_model((5,)), f"{tmp}/m.onnx")
    assert _cli("check", f"{tmp}/m.onnx") == 0, capsys.readouterr().out


def test_the_roofline_counts_only_the_gathered_rows_of_a_table():
    b = compile_model(_gather_model((37,), ids_shape=(2, 8)))
    io = sum(int(np.prod(t.shape)) * DType[t.device_dtype].size for t in (*b.inputs, *b.outputs))
    assert roofline(b, get_target("trn1")).min_bytes == io + 16 * 16 * 4  # 16 rows of 16 fp32, of 37


def _fake_run(transfers: list[tuple[float, float, float, int]]) -> SimpleNamespace:
    """A traced run of DMA transfers (start, end, fixed ns, HBM bytes), each on its own queue."""
    streams = [SimpleNamespace(core=0, name=f"DMA{k}", ops=[SimpleNamespace(dma=DmaCost(fixed, nbytes, nbytes))])
               for k, (_, _, fixed, nbytes) in enumerate(transfers)]
    trace = [TraceEvent(0, f"DMA{k}", 0, start, end) for k, (start, end, _, _) in enumerate(transfers)]
    return SimpleNamespace(simulator=SimpleNamespace(streams=streams), last_run=RunStats(max(t[1] for t in transfers),
                                                                                         len(trace), trace))


def test_hbm_peak_counts_the_transfers_inside_a_window():
    assert hbm_peak_gbps(_fake_run([(0, 10, 0, 1000), (0, 10, 0, 1000)])) == pytest.approx(200)
    assert hbm_peak_gbps(_fake_run([(0, 10, 0, 1000), (20, 30, 0, 1000)])) == pytest.approx(100)
    # The fixed cost moves no bytes: 1000 bytes in the last 5 ns of each.
    assert hbm_peak_gbps(_fake_run([(0, 10, 5, 1000), (0, 10, 5, 1000)])) == pytest.approx(400)


def test_a_shift_amount_stays_below_the_width_of_its_type():
    model = make_model([helper.make_node("BitShift", ["x", "n"], ["y"], direction="LEFT")],
                       {"x": ([4], TensorProto.UINT16), "n": ([4], TensorProto.UINT16)},
                       {"y": ([4], TensorProto.UINT16)})
    assert input_ranges(prepare(model, Options())) == {"n": [0, 16]}
