"""MPI's own start-up and finalisation for `mpiexec -n K neuronx-cc-lite run`, bounded by the rank timeout.

MPI_Init_thread returns only once every process of the job has reached it (MPICH's does a PMI barrier over the
job): a partner stopped before it, crashed before it (Hydra, the launcher, ends the job only when a process dies of
a signal, not when it exits before MPI's start-up), or slow to import would leave every other process in it for
ever, spinning. mpi4py's MPI.Init_thread keeps the GIL all the while, so nothing else in the process could run.

So MPI is started here through ctypes, which lets go of the GIL during the call, with a watchdog thread beside
it. The watchdog waits, with select, on two things: the rank timeout, and the signals the command handles
(SIGINT, SIGTERM, SIGHUP: their Python handlers run only on the main thread, which is inside MPI, so
signal.set_wakeup_fd hands their numbers to a pipe the watchdog reads). Past the timeout it prints the NRT_RANKS
line; on a signal, the NCC_INTERRUPTED line. Either way it ends the process with os._exit(status), the only way out
of a call that does not return. Before that it leaves the other processes a moment (GRACE): once one process of
the job ends inside MPI's start-up, Hydra SIGKILLs all the others at once, so a process whose own timeout comes
later than that can print nothing.

MPI_Finalize waits for every process too, and runs under the same watchdog; after a process was given up on, it
is skipped (it would wait for that process for ever, or crash: MPICH's does once the process has died). MPI calls
stay on the main thread; the watchdog makes none. mpi4py is told not to start MPI itself at import
(rc.initialize) and to finalise it at exit (rc.finalize): a process that leaves without MPI_Finalize makes Hydra
SIGKILL every other process of the job.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from neuronx_cc_lite import interrupts

GRACE = 1.0  # seconds a process that gives up leaves the others to say so too before it ends the job
_job = {"started": False, "timeout": 0.0, "lost": False}  # MPI started here; its wait; a partner given up on


def start_world(timeout: float) -> Any:
    """MPI's COMM_WORLD once every process of the job has started MPI, or the process ends with the coded line
    (exit 1 past `timeout` seconds, 128 + the signal's number on SIGINT, SIGTERM or SIGHUP)."""
    import mpi4py

    mpi4py.rc.initialize = False  # takes effect only before mpi4py.MPI's first import
    mpi4py.rc.finalize = True
    from mpi4py import MPI

    if MPI.Is_initialized():  # started already by this program (an embedding one, a test)
        return MPI.COMM_WORLD
    init = ctypes.CDLL(MPI.__file__).MPI_Init_thread  # the extension's own libmpi answers the symbol
    init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    init.restype = ctypes.c_int
    provided = ctypes.c_int()
    with _watchdog(timeout, "start-up", "start (stopped, crashed before it, or slower than that)"):
        failed = init(None, None, MPI.THREAD_MULTIPLE, ctypes.byref(provided))  # mpi4py's own default level
    if failed:
        raise RuntimeError(f"MPI_Init_thread failed with error {failed}")
    MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)  # as mpi4py sets it when it starts MPI: errors raise
    _job.update(started=True, timeout=timeout)
    return MPI.COMM_WORLD


def partner_lost() -> None:
    """This process gave up on another of the job, or heard that one did: MPI_Finalize, which waits for every
    process, would wait for that one for ever (or crash, MPICH's does when it has died), so `finish` skips it."""
    _job["lost"] = True


def finish(status: int) -> int:
    """`status`, once MPI is finalised, as every process of the job must do before it leaves (Hydra SIGKILLs the
    others when one leaves without). MPI_Finalize waits for every process: bounded by the rank timeout, as the
    start-up is. After a lost partner the process leaves at once without it, GRACE seconds after its error (that
    moment lets the others say theirs: Hydra ends them when this one leaves)."""
    if not _job["started"]:
        return status
    from mpi4py import MPI

    if MPI.Is_finalized():
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    if _job["lost"]:
        time.sleep(GRACE)
        os._exit(status)
    with _watchdog(_job["timeout"], "finalisation", "finish (killed, stopped or stuck)"):
        ctypes.CDLL(MPI.__file__).MPI_Finalize()
    return status


def _process() -> str:
    """This process's number in the job, as the launcher gives it (MPI cannot say it before its start-up)."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return os.environ[name]
    return "?"


class _watchdog:
    """Inside, a thread ends the process with the coded line when `timeout` seconds pass or a handled signal comes;
    leaving the block (MPI has started) stops it."""

    def __init__(self, timeout: float, stage: str, missing: str) -> None:
        self.timeout, self.stage, self.missing = timeout, stage, missing
        self.lock = threading.Lock()  # the main thread leaving and the watchdog ending the process exclude each other
        self.done = False

    def __enter__(self) -> None:
        self.signals, self.wakeup = os.pipe()
        self.stop, self.stopper = os.pipe()
        os.set_blocking(self.wakeup, False)
        on_main = threading.current_thread() is threading.main_thread()  # only it may set the wakeup fd
        self.previous = signal.set_wakeup_fd(self.wakeup, warn_on_full_buffer=False) if on_main else None
        self.thread = threading.Thread(target=self._watch, name="mpi-start-watchdog", daemon=True)
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.done = True
        os.write(self.stopper, b"x")
        self.thread.join()
        if self.previous is not None:
            signal.set_wakeup_fd(self.previous)
        for fd in (self.signals, self.wakeup, self.stop, self.stopper):
            os.close(fd)

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.signals, self.stop], [], [], left)
            if self.stop in ready:
                return
            if self.signals in ready:
                signum = os.read(self.signals, 1)[0]
                if signum in interrupts.WHY:  # another signal a handler was set for is not the command's to end
                    why = interrupts.Interrupted(signum)
                    return self._end(interrupts.message(why), interrupts.status(why))
        self._end(f"NRT_RANKS: process {_process()} of the MPI job waited {self.timeout:g} s in MPI's {self.stage} "
                  f"for the other processes of the job: one of them did not {self.missing} "
                  "($NEURONX_CC_LITE_RANK_TIMEOUT sets the wait)", 1)

    def _end(self, line: str, status: int) -> None:
        with self.lock:
            if self.done:  # MPI started meanwhile: the main thread goes on (and meets the signal itself)
                return
            print(f"{interrupts.PROG}: error: {line}", file=sys.stderr, flush=True)
            time.sleep(GRACE)
            os._exit(status)
