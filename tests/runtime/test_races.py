"""The race checker names two accesses that no semaphore orders, and stays silent when semaphores order them."""

from __future__ import annotations

import numpy as np
import pytest

from isa.dtypes import DType
from isa.functions import ActFunc
from isa.instructions import make
import runtime
from tests.runtime.helpers import hbm, model, sbuf

X, OUT = 0, 4096


def _program(synchronised: bool, war_only: bool = False) -> runtime.Model:
    """DMA load -> ACT relu -> DMA store; without semaphores every hand-off is a race."""
    sync = synchronised or war_only
    return model({
        "DMA0": [make("dma_copy", dst=sbuf(4, 8), src=hbm(X, 4, 8), signal=5 if sync else None)],
        "ACT": [make("activation", dst=sbuf(4, 8, 1024), src=sbuf(4, 8), func=ActFunc.relu, scale=1.0,
                     waits=((5, 1),) if sync else (), signal=1 if sync else None)],
        "DMA1": [make("dma_copy", dst=hbm(OUT, 4, 8), src=sbuf(4, 8, 1024), waits=((1, 1),) if sync else ()),
                 # overwrite the ACT input: ordered after the ACT read only through the wait above
                 make("dma_copy", dst=sbuf(4, 8), src=hbm(X, 4, 8))],
    }, {"x": (X, (4, 8))}, {"y": (OUT, (4, 8))})


@pytest.mark.parametrize("policy", ["clock", "random"])
def test_synchronised_program_has_no_race(policy):
    x = np.ones((4, 8), np.float32)
    _program(True).run({"x": x}, policy=policy, check_races=True)


def test_missing_semaphore_is_named():
    with pytest.raises(runtime.RaceError) as e:
        _program(False).run({"x": np.ones((4, 8), np.float32)}, check_races=True)
    text = str(e.value)
    assert text.startswith("NRT_RACE: core 0 ")
    assert "with no semaphore ordering the two" in text and "dma_copy" in text and "activation" in text


def test_write_after_read_through_transitive_order_is_fine():
    """DMA1's second copy overwrites what ACT read; DMA1 waited on ACT's completion for its first copy, and a
    stream runs in order, so the overwrite is ordered after the read without a semaphore of its own."""
    _program(False, war_only=True).run({"x": np.ones((4, 8), np.float32)}, check_races=True)


def test_a_scatter_writes_its_whole_table():
    """A scatter's row operand is row 0, yet any row may be written: a read of row 3 on another queue that no
    semaphore orders after the scatter is a race; with a semaphore it is none."""
    int32 = DType.int32
    index = sbuf(2, 1, 64, int32)

    def program(synchronised: bool) -> runtime.Model:
        return model({
            "DMA0": [make("dma_copy", dst=sbuf(2, 8), src=hbm(X, 2, 8)),
                     make("dma_copy", dst=index, src=hbm(X, 2, 1, int32)),  # x's zero bits: both rows to row 0
                     make("dma_scatter", dst=hbm(OUT, 1, 8), src=sbuf(2, 8), index=index, rows=4, row_stride=8,
                          signal=5 if synchronised else None)],
            "DMA1": [make("dma_copy", dst=sbuf(1, 8, 1024), src=hbm(OUT + 3 * 32, 1, 8),
                          waits=((5, 1),) if synchronised else ())],
        }, {"x": (X, (4, 8))}, {"y": (OUT, (4, 8))})

    x = np.zeros((4, 8), np.float32)
    program(True).run({"x": x}, check_races=True)
    with pytest.raises(runtime.RaceError, match="dma_scatter"):
        program(False).run({"x": x}, check_races=True)
