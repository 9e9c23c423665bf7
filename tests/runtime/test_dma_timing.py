"""The DMA model of the simulator (runtime/simulator.py, isa/costs.py), pinned to the target's figures: a
transfer's latency, the descriptor generator preparing one transfer at a time, a queue hiding the next transfer's
latency behind the data of the one moving, and the limits a core's engines and a chip's HBM put on transfers
moving together."""

from __future__ import annotations

import pytest

from isa.bundle import Bundle, Stream
from isa.instructions import make
from isa.target import TRN1
import runtime
from tests.runtime.helpers import HBM_SIZE, hbm, model, sbuf

T = TRN1


def engine_ns(nbytes: int, pieces: int = 1) -> float:
    return pieces * T.dma_piece_ns + nbytes / T.dma_queue_gbps


def load(rows: int, cols: int, hbm_offset: int = 0, sbuf_offset: int = 0):
    return make("dma_copy", dst=sbuf(rows, cols, sbuf_offset), src=hbm(hbm_offset, rows, cols))


def elapsed(streams: dict) -> float:
    m = model(streams, {}, {})
    m.run({})
    return m.last_run.elapsed_ns


def test_one_transfer_waits_its_latency_then_pays_its_pieces_and_bytes():
    # 8 SBUF rows of 4 KiB from one contiguous HBM run: 8 pieces
    assert elapsed({"DMA0": [load(8, 1024)]}) == pytest.approx(T.dma_latency_ns + engine_ns(8 * 4096, 8))


def test_the_descriptor_generator_prepares_one_transfer_at_a_time():
    """Sixteen transfers triggered together start their data dma_descriptor_ns apart (the profile's stagger)."""
    streams = {f"DMA{q}": [load(8, 64, 0, q * 256)] for q in range(16)}
    assert elapsed(streams) == pytest.approx(15 * T.dma_descriptor_ns + T.dma_latency_ns + engine_ns(8 * 256, 8))


def test_a_queue_hides_the_next_latency_behind_a_long_transfer():
    """Transfers whose data outlasts the latency follow each other back to back; short ones expose it."""
    long_ns = engine_ns(8 * 4096, 8)
    assert long_ns > T.dma_latency_ns
    four = [load(8, 1024, 0, k * 4096) for k in range(4)]
    assert elapsed({"DMA0": four}) == pytest.approx(T.dma_latency_ns + 4 * long_ns)
    short = [load(8, 64, 0, k * 256) for k in range(4)]
    assert elapsed({"DMA0": short}) > 2 * T.dma_latency_ns  # one prepared ahead, not all four


def test_sp_transfers_share_the_cores_dma_engines():
    """SP triggers transfers onto the core's engines: with 16 queues moving too, the core moves no more than its
    16 engines can (not a 17th engine's worth)."""
    rows, cols = 8, 8192  # 256 KiB each
    streams = {f"DMA{q}": [load(rows, cols, 0, 0)] for q in range(16)}
    streams["SP"] = [load(rows, cols, 0, 0)]
    nbytes = 17 * rows * cols * 4
    assert elapsed(streams) >= T.dma_latency_ns + nbytes / T.core_dma_gbps


def test_two_cores_share_their_chips_hbm():
    """Two ranks of one chip copying HBM to HBM on every queue ask for 2 x 16 x 2 x 17 GB/s, more than the
    chip's 820: they slow down to share it."""
    rows, cols = 32, 1024  # 128 KiB per copy
    size = rows * cols * 4
    cores = []
    for rank in range(2):
        base = rank * 32 * size
        streams = {f"DMA{q}": [make("dma_copy", dst=hbm(base + (16 + q) * size, rows, cols),
                                    src=hbm(base + q * size, rows, cols))] for q in range(16)}
        cores.append({name: Stream(instrs, [""]) for name, instrs in streams.items()})
    assert 2 * 16 * 2 * T.dma_queue_gbps > T.hbm_gbps
    m = runtime.Model(Bundle("trn1", 64 * size + HBM_SIZE, [], [], cores))
    m.run({})
    hbm_bytes = 2 * 16 * 2 * size
    assert m.last_run.elapsed_ns >= hbm_bytes / T.hbm_gbps
    assert m.last_run.elapsed_ns == pytest.approx(T.dma_latency_ns + 15 * T.dma_descriptor_ns
                                                  + hbm_bytes / T.hbm_gbps, rel=0.05)
