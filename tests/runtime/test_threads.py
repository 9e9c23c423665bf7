"""The runtime chooses its own BLAS threading (runtime/threads.py): one thread while a run simulates, the caller's
setting back afterwards, and runs that overlap share the limit (issue 20)."""

from __future__ import annotations

import threading

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from runtime.threads import one_blas_thread
from tests.conftest import compile_to_model, gemm_model


def _blas_threads() -> set[int]:
    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


def test_a_run_simulates_on_one_blas_thread_and_gives_the_setting_back(tmp_path, monkeypatch):
    model = compile_to_model(gemm_model(4, 64, 32), tmp_path)
    seen = []
    simulate = model.simulator.run

    def watched(*args, **kwargs):
        seen.append(_blas_threads())
        return simulate(*args, **kwargs)

    monkeypatch.setattr(model.simulator, "run", watched)
    with threadpool_limits(limits=2, user_api="blas"):
        model.run({"x": np.ones((4, 64), np.float32)})
        assert _blas_threads() == {2}
    assert seen == [{1}]


class _FakeLimits:
    """threadpoolctl's limiter, recording what the runtime asks of it."""

    calls: list[str] = []

    def __init__(self, limits: int, user_api: str) -> None:
        self.calls.append(f"limit {user_api} to {limits}")

    def restore_original_limits(self) -> None:
        self.calls.append("restore")


def test_overlapping_runs_share_one_limit_until_the_last_ends(monkeypatch):
    """An ExecutionQueue's worker starts a run; the caller's own run starts, and ends after the worker's: BLAS's
    one thread count is set once, when the first run starts, and given back once, when the last one ends."""
    import threadpoolctl

    monkeypatch.setattr(threadpoolctl, "threadpool_limits", _FakeLimits)
    monkeypatch.setattr(_FakeLimits, "calls", [])
    worker_in, caller_in, worker_out = threading.Event(), threading.Event(), threading.Event()

    def queue_worker() -> None:
        with one_blas_thread():
            worker_in.set()
            caller_in.wait()
        _FakeLimits.calls.append("worker's run ended")
        worker_out.set()

    worker = threading.Thread(target=queue_worker)
    worker.start()
    worker_in.wait()
    with one_blas_thread():
        caller_in.set()
        worker_out.wait()
    worker.join()
    assert _FakeLimits.calls == ["limit blas to 1", "worker's run ended", "restore"]
