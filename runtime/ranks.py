"""Where the ranks of a bundle run: one small interface, two implementations.

    InProcess   every rank in this process (the default; deterministic)
    MpiRanks    ranks spread over the processes `mpiexec -n K` started: rank r on process r * K // ranks, so
                the ranks of a chip stay together when K divides the chip count

Under MPI every process runs the same simulation of every rank's timing, so all of them reach the same collective
at the same point of the same event order; only the ranks a process hosts compute values. A collective is where
values cross processes: when it starts, each process contributes the source buffers of the members it hosts and
receives the others' (`exchange`, an allgather called by every process in the same order), then each computes the
collective from the same buffers in the same group order, which is why outputs are bit-identical to an in-process
run. Outputs are gathered to process 0 (`gather_outputs`).

No wait on another process is unbounded. Every exchange (the agreement before the run, each collective, the
outputs) is point to point, polled: a process that has not sent its part within the rank timeout
(`$NEURONX_CC_LITE_RANK_TIMEOUT` seconds, default 600) is named as killed, stopped or stuck, and the process that
gave up tells every other one, so that each ends with that NRT_RANKS error instead of waiting on. A rank that fails
on its process (say, an out-of-range gather index) does the same with its own error, then aborts the MPI job.
A RanksError that gave up on a process, or heard that another did, says so (`partner_lost`): MPI_Finalize would
wait for that process too, so the command leaves without it. (MPICH's mpiexec itself SIGKILLs every process of the
job at once when one ends without MPI_Finalize; MPI's own start-up is bounded by neuronx_cc_lite/mpi_start.py.)
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Mapping

import numpy as np

# Message tags of the exchanges and of the notices a process sends when it gives up (any value below MPI's upper
# bound on tags, 32767 at least, that nothing else in the job uses)
_PART, _NOTICE = 7301, 7302
DEFAULT_TIMEOUT = 600.0  # seconds a process waits for another's part of an exchange
GRACE = 1.0  # seconds a failing process leaves the others to report before it aborts the job


class InProcess:
    """Every rank in this process."""

    process = 0
    processes = 1

    def local(self, rank: int) -> bool:
        return True

    def exchange(self, members: tuple[int, ...], buffers: Mapping[int, np.ndarray]) -> list[np.ndarray]:
        return [buffers[r] for r in members]

    def gather_outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        return outputs

    def abort(self, error: BaseException) -> None:
        """Nothing else to stop: the error goes on up."""


class MpiRanks:
    """Ranks spread over the processes of an MPI job (mpi4py's COMM_WORLD unless given another communicator)."""

    def __init__(self, ranks: int, comm: Any = None) -> None:
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        self.comm = comm
        self.process = comm.Get_rank()
        self.processes = comm.Get_size()
        self.ranks = ranks

    def host_of(self, rank: int) -> int:
        return rank * self.processes // self.ranks

    def local(self, rank: int) -> bool:
        return self.host_of(rank) == self.process

    def exchange(self, members: tuple[int, ...], buffers: Mapping[int, np.ndarray]) -> list[np.ndarray]:
        mine = {r: buffers[r] for r in members if self.local(r)}
        everyone: dict[int, np.ndarray] = {}
        for part in allgather(self.comm, mine, "a collective"):
            everyone.update(part)
        return [everyone[r] for r in members]

    def gather_outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Process 0 gets every output piece the others read; it alone returns the outputs."""
        if self.process != 0:
            _send_all(self.comm, [_isend(self.comm, outputs, 0)], "the outputs")
            return None
        merged: dict[str, np.ndarray] = dict(outputs)
        for part in _receive(self.comm, range(1, self.processes), "the outputs").values():
            merged.update(part)
        return merged

    def abort(self, error: BaseException) -> None:
        """Say the error, tell the other processes (they stop waiting on this one and say it too), leave them a
        moment to, and end the job."""
        print(f"neuronx-cc-lite: error: process {self.process}: {error}", file=sys.stderr, flush=True)
        if not getattr(error, "heard", False):
            notify(self.comm, f"process {self.process} of the MPI job failed during the run: {error}")
        time.sleep(GRACE)
        self.comm.Abort(1)


def rank_timeout() -> float:
    """Seconds a process waits for another's part of an exchange ($NEURONX_CC_LITE_RANK_TIMEOUT, else 600)."""
    text = os.environ.get("NEURONX_CC_LITE_RANK_TIMEOUT", "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        raise ValueError(f"$NEURONX_CC_LITE_RANK_TIMEOUT is {text!r}, not a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"$NEURONX_CC_LITE_RANK_TIMEOUT is {text!r}, not a positive number of seconds")
    return seconds


def allgather(comm: Any, mine: Any, what: str) -> list[Any]:
    """comm.allgather(mine), bounded: every process's part in process order, or RanksError naming the processes
    whose part did not come within the rank timeout (or the failure another process told of meanwhile)."""
    me, count = comm.Get_rank(), comm.Get_size()
    sends = [_isend(comm, mine, p) for p in range(count) if p != me]
    parts = _receive(comm, (p for p in range(count) if p != me), what)
    _send_all(comm, sends, what)
    parts[me] = mine
    return [parts[p] for p in range(count)]


def notify(comm: Any, text: str) -> None:
    """Tell every other process of the job why this one stops (they raise it as their RanksError)."""
    for p in range(comm.Get_size()):
        if p != comm.Get_rank():
            comm.isend(text, dest=p, tag=_NOTICE)


def _isend(comm: Any, value: Any, to: int) -> Any:
    return comm.isend(value, dest=to, tag=_PART)


def _receive(comm: Any, sources: Any, what: str) -> dict[int, Any]:
    """The next part from each of `sources`, polled (with a back-off to 10 ms) until the rank timeout."""
    pending, parts = list(sources), {}
    deadline, pause = time.monotonic() + rank_timeout(), 0.0005
    while pending:
        for p in list(pending):
            if comm.iprobe(source=p, tag=_PART):
                parts[p] = comm.recv(source=p, tag=_PART)
                pending.remove(p)
        if pending:
            _wait_a_little(comm, deadline, pause, pending, what)
            pause = min(2 * pause, 0.01)
    return parts


def _send_all(comm: Any, sends: list[Any], what: str) -> None:
    """Wait, within the rank timeout, until every part this process sent has gone (a large one goes only once its
    receiver takes it)."""
    from mpi4py import MPI

    deadline, pause = time.monotonic() + rank_timeout(), 0.0005
    while not MPI.Request.Testall(sends):
        _wait_a_little(comm, deadline, pause, None, what)
        pause = min(2 * pause, 0.01)


def _wait_a_little(comm: Any, deadline: float, pause: float, pending: list[int] | None, what: str) -> None:
    """Sleep `pause`; RanksError when another process told of a failure, or when the deadline has passed (this
    process then tells the others)."""
    from runtime.errors import RanksError

    if comm.iprobe(tag=_NOTICE):  # a notice comes only from a process that gave up on another, or that aborts
        error = RanksError(comm.recv(tag=_NOTICE))
        error.heard = True  # type: ignore[attr-defined]
        error.partner_lost = True  # type: ignore[attr-defined]
        raise error
    if time.monotonic() > deadline:
        who = (f"process{'es' if len(pending) > 1 else ''} {', '.join(map(str, pending))}" if pending
               else "a process that did not take its part")
        text = (f"process {comm.Get_rank()} of the MPI job waited {rank_timeout():g} s for {who} at {what}: "
                "killed, stopped or stuck ($NEURONX_CC_LITE_RANK_TIMEOUT sets the wait)")
        notify(comm, text)
        error = RanksError(text)
        error.partner_lost = True  # type: ignore[attr-defined]  # MPI_Finalize would wait for it (or crash)
        raise error
    time.sleep(pause)


def launched_by_mpi() -> bool:
    """Whether this process is one of several that an MPI launcher started (MPICH/Hydra, Open MPI, PMIx); a
    launcher variable that is not a count raises ValueError naming it."""
    import os

    for size in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        text = os.environ.get(size, "1") or "1"
        try:
            count = int(text)
        except ValueError:
            raise ValueError(f"${size} is {text!r}, not a number of processes") from None
        if count > 1:
            return True
    return False


def agree(comm: Any, mine: dict[str, Any], what: str) -> None:
    """Every process of the job states what it is about to run (`mine`: the bundle's hash, the inputs' digest) or
    the error that stopped it ({"error": text}); all of them see every statement (one allgather, which every process
    reaches: a process that failed still takes part instead of leaving the others waiting in the first collective)
    and a failure or a disagreement raises RanksError on every process that did not fail itself."""
    from runtime.errors import RanksError

    everyone = allgather(comm, mine, f"the agreement on {what}")
    for process, said in enumerate(everyone):
        if "error" in said and "error" not in mine:
            raise RanksError(f"process {process} of the MPI job failed before the run: {said['error']}")
    if "error" in mine:
        return  # the caller raises its own error
    for process, said in enumerate(everyone):
        for key, value in mine.items():
            if said.get(key) != value:
                raise RanksError(f"the processes of the MPI job disagree on {what}: process {process} has {key} "
                                 f"{_short(said.get(key))}, process {comm.Get_rank()} {_short(value)}")


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
