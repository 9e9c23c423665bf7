"""The asynchronous API: submit, poll, wait, queue several, errors delivered to the handle."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import neuronx_cc_lite
import runtime
from runtime.errors import InputError
from runtime.execution_queue import ExecutionQueue, QueueError


@pytest.fixture(scope="module")
def model() -> runtime.Model:
    return runtime.load(neuronx_cc_lite.compile("models/mlp_small.onnx"))


def _input(model: runtime.Model, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in model.inputs}


def test_queued_inferences_give_what_synchronous_runs_give(model: runtime.Model) -> None:
    inputs = [_input(model, seed) for seed in range(3)]
    expected = [model.run(x) for x in inputs]
    with ExecutionQueue(model) as queue:
        handles = [queue.submit(x) for x in inputs]
        for x in inputs:  # the caller may reuse its arrays at once: the queue copied them
            for array in x.values():
                array.fill(np.nan)
        results = [h.wait(timeout=120) for h in handles]
    for want, got, h in zip(expected, results, handles):
        assert h.done() and h.stats is not None and h.stats.elapsed_ns > 0
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    assert [h.sequence for h in handles] == [0, 1, 2]


def test_a_failed_inference_raises_at_wait_and_the_next_still_runs(model: runtime.Model) -> None:
    with ExecutionQueue(model) as queue:
        bad = queue.submit({"not_an_input": np.zeros(1, np.float32)})
        good = queue.submit(_input(model, 7))
        with pytest.raises(InputError):
            bad.wait(timeout=120)
        assert set(good.wait(timeout=120)) == {o.name for o in model.outputs}


class _Gated:
    """A stand-in model whose runs wait for a gate: lets the test see a queued, unfinished inference."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.order: list[int] = []
        self.last_run = None

    def run(self, inputs: dict, **options: object) -> dict:
        self.gate.wait(timeout=60)
        self.order.append(int(inputs["k"]))
        return {"k": inputs["k"]}


def test_poll_timeout_and_order() -> None:
    gated = _Gated()
    queue = ExecutionQueue(gated)  # type: ignore[arg-type]
    handles = [queue.submit({"k": np.array(k)}) for k in range(4)]
    assert not any(h.done() for h in handles)
    with pytest.raises(QueueError, match="not finished"):
        handles[0].wait(timeout=0.05)
    gated.gate.set()
    assert [int(h.wait(timeout=60)["k"]) for h in handles] == [0, 1, 2, 3]
    assert gated.order == [0, 1, 2, 3]
    queue.close()
    with pytest.raises(QueueError, match="closed"):
        queue.submit({"k": np.array(9)})
