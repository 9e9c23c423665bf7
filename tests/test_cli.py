"""The command line: the forms the README and the issues rely on, exit statuses, and no partial files."""

from __future__ import annotations

import collections
import glob
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from neuronx_cc_lite.cli import main
from neuronx_cc_lite.reference import onnxruntime_outputs
from tests.conftest import MODELS_DIR, ROOT

MODEL = os.path.join(MODELS_DIR, "mlp_odd.onnx")


def _cli(*args: str) -> int:
    return main(["-q", *args])


def test_compile_run_disasm_asm_info(tmp, capsys):
    neff = f"{tmp}/m.neff"
    assert _cli("compile", MODEL, "-o", neff) == 0
    x = np.random.default_rng(0).standard_normal((3, 100)).astype(np.float32)
    np.savez(f"{tmp}/in.npz", x=x)
    assert _cli("run", neff, "--inputs", f"{tmp}/in.npz", "--outputs", f"{tmp}/out.npz") == 0
    with np.load(f"{tmp}/out.npz") as out:
        expected = onnxruntime_outputs(onnx.load(MODEL), {"x": x})["y"]
        np.testing.assert_allclose(out["y"], expected, rtol=1e-4, atol=1e-6)

    capsys.readouterr()
    assert _cli("disasm", neff) == 0
    listing = capsys.readouterr().out
    assert ".stream PE" in listing and "nc_matmul" in listing
    with open(f"{tmp}/m.s", "w") as f:
        f.write(listing)
    assert _cli("asm", f"{tmp}/m.s", "-o", f"{tmp}/again.neff") == 0
    with open(neff, "rb") as a, open(f"{tmp}/again.neff", "rb") as b:
        assert a.read() == b.read()

    assert _cli("info", neff) == 0
    info = capsys.readouterr().out
    assert "input         x: float32[3, 100]" in info and "output        y: float32[3, 7]" in info


def test_disasm_filters_by_engine(tmp, capsys):
    neff = f"{tmp}/m.neff"
    _cli("compile", MODEL, "-o", neff)
    capsys.readouterr()
    _cli("disasm", neff, "--engine", "PE", "--no-data")
    out = capsys.readouterr().out
    assert ".stream PE" in out and ".stream ACT" not in out and ".stream DMA" not in out


def test_same_model_same_bundle(tmp):
    _cli("compile", MODEL, "-o", f"{tmp}/a.neff")
    _cli("compile", MODEL, "-o", f"{tmp}/b.neff")
    with open(f"{tmp}/a.neff", "rb") as a, open(f"{tmp}/b.neff", "rb") as b:
        assert a.read() == b.read()


def test_check_passes_for_a_good_model(capsys):
    assert _cli("check", MODEL) == 0
    assert "ok" in capsys.readouterr().out


@pytest.mark.parametrize("make_args, code", [
    (lambda t: ["compile", f"{t}/missing.onnx", "-o", f"{t}/out.neff"], "NCC_ONNX_LOAD"),
    (lambda t: ["run", f"{t}/bad.neff", "--inputs", f"{t}/in.npz"], "NRT_LOAD"),
    (lambda t: ["run", f"{t}/good.neff", "--inputs", f"{t}/wrong.npz"], "NRT_INPUT"),
    (lambda t: ["asm", f"{t}/bad.s", "-o", f"{t}/out.neff"], "NCC_ISA_PARSE"),
    (lambda t: ["profile", f"{t}/missing.neff", "--json", f"{t}/s.json"], "NRT_LOAD"),
    (lambda t: ["profile", f"{t}/good.neff", "--inputs", f"{t}/bad.s", "--json", f"{t}/s.json"], "NCC_USAGE"),
    (lambda t: ["profile", f"{t}/good.neff", "--inputs", f"{t}/wrong.npz", "--json", f"{t}/s.json"], "NRT_INPUT"),
])
def test_failures_are_one_coded_line_and_leave_nothing(tmp, capsys, make_args, code):
    _cli("compile", MODEL, "-o", f"{tmp}/good.neff")
    with open(f"{tmp}/good.neff", "rb") as f:
        data = bytearray(f.read())
    data[200] ^= 1
    with open(f"{tmp}/bad.neff", "wb") as f:
        f.write(data)
    np.savez(f"{tmp}/wrong.npz", y=np.zeros(3, np.float32))
    with open(f"{tmp}/bad.s", "w") as f:
        f.write(".bundle {}\n.core 0\n.stream PE\n     0  nc_matmul nonsense\n")
    capsys.readouterr()
    before = set(os.listdir(tmp))
    assert _cli(*make_args(tmp)) == (2 if code == "NCC_USAGE" else 1)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"neuronx-cc-lite: error: {code}"), err
    assert set(os.listdir(tmp)) == before


def test_console_script_help_and_usage_errors():
    """The installed entry point, as a user runs it: --help teaches, misuse exits 2."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "neuronx_cc_lite", *a], cwd=ROOT,  # noqa: E731
                                    capture_output=True, text=True)
    help_text = run("--help")
    assert help_text.returncode == 0 and "examples:" in help_text.stdout and "compile" in help_text.stdout
    assert "profile" in help_text.stdout and "--json" in run("profile", "--help").stdout
    assert run("compile").returncode == 2
    assert "--input-shape" in run("compile", "--help").stdout


ALL_MODELS = sorted(f for f in os.listdir(MODELS_DIR) if f.endswith(".onnx"))


@pytest.mark.parametrize("extra", [[], ["--auto-cast", "matmult", "--auto-cast-type", "bf16"]],
                         ids=["fp32", "matmult-bf16"])
@pytest.mark.parametrize("name", ALL_MODELS)
def test_check_passes_for_every_bundled_model(capsys, name, extra):
    """The acceptance test of the models: `check` exits 0 (fp32: rtol 1e-3, atol 1e-4; auto-cast: the
    documented bound)."""
    code = _cli("check", os.path.join(MODELS_DIR, name), *extra)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "MISMATCH" not in out


def test_analyze_names_every_unsupported_node(tmp, capsys):
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="fine"),
                        helper.make_node("Det", ["r"], ["a"], name="bad_one"),
                        helper.make_node("Det", ["x"], ["b"], name="bad_two")],
                       {"x": ([4, 3, 3], TensorProto.FLOAT)},
                       {"a": ([4], TensorProto.FLOAT), "b": ([4], TensorProto.FLOAT)})
    onnx.save(model, f"{tmp}/m.onnx")
    assert _cli("analyze", f"{tmp}/m.onnx") == 1
    out = capsys.readouterr().out
    assert "Det                               2  no" in out and "Relu                              1  yes" in out
    assert "1 of 3 nodes of the model supported (33.3%)" in out
    assert "unsupported: bad_one (Det): operator Det is not supported" in out
    assert "unsupported: bad_two (Det)" in out
    assert _cli("compile", f"{tmp}/m.onnx", "-o", f"{tmp}/m.neff") == 1
    assert "bad_one" in capsys.readouterr().err and not os.path.exists(f"{tmp}/m.neff")


def test_run_profile_writes_a_chrome_trace(tmp, capsys):
    import json

    neff = f"{tmp}/m.neff"
    _cli("compile", MODEL, "-o", neff)
    np.savez(f"{tmp}/in.npz", x=np.ones((3, 100), np.float32))
    assert main(["run", neff, "--inputs", f"{tmp}/in.npz", "--outputs", f"{tmp}/o.npz",
                 "--profile", f"{tmp}/trace.json"]) == 0
    with open(f"{tmp}/trace.json") as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {threads[e["tid"]] for e in events} >= {"PE", "ACT"}
    assert all(e["dur"] > 0 for e in events)
    assert any(e["ph"] == "f" for e in trace["traceEvents"])
    assert any(e["name"] == "nc_matmul" and e["args"]["node"] == "/l0/MatMul" for e in events)
    assert max(e["ts"] + e["dur"] for e in events) == pytest.approx(trace["otherData"]["elapsed_us"])
    assert "busy" in capsys.readouterr().err


def _if_and_loop_model() -> onnx.ModelProto:
    """x -> If (its branches give x different shapes, so its output shape is open) -> Gather; and a Loop over x."""
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    f32 = TensorProto.FLOAT
    branch = lambda name, node: helper.make_graph(  # noqa: E731
        [node], name, [], [helper.make_tensor_value_info(node.output[0], f32, ["rows", "columns"])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["again"], ["again_out"]), helper.make_node("Add", ["sum", "x"], ["sum_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("again", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("sum", f32, [2, 3])],
        [helper.make_tensor_value_info("again_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("sum_out", f32, [2, 3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["z"], name="the_if",
                              then_branch=branch("then", helper.make_node("Relu", ["x"], ["kept"])),
                              else_branch=branch("else", helper.make_node("Flatten", ["x"], ["flat"], axis=0))),
             helper.make_node("Gather", ["z", "first"], ["picked"], name="pick", axis=0),
             helper.make_node("Loop", ["trips", "", "x"], ["summed"], name="the_loop", body=body)]
    return make_model(nodes, {"x": ([2, 3], f32)}, {"picked": (["n", "m"], f32), "summed": ([2, 3], f32)},
                      {"zero": np.array(0, np.float32), "first": np.array([0], np.int64),
                       "trips": np.array(3, np.int64)})


def test_analyze_names_the_models_own_operators(capsys):
    """A quantized model is reported as its QuantizeLinear, DequantizeLinear and Gemm nodes, not as the compiler's
    MatMulEpilogue and SaturatingCast (which the last line lists as what it compiles to)."""
    assert _cli("analyze", os.path.join(MODELS_DIR, "cnn_qdq.onnx")) == 0
    out = capsys.readouterr().out
    model = onnx.load(os.path.join(MODELS_DIR, "cnn_qdq.onnx"))
    rows = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()[1:] if line.endswith("yes")}
    assert rows == dict(collections.Counter(n.op_type for n in model.graph.node))
    assert rows["QuantizeLinear"] == 9 and rows["DequantizeLinear"] == 17 and rows["Gemm"] == 1
    compiled = out.splitlines()[-1]
    assert compiled.startswith("compiled as 64 nodes after the passes: ") and "MatMulEpilogue 1" in compiled


def test_analyze_traces_a_node_a_pass_made_to_the_model_node_it_came_from(tmp, capsys):
    """A Det inside a Loop's body is unrolled into nodes the model does not have: each is reported with the Loop
    it came from, and the Loop and its body's Det are the model's unsupported nodes."""
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    f32 = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["again"], ["again_out"]), helper.make_node("Det", ["m"], ["d"], name="det"),
         helper.make_node("Identity", ["m"], ["m_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("again", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("m", f32, [3, 3])],
        [helper.make_tensor_value_info("again_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("m_out", f32, [3, 3]), helper.make_tensor_value_info("d", f32, [])])
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Loop", ["trips", "", "r"], ["m_final", "dets"], name="the_loop", body=body)],
                       {"x": ([3, 3], f32)}, {"m_final": ([3, 3], f32), "dets": ([2], f32)},
                       {"trips": np.array(2, np.int64)})
    onnx.save(model, f"{tmp}/m.onnx")
    assert _cli("analyze", f"{tmp}/m.onnx") == 1
    out = capsys.readouterr().out
    assert "Det                               1  no" in out and "Loop                              1  no" in out
    assert "Relu                              1  yes" in out
    assert "1 of 5 nodes of the model supported (20.0%)" in out
    made = [line for line in out.splitlines() if line.startswith("unsupported: ")]
    assert made and all(" (Det) (from the_loop): operator Det is not supported" in line for line in made), made
    assert all(line.startswith("unsupported: the_loop/") for line in made), made


def test_analyze_reports_subgraph_ops_and_what_they_leave_dynamic(tmp, capsys):
    """An If on a run-time value is reported with why it stays and how to make it fold (no internal error); the
    Loop with a constant trip count is unrolled; a node whose shape the If leaves open is told why, and nobody is
    told to pin input shapes that are static already."""
    onnx.save(_if_and_loop_model(), f"{tmp}/m.onnx")
    assert _cli("analyze", f"{tmp}/m.onnx") == 1
    captured = capsys.readouterr()
    assert captured.err == ""
    out = captured.out
    # ReduceSum, Greater, the If with its branches' Relu and Flatten, the Gather, the Loop with its Identity and Add:
    # the If stays for run time (and with it its branches) and the Gather's input shape is open
    assert "5 of 9 nodes of the model supported (55.6%)" in out
    assert "If                                1  no" in out and "Relu                              1  no" in out
    assert "Loop                              1  yes" in out and "Identity                          1  yes" in out
    assert "unsupported: the_if (If): its condition 'positive' is known only at run time (it depends on input(s) " \
           "'x'); an If compiles when its condition folds to a constant (pin the input with --input-value" in out
    assert "the_loop" not in out
    assert "unsupported: pick (Gather): the shape of 'z' is not static after constant folding: If node 'the_if' " \
           "stays for run time" in out
    assert "--input-shape" not in out

    assert _cli("compile", f"{tmp}/m.onnx", "-o", f"{tmp}/m.neff") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("neuronx-cc-lite: error: NCC_SHAPE_DYNAMIC: node 'the_if' (If)")
    assert "--input-shape" not in err and not os.path.exists(f"{tmp}/m.neff")


@pytest.mark.slow
def test_analyze_never_fails_internally_on_the_onnx_node_tests(tmp, capsys):
    """Over every ONNX node test: a report (exit 0 or 1) or one coded line, never an internal error."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the test-case generators warn about the overflows they test
        cases = load_model_tests(kind="node")
    assert len(cases) > 1000
    bad = []
    for case in cases:
        model = case.model or onnx.load(os.path.join(case.model_dir, "model.onnx"))
        onnx.save(model, f"{tmp}/m.onnx")
        code = _cli("analyze", f"{tmp}/m.onnx")
        err = capsys.readouterr().err
        coded = err == "" or (err.count("\n") == 1 and err.startswith("neuronx-cc-lite: error: NCC_"))
        if code not in (0, 1) or not coded or "NCC_INTERNAL" in err or "NCC_VERIFY" in err:
            bad.append(f"{case.name}: exit {code}: {err.strip()}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(MODELS_DIR, "*.onnx"))), ids=os.path.basename)
def test_analyze_supports_every_bundled_model(path, capsys):
    """Issue 8: analyze runs on every model in models/ without an internal error, and finds every node of each
    supported (they all compile: tests/compiler/test_models.py)."""
    assert _cli("analyze", path) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "nodes of the model supported (100.0%)" in captured.out


def test_a_reader_that_stops_early_gets_no_error(tmp):
    """`disasm ... | head`: the listing is longer than a pipe holds, the reader closes after one line, and the
    command stops without a word on stderr (status 141 as a shell reports SIGPIPE, or 0 when the last write went
    out before the reader left)."""
    neff = f"{tmp}/m.neff"
    assert _cli("-q", "compile", os.path.join(MODELS_DIR, "bert_hf.onnx"), "-o", neff) == 0
    p = subprocess.Popen([sys.executable, "-m", "neuronx_cc_lite", "disasm", neff], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().startswith(b";")
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert p.returncode in (0, 141) and err == b"", err
