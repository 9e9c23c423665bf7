"""The race checker keeps every read since the last write, so its verdict does not depend on the schedule; a
wait means what the listing says; its shadow costs what the program touches, not what HBM holds."""

from __future__ import annotations

import numpy as np
import pytest

from isa.bundle import Bundle, Stream, TensorInfo
from isa.functions import ActFunc
from isa.instructions import make
import runtime
from runtime.races import Access, RaceChecker
from tests.runtime.helpers import hbm, model, sbuf

X, OUT_A, OUT_B = 0, 4096, 8192
SCHEDULES = [("clock", 0)] + [("random", seed) for seed in range(20)]


def _two_readers(overwrite_waits: tuple[tuple[int, int], ...],
                 act_signal: int = 1, dve_signal: int = 2) -> runtime.Model:
    """DMA0 loads tile T; ACT and DVE both read T (concurrently: each waits only for the load); DMA2 then
    overwrites T after `overwrite_waits`. The overwrite is race-free only when ordered after both reads. DMA1
    stores what ACT and DVE wrote, after both when they share a semaphore."""
    shared = act_signal == dve_signal
    stores = [((act_signal, 2),)] * 2 if shared else [((act_signal, 1),), ((dve_signal, 1),)]
    return model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 8), src=hbm(X, 4, 8), signal=5)],
        "ACT": [make("activation", dst=sbuf(4, 8, 1024), src=sbuf(4, 8), func=ActFunc.relu, scale=1.0,
                     waits=((5, 1),), signal=act_signal)],
        "DVE": [make("tensor_copy", dst=sbuf(4, 8, 2048), src=sbuf(4, 8), waits=((5, 1),), signal=dve_signal)],
        "DMA1": [make("dma_copy", dst=hbm(OUT_A, 4, 8), src=sbuf(4, 8, 1024), waits=stores[0]),
                 make("dma_copy", dst=hbm(OUT_B, 4, 8), src=sbuf(4, 8, 2048), waits=stores[1])],
        "DMA2": [make("dma_copy", dst=sbuf(4, 8), src=hbm(X, 4, 8), waits=overwrite_waits)],
    }, {"x": (X, (4, 8))}, {"a": (OUT_A, (4, 8)), "b": (OUT_B, (4, 8))})


def _verdicts(m: runtime.Model) -> list[str | None]:
    """The race reported (None: none) under the clock policy and twenty random interleavings."""
    found = []
    for policy, seed in SCHEDULES:
        try:
            m.run({"x": np.ones((4, 8), np.float32)}, policy=policy, seed=seed, check_races=True)
            found.append(None)
        except runtime.RaceError as e:
            found.append(str(e))
    return found


def test_write_after_two_concurrent_reads_is_flagged_under_every_schedule():
    """The overwrite waits for ACT only. A checker that kept only the last reader missed this whenever DVE read
    before ACT: the overwrite is ordered after ACT, and DVE's read was forgotten."""
    verdicts = _verdicts(_two_readers(((1, 1),)))  # named from whichever side comes second
    assert all(v is not None and "core 0 DMA2 #0 dma_copy" in v and "core 0 DVE #0 tensor_copy" in v
               for v in verdicts), verdicts


def test_write_after_both_reads_is_race_free_under_every_schedule():
    assert _verdicts(_two_readers(((1, 1), (2, 1)))) == [None] * len(SCHEDULES)


def test_a_wait_for_zero_orders_nothing():
    """`wait[s1>=0]` never waits, under either policy, so it must not order the overwrite after ACT's read
    either (it used to take the clock of ACT's latest increment, or fail when nothing had signalled yet)."""
    verdicts = _verdicts(_two_readers(((1, 0), (2, 1))))
    assert all(v is not None and "ACT #0 activation" in v for v in verdicts), verdicts


def test_a_wait_for_zero_on_a_semaphore_nothing_signals_runs():
    m = _two_readers(((9, 0), (1, 1), (2, 1)))
    assert _verdicts(m) == [None] * len(SCHEDULES)


def test_a_semaphore_two_streams_signal_orders_only_what_every_schedule_guarantees():
    """ACT and DVE both increment s1. s1 >= 1 may come from either, so it orders neither read; s1 >= 2 needs
    both increments, so it orders both."""
    assert all(v is not None for v in _verdicts(_two_readers(((1, 1),), act_signal=1, dve_signal=1)))
    assert _verdicts(_two_readers(((1, 2),), act_signal=1, dve_signal=1)) == [None] * len(SCHEDULES)


@pytest.mark.parametrize("at", [
    np.arange(0, 400, 4),  # one contiguous row
    (np.arange(16)[:, None] * 768 + np.arange(8)[None, :] * 8).ravel(),  # rows of a strided view
    np.zeros(5, np.int64),  # a broadcast read: every element at one byte
    np.array([7, 3, 11, 12, 40]),  # no structure at all
    np.array([5]),
    np.array([], np.int64),
], ids=["row", "rows", "broadcast", "irregular", "one", "empty"])
def test_an_access_keeps_its_footprint(at):
    assert np.array_equal(Access(("HBM", 0), at, False).at, at)


def test_the_shadow_costs_what_is_touched_not_the_size_of_hbm():
    """32 fp32 elements read near the end of 64 MiB of HBM: the HBM shadow is one page at 4-byte granularity
    (1024 entries), not 64 MiB of entries."""
    hbm_size, far = 64 << 20, (64 << 20) - 4096
    b = Bundle("trn1", hbm_size, [TensorInfo.whole("x", (4, 8), "float32", "fp32", far)],
               [TensorInfo.whole("y", (4, 8), "float32", "fp32", 0)],
               [{"DMA0": Stream([make("dma_copy", dst=sbuf(4, 8), src=hbm(far, 4, 8), signal=1)], [""]),
                 "DMA1": Stream([make("dma_copy", dst=hbm(0, 4, 8), src=sbuf(4, 8), waits=((1, 1),))], [""])}])
    m = runtime.Model(b)
    checker: RaceChecker = m._race_checker()
    assert checker.shadow[("HBM", 0)].write.size == 2 * 1024  # the page read and the page written
    assert checker.shadow[("SBUF", 0)].write.size == 4 * 1024  # one page per partition row
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert np.array_equal(m.run({"x": x}, check_races=True)["y"], x)
