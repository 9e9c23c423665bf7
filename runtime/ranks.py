"""Where the ranks of a bundle run: one small interface, two implementations.

    InProcess   every rank in this process (the default; deterministic)
    MpiRanks    ranks spread over the processes `mpiexec -n K` started: rank r on process r * K // ranks, so
                the ranks of a chip stay together when K divides the chip count

Under MPI every process runs the same simulation of every rank's timing, so all of them reach the same collective
at the same point of the same event order; only the ranks a process hosts compute values. A collective is where
values cross processes: when it starts, each process contributes the source buffers of the members it hosts and
receives the others' (`exchange`, one MPI allgather, called by every process in the same order), then each
computes the collective from the same buffers in the same group order, which is why outputs are bit-identical to
an in-process run. Outputs are gathered to process 0 (`gather_outputs`). A rank that fails with an error on one
process (say, an out-of-range gather index) aborts the MPI job: the other processes cannot know and would wait.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import numpy as np


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
        for part in self.comm.allgather(mine):
            everyone.update(part)
        return [everyone[r] for r in members]

    def gather_outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Process 0 gets every output piece the others read; it alone returns the outputs."""
        parts = self.comm.gather(outputs, root=0)
        if self.process != 0:
            return None
        merged: dict[str, np.ndarray] = {}
        for part in parts:
            merged.update(part)
        return merged

    def abort(self, error: BaseException) -> None:
        print(f"neuronx-cc-lite: error: process {self.process}: {error}", file=sys.stderr, flush=True)
        self.comm.Abort(1)


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

    everyone = comm.allgather(mine)
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
