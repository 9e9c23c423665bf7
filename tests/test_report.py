"""`neuronx-cc-lite profile --html` and runtime/report.py: the page is written, needs no network, carries the
summary, a timeline row per engine and DMA queue with a box per instruction, and SBUF/PSUM occupancy; the slow tier
renders it in headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import runtime
from neuronx_cc_lite.cli import main
from neuronx_cc_lite.reference import bundle_inputs
from runtime import report
from runtime.profile import summarize
from runtime.simulator import RunStats, TraceEvent
from tests.conftest import MODELS_DIR

MLP = os.path.join(MODELS_DIR, "mlp_small.onnx")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[str, str, dict]:
    """(the page, the bundle's path, the summary as --json writes it) of `profile --html` on a small MLP."""
    tmp = str(tmp_path_factory.mktemp("report"))
    neff = f"{tmp}/m.neff"
    assert main(["-q", "compile", MLP, "-o", neff]) == 0
    assert main(["-q", "profile", neff, "--html", f"{tmp}/r.html", "--json", f"{tmp}/s.json"]) == 0
    assert sorted(os.listdir(tmp)) == ["m.neff", "r.html", "s.json"]  # nothing half-written beside them
    with open(f"{tmp}/r.html", encoding="utf-8") as f, open(f"{tmp}/s.json") as g:
        return f.read(), neff, json.load(g)


def _data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', html, re.S)
    assert found
    return json.loads(found.group(1))


def _unpack(data: dict, key: str, dtype: type) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data[key]), np.dtype(dtype).newbyteorder("<"))


def test_the_page_is_self_contained(page):
    html, _, _ = page
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert not re.search(r"https?://|//cdn|<link\b|\bsrc=|@import|url\(", html)  # nothing fetched


def test_the_page_holds_the_summary_and_top_nodes(page):
    html, _, s = page
    assert f"{s['latency_us']:.2f} us" in html and f"{s['mfu']:.1%}" in html and f"{s['mbu']:.1%}" in html
    assert f"{s['dma_transfers']} transfers" in html and f"{s['ratio']:.2f}x the roofline" in html
    for engine in s["engines"]:
        assert f"<td>{engine}</td>" in html
    assert s["top_nodes"]
    for row in s["top_nodes"]:
        assert f"<td>{row['node']}</td>" in html  # the names need no escaping in this model
    assert "<pre>latency " in html  # the text the command prints


def test_the_page_shows_the_critical_path(page):
    html, _, s = page
    section = html.split("<h2>Critical path</h2>")[1].split("<h2>")[0]
    assert f"{s['critical_instructions']} instructions" in section
    for engine, us in s["critical_busy_us"].items():
        assert f"<td>{engine}</td><td class=\"n\">{us:.2f}</td>" in section
    assert f"<td>between</td><td class=\"n\">{s['critical_waiting_us']:.2f}</td>" in section
    for row in s["critical_nodes"]:
        assert f"<td>{row['node']}</td><td class=\"n\">{row['us']:.2f}</td>" in section
    assert s["critical_transfers"]  # (the model's input comes in and its output goes out through the path)
    for row in s["critical_transfers"]:
        assert f"<td>{row['what']}</td><td class=\"n\">{row['us']:.2f}</td><td class=\"n\">{row['transfers']}</td>" \
            in section


def test_the_timeline_has_a_row_per_stream_and_a_box_per_instruction(page):
    html, neff, _ = page
    data = _data(html)
    model = runtime.load(neff)
    model.run(bundle_inputs(model.bundle, 0), trace=True)
    stats = model.last_run
    streams = {name for name, s in model.bundle.cores[0].items() if s.instructions}
    assert data["rows"][:5] == ["0 PE", "0 ACT", "0 DVE", "0 POOL", "0 SP"]
    assert set(data["rows"]) == {f"0 {n}" for n in {"PE", "ACT", "DVE", "POOL", "SP"} | streams}
    assert data["boxes"] == data["instructions"] == stats.instructions and "count" not in data
    row, start, end = _unpack(data, "row", np.uint16), _unpack(data, "start", np.float32), _unpack(data, "end",
                                                                                                  np.float32)
    mnem, index = _unpack(data, "mnem", np.uint16), _unpack(data, "index", np.uint32)
    boxes = {(data["rows"][r], int(i), data["mnemonics"][m]): (s, e) for r, i, m, s, e in
             zip(row, index, mnem, start, end)}
    for e in stats.trace:
        instr = model.bundle.cores[0][e.stream].instructions[e.index]
        assert boxes[f"0 {e.stream}", e.index, instr.op] == pytest.approx((e.start, e.end), rel=1e-6)
    assert data["elapsed"] == stats.elapsed_ns


def test_the_page_charts_sbuf_and_psum(page):
    """A canvas per chart, which the script draws on the timeline's time axis from the payload's samples."""
    html, _, _ = page
    for mem in ("SBUF", "PSUM"):
        assert f'<figure class="occupancy" data-mem="{mem}" data-core="0">' in html
    assert html.count('<canvas class="chart"') == 2
    charts = _data(html)["charts"]
    assert [(c["core"], c["mem"]) for c in charts] == [(0, "SBUF"), (0, "PSUM")]
    for c in charts:
        assert len(c["times"]) == len(c["live"]) == len(c["hw"]) == report.CHART_POINTS
        assert 0 < max(c["live"]) <= max(c["hw"]) <= c["top"]


def test_dma_boxes_carry_the_bytes_they_moved(page):
    """Each DMA box's bytes are what its instruction writes; compute engines' boxes move none."""
    html, neff, _ = page
    data = _data(html)
    model = runtime.load(neff)
    row, index, moved = _unpack(data, "row", np.uint16), _unpack(data, "index", np.uint32), \
        _unpack(data, "bytes", np.float64)
    dma = 0
    for r, i, b in zip(row, index, moved):
        stream = data["rows"][r].split()[1]
        instr = model.bundle.cores[0][stream].instructions[i]
        if stream.startswith("DMA"):
            dst = next(o for f, o in instr.operands() if f.writes)
            assert b == dst.num_partitions * dst.free_size * dst.dtype.size > 0
            dma += 1
        else:
            assert b == 0
    assert dma > 0


def test_engine_time_rolls_up_by_operator_type_and_layer(tmp):
    """Per-node rows of a model's many identical layers add up to one row per operator type (the model's:
    QuantizeLinear, not the SaturatingCast it is compiled to) and one per layer; each table sums to the engine
    time of every instruction."""
    neff = f"{tmp}/q.neff"
    assert main(["-q", "compile", os.path.join(MODELS_DIR, "cnn_qdq.onnx"), "-o", neff]) == 0
    model = runtime.load(neff)
    model.run(bundle_inputs(model.bundle, 0), trace=True)
    program = report._Program.of(model.bundle, model.target.dma_queues)
    tables = report.rollups(model.bundle, program, model.last_run.trace)
    busy = sum(e.end - e.start for e in model.last_run.trace) / 1000
    for rows in tables.values():
        assert sum(r.busy_us for r in rows) == pytest.approx(busy) and sum(r.share for r in rows) == pytest.approx(1)
        assert [r.busy_us for r in rows] == sorted((r.busy_us for r in rows), reverse=True)
    ops = {r.name for r in tables["operator"]}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= ops
    assert not ops & {"SaturatingCast", "MatMulEpilogue", "Round", "(unknown)"}
    quantize = next(r for r in tables["operator"] if r.name == "QuantizeLinear")
    assert quantize.nodes > 1  # several expanded pieces of several QuantizeLinear nodes in one row
    html = report.render_html(model.bundle, model.last_run, summarize(model))
    assert "<h2>Engine time by operator type</h2>" in html and "<h2>Engine time by layer</h2>" in html
    assert "<td>QuantizeLinear</td>" in html


@pytest.mark.parametrize("node, layer", [
    ("/encoder/layer.3/attention/self/query/MatMul", "/encoder/layer.3"),
    ("/layer1/layer1.0/conv1/Conv", "/layer1"),
    ("/embeddings/word_embeddings/Gather", "/embeddings"),
    ("/Add", "(top level)"),
    ("conv1", "(top level)"),
])
def test_layer_of_names_the_first_numbered_scope(node, layer):
    assert report.layer_of(node) == layer


def test_an_idle_engine_keeps_its_row_and_its_name(page):
    html, _, s = page
    assert "SP" not in s["engines"]  # the MLP never uses SP
    assert "<td>SP</td>" in html and "0% (idle)</td>" in html
    assert "0 SP" in _data(html)["rows"]


def test_live_ranges_follow_writes_and_last_reads():
    # granule 0: written [0,1], read [2,3], written again [4,5] (the first value ends at 3), read [6,8];
    # granule 1: read before any write (nothing live), written [1,2] and [3,4] with no read between (one
    # accumulating value), read [5,9]
    start = np.array([0, 2, 4, 6, 0.5, 1, 3, 5.0])
    end = np.array([1, 3, 5, 8, 0.7, 2, 4, 9.0])
    g0 = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    writes = np.array([1, 0, 1, 0, 0, 1, 1, 0], bool)
    begins, ends = report._live_ranges(start, end, g0, g0 + 1, writes)
    assert sorted(zip(begins, ends)) == [(0, 3), (1, 9), (4, 8)]
    # a value read while the next one is being written ends when that write starts; one never read lives while
    # its writer runs
    begins, ends = report._live_ranges(np.array([0, 2, 3.0]), np.array([1, 6, 4.0]), np.zeros(3, int),
                                       np.ones(3, int), np.array([1, 0, 1], bool))
    assert sorted(zip(begins, ends)) == [(0, 3), (3, 4)]


def test_occupancy_counts_what_a_tile_holds(page):
    _, neff, _ = page
    model = runtime.load(neff)
    model.run(bundle_inputs(model.bundle, 0), trace=True)
    target = model.target
    charts = report.occupancy(report._Program.of(model.bundle, target.dma_queues), target, model.last_run.trace,
                              model.last_run.elapsed_ns)
    assert [(c.core, c.mem) for c in charts] == [(0, "SBUF"), (0, "PSUM")]
    for c in charts:
        assert 0 < c.peak_live <= c.peak_high_water <= c.capacity
        assert len(c.live) == len(c.high_water) == report.CHART_POINTS
        assert max(c.live) == c.peak_live and all(a <= b for a, b in zip(c.high_water, c.high_water[1:]))
        assert all(live <= hw for live, hw in zip(c.live, c.high_water))


def test_long_traces_merge_into_few_boxes(page, monkeypatch):
    """Beyond MAX_BOXES, boxes of a row starting in one slice of time join; the page still counts every
    instruction and stays small."""
    _, neff, _ = page
    model = runtime.load(neff)
    model.run(bundle_inputs(model.bundle, 0), trace=True)
    stats = model.last_run
    repeats = 50
    trace = [TraceEvent(e.core, e.stream, e.index, e.start + k * stats.elapsed_ns, e.end + k * stats.elapsed_ns)
             for k in range(repeats) for e in stats.trace]
    monkeypatch.setattr(report, "MAX_BOXES", len(trace) // 10)
    long_run = RunStats(stats.elapsed_ns * repeats, len(trace), trace)
    data = _data(report.render_html(model.bundle, long_run, summarize(model)))
    count = _unpack(data, "count", np.uint32)
    assert data["boxes"] <= report.MAX_BOXES and count.sum() == len(trace) == data["instructions"]
    start, end = _unpack(data, "start", np.float32), _unpack(data, "end", np.float32)
    assert (end >= start).all() and end.max() == pytest.approx(long_run.elapsed_ns, rel=1e-6)


def test_profile_refuses_to_overwrite_the_bundle_with_the_page(page, capsys):
    _, neff, _ = page
    with open(neff, "rb") as f:
        before = f.read()
    assert main(["-q", "profile", neff, "--html", neff]) == 2
    assert "NCC_USAGE" in capsys.readouterr().err
    with open(neff, "rb") as f:
        assert f.read() == before


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed (Debian: apt-get install "
                                                "chromium)")
def test_chromium_draws_the_timeline(page, tmp_path):
    html, _, _ = page
    path = tmp_path / "r.html"
    path.write_text(html, encoding="utf-8")
    flags = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1200,1600", f"--user-data-dir={tmp_path / 'profile'}"]
    data = _data(html)
    dma = next(r for r in data["rows"] if "DMA" in r)
    dom = subprocess.run([*flags, "--dump-dom", f"{path.as_uri()}#box={dma}:0"], capture_output=True, text=True,
                         timeout=120).stdout
    assert 'data-timeline="drawn"' in dom  # the script ran to its end
    drawn = re.search(r'<canvas id="timeline"[^>]* data-drawn="(\d+)"', dom)
    assert drawn and int(drawn.group(1)) > 0
    legend = re.search(r'<div id="legend">(.*?)</div>', dom, re.S)
    assert legend and "PE" in legend.group(1) and "DMA" in legend.group(1)
    # the charts sit on the timeline's axis: the same label column and scale (pixels per ns)
    axis = re.search(r'<canvas id="timeline"[^>]* data-left="([\d.]+)" data-scale="([\d.e-]+)"', dom)
    charts = re.findall(r'<canvas class="chart"[^>]* data-drawn="1" data-left="([\d.]+)" data-scale="([\d.e-]+)"', dom)
    assert axis and len(charts) == 2 and all(c == axis.groups() for c in charts), (axis, charts)
    # the first DMA's tooltip: its bytes and rate
    tip = re.search(r'<div id="tip"[^>]*>(.*?)</div>', dom, re.S)
    assert tip and "dma_" in tip.group(1), tip
    rows, index, moved = (_unpack(data, "row", np.uint16), _unpack(data, "index", np.uint32),
                          _unpack(data, "bytes", np.float64))
    k = next(k for k in range(len(rows)) if data["rows"][rows[k]] == dma and index[k] == 0)
    assert re.search(rf"bytes  .*\b{int(moved[k])} B", tip.group(1)), tip.group(1)
    assert re.search(r"rate   \d+\.\d\d GB/s", tip.group(1)), tip.group(1)
    shot = tmp_path / "r.png"
    subprocess.run([*flags, f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000  # not a blank page
