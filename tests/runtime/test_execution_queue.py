"""The asynchronous API: submit, poll, wait, queue several, errors delivered to the handle."""

from __future__ import annotations

import re
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


def test_two_queues_and_direct_runs_on_one_model_take_turns(model: runtime.Model) -> None:
    """One model, one set of memories: two queues and a thread running directly all get their own answers (they
    raised IndexError or mixed their inputs)."""
    inputs = [_input(model, seed) for seed in range(6)]
    expected = [model.run(x) for x in inputs]
    direct: list[dict[str, np.ndarray]] = []
    with ExecutionQueue(model) as first, ExecutionQueue(model) as second:
        handles = [(first if k % 2 else second).submit(x) for k, x in enumerate(inputs)]
        runner = threading.Thread(target=lambda: direct.extend(model.run(x) for x in inputs))
        runner.start()
        results = [h.wait(timeout=300) for h in handles]
        runner.join()
    for want, got, ran in zip(expected, results, direct):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
            np.testing.assert_array_equal(ran[name], want[name])


@pytest.mark.parametrize("call, error, says", [
    (lambda m: ExecutionQueue("model.neff"), TypeError, "takes a loaded model"),
    (lambda m: ExecutionQueue(m).submit([np.zeros(3)]), TypeError, "inputs must be a mapping"),
    (lambda m: ExecutionQueue(m).submit(_input(m, 0), policy="fastest"), ValueError, "policy must be one of"),
    (lambda m: ExecutionQueue(m).submit(_input(m, 0), colour="red"), TypeError, "unknown option(s) colour"),
    (lambda m: m.run(_input(m, 0), seed="one"), TypeError, "seed must be an integer"),
    (lambda m: m.run([1, 2]), TypeError, "inputs must be a mapping"),
])
def test_misuse_is_a_type_or_value_error_naming_the_argument(model: runtime.Model, call, error, says) -> None:
    with pytest.raises(error, match=re.escape(says)):
        call(model)
