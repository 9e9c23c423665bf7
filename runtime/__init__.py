"""The neuronx-cc-lite runtime: loads a bundle and runs it on a simulated chip.

It depends on numpy, ml_dtypes and the bundle contract in `isa/` only: never on onnx or the compiler.
"""

from runtime.errors import (AccessError, CollectiveError, DeadlockError, InputError, LoadError,
                            NeuronRuntimeError)
from runtime.execution_queue import ExecutionQueue, Handle, QueueError
from runtime.model import IoBytes, Model, load
from runtime.races import RaceError
from runtime.state import DeviceState

__all__ = ["load", "Model", "DeviceState", "IoBytes", "ExecutionQueue", "Handle", "NeuronRuntimeError", "LoadError",
           "InputError", "AccessError", "CollectiveError", "DeadlockError", "RaceError", "QueueError"]
