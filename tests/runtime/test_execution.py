"""Engines run concurrently, ordered only by semaphores: unsynchronised programs show it, deadlocks are named,
memory starts as NaN, every access is bounds-checked, and wrong inputs are refused clearly."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from isa.functions import ActFunc
from isa.instructions import make
import runtime
from tests.conftest import ROOT
from tests.runtime.helpers import hbm, model, psum, sbuf

X, OUT = 0, 4096


def _copy_program(synchronised: bool):
    """DMA load -> ACT relu -> DMA store, with or without the semaphores between them."""
    load_signal, act_wait, act_signal, store_wait = (5, ((5, 1),), 1, ((1, 1),)) if synchronised else \
        (None, (), None, ())
    return model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 8), src=hbm(X, 4, 8), signal=load_signal)],
        "ACT": [make("activation", dst=sbuf(4, 8, 1024), src=sbuf(4, 8), func=ActFunc.relu, scale=1.0,
                     waits=act_wait, signal=act_signal)],
        "DMA1": [make("dma_copy", dst=hbm(OUT, 4, 8), src=sbuf(4, 8, 1024), waits=store_wait)],
    }, {"x": (X, (4, 8))}, {"y": (OUT, (4, 8))})


def test_synchronised_program_is_right_under_every_policy():
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    m = _copy_program(True)
    for policy, seed in [("clock", 0)] + [("random", s) for s in range(10)]:
        np.testing.assert_array_equal(m.run({"x": x}, policy=policy, seed=seed)["y"], np.maximum(x, 0))


def test_missing_semaphores_read_unwritten_memory():
    """Without waits the engines do not run in program order: the store reads SBUF before anyone wrote it."""
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    y = _copy_program(False).run({"x": x})["y"]
    assert np.isnan(y).all()


def test_deadlock_names_the_waiting_instructions():
    m = model({
        "ACT": [make("activation", dst=sbuf(4, 8, 1024), src=sbuf(4, 8), func=ActFunc.relu, scale=1.0,
                     waits=((2, 1),), signal=1)],
        "DVE": [make("memset", dst=sbuf(4, 8), value=0.0, waits=((1, 1),), signal=2)],
    }, {}, {})
    with pytest.raises(runtime.DeadlockError) as e:
        m.run({})
    text = str(e.value)
    assert "core 0 ACT #0 activation waits for s2>=1 (is 0)" in text
    assert "core 0 DVE #0 memset waits for s1>=1 (is 0)" in text


def test_simulated_time_overlaps_independent_engines():
    one = model({"DVE": [make("memset", dst=sbuf(128, 4096), value=0.0)]}, {}, {})
    two = model({"DVE": [make("memset", dst=sbuf(128, 4096), value=0.0)],
                 "ACT": [make("tensor_copy", dst=sbuf(128, 4096, 65536), src=sbuf(128, 4096, 32768))]}, {}, {})
    one.run({})
    two.run({})
    assert two.last_run.elapsed_ns < 1.5 * one.last_run.elapsed_ns


def test_vector_and_gpsimd_take_turns_on_sbuf():
    """VectorE and GpSimdE share SBUF's port: their instructions run one after the other."""
    def memsets(engines: tuple[str, ...]) -> float:
        m = model({e: [make("memset", dst=sbuf(128, 4096, 65536 * k), value=0.0)] for k, e in enumerate(engines)},
                  {}, {})
        m.run({})
        return m.last_run.elapsed_ns

    assert memsets(("DVE", "POOL")) >= 0.99 * (memsets(("DVE",)) + memsets(("POOL",)))


def test_vector_and_scalar_take_turns_on_psum():
    def copies(engines: tuple[str, ...]) -> float:
        m = model({e: [make("tensor_copy", dst=sbuf(128, 512, 4096 * k), src=psum(128, 512, 2048 * k))]
                   for k, e in enumerate(engines)}, {}, {})
        m.run({})
        return m.last_run.elapsed_ns

    assert copies(("DVE", "ACT")) >= 0.99 * (copies(("DVE",)) + copies(("ACT",)))


def test_invalid_instruction_is_refused_at_load():
    with pytest.raises(runtime.LoadError, match="PE cannot write SBUF"):
        model({"PE": [make("nc_matmul", dst=sbuf(4, 4), stationary=sbuf(4, 4), moving=sbuf(4, 4),
                           accumulate=False)]}, {}, {})


def test_wrong_inputs_are_refused_with_names():
    m = _copy_program(True)
    good = np.zeros((4, 8), np.float32)
    with pytest.raises(runtime.InputError, match="missing input"):
        m.run({})
    with pytest.raises(runtime.InputError, match="unknown input.*'?z"):
        m.run({"x": good, "z": good})
    with pytest.raises(runtime.InputError, match=r"shape \[8, 4\], expected \[4, 8\]"):
        m.run({"x": good.T})
    with pytest.raises(runtime.InputError, match="dtype float64, expected float32"):
        m.run({"x": good.astype(np.float64)})


def test_runtime_imports_neither_onnx_nor_the_compiler():
    code = ("import sys, runtime; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('onnx', 'neuronx_cc_lite', 'lark', 'onnxruntime')]; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hbm_costs_only_the_pages_a_program_touches():
    """A bundle whose one transfer touches 16 bytes at the end of 3 GiB of HBM loads and runs in far less memory
    than 3 GiB: HBM is an anonymous mapping, and only the spans operands name are filled."""
    from isa.bundle import Bundle, Stream, TensorInfo
    from isa.dtypes import DType

    far = 3 * 2**30 - 16
    load = make("dma_copy", dst=sbuf(1, 4), src=hbm(far, 1, 4, DType.fp32), signal=5)
    store = make("dma_copy", dst=hbm(0, 1, 4, DType.fp32), src=sbuf(1, 4), waits=((5, 1),))
    b = Bundle("trn1", 3 * 2**30, [TensorInfo.whole("x", (1, 4), "float32", "fp32", far)],
               [TensorInfo.whole("y", (1, 4), "float32", "fp32", 0)], [{"DMA0": Stream([load], [""]),
                                                                         "DMA1": Stream([store], [""])}])
    before = _resident_kib()
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    model = runtime.load(b)
    np.testing.assert_array_equal(model.run({"x": x})["y"], x)
    grown_kib = _resident_kib() - before  # while the model, and its HBM, are alive
    assert grown_kib < 256 * 1024, f"loading and running grew the process by {grown_kib} KiB"


def _resident_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
