"""generate on transformers decoders exported as users export them (models/decoders.py): the tokens of
transformers' own greedy generate, the cache held on the device, only the token and the logits crossing per step."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

pytest.importorskip("transformers")

import runtime  # noqa: E402
from isa.target import get_target  # noqa: E402
from neuronx_cc_lite.generate.generator import Generator  # noqa: E402
from runtime.profile import host_overhead_us, roofline, timed_run  # noqa: E402
from tests.conftest import MODELS_DIR  # noqa: E402

sys.path.insert(0, MODELS_DIR)
import decoders  # noqa: E402

PROMPT = [5, 17, 99, 3, 42]
NEW = 12
VOCABULARY = 128


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("decoders"))
    return {name: decoders.export(name, folder) for name in decoders.MODELS}


@pytest.fixture(scope="module")
def references():
    return {name: decoders.greedy_reference(name, PROMPT, NEW) for name in decoders.MODELS}


@pytest.mark.parametrize("name", decoders.MODELS)
def test_greedy_gives_transformers_tokens_with_the_cache_on_the_device(exported, references, name):
    generator = Generator(exported[name], max_length=32)
    out = generator.generate(PROMPT, NEW)
    assert out.tokens == references[name]
    assert len(set(out.tokens)) > 3  # a sequence that says something about the model, not one token repeated
    held = {t.name: t.shape for t in generator.state.tensors.values()}
    assert held["past_key_values.0.key"][2] == 32 and held["past_length"] == (1,)
    assert generator.past_length() == len(PROMPT) + NEW - 1  # the last token's entry is never needed
    for (step, _, _), model in generator._models.items():
        assert not any(t.name.startswith(("past", "present")) for t in (*model.inputs, *model.outputs)), step


def test_a_stop_token_ends_generation(exported, references):
    name = "gpt2_tiny"
    stop = references[name][4]
    first = references[name].index(stop)
    out = Generator(exported[name], max_length=32).generate(PROMPT, NEW, stop_tokens=[stop])
    assert out.tokens == references[name][:first + 1] and out.stopped


def test_a_longer_prompt_takes_a_larger_bucket(exported):
    prompt = list(range(3, 23))  # 20 tokens: the 32 bucket
    want = decoders.greedy_reference("llama_tiny", prompt, 6)
    out = Generator(exported["llama_tiny"], max_length=48).generate(prompt, 6)
    assert out.bucket == 32 and out.tokens == want


@pytest.mark.parametrize("sampling", ["greedy", "top-k"])
def test_only_the_token_and_the_logits_cross_per_step(exported, sampling, monkeypatch):
    """Counted as the runtime copies them: 4 bytes of token (out when the device picks it, in when the host draws
    it) and the logits out, per decode step; the cache is never read or written from the host."""
    copies = []
    original = runtime.Model.run_with_io

    def counted(self, inputs, *args, **kwargs):
        outputs, stats, io = original(self, inputs, *args, **kwargs)
        copies.append((self.bundle.flags["decoder"]["step"], io))
        return outputs, stats, io

    monkeypatch.setattr(runtime.Model, "run_with_io", counted)
    generator = Generator(exported["llama_tiny"], max_length=32)
    out = generator.generate(PROMPT, 6, sampling=sampling, top_k=5, seed=3)
    steps = [io for step, io in copies if step == "decode"]
    assert len(steps) == 5
    token, logits = 4, VOCABULARY * 4
    expected = runtime.IoBytes(0, token + logits) if sampling == "greedy" else runtime.IoBytes(token, logits)
    assert all(io == expected for io in steps)
    assert out.host_device_bytes_per_step == token + logits
    assert generator.state.bytes_to_host == 0 and generator.state.bytes_to_device == 0


@pytest.mark.parametrize("sampling", ["greedy", "top-p"])
def test_the_next_step_is_queued_before_the_host_is_done_with_this_one(exported, sampling, monkeypatch):
    """Greedy: the device feeds its pick back, so step t + 1 is queued before step t's token reaches the host;
    a draw on the host: right after the draw, before the host hands the token on."""
    events = []
    original = runtime.ExecutionQueue.submit

    def submit(self, inputs, **options):
        events.append("submit")
        return original(self, inputs, **options)

    monkeypatch.setattr(runtime.ExecutionQueue, "submit", submit)
    Generator(exported["gpt2_tiny"], max_length=32).generate(PROMPT, 4, sampling=sampling, top_p=0.8,
                                                             on_token=lambda t: events.append("token"))
    assert events == ["submit", "token"] * 3 + ["token"]


def test_times_are_the_chip_model_plus_the_runtime_overhead(exported):
    generator = Generator(exported["llama_tiny"], max_length=32, target="inf2")
    out = generator.generate(PROMPT, 4)
    target = get_target("inf2")
    prefill = generator.bundle("prefill", 16, True)
    decode = generator.bundle("decode", 1, True)
    ttft = timed_run(prefill, target).last_run.elapsed_ns / 1e3 + host_overhead_us(prefill, target)
    tpot = timed_run(decode, target).last_run.elapsed_ns / 1e3 + host_overhead_us(decode, target)
    assert out.ttft_us == pytest.approx(ttft) and out.tpot_us == pytest.approx(tpot)
    assert out.tokens_per_s == pytest.approx(4 / ((ttft + 3 * tpot) / 1e6))
    assert tpot > target.host_launch_us  # the runtime's launch is part of every step
    bound = roofline(decode, target)  # the cache is read every step: the roofline counts it
    cache = sum(t.size for t in decode.hbm_tensors if t.kind == "state" and t.name.startswith("past_key_values"))
    assert bound.read_bytes >= cache and bound.ns <= timed_run(decode, target).last_run.elapsed_ns


def test_seeded_sampling_repeats_and_stays_in_its_set(exported):
    generator = Generator(exported["gpt2_tiny"], max_length=32)
    first = generator.generate(PROMPT, 8, sampling="top-k", top_k=3, seed=7)
    assert generator.generate(PROMPT, 8, sampling="top-k", top_k=3, seed=7).tokens == first.tokens
    for token, logits in zip(first.tokens, first.logits):
        assert token in np.argsort(-logits, kind="stable")[:3]
    nucleus = generator.generate(PROMPT, 8, sampling="top-p", top_p=0.5, seed=1)
    for token, logits in zip(nucleus.tokens, nucleus.logits):
        p = np.exp(logits - logits.max())
        p /= p.sum()
        assert p[p > p[token]].sum() < 0.5  # the tokens likelier than it hold less than top_p


@pytest.mark.slow
@pytest.mark.parametrize("name", decoders.MODELS)
def test_torchscript_exports_generate_transformers_tokens(tmp_path, references, name):
    path = decoders.export(name, str(tmp_path), exporter="torchscript")
    assert Generator(path, max_length=32, cache=False).generate(PROMPT, NEW).tokens == references[name]


def test_a_decode_step_is_race_free_and_the_same_in_any_engine_order(exported):
    generator = Generator(exported["llama_tiny"], max_length=32)
    generator.generate(PROMPT, 3)
    decode = generator.loaded("decode", 1, True)
    before = {name: generator.state.read(name) for name in generator.state.names}
    clocked = decode.run({}, check_races=True)  # the cache written in place, read by attention: ordered
    for name, value in before.items():
        generator.state.write(name, value)
    shuffled = decode.run({}, policy="random", seed=3)
    np.testing.assert_array_equal(shuffled["logits"], clocked["logits"])
    assert int(clocked["token"][0, 0]) == decoders.greedy_reference("llama_tiny", PROMPT, 4)[3]
