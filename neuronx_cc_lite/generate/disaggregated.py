"""Disaggregated serving: the prefill on one group of ranks, the decode steps on another, the KV cache sent between.

    out = disaggregated("decoder.onnx", [1, 2, 3], 16, tp=2, target="trn1", max_length=64)
    out.tokens, out.ttft_us, out.transfer.us, out.tpot_us

Two generators of one model and one layout (the same tensor-parallel degree, so rank i of either group holds the
same pieces of the cache) each own their device state: the prefill group runs the prompt's prefill (greedy: the
device picks the first token and keeps it as state), runtime/transfer.py copies every state tensor (the cache, its
length, the next token) to the decode group's state device to device and times the transfer on the chip model,
and the decode group's steps continue from it. The time to first token is the prefill's; the first decode step
waits for the transfer (reported apart).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable

from isa.target import get_target
from neuronx_cc_lite.generate.generator import Generator
from neuronx_cc_lite.generate.kv_cache import TOKEN


@dataclass
class Disaggregated:
    tokens: list[int] = field(default_factory=list)
    ttft_us: float = 0.0
    tpot_us: float = 0.0
    transfer: object = None  # runtime.transfer.KvTransfer
    host_device_bytes_per_step: int = 0


def disaggregated(model: str | os.PathLike[str], prompt_ids: Iterable[int], max_new_tokens: int, *, tp: int = 1,
                  target: str = "trn1", max_length: int | None = None, **options: object) -> Disaggregated:
    """Greedy generation with the prefill and the decode on two groups of `tp` ranks (module docstring)."""
    from runtime.profile import host_overhead_us
    from runtime.transfer import send_state

    prefill = Generator(model, max_length=max_length, target=target, tp=tp, **options)
    decode = Generator(model, max_length=max_length, target=target, tp=tp, **options)
    first = prefill.generate(prompt_ids, 1)  # the prefill alone: its token is also in its state
    out = Disaggregated([*first.tokens], first.ttft_us)
    if max_new_tokens == 1:
        return out
    step = decode.loaded("decode", 1, True)
    out.transfer = send_state(prefill.state, step.state, get_target(target), step.bundle.lnc)
    times = []
    while len(out.tokens) < max_new_tokens:
        result = step.run({})
        out.tokens.append(int(result[TOKEN].reshape(-1)[0]))
        times.append(step.last_run.elapsed_ns / 1e3 + host_overhead_us(step.bundle, step.target))
        out.host_device_bytes_per_step = step.last_io.to_device + step.last_io.to_host
    out.tpot_us = sum(times) / len(times)
    return out
