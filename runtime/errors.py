"""Runtime errors. Each has a stable code, printed first on its one line."""

from __future__ import annotations


class NeuronRuntimeError(Exception):
    code = "NRT"

    def __str__(self) -> str:
        return f"{self.code}: {super().__str__()}"


class LoadError(NeuronRuntimeError):
    code = "NRT_LOAD"


class InputError(NeuronRuntimeError):
    code = "NRT_INPUT"


class AccessError(NeuronRuntimeError):
    code = "NRT_ACCESS"


class DeadlockError(NeuronRuntimeError):
    code = "NRT_DEADLOCK"


class CollectiveError(NeuronRuntimeError):
    """Ranks of a replica group posted different collectives as their k-th on it."""

    code = "NRT_COLLECTIVE"


class RanksError(NeuronRuntimeError):
    """The processes of an MPI job run different bundles or inputs, or one of them failed before the run."""

    code = "NRT_RANKS"
