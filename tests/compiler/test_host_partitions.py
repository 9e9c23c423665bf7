"""--fallback host: what the chip cannot run goes to the CPU (partition/host.py, runtime/host.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime
from isa import bundle as bundle_format
from isa.errors import BundleError
from neuronx_cc_lite.cli import main
from neuronx_cc_lite.compiler import Options, compile_model
from neuronx_cc_lite.errors import CompileError, UnsupportedError
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import MODELS_DIR, ROOT, assert_close, make_model

sys.path.insert(0, MODELS_DIR)
from detection_head import detection_head  # noqa: E402  (models/ is a folder of scripts, not a package)

F = TensorProto.FLOAT
HOST = Options(fallback="host")


def _image(seed: int) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)}


@pytest.fixture(scope="module")
def detector(tmp_path_factory) -> tuple[onnx.ModelProto, str]:
    model = detection_head()
    path = str(tmp_path_factory.mktemp("det") / "det.neff")
    bundle_format.write(compile_model(model, HOST), path)
    return model, path


def test_without_the_flag_the_detector_is_refused_naming_every_cause():
    with pytest.raises(UnsupportedError) as e:
        compile_model(detection_head())
    text = str(e.value)
    assert e.value.code == "NCC_SHAPE_DYNAMIC" and "\n" not in text
    # every node refused for itself, grouped by operator, then those downstream counted by operator
    assert "NonZero x1 ('/post/nonzero'): produces a data-dependent shape" in text
    assert "NonMaxSuppression x1 ('/post/nms')" in text
    assert "node(s) reading shapes left to run time (Gather x3, GatherND x1, Shape x1, Squeeze x1, TopK x1)" in text
    assert text.endswith("--fallback host runs them on the CPU")
    assert {name for name, _, _ in e.value.nodes} >= {"/post/nonzero", "/post/nms", "/post/topk_dets"}


def test_the_detector_runs_on_chip_and_host_and_matches_onnxruntime(detector):
    model, path = detector
    b = bundle_format.read(path)
    assert [p.kind for p in b.parts] == ["chip", "host"]
    chip, host = b.parts
    # the backbone, heads, decoding and the static-k TopK on the chip; NMS, NonZero and the TopK whose k is
    # computed on the host, with the shape arithmetic that reads only host values (Shape, Min)
    assert chip.bundle is not None and chip.inputs == ["image"]
    chip_nodes = {node for core in chip.bundle.cores for s in core.values() for node in s.nodes}
    assert {"/backbone/conv1", "/head/cls", "/post/topk_anchors"} <= chip_nodes
    assert host.ops == {"Gather": 3, "GatherND": 1, "Min": 1, "NonMaxSuppression": 1, "NonZero": 1, "Shape": 1,
                        "Squeeze": 1, "TopK": 1}
    assert set(host.inputs) <= set(chip.outputs) and onnx.load_from_string(host.onnx).graph.node
    loaded = runtime.load(path)
    for seed in range(3):
        feeds = _image(seed)
        ours, ref = loaded.run(feeds), onnxruntime_outputs(model, feeds)
        assert [o.shape for o in ours.values()] == [r.shape for r in ref.values()]
        assert_close(ours, ref, rtol=1e-4)
    stats = loaded.last_run
    chip_run, host_run = stats.parts
    assert chip_run.device_ns > 0 and host_run.ns > 0 and chip_run.bytes_in == 3 * 16 * 16 * 4
    assert stats.elapsed_ns == pytest.approx(chip_run.ns + host_run.ns)
    assert chip_run.ns > chip_run.device_ns  # the launch and the copies


def test_a_node_the_chip_cannot_run_between_chip_parts(tmp):
    """Relu on the chip, Det (no lowering) on the host, then Mul on the chip again: three parts."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Det", ["r"], ["d"], name="det"),
             helper.make_node("Unsqueeze", ["d", "axes"], ["du"], name="unsqueeze"),
             helper.make_node("Mul", ["du", "x2"], ["y"], name="scale")]
    model = make_model(nodes, {"x": ([4, 3, 3], F), "x2": ([4, 6], F)}, {"y": ([4, 6], F)},
                       {"axes": np.array([1], np.int64)})
    with pytest.raises(UnsupportedError, match="node 'det' \\(Det\\): operator Det is not supported; --fallback host"):
        compile_model(model)
    b = compile_model(model, HOST)
    assert [(p.kind, p.inputs, p.outputs) for p in b.parts] == [
        ("chip", ["x"], ["r"]), ("host", ["r"], ["du"]), ("chip", ["du", "x2"], ["y"])]
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 3, 3)).astype(np.float32),
             "x2": np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)}
    assert_close(runtime.load(b).run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-4)


def test_a_model_the_chip_runs_whole_is_a_plain_bundle_with_the_flag():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ([4, 8], F)}, {"y": ([4, 8], F)})
    b = compile_model(model, HOST)
    assert not b.parts and b.cores and b.flags["fallback"] == "host"
    assert "fallback" not in compile_model(model).flags  # the flag's default leaves bundles as they were


def test_ranks_and_host_parts_do_not_mix():
    with pytest.raises(CompileError, match="NCC_OPTION.*--fallback host runs a model on one rank"):
        compile_model(detection_head(), Options(fallback="host", tp=2))


def test_the_bundle_is_deterministic_and_checked(detector, tmp):
    model, path = detector
    with open(path, "rb") as f:
        first = f.read()
    assert bundle_format.to_bytes(compile_model(model, HOST)) == first
    b = bundle_format.from_bytes(first)
    b.parts[1].inputs.append("nowhere")
    with pytest.raises(BundleError, match="parts\\[1\\]: input 'nowhere' is neither a model input nor an earlier"):
        bundle_format.from_bytes(bundle_format.to_bytes(b))
    b = bundle_format.from_bytes(first)
    b.parts[1].onnx = b"not onnx"
    with pytest.raises(runtime.LoadError, match="part 1 \\(host\\): onnxruntime cannot load it"):
        runtime.load(b)


def test_the_runtime_loads_onnxruntime_only_for_host_parts(detector, tmp):
    """Neither onnx nor the compiler in any case; onnxruntime only when the bundle has a host part."""
    _, path = detector
    plain = os.path.join(tmp, "plain.neff")
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ([4, 8], F)}, {"y": ([4, 8], F)})
    bundle_format.write(compile_model(model), plain)
    code = ("import sys, numpy as np, runtime\n"
            "m = runtime.load(sys.argv[1]); m.run({i.name: np.zeros(i.shape, i.dtype) for i in m.inputs})\n"
            "print(sorted({k.split('.')[0] for k in sys.modules} & {'onnx', 'neuronx_cc_lite', 'onnxruntime'}))")
    seen = [subprocess.run([sys.executable, "-c", code, p], cwd=ROOT, capture_output=True, text=True, check=True
                           ).stdout.strip() for p in (plain, path)]
    assert seen == ["[]", "['onnxruntime']"]


def test_the_command_line_shows_the_split_the_host_time_and_the_transfers(detector, tmp, capsys):
    model, path = detector
    onnx.save(model, f"{tmp}/det.onnx")
    assert main(["analyze", f"{tmp}/det.onnx", "--fallback", "host"]) == 0
    out = capsys.readouterr().out
    assert "with --fallback host: 2 parts, run in turn" in out
    assert "part 1: host (onnxruntime), 10 nodes: Gather 3, GatherND 1, Min 1, NonMaxSuppression 1" in out
    np.savez(f"{tmp}/in.npz", **_image(0))
    assert main(["run", path, "--inputs", f"{tmp}/in.npz", "--outputs", f"{tmp}/out.npz", "--profile",
                 f"{tmp}/trace.json"]) == 0
    with np.load(f"{tmp}/out.npz") as got:
        assert_close(dict(got), onnxruntime_outputs(model, _image(0)), rtol=1e-4)
    with open(f"{tmp}/trace.json") as f:
        events = json.load(f)["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"host", "part 0: core 0"} <= names
    assert any(e["name"] == "part 1: host" and e["dur"] > 0 for e in events)
    assert any(e["name"] == "part 0: launch and copies" for e in events)
    capsys.readouterr()
    assert main(["profile", path, "--json", f"{tmp}/p.json"]) == 0
    out = capsys.readouterr().out
    assert "part 1: host," in out and "NonMaxSuppression x1" in out
    assert "between host and device" in out and "launches and copies" in out
    with open(f"{tmp}/p.json") as f:
        summary = json.load(f)
    assert summary["host_us"] > 0 and summary["transfer_bytes"] > 3072 and len(summary["parts"]) == 2
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert "det_boxes: float32[?]" in out and "part 1        host (onnxruntime)" in out
    assert main(["disasm", path, "--no-data"]) == 0
    listing = capsys.readouterr().out
    assert listing.startswith(".part 0 chip") and "\n.part 1 host " in listing
