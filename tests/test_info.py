"""`neuronx-cc-lite info`: what a bundle needs of the chip (SBUF/PSUM peaks, semaphores) and how long it runs,
as text and as JSON, checked against what a run actually does."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest

import runtime
from isa import bundle as bundle_format
from isa.operand import Mem
from neuronx_cc_lite.cli import main
from neuronx_cc_lite.compiler import compile_model
from neuronx_cc_lite.reference import bundle_inputs
from runtime.memory import UNWRITTEN
from runtime.profile import estimated_latency_ns, on_chip_peak, semaphores_used
from tests.conftest import MODELS_DIR

MODELS = sorted(f for f in os.listdir(MODELS_DIR) if f.endswith(".onnx"))


def _compiled(name: str, tmp: str) -> str:
    path = os.path.join(tmp, "m.neff")
    bundle_format.write(compile_model(onnx.load(os.path.join(MODELS_DIR, name))), path)
    return path


@pytest.mark.parametrize("name", MODELS)
def test_estimates_are_what_a_run_does(name, tmp):
    """The estimated latency is the simulated latency of a run (timing never depends on values); SBUF and PSUM
    bytes past the reported peak are never touched, and the peak's last column is."""
    model = runtime.load(_compiled(name, tmp))
    model.run(bundle_inputs(model.bundle, 0))
    assert estimated_latency_ns(model.bundle, model.target) == pytest.approx(model.last_run.elapsed_ns, rel=1e-12)
    for mem, arrays in ((Mem.SBUF, model.memory.sbuf), (Mem.PSUM, model.memory.psum)):
        row, partitions = on_chip_peak(model.bundle, mem)
        touched = arrays[0] != UNWRITTEN
        assert 0 < row and 0 < partitions <= model.target.partitions
        assert not touched[:, row:].any() and not touched[partitions:].any()
        assert touched[:, :row].any(axis=0)[row - 16:].any()  # the peak is the top of what is used
    used = semaphores_used(model.bundle)
    signalled = {i.signal for s in model.bundle.cores[0].values() for i in s.instructions} - {None}
    assert len(used) == 1 and len(signalled) <= used[0] <= model.target.semaphores


def test_info_text_and_json_agree(tmp, capsys):
    neff = _compiled("mlp_odd.onnx", tmp)
    assert main(["info", neff]) == 0
    text = capsys.readouterr().out
    assert main(["info", neff, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    b = bundle_format.read(neff)
    assert info["flags"] == b.flags and info["stats"] == b.stats
    flags_line = next(line for line in text.splitlines() if line.startswith("flags"))
    assert json.loads(flags_line.split(None, 1)[1]) == b.flags  # JSON, not a Python repr
    assert info["inputs"] == [t.to_json() for t in b.inputs]
    assert info["sbuf"]["bytes_per_partition"] == 192 * 1024 and info["psum"]["bytes_per_partition"] == 16 * 1024
    assert 0 < info["sbuf"]["peak_bytes_per_partition"] <= info["sbuf"]["bytes_per_partition"]
    assert 0 < info["semaphores"]["used"][0] <= info["semaphores"]["per_core"] == 32
    model = runtime.load(neff)
    model.run({"x": np.ones((3, 100), np.float32)})
    assert info["estimated_latency_us"] == pytest.approx(model.last_run.elapsed_ns / 1000)
    assert 0 < info["roofline_us"] <= info["estimated_latency_us"]
    assert f"{info['estimated_latency_us']:.2f} us estimated" in text
    assert f"peak {info['sbuf']['peak_bytes_per_partition'] / 1024:.1f} KiB of 192 KiB" in text
    assert f"semaphores    {info['semaphores']['used'][0]} of 32 per core" in text


def test_info_on_a_bad_bundle_is_one_coded_line(tmp, capsys):
    with open(f"{tmp}/bad.neff", "wb") as f:
        f.write(b"not a bundle")
    assert main(["info", f"{tmp}/bad.neff", "--json"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("neuronx-cc-lite: error: NCC_BUNDLE"), err
    assert main(["info", f"{tmp}/missing.neff"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("neuronx-cc-lite: error: NRT_LOAD"), err
