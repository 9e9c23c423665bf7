"""Stream names (isa/streams.py): every stream's name reads back as the same stream, the names are the ones bundles
and traces have always carried, and a name that is no stream is refused naming it."""

from __future__ import annotations

import re

import pytest

from isa.operand import Engine
from isa.streams import StreamId, stream_names
from tests.runtime.helpers import model
import runtime

ONE_OF_EACH = [StreamId(e) for e in Engine if e is not Engine.DMA] + [StreamId(Engine.DMA, q) for q in (0, 1, 15, 127)]


@pytest.mark.parametrize("stream", ONE_OF_EACH, ids=str)
def test_every_stream_round_trips_through_its_name(stream):
    assert StreamId.parse(stream.name) == stream
    assert str(stream) == stream.name


def test_the_names_are_the_bundle_formats():
    assert stream_names(2) == ("PE", "ACT", "DVE", "POOL", "SP", "DMA0", "DMA1", "CC")
    assert [s.name for s in ONE_OF_EACH[-4:]] == ["DMA0", "DMA1", "DMA15", "DMA127"]
    assert all(StreamId.parse(name).name == name for name in stream_names(16))


def test_a_dma_stream_is_its_queue_and_every_other_engine_has_one():
    assert StreamId.parse("DMA7").engine is Engine.DMA and StreamId.parse("DMA7").queue == 7
    assert StreamId.parse("ACT").queue is None
    assert StreamId.of(Engine.PE, 3) == StreamId(Engine.PE)  # the queue counts only for DMA
    assert StreamId.of(Engine.DMA, 3).name == "DMA3"
    with pytest.raises(ValueError, match="no stream of engine DMA"):
        StreamId(Engine.DMA)
    with pytest.raises(ValueError, match="no stream of engine PE with queue 3"):
        StreamId(Engine.PE, 3)
    with pytest.raises(ValueError, match="queue -1"):
        StreamId(Engine.DMA, -1)


# "DMA" alone is the engine, not a stream; a queue's number is written one way only (so that it reads back as the
# name it came from); names are case-sensitive
@pytest.mark.parametrize("name", ["DMA", "DMA007", "DMA-1", "DMA1.0", "dma0", "pe", " PE", "", "TPB", "DMA\u00b2",
                                  "DMA\u0661"])
def test_a_name_that_is_no_stream_is_refused_naming_it(name):
    with pytest.raises(ValueError, match=f"^unknown stream {re.escape(repr(name))}: "):
        StreamId.parse(name)


def test_the_runtime_refuses_a_bundle_stream_that_is_no_stream_or_no_queue_of_its_target():
    with pytest.raises(runtime.LoadError, match="unknown stream 'DMA'"):  # once a ValueError from int("")
        model({"DMA": []}, {}, {})
    with pytest.raises(runtime.LoadError, match="stream DMA16: a trn1 core has 16 DMA queues"):
        model({"DMA16": []}, {}, {})
    model({"DMA15": [], "CC": []}, {}, {})


def test_the_profilers_timing_run_refuses_what_the_runtime_refuses():
    """profile's timed run (no values computed) reads stream names with the runtime's own check."""
    from isa.bundle import Bundle, Stream
    from isa.target import get_target
    from runtime.profile import timed_run
    from tests.runtime.helpers import HBM_SIZE

    for name, said in (("DMA", "unknown stream 'DMA'"), ("DMA16", "stream DMA16: a trn1 core has 16 DMA queues")):
        with pytest.raises(runtime.LoadError, match=re.escape(said)):
            timed_run(Bundle("trn1", HBM_SIZE, [], [], [{name: Stream([], [])}]), get_target("trn1"))
