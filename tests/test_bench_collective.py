"""bench-collective: the rows it prints and writes, the check against numpy, and the bus bandwidth bound."""

from __future__ import annotations

import json

import numpy as np
import pytest

from isa.collectives import OPS, bus_bandwidth_limit, collective_cost, topology
from isa.dtypes import DType
from isa.target import TRN1, TRN2
from neuronx_cc_lite import bench_collective
from neuronx_cc_lite.bench_collective import build_bundle, counts, expected, inputs
from neuronx_cc_lite.cli import main
import runtime


def _bench(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        status = main(["-q", "bench-collective", *args])
    except SystemExit as e:  # argparse's usage errors
        status = int(e.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def test_rows_double_and_are_checked_up_to_check_bytes(tmp, capsys):
    status, out, _ = _bench(capsys, "all_reduce", "--ranks", "8", "--target", "trn1", "--min-bytes", "1024",
                            "--max-bytes", "65536", "--check-bytes", str(8 * 16384), "--json", f"{tmp}/rows.json")
    assert status == 0
    with open(f"{tmp}/rows.json") as f:
        rows = json.load(f)
    assert [r["bytes"] for r in rows] == [1024 << k for k in range(7)]
    assert {"bytes", "time_us", "algbw_gbps", "busbw_gbps", "check", "algorithm", "dtype", "count"} <= set(rows[0])
    assert [r["check"] for r in rows] == ["ok"] * 5 + ["model"] * 2  # bytes x 8 ranks <= 128 KiB ran with data
    for r in rows:
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e3))
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 7 / 8)
        assert r["busbw_gbps"] <= TRN1.link_gbps
    assert "busbw limit: 384.0 GB/s" in out and out.count(" ok\n") == 5 and out.count(" model\n") == 2


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("target,ranks,dtype", [("trn1", 6, "fp32"), ("trn2", 8, "bf16"), ("inf2", 4, "int8")])
def test_every_collective_matches_numpy(op, target, ranks, dtype, tmp, capsys):
    status, out, _ = _bench(capsys, op, "--ranks", str(ranks), "--target", target, "--dtype", dtype,
                            "--min-bytes", "64", "--max-bytes", "4096", "--json", f"{tmp}/rows.json")
    assert status == 0, out
    with open(f"{tmp}/rows.json") as f:
        assert {r["check"] for r in json.load(f)} == {"ok"}


@pytest.mark.parametrize("dtype", ["uint8", "int8", "fp8_e4m3"])
def test_sums_of_many_ranks_in_narrow_types(dtype, capsys):
    """64 ranks' sums leave int8 and need rounding in fp8: the reference saturates and rounds as the engines do."""
    status, out, _ = _bench(capsys, "all_reduce", "--ranks", "64", "--dtype", dtype, "--min-bytes", "2048",
                            "--max-bytes", "2048")
    assert status == 0 and out.count(" ok\n") == 1


def test_expected_saturates_integers():
    x = np.array([[100, -100], [100, -100]], dtype=np.int8)
    assert expected("all_reduce", x).tolist() == [[127, -128]] * 2


def test_the_simulated_time_is_the_cost_models():
    topo = topology(TRN2, 1, 16)  # two chips
    src, dst = counts("reduce_scatter", 1 << 16, DType.fp32, 16)
    model = runtime.load(build_bundle("reduce_scatter", topo, DType.fp32, src, dst), collective_algorithm="ring")
    model.run({"x": inputs("reduce_scatter", DType.fp32, 16, src)})
    cost = collective_cost("reduce_scatter", src * 4, 4, tuple(range(16)), topo, "ring")
    assert model.last_run.elapsed_ns == pytest.approx(cost.ns)


def test_expected_results_by_hand():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)  # rank i's src is row i
    assert expected("all_reduce", x).tolist() == [[12, 15, 18, 21]] * 3
    assert expected("permute", x, shift=1).tolist() == [x[2].tolist(), x[0].tolist(), x[1].tolist()]
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert expected("all_gather", y).tolist() == [[0, 1, 2, 3, 4, 5]] * 3
    z = np.arange(8, dtype=np.float32).reshape(2, 4)  # 2 ranks, 2 blocks of 2
    assert expected("reduce_scatter", z).tolist() == [[4, 6], [8, 10]]
    assert expected("all_to_all", z).tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_distinct_inputs_per_rank():
    for op in OPS:
        x = inputs(op, DType.bf16, 16, 64)
        assert len({row.tobytes() for row in x}) == 16


def test_a_wrong_result_fails_the_check(tmp, capsys, monkeypatch):
    monkeypatch.setattr(bench_collective, "expected", lambda op, x, shift=1: np.zeros_like(x))
    status, out, _ = _bench(capsys, "all_reduce", "--ranks", "4", "--min-bytes", "256", "--max-bytes", "256")
    assert status == 1 and "FAIL: " in out


def test_large_rows_stay_within_the_links(tmp, capsys):
    status, _, _ = _bench(capsys, "all_gather", "--ranks", "64", "--target", "trn2", "--lnc", "1",
                          "--min-bytes", str(1 << 20), "--max-bytes", str(1 << 28), "--check-bytes", "0",
                          "--algorithm", "hierarchical", "--json", f"{tmp}/rows.json")
    assert status == 0
    limit = bus_bandwidth_limit("all_gather", tuple(range(64)), topology(TRN2, 1, 64))
    with open(f"{tmp}/rows.json") as f:
        rows = json.load(f)
    assert len(rows) == 9 and all(r["check"] == "model" and r["algorithm"] == "hierarchical" for r in rows)
    assert all(0 < r["busbw_gbps"] <= limit for r in rows)
    assert rows[-1]["busbw_gbps"] > rows[0]["busbw_gbps"]  # latency matters less as messages grow


@pytest.mark.parametrize("args,status,message", [
    (["broadcast", "--ranks", "2"], 2, "invalid choice: 'broadcast'"),
    (["all_reduce", "--ranks", "257", "--target", "trn1"], 2, "at most 8 instances, 256 ranks"),
    (["all_reduce", "--ranks", "4", "--lnc", "2"], 2, "trn1 takes --lnc 1, not 2"),
    (["all_reduce", "--ranks", "4", "--min-bytes", "0"], 2, "1 <= --min-bytes <= --max-bytes"),
    (["all_reduce", "--ranks", "4", "--min-bytes", "64", "--max-bytes", "32"], 2, "1 <= --min-bytes"),
    (["all_reduce", "--ranks", "3", "--algorithm", "hierarchical"], 2, "hierarchical needs the same number"),
])
def test_errors_are_one_coded_line(args, status, message, capsys):
    got, out, err = _bench(capsys, *args)
    assert got == status
    assert err.count("\n") == 1 and "error: NCC_USAGE: " in err and message in err
    assert out == ""
