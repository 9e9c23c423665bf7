"""Generation: a prefill bundle and a decode bundle sharing one KV cache on the device.

    gen = Generator("decoder.onnx", max_length=64, target="trn1")
    out = gen.generate([1, 2, 3], max_new_tokens=16)                      # greedy
    out = gen.generate([1, 2, 3], 16, sampling="top-p", top_p=0.9, seed=0, stop_tokens={2})
    out.tokens, out.ttft_us, out.tpot_us, out.tokens_per_s, out.host_device_bytes_per_step

The prompt is padded to the smallest prefill bucket that holds it (`buckets`: powers of two from 16, and
`max_length`); each bucket's prefill and the decode step are compiled once (and kept in the compile cache) with the
cache rewrite of generate/kv_cache.py, and loaded on one DeviceState: the prefill writes the prompt's entries and
its length, each decode step one entry. The cache never leaves the device.

The loop is asynchronous where the data allow (runtime.ExecutionQueue, as the Neuron runtime's nrta_* calls):
- greedy: the device picks the token (ArgMax) and keeps it as the next step's input, so step t + 1 is queued as soon
  as step t has run, before the host reads step t's token and logits, checks them for a stop token and hands them
  on: the host's work on step t overlaps the device's step t + 1 (a step queued past a stop token is discarded);
- top-k / top-p: step t + 1 needs the token the host draws from step t's logits, so it is queued right after the
  draw, and the rest of the host's work on step t (the stop check, handing the token on) overlaps it.
Per decode step the host sends at most the token and receives the token and the logits (`host_device_bytes_per_step`
counts them as the runtime copies them).

Times are the chip model's (each run's simulated latency, which does not depend on the values) plus the runtime's
overhead per inference (runtime/profile.py `host_overhead_us`: the launch and the input and output copies):
TTFT is the prefill's, TPOT a decode step's, and tokens per second the generated tokens over TTFT + (N - 1) TPOT.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from isa.bundle import Bundle
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.generate.kv_cache import LENGTH, PROMPT_LENGTH, TOKEN
from neuronx_cc_lite.generate.layout import DecoderLayout, read_layout
from neuronx_cc_lite.generate.sampling import Sampler

SMALLEST_BUCKET = 16


@dataclass
class Generation:
    tokens: list[int]  # the generated tokens (a stop token included, as transformers' generate returns it)
    ttft_us: float
    tpot_us: float
    tokens_per_s: float
    host_device_bytes_per_step: int  # a decode step's copies between host and device (token in, token and logits out)
    prefill_host_device_bytes: int
    stopped: bool  # ended on a stop token (else on max_new_tokens)
    bucket: int  # the prefill bucket the prompt was padded to
    logits: list[np.ndarray] = field(default_factory=list, repr=False)  # each generated token's logits

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "ttft_us": round(self.ttft_us, 3), "tpot_us": round(self.tpot_us, 3),
                "tokens_per_s": round(self.tokens_per_s, 3),
                "host_device_bytes_per_step": self.host_device_bytes_per_step,
                "prefill_host_device_bytes": self.prefill_host_device_bytes, "stopped": self.stopped,
                "bucket": self.bucket}


class Generator:
    def __init__(self, model: str | os.PathLike[str], *, max_length: int | None = None, target: str = "trn1",
                 buckets: Iterable[int] | None = None, auto_cast: str = "none", auto_cast_type: str = "bf16",
                 cache: bool = True, cache_dir: str | os.PathLike[str] | None = None) -> None:
        from neuronx_cc_lite.compiler import check_options

        check_options(target=target, auto_cast=auto_cast, auto_cast_type=auto_cast_type)
        self.model = os.fspath(model)
        self.layout: DecoderLayout = read_layout(model)
        fixed = self.layout.fixed_length
        if max_length is None:
            max_length = fixed if fixed is not None else 128
        if not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2, not {max_length!r}")
        if fixed is not None and max_length != fixed:
            raise CompileError("NCC_GENERATE", f"{self.model} has a static cache of {fixed} positions; --max-length "
                                               f"must be {fixed}")
        self.max_length = max_length
        self.buckets = sorted(set(buckets)) if buckets is not None else default_buckets(max_length)
        if not self.buckets or any(not isinstance(b, int) or not 1 <= b <= max_length for b in self.buckets):
            raise ValueError(f"buckets must be prompt lengths in [1, {max_length}], not {buckets!r}")
        self.options = {"target": target, "auto_cast": auto_cast, "auto_cast_type": auto_cast_type}
        self.cache_dir = (os.fspath(cache_dir) if cache_dir is not None else None) if cache else None
        self.use_cache = cache
        self._models: dict[tuple[str, int, bool], Any] = {}
        self.state: Any = None  # the DeviceState every bundle of this generator shares (the KV cache)

    # -- bundles ------------------------------------------------------------------------------------------------

    def bundle(self, step: str, tokens: int, greedy: bool) -> Bundle:
        """The compiled prefill (of a bucket of `tokens`) or decode step (`tokens` 1)."""
        from neuronx_cc_lite.cache import cached, default_dir
        from neuronx_cc_lite.compiler import Options, compile_model

        fixed = self.layout.fixed_length
        past = fixed if fixed is not None else (0 if step == "prefill" else self.max_length - tokens)
        options = Options(**self.options, input_shapes=self.layout.step_shapes(tokens, past),
                          decoder={"step": step, "max_length": self.max_length, "tokens": tokens, "greedy": greedy})
        options.check()
        directory = (self.cache_dir or default_dir()) if self.use_cache else None
        return cached(self.model, options.flags(), directory, lambda: compile_model(self.model, options))

    def loaded(self, step: str, tokens: int, greedy: bool) -> Any:
        """The step's bundle loaded on the generator's device state."""
        import runtime
        from neuronx_cc_lite import progress

        key = (step, tokens, greedy)
        if key not in self._models:
            progress.status(f"compiling the {step} step" + (f" (bucket {tokens})" if step == "prefill" else ""))
            model = runtime.load(self.bundle(step, tokens, greedy), state=self.state)
            self.state = model.state
            self._models[key] = model
        return self._models[key]

    def bucket_for(self, length: int) -> int:
        fits = [b for b in self.buckets if b >= length]
        if not fits:
            raise CompileError("NCC_GENERATE", f"a prompt of {length} tokens is longer than the largest prefill "
                                               f"bucket ({self.buckets[-1]})")
        return fits[0]

    # -- generation ---------------------------------------------------------------------------------------------

    def generate(self, prompt_ids: Iterable[int], max_new_tokens: int, *, sampling: str = "greedy", top_k: int = 50,
                 top_p: float = 0.9, temperature: float = 1.0, seed: int = 0,
                 stop_tokens: Iterable[int] = (), on_token: Callable[[int], None] | None = None) -> Generation:
        """Generate up to `max_new_tokens` after `prompt_ids`; `on_token(token)` is called for each as it comes."""
        import runtime
        from runtime.profile import host_overhead_us

        prompt = [int(t) for t in prompt_ids]
        sampler = Sampler(sampling, top_k, top_p, temperature, seed)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
        if not prompt:
            raise ValueError("the prompt needs at least one token")
        vocabulary = self.layout.vocabulary
        if vocabulary is not None and not all(0 <= t < vocabulary for t in prompt):
            raise ValueError(f"prompt ids must lie in [0, {vocabulary}) (the model's vocabulary)")
        if len(prompt) + max_new_tokens - 1 > self.max_length:
            raise ValueError(f"a prompt of {len(prompt)} tokens and {max_new_tokens} new ones need "
                             f"{len(prompt) + max_new_tokens - 1} cache positions; max_length is {self.max_length}")
        stops = {int(t) for t in stop_tokens}
        greedy = sampler.mode == "greedy"
        bucket = self.bucket_for(len(prompt))
        prefill = self.loaded("prefill", bucket, greedy)
        decode = self.loaded("decode", 1, greedy) if max_new_tokens > 1 else None
        ids = np.zeros((1, bucket), np.int64)
        ids[0, :len(prompt)] = prompt
        out = prefill.run({"input_ids": ids, PROMPT_LENGTH: np.array([len(prompt)], np.int64)})
        ttft = prefill.last_run.elapsed_ns / 1e3 + host_overhead_us(prefill.bundle, prefill.target)
        prefill_bytes = prefill.last_io.to_device + prefill.last_io.to_host
        result = Generation([], ttft, 0.0, 0.0, 0, prefill_bytes, False, bucket)
        step_us: list[float] = []
        with runtime.ExecutionQueue(decode or prefill) as queue:
            in_flight: list[Any] = []  # submitted decode steps, oldest first
            submitted = 0

            def submit(inputs: dict[str, np.ndarray]) -> None:
                nonlocal submitted
                if submitted < max_new_tokens - 1:
                    in_flight.append(queue.submit(inputs))
                    submitted += 1

            if greedy:  # the device feeds its pick back: step 1 goes before the host looks at the prefill's
                submit({})
            token = _chosen(out, sampler, greedy)
            while True:
                if not greedy:  # the next step needs this token: it goes as soon as it is drawn
                    submit({"input_ids": np.array([[token]], np.int64)})
                result.tokens.append(token)  # the host's work on this token, while the device runs the next
                result.logits.append(out["logits"].reshape(-1))
                if on_token is not None:
                    on_token(token)
                if token in stops or len(result.tokens) == max_new_tokens:
                    result.stopped = token in stops  # a step queued past a stop token is discarded
                    break
                handle = in_flight.pop(0)
                out = handle.wait()
                if greedy:  # one step ahead again, before this one's token is read
                    submit({})
                assert handle.stats is not None and decode is not None
                step_us.append(handle.stats.elapsed_ns / 1e3 + host_overhead_us(decode.bundle, decode.target))
                result.host_device_bytes_per_step = _io(handle)
                token = _chosen(out, sampler, greedy)
        n = len(result.tokens)
        result.tpot_us = float(np.mean(step_us)) if step_us else 0.0
        result.tokens_per_s = n / ((result.ttft_us + (n - 1) * result.tpot_us) / 1e6)
        return result

    def reset(self) -> None:
        """The device state back to zeros (a prefill starts a sequence afresh without it)."""
        if self.state is not None:
            self.state.reset()

    def past_length(self) -> int:
        """How many cache positions the device holds (copied to the host: 8 bytes)."""
        return int(self.state.read(LENGTH)[0]) if self.state is not None else 0


def _chosen(outputs: dict[str, np.ndarray], sampler: Sampler, greedy: bool) -> int:
    """The step's token: the device's pick (greedy), or the host's draw from its logits."""
    return int(outputs[TOKEN].reshape(-1)[0]) if greedy else sampler(outputs["logits"].reshape(-1))


def _io(handle: Any) -> int:
    """The bytes a queued run copied between host and device."""
    return int(handle.io.to_device + handle.io.to_host)


def default_buckets(max_length: int) -> list[int]:
    """Powers of two from SMALLEST_BUCKET up to max_length, and max_length."""
    found = [1 << k for k in range(int(math.log2(SMALLEST_BUCKET)), max_length.bit_length())
             if 1 << k < max_length]
    return [*found, max_length]
