"""Asynchronous execution, in the spirit of the Neuron runtime's `nrta_*` calls: submit an inference and get a
handle at once, poll it or wait on it, queue several.

    queue = runtime.ExecutionQueue(runtime.load("model.neff"))
    first = queue.submit({"x": x1})
    second = queue.submit({"x": x2}, policy="random", seed=3)
    first.done()               # poll: has it run?
    outputs = second.wait()    # block until it has run; raises the error the run raised
    queue.close()              # or use the queue as a context manager

A model is one program with one set of memories, so its inferences run one after another in the order they were
submitted, on the queue's one worker thread (as a NeuronCore runs its queue); the caller's thread is free
meanwhile. Inputs are copied at submit, so the caller may reuse its arrays at once. Several queues on one model,
or a queue and direct runs, take turns on it (Model.run is one run at a time).
"""

from __future__ import annotations

import queue as queues
import threading
from typing import Any, Mapping

import numpy as np

from runtime.errors import NeuronRuntimeError
from runtime.model import IoBytes, Model, check_run_options
from runtime.simulator import RunStats


class QueueError(NeuronRuntimeError):
    code = "NRT_QUEUE"


class Handle:
    """One submitted inference."""

    def __init__(self, sequence: int) -> None:
        self.sequence = sequence  # submission order, from 0
        self._finished = threading.Event()
        self._outputs: dict[str, np.ndarray] | None = None
        self._error: BaseException | None = None
        self.stats: RunStats | None = None  # the run's simulated time and counts, once it has run
        self.io: IoBytes | None = None  # the bytes the run copied between host and device, once it has run

    def done(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> dict[str, np.ndarray]:
        """The outputs, once the inference has run; raises its error, or QueueError when `timeout` seconds pass
        first (the inference stays queued)."""
        if not self._finished.wait(timeout):
            raise QueueError(f"inference #{self.sequence} has not finished within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._outputs is not None
        return self._outputs

    def _finish(self, outputs: dict[str, np.ndarray] | None, error: BaseException | None,
                stats: RunStats | None, io: IoBytes | None = None) -> None:
        self._outputs, self._error, self.stats, self.io = outputs, error, stats, io
        self._finished.set()


_STOP = object()


RUN_OPTIONS = frozenset({"policy", "seed", "trace", "check_races"})


class ExecutionQueue:
    def __init__(self, model: Model) -> None:
        if not callable(getattr(model, "run", None)):
            raise TypeError(f"ExecutionQueue takes a loaded model (runtime.load(...)), not {type(model).__name__}")
        self.model = model
        self._jobs: queues.Queue[Any] = queues.Queue()
        self._submitted = 0
        self._closed = False
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._work, name="neuron-execution-queue", daemon=True)
        self._worker.start()

    def submit(self, inputs: Mapping[str, np.ndarray], **run_options: Any) -> Handle:
        """Queue one inference; `run_options` are those of Model.run (policy, seed, trace, check_races). Arguments
        that could not mean anything raise TypeError or ValueError here, not later on the handle."""
        unknown = sorted(set(run_options) - RUN_OPTIONS)
        if unknown:
            raise TypeError(f"submit() got unknown option(s) {', '.join(unknown)} (it takes "
                            f"{', '.join(sorted(RUN_OPTIONS))})")
        check_run_options(inputs, run_options.get("policy", "clock"), run_options.get("seed", 0))
        with self._lock:
            if self._closed:
                raise QueueError("the queue is closed")
            handle = Handle(self._submitted)
            self._submitted += 1
            copied = {name: np.array(value, copy=True) for name, value in inputs.items()}
            self._jobs.put((handle, copied, run_options))
        return handle

    def close(self) -> None:
        """Refuse new work, run what is queued, and stop the worker."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._jobs.put(_STOP)
        self._worker.join()

    def __enter__(self) -> ExecutionQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            handle, inputs, options = job
            try:
                io = None
                if isinstance(self.model, Model):
                    outputs, stats, io = self.model.run_with_io(inputs, **options)
                else:  # a stand-in with a run() of its own
                    outputs, stats = self.model.run(inputs, **options), self.model.last_run
            except Exception as e:  # delivered to whoever waits on the handle
                handle._finish(None, e, None)
            else:
                handle._finish(outputs, None, stats, io)
