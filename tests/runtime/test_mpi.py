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


PARTNER = """
import os, signal, sys, time
from mpi4py import MPI
from runtime.errors import RanksError
from runtime.ranks import allgather
comm = MPI.COMM_WORLD
if comm.Get_rank() == 1:
    comm.send(os.getpid(), dest=0, tag=1)
    if sys.argv[1] == "stopped":
        os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(3)
partner = comm.recv(source=1, tag=1)
start = time.monotonic()
try:
    allgather(comm, {"x": 1}, "a collective")
    print("no error", flush=True)
except RanksError as e:
    print(f"after {time.monotonic() - start:.1f} s: {e}", flush=True)
if sys.argv[1] == "stopped":
    os.kill(partner, signal.SIGKILL)  # mpiexec waits for every process, the stopped one too
os._exit(1)
"""


@pytest.mark.parametrize("partner", ["stopped", "killed"])
def test_a_partner_stopped_or_killed_mid_run_is_a_coded_error_within_the_rank_timeout(tmp, partner):
    """A partner that stopped or died after the job started left the others waiting in their exchange for ever
    (mpiexec's own cleanup, which ends the whole job when a process dies, is off here, as -disable-auto-cleanup
    sets it)."""
    with open(f"{tmp}/partner.py", "w") as f:
        f.write(PARTNER)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NEURONX_CC_LITE_RANK_TIMEOUT": "2", "PYTHONPATH": root}
    result = subprocess.run([MPIEXEC, "-disable-auto-cleanup", "-n", "2", sys.executable, f"{tmp}/partner.py",
                             partner], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    said = [line for line in result.stdout.splitlines() if line.startswith(("after", "no error"))][0]
    assert said.endswith("process 0 of the MPI job waited 2 s for process 1 at a collective: killed, stopped or "
                         "stuck ($NEURONX_CC_LITE_RANK_TIMEOUT sets the wait)"), result.stdout + result.stderr
    assert float(said.split()[1]) < 10


def test_a_rank_timeout_that_is_not_a_number_is_a_usage_error(tmp, capsys, monkeypatch):
    from neuronx_cc_lite.cli import main

    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("NEURONX_CC_LITE_RANK_TIMEOUT", "soon")
    assert main(["run", f"{tmp}/m.neff"]) == 2
    assert "NCC_USAGE: $NEURONX_CC_LITE_RANK_TIMEOUT is 'soon', not a number of seconds" in capsys.readouterr().err


# A partner of the job that fails around MPI's own start-up. It writes its process id first, so that the test can
# end it if the launcher has not: a stopped process keeps mpiexec waiting.
EARLY_PARTNER = """
import os, signal, sys, time
open(sys.argv[2], "w").write(str(os.getpid()))
how = sys.argv[1]
if how.startswith("slow"):  # slow to import: reaches MPI's start-up late, then runs as the survivor does
    time.sleep(float(how[4:]))
    from neuronx_cc_lite.cli import main
    sys.exit(main(sys.argv[3:]))
if how in ("stopped", "crashed"):  # before MPI's start-up
    os.kill(os.getpid(), signal.SIGSTOP) if how == "stopped" else os._exit(5)
from mpi4py import MPI  # after it: dies or stops once process 0 has sent its part of the first agreement
MPI.COMM_WORLD.probe(source=0, tag=7301)
os.kill(os.getpid(), signal.SIGKILL if how == "killed" else signal.SIGSTOP)
"""

# Runs a command and writes its exit status to a file: the survivor's own status, which mpiexec's is not. The
# command and the process that waits for it are in a session of their own, out of reach of the launcher's clean-up
# (it SIGKILLs the process group of each process it started, and this one, which it started, leads its group).
STATUS_OF = """
import os, subprocess, sys
child = os.fork()
if child == 0:
    os.setsid()
    status = subprocess.call(sys.argv[2:], close_fds=False)  # the launcher's PMI_FD
    open(sys.argv[1], "w").write(str(status))
    os._exit(0)
os.waitpid(child, 0)
"""


def _early(tmp: str, how: str, survivors: int = 1, timeout: float = 2, launcher: tuple[str, ...] = (),
           wrap: bool = True) -> tuple[str, list[str], float]:
    """`survivors` processes run the tp2 bundle, the last process of the job is a partner that fails as `how` says;
    returns what mpiexec printed (its own notices go to stdout), each survivor's exit status and the seconds the job took (the partner is then made
    sure to be gone)."""
    import signal
    import time

    bundle = _tp2(tmp, "a", 0)
    for name, text in (("partner.py", EARLY_PARTNER), ("status_of.py", STATUS_OF)):
        with open(f"{tmp}/{name}", "w") as f:
            f.write(text)
    run = [CLI, "-q", "run", bundle, "--inputs", f"{tmp}/a.npz", "--outputs", f"{tmp}/out.npz"]
    command = [MPIEXEC, *launcher]
    for s in range(survivors):
        wrapper = [sys.executable, f"{tmp}/status_of.py", f"{tmp}/status{s}"] if wrap else []
        command += ["-n", "1", *wrapper, *run, ":"]
    command += ["-n", "1", sys.executable, f"{tmp}/partner.py", how, f"{tmp}/partner.pid", *run[1:]]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "NEURONX_CC_LITE_RANK_TIMEOUT": str(timeout),
           "PYTHONPATH": root}
    start = time.monotonic()
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = start + 60
        while time.monotonic() < deadline and job.poll() is None and not (
                wrap and all(os.path.exists(f"{tmp}/status{s}") for s in range(survivors))):
            time.sleep(0.1)
        took = time.monotonic() - start
        if job.poll() is None and os.path.exists(f"{tmp}/partner.pid"):  # a stopped partner keeps mpiexec waiting
            try:
                os.kill(int(open(f"{tmp}/partner.pid").read()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        stdout, stderr = job.communicate(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    statuses = [open(f"{tmp}/status{s}").read() if os.path.exists(f"{tmp}/status{s}") else "none"
                for s in range(survivors)]
    return stdout + stderr, statuses, took


def _clean(stderr: str, tmp: str) -> None:
    assert "Traceback" not in stderr and "NCC_INTERNAL" not in stderr, stderr
    assert not os.path.exists(f"{tmp}/out.npz")


@pytest.mark.parametrize("how", ["stopped", "crashed"])
def test_a_partner_that_never_starts_mpi_is_a_coded_error_within_the_rank_timeout(tmp, how):
    """A partner stopped or crashed before MPI's own start-up left the others inside MPI_Init for ever (Hydra ends
    the job only when a process dies of a signal), spinning; now each gives up after the rank timeout."""
    stderr, statuses, took = _early(tmp, how)
    assert ("neuronx-cc-lite: error: NRT_RANKS: process 0 of the MPI job waited 2 s in MPI's start-up for the "
            "other processes of the job: one of them did not start") in stderr, stderr
    assert statuses == ["1"] and took < 20, (statuses, took)
    _clean(stderr, tmp)


@pytest.mark.parametrize("how", ["killed", pytest.param("stopped-after-start-up", marks=pytest.mark.slow)])
def test_a_partner_lost_after_start_up_leaves_the_survivor_free_to_exit(tmp, how):
    """With the launcher's clean-up off, the survivor gave its NRT_RANKS error, then waited in MPI_Finalize for the
    lost partner for ever (or crashed in it, as MPICH's does when the partner has died): it now leaves without."""
    stderr, statuses, took = _early(tmp, how, launcher=("-disable-auto-cleanup",))
    assert ("NRT_RANKS: process 0 of the MPI job waited 2 s for process 1 at the agreement on the bundle: killed, "
            "stopped or stuck") in stderr, stderr
    assert statuses == ["1"] and took < 20, (statuses, took)
    _clean(stderr, tmp)


@pytest.mark.slow
def test_each_survivor_of_a_partner_that_never_starts_says_so(tmp):
    """The first survivor to leave MPI's start-up makes Hydra SIGKILL the others: the moment it leaves them
    (mpi_start.GRACE) lets theirs, whose timeouts end at about the same time, be said too."""
    stderr, statuses, took = _early(tmp, "stopped", survivors=2)
    for process in (0, 1):
        assert f"NRT_RANKS: process {process} of the MPI job waited 2 s in MPI's start-up" in stderr, stderr
    assert "1" in statuses and took < 30, (statuses, took)
    _clean(stderr, tmp)


@pytest.mark.slow
def test_a_partner_slow_to_start_within_the_rank_timeout_is_waited_for(tmp):
    stderr, statuses, took = _early(tmp, "slow3", timeout=30)
    assert statuses == ["0"], stderr
    assert os.path.exists(f"{tmp}/out.npz")


@pytest.mark.slow
def test_ctrl_c_while_mpi_starts_gives_the_interrupted_line_on_each_survivor(tmp):
    """mpiexec passes a first Ctrl-C on to every process; those inside MPI_Init could not run their handlers."""
    import signal
    import threading

    def interrupt() -> None:  # once the survivor is inside MPI's start-up, well before its timeout of 60 s
        import time

        time.sleep(8)
        for line in os.popen(f"ps -o pid= -o args= --ppid {os.getpid()}"):
            if MPIEXEC in line:
                os.kill(int(line.split()[0]), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    stderr, _, took = _early(tmp, "stopped", timeout=60, wrap=False)
    assert "neuronx-cc-lite: error: NCC_INTERRUPTED: interrupted (Ctrl-C); no output was written" in stderr, stderr
    assert took < 30
    _clean(stderr, tmp)


@pytest.mark.slow
def test_a_partner_killed_by_a_signal_makes_the_launcher_sigkill_the_survivors(tmp):
    """What MPICH's mpiexec does by default: when a process dies of a signal, it SIGKILLs every other process of
    the job at once (no SIGTERM first; measured with strace: within 15-30 ms), so they can say nothing. Here the
    survivor, whose rank timeout is 60 s, is gone within seconds, silent, and no output was written."""
    stderr, _, took = _early(tmp, "killed", timeout=60, wrap=False)
    assert "Killed (signal 9)" in stderr and "neuronx-cc-lite: error" not in stderr, stderr
    assert took < 30
    _clean(stderr, tmp)
