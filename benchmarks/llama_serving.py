"""Llama-3-8B and 70B serving from their shapes alone: TTFT and TPOT on the chip model beside AWS's published figures,
and the KV transfer of disaggregated serving.

    .venv/bin/python benchmarks/llama_serving.py --config llama3-8b --target trn1 --tp 32 [--lnc 2] [--prompt 128]
                                                 [--transfer-tokens 2048] [--json OUT.json]

The model is models/llama_shapes.py's with its weights declared and not present (neuronx_cc_lite/declared.py),
heads and intermediate size padded for the ranks as NxD Inference pads them (24 ranks: 32 query heads become 48).
A layer is compiled once and repeated: the decoder is compiled with 2 layers (the prefill of a `--prompt`-token
bucket and the decode step, greedy on the host, matmuls in bf16) and run by the timing-only simulation
(runtime.profile.timed_run: every rank, collectives timed as in a real run). Every layer ends in an all-reduce that
all ranks wait for, so the second layer's time is the span between the two layers' last all-reduces (rank 0's
trace), with the first layer's weights fetched and the second's in flight as a deeper model's middle layers are;
a model of L layers takes T(2) + (L - 2) x that span. (The difference T(2) - T(1) would not do: a single layer's
model overlaps the LM head's weight stream with the layer, which a deep model's last layer alone does.) TTFT is the
prefill's and TPOT a decode step's, each with the runtime's launch and copies (runtime.profile.host_overhead_us).

The KV transfer: the decode bundle's state pieces (the cache by key/value head on each rank) scaled to
`--transfer-tokens` positions and all layers, sent from a prefill group of `--tp` ranks to a decode group of as
many on a second instance (runtime/transfer.py: a permute over both, EFA between instances).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models"))

import onnx  # noqa: E402
from llama_shapes import CONFIGS, LlamaConfig, build  # noqa: E402

from isa.target import TARGETS, Target  # noqa: E402
from neuronx_cc_lite.generate.generator import Generator  # noqa: E402
from runtime.layout import piece_bytes  # noqa: E402
from runtime.profile import host_overhead_us, timed_run  # noqa: E402
from runtime.transfer import transfer_time  # noqa: E402

# AWS's published batch-1 figures (issue 18: the inf2/trn1 decoder latency tables and NxD Inference tutorials), ms:
# (TPOT low, high), (TTFT low, high) for 128 input tokens; None where none is published.
PUBLISHED = {
    ("llama3-8b", "trn1", 32): ((5.86, 7.04), (14.8, 17.1)),
    ("llama3-8b", "inf2", 24): ((6.42, 7.41), (25.0, 29.0)),
    ("llama3-70b", "trn1", 32): ((24.5, 26.5), (52.5, 53.2)),  # CHIP.md: TTFT for 128 input tokens
    ("llama3-70b", "inf2", 24): ((32.5, 34.7), None),
    ("llama3-70b", "trn2", 64): ((19.6, 19.6), None),
}


def layer_span_us(bundle, target) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """The step's simulated latency (no host overhead), the second layer's span (module docstring) and the time
    rank 0's collectives take in it."""
    run = timed_run(bundle, target, trace=True).last_run
    ends = {0: 0.0, 1: 0.0}
    collective = 0.0
    for e in run.trace:
        node = bundle.cores[0][e.stream].nodes[e.index] if e.core == 0 and e.stream == "CC" else None
        for layer in ends:
            if node and node.startswith(f"layers.{layer}."):
                ends[layer] = max(ends[layer], e.end)
                collective += (e.end - e.start) if layer == 1 else 0.0
    return run.elapsed_ns / 1e3, (ends[1] - ends[0]) / 1e3, collective / 1e3


def _multiplied_weights(real: LlamaConfig) -> int:
    """The weights a step multiplies: all but the embedding table (a gather reads a row of it per token)."""
    return real.parameters - real.vocabulary * real.hidden


def decode_lower_bound_ms(real: LlamaConfig, target: Target, tp: int, lnc: int, all_reduce_us_per_layer: float
                          ) -> float:
    """What any decode step of the sharded model takes at least: its layers' all-reduces (as the chip model times
    them) and the weights a rank must stream, the model's bf16 weights but the embedding table cut evenly over the
    ranks, at a rank's DMA bandwidth (its `lnc` cores' queues)."""
    return prefill_lower_bound_ms(real, target, tp, lnc, all_reduce_us_per_layer, tokens=0)


def prefill_lower_bound_ms(real: LlamaConfig, target: Target, tp: int, lnc: int, all_reduce_us_per_layer: float,
                           tokens: int) -> float:
    """What any step over `tokens` tokens takes at least: its layers' all-reduces and the larger of the weights a
    rank must stream (decode_lower_bound_ms's) and its share of the matmuls at TensorE's bf16 peak (2 x tokens
    FLOPs a weight)."""
    weights = _multiplied_weights(real)
    streamed_ns = weights * 2 / tp / (lnc * target.core_dma_gbps)
    compute_ns = 2 * tokens * weights / tp / (lnc * target.pe_tflops("bf16") * 1000)
    return (real.layers * all_reduce_us_per_layer * 1e3 + max(streamed_ns, compute_ns)) / 1e6


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=["llama3-8b", "llama3-70b"], default="llama3-8b")
    p.add_argument("--target", choices=sorted(TARGETS), default="trn1")
    p.add_argument("--tp", type=int, default=32)
    p.add_argument("--lnc", type=int)
    p.add_argument("--prompt", type=int, default=128, help="prefill bucket (input tokens)")
    p.add_argument("--max-length", type=int, default=256, help="the decode step's cache capacity")
    p.add_argument("--transfer-tokens", type=int, default=2048)
    p.add_argument("--decode-only", action="store_true", help="time the decode step alone (no TTFT)")
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args(argv)
    real = CONFIGS[args.config]
    config = real.padded_for(args.tp) if real.heads % args.tp or real.intermediate % args.tp else real
    target = TARGETS[args.target]
    start = time.perf_counter()
    times: dict[str, list[float]] = {}
    overhead: dict[str, float] = {}
    state_bytes: list[int] = []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"{config.name}-2.onnx")
        onnx.save(build(replace(config, layers=2), declared=True, real=replace(real, layers=2)), path)
        g = Generator(path, max_length=args.max_length, target=args.target, tp=args.tp, lnc=args.lnc,
                      auto_cast="matmult", cache=True, buckets=[args.prompt])
        steps = [("decode", 1)] + ([] if args.decode_only else [("prefill", args.prompt)])
        for step, tokens in steps:
            bundle = g.bundle(step, tokens, False)
            two, span, collective = layer_span_us(bundle, target)
            times[step] = [two, span, collective]
            overhead[step] = host_overhead_us(bundle, target)
            print(f"  {config.name} 2 layers {step}: {two:,.1f} us on the device, a layer {span:,.1f} us "
                  f"({collective:,.1f} in all-reduces) ({time.perf_counter() - start:.0f} s)", flush=True)
            if step == "decode":  # a layer's cache pieces per rank at the transfer's length, for every layer
                state_bytes = [0] * len(bundle.cores)
                for info in bundle.state:
                    if info.name.startswith("past_key_values.0."):
                        for q in info.placements:
                            state_bytes[q.rank] += piece_bytes(info, q) * args.transfer_tokens // \
                                info.shape[2] * real.layers
    result = {"config": args.config, "padded": config.name, "target": args.target, "tp": args.tp,
              "lnc": args.lnc, "prompt": args.prompt, "layers": real.layers}
    for step in times:
        two, span, collective = times[step]
        result[step] = {"two_layers_us": two, "per_layer_us": span, "per_layer_all_reduce_us": collective,
                        "overhead_us": overhead[step],
                        "ms": (two + (real.layers - 2) * span + overhead[step]) / 1e3}
    result["decode"]["lower_bound_ms"] = decode_lower_bound_ms(real, target, args.tp, args.lnc or 1,
                                                               result["decode"]["per_layer_all_reduce_us"])
    if "prefill" in result:
        result["prefill"]["lower_bound_ms"] = prefill_lower_bound_ms(
            real, target, args.tp, args.lnc or 1, result["prefill"]["per_layer_all_reduce_us"], args.prompt)
    sent = transfer_time(state_bytes, target, args.lnc or 1)
    result["kv_transfer"] = {"tokens": args.transfer_tokens, "bytes_per_rank": sent.bytes_per_rank,
                             "total_bytes": sent.total_bytes, "ms": sent.ns / 1e6, "instances": sent.instances}
    published = PUBLISHED.get((args.config, args.target, args.tp))
    result["aws"] = {"tpot_ms": published[0], "ttft_ms": published[1]} if published else None
    result["seconds"] = time.perf_counter() - start
    tpot, ttft = result["decode"]["ms"], result["prefill"]["ms"] if "prefill" in result else float("nan")
    aws_tpot = f"{published[0][0]}-{published[0][1]}" if published else "-"
    aws_ttft = f"{published[1][0]}-{published[1][1]}" if published and published[1] else "none published"
    ratio = f"{tpot / published[0][0]:.2f}x" if published else "-"
    bound = result["decode"]["lower_bound_ms"]
    print(f"{args.config} {args.target} TP {args.tp}: TPOT {tpot:.2f} ms (lower bound {bound:.2f}; AWS {aws_tpot}; "
          f"{ratio} of AWS's best), "
          f"TTFT {ttft:.2f} ms (lower bound {result.get('prefill', {}).get('lower_bound_ms', float('nan')):.2f}; "
          f"AWS {aws_ttft}); per layer decode {result['decode']['per_layer_us']:.1f} us, "
          f"prefill {result.get('prefill', {}).get('per_layer_us', float('nan')):.1f} us; KV transfer of {args.transfer_tokens} tokens "
          f"{sent.total_bytes / 1e6:.0f} MB: {sent.ns / 1e6:.2f} ms ({result['seconds']:.0f} s)")
    if args.json:
        with open(args.json, "x") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
