"""Ranks over MPI processes: `mpiexec -n K neuronx-cc-lite run` gives the bytes an in-process run gives, and a
rank that fails, or ranks that disagree, end the whole job with the coded error in bounded time."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import neuronx_cc_lite
import runtime
from isa import bundle as bundle_format
from isa.dtypes import DType
from isa.functions import AluOp
from isa.instructions import make
from tests.conftest import MODELS_DIR
from tests.runtime import test_collectives as collectives
from tests.runtime.helpers import hbm, sbuf

BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
CLI = os.path.join(BIN, "neuronx-cc-lite")
TIMEOUT = 120  # a hang would be a failure, not a wait


def _run(tmp: str, bundle: str, processes: int, out: str) -> subprocess.CompletedProcess:
    command = [CLI, "-q", "run", bundle, "--inputs", f"{tmp}/in.npz", "--outputs", out]
    if processes > 1:
        command = [MPIEXEC, "-n", str(processes), *command]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def _same_bytes(expected: dict[str, np.ndarray], path: str) -> None:
    with np.load(path) as y:
        assert sorted(y.files) == sorted(expected)
        for name, x in expected.items():
            assert x.dtype == y[name].dtype and x.tobytes() == y[name].tobytes(), name


def test_a_tp4_bundle_over_two_and_three_processes_gives_the_in_process_bytes(tmp):
    path = f"{tmp}/gpt.neff"
    neuronx_cc_lite.compile(os.path.join(MODELS_DIR, "gpt_modern.onnx"), tp=4, output=path)
    x = np.random.default_rng(0).standard_normal((1, 32, 64)).astype(np.float32)
    np.savez(f"{tmp}/in.npz", hidden=x)
    expected = runtime.load(path).run({"hidden": x})
    for processes in (2, 3):
        many = _run(tmp, path, processes, f"{tmp}/many{processes}.npz")
        assert many.returncode == 0, many.stderr
        _same_bytes(expected, f"{tmp}/many{processes}.npz")


@pytest.mark.parametrize("op", collectives.OPS)
def test_each_collective_over_processes(tmp, op):
    dtype = collectives.DTYPES["fp32"]
    streams, src, dst = collectives._one_collective(op, 4, dtype)
    bundle_format.write(collectives.bundle(streams, src, dst, dtype), f"{tmp}/c.neff")
    x = collectives._inputs(4, src, dtype)
    np.savez(f"{tmp}/in.npz", x=x)
    two = _run(tmp, f"{tmp}/c.neff", 2, f"{tmp}/two.npz")
    assert two.returncode == 0, two.stderr
    _same_bytes(runtime.load(f"{tmp}/c.neff").run({"x": x}), f"{tmp}/two.npz")


def test_ranks_that_disagree_end_the_job_with_the_named_error(tmp):
    dt = collectives.DTYPES["fp32"]
    buffer = collectives.buffer
    streams = [{"CC": [make("all_reduce", dst=buffer(collectives.OUT, 8, dt), src=buffer(collectives.IN, 8, dt),
                            group=0, op=op)]} for op in (AluOp.add, AluOp.maximum)]
    bundle_format.write(collectives.bundle(streams, 8, 8, dt), f"{tmp}/c.neff")
    np.savez(f"{tmp}/in.npz", x=np.ones((2, 8), np.float32))
    result = _run(tmp, f"{tmp}/c.neff", 2, f"{tmp}/out.npz")
    assert result.returncode != 0
    assert "NRT_COLLECTIVE: ranks 0 and 1 disagree on collective #0 of group 0" in result.stderr
    assert not os.path.exists(f"{tmp}/out.npz")


def test_a_rank_that_fails_on_its_process_stops_the_others(tmp):
    """Rank 1 (process 1) gathers a row past its table; rank 0 (process 0) waits for it in an all_reduce."""
    dt = collectives.DTYPES["fp32"]
    buffer, IN, OUT = collectives.buffer, collectives.IN, collectives.OUT
    coll = make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0, op=AluOp.add, waits=((3, 1),))
    index = sbuf(1, 1, dtype=DType.int32)
    failing = {"DMA0": [make("dma_copy", dst=index, src=hbm(collectives.STAGE, 1, 1, DType.int32)),
                        make("dma_gather", dst=sbuf(1, 4, 64), src=hbm(IN, 1, 4), index=index, rows=2, row_stride=4,
                             signal=3)],
               "CC": [coll]}
    b = collectives.bundle([{"CC": [make("all_reduce", dst=buffer(OUT, 8, dt), src=buffer(IN, 8, dt), group=0,
                                         op=AluOp.add)]}, failing], 8, 8, dt)
    b.weights = [bundle_format.Segment(collectives.STAGE, np.array([5], np.int32).tobytes(), 1)]
    bundle_format.write(b, f"{tmp}/c.neff")
    np.savez(f"{tmp}/in.npz", x=np.ones((2, 8), np.float32))
    result = _run(tmp, f"{tmp}/c.neff", 2, f"{tmp}/out.npz")
    assert result.returncode != 0
    assert "NRT_ACCESS: core 1 DMA0 #1 dma_gather" in result.stderr
    assert not os.path.exists(f"{tmp}/out.npz")


def _mpmd(tmp: str, first: list[str], second: list[str]) -> subprocess.CompletedProcess:
    """Two processes, each with its own command line (as `mpiexec -n 1 A : -n 1 B` runs them)."""
    command = [MPIEXEC, "-n", "1", CLI, "-q", "run", *first, ":", "-n", "1", CLI, "-q", "run", *second]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def _tp2(tmp: str, name: str, seed: int) -> str:
    path = f"{tmp}/{name}.neff"
    neuronx_cc_lite.compile(os.path.join(MODELS_DIR, "gpt_modern.onnx"), tp=2, output=path, cache=False)
    x = np.random.default_rng(seed).standard_normal((1, 32, 64)).astype(np.float32)
    np.savez(f"{tmp}/{name}.npz", hidden=x)
    return path


@pytest.mark.parametrize("partner, says", [
    ("another bundle", "disagree on the bundle"),
    ("other inputs", "disagree on the inputs"),
    ("a missing bundle", "process 1 of the MPI job failed before the run: NRT_LOAD: cannot read"),
    ("inputs of another shape", "process 1 of the MPI job failed before the run: NRT_INPUT"),
])
def test_processes_that_disagree_or_fail_before_the_run_stop_with_a_coded_error(tmp, partner, says):
    """A partner running another bundle or other inputs made process 0 write a wrong answer with status 0; one
    that failed to load or to read its inputs left the others waiting in the first collective."""
    bundle = _tp2(tmp, "a", 0)
    mine = [bundle, "--inputs", f"{tmp}/a.npz", "--outputs", f"{tmp}/out.npz"]
    theirs = list(mine)
    if partner == "another bundle":  # the same model compiled with other options: another program
        theirs[0] = f"{tmp}/b.neff"
        neuronx_cc_lite.compile(os.path.join(MODELS_DIR, "gpt_modern.onnx"), tp=2, output=theirs[0], cache=False,
                                optimize=1)
    elif partner == "other inputs":
        theirs[2] = f"{tmp}/b.npz"
        np.savez(theirs[2], hidden=np.zeros((1, 32, 64), np.float32))
    elif partner == "a missing bundle":
        theirs[0] = f"{tmp}/missing.neff"
    else:
        theirs[2] = f"{tmp}/b.npz"
        np.savez(theirs[2], hidden=np.zeros((1, 16, 64), np.float32))
    result = _mpmd(tmp, mine, theirs)
    assert result.returncode != 0
    assert says in result.stderr and "error: NRT_RANKS: " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.exists(f"{tmp}/out.npz")


def test_a_launcher_variable_that_is_not_a_count_is_a_usage_error(tmp, capsys, monkeypatch):
    from neuronx_cc_lite.cli import main

    monkeypatch.setenv("PMI_SIZE", "two")
    assert main(["run", f"{tmp}/m.neff"]) == 2
    assert "NCC_USAGE: $PMI_SIZE is 'two', not a number of processes" in capsys.readouterr().err
