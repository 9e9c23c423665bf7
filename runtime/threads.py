"""The runtime chooses its own BLAS threading: one thread while it simulates.

The simulator calls numpy once per instruction, on at most a tile: a matmul of 128 x 128 x 512, an elementwise
operation over 128 partitions. OpenBLAS's worker threads cost more to wake than such a call takes, and on a busy
machine they spin against the other processes for the cores: a ResNet-18 run took 10-28 s with OpenBLAS's default
threads on a loaded 2-core machine and 0.4-0.5 s with one (issue 20). So every run sets the BLAS libraries numpy
loaded to one thread (threadpoolctl, about 0.2 ms) and gives them back their setting when it ends, whatever the
user's environment says; what the caller does outside a run keeps its threads.

BLAS's thread count is one setting per process, so runs that overlap (an ExecutionQueue's worker beside the
caller's own runs) share one limit: the first run in sets it, the last one out restores it. (The OpenBLAS numpy
ships, 0.3.31, ignores a count set from another thread once the main thread has set one: after a caller's
run on the main thread and a worker's run overlap and the worker's ends last, BLAS may stay on one thread.)
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

_lock = threading.Lock()
_inside = 0  # runs inside the limit now
_limit: Any = None  # threadpoolctl's limiter while _inside > 0


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread while inside (nested and concurrent uses share one limit)."""
    global _inside, _limit
    with _lock:
        if _inside == 0:
            from threadpoolctl import threadpool_limits  # here: `import runtime` stays light

            _limit = threadpool_limits(limits=1, user_api="blas")
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                _limit.restore_original_limits()
                _limit = None
