"""Disaggregated serving (generate/disaggregated.py, runtime/transfer.py): the prefill on one group of ranks, the
decode on another, the KV cache sent device to device; the tokens and the cache's bytes are a single group's."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest

from isa.collectives import collective_cost, topology
from isa.target import TARGETS
from neuronx_cc_lite.generate.disaggregated import disaggregated
from neuronx_cc_lite.generate.generator import Generator
from runtime.layout import piece_bytes
from runtime.transfer import send_state, transfer_time
from tests.conftest import MODELS_DIR

sys.path.insert(0, MODELS_DIR)
from llama_shapes import CONFIGS, build  # noqa: E402

PROMPT = [5, 77, 12, 30, 8, 101, 64]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("disaggregated")
    path = str(folder / "llama.onnx")
    onnx.save(build(CONFIGS["llama3-tiny"], declared=False, seed=1), path)
    return path, {"cache_dir": str(folder / "cache")}  # each step compiled once for every generator


def test_the_decode_group_continues_from_the_sent_cache(llama):
    llama, cache = llama
    one = Generator(llama, max_length=32, tp=2, **cache).generate(PROMPT, 6)
    out = disaggregated(llama, PROMPT, 6, tp=2, max_length=32, **cache)
    assert out.tokens == one.tokens and len(out.tokens) == 6
    assert out.ttft_us == pytest.approx(one.ttft_us)
    assert out.transfer.ns > 0 and out.transfer.ranks == 2
    assert out.host_device_bytes_per_step == one.host_device_bytes_per_step  # the token and logits only


def test_the_same_bytes_arrive_as_a_single_group_holds(llama):
    llama, cache = llama
    single = Generator(llama, max_length=32, tp=2, **cache)
    single.generate(PROMPT, 1)
    prefill = Generator(llama, max_length=32, tp=2, **cache)
    prefill.generate(PROMPT, 1)
    decode = Generator(llama, max_length=32, tp=2, **cache).loaded("decode", 1, True)
    before = (prefill.state.bytes_to_host, prefill.state.bytes_to_device, decode.state.bytes_to_device)
    sent = send_state(prefill.state, decode.state, TARGETS["trn1"])
    assert (prefill.state.bytes_to_host, prefill.state.bytes_to_device, decode.state.bytes_to_device) == before
    total = 0
    for name, info in decode.state.tensors.items():
        for p in info.placements:
            assert decode.state.piece_array(name, p).tobytes() == single.state.piece_array(name, p).tobytes()
            total += piece_bytes(info, p)
    assert sent.total_bytes == total
    assert any(np.any(decode.state.piece_array(n, i.placements[0])) for n, i in decode.state.tensors.items())


def test_the_transfer_is_timed_as_a_permute_between_the_groups():
    t = TARGETS["trn1"]
    one_instance = transfer_time([64 << 20] * 16, t)  # 16 + 16 ranks of one trn1.32xlarge
    two = transfer_time([64 << 20] * 32, t)  # a group per instance: over EFA
    assert one_instance.instances == 1 and two.instances == 2
    expected = collective_cost("permute", 64 << 20, 1, tuple(range(32)), topology(t, 1, 32), shift=16).ns
    assert one_instance.ns == expected
    assert two.ns > one_instance.ns
