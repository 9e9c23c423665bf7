"""Tensor parallelism on decoders as transformers exports them, at their real widths: 2 layers, a prefill of 128
tokens, matmuls in bf16, random weights. Each spells its fused projections its own way, which split-projections
must cut apart before the plan can shard them by head (neuronx_cc_lite/partition/split_projections.py):

    phi3_mini   Phi-3-mini (hidden 3072, 32 heads, MLP 8192): Q, K and V Sliced out of one product, gate and up
                Split out of another
    falcon_1b   Falcon-style multi-query attention (hidden 2048, 32 query heads, one key/value head): one product
                Reshaped into heads and Split by head
    bigcode_1b  SantaCoder-style GPTBigCode (hidden 2048, 16 query heads, one key/value head): one product
                Unsqueezed and Split

For each model and --tp: the simulated latency (runtime.profile.timed_run: every rank, collectives as in a real run),
its ratio to one rank, and the weights every rank reads whole (partition.whole_weights; a multi-query model's one
key/value head stays whole, as NxD Inference replicates it).

    .venv/bin/python benchmarks/tp_exports.py [NAME ...] [--tp 8] [--target trn1]

The first run exports each model into build/exports/ (about 1 GB for Phi-3-mini's two layers in fp32).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.architectures import _hf, _text  # noqa: E402
from benchmarks.exports import Registry, export  # noqa: E402
from isa.target import TARGETS  # noqa: E402
from neuronx_cc_lite.compiler import Options, compile_model, prepare  # noqa: E402
from neuronx_cc_lite.partition import split_projections, whole_weights  # noqa: E402
from neuronx_cc_lite.partition.plan import choose  # noqa: E402
from runtime.profile import timed_run  # noqa: E402

VOCAB, TOKENS = 2048, 128
MODELS = Registry({
    "phi3_mini": _hf("Phi3Model", "Phi3Config", lambda: _text(VOCAB, TOKENS), vocab_size=VOCAB, hidden_size=3072,
                     num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=32, intermediate_size=8192,
                     pad_token_id=0, max_position_embeddings=256, use_cache=False),
    "falcon_1b": _hf("FalconModel", "FalconConfig", lambda: _text(VOCAB, TOKENS), vocab_size=VOCAB, hidden_size=2048,
                     num_hidden_layers=2, num_attention_heads=32, multi_query=True, new_decoder_architecture=False,
                     parallel_attn=True, bias=False, use_cache=False),
    "bigcode_1b": _hf("GPTBigCodeModel", "GPTBigCodeConfig", lambda: _text(VOCAB, TOKENS), vocab_size=VOCAB,
                      n_embd=2048, n_layer=2, n_head=16, n_positions=256, use_cache=False),
}, "tp-")


def whole_mib(path: str, tp: int) -> float:
    """MiB of weights every rank of the --tp plan reads whole."""
    g = split_projections.run(prepare(path, Options()))
    return sum(nbytes for _, nbytes in whole_weights(g, choose(g, tp))) / 2**20


def latency_us(path: str, tp: int, target: str) -> tuple[float, float]:
    """(simulated latency in us, compile seconds) at --tp `tp`, matmuls in bf16."""
    start = time.perf_counter()
    bundle = compile_model(path, Options(target=target, tp=tp, auto_cast="matmult", auto_cast_type="bf16"))
    seconds = time.perf_counter() - start
    return timed_run(bundle, TARGETS[target]).last_run.elapsed_ns / 1000, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"models (default: all of {', '.join(MODELS.builders)})")
    parser.add_argument("--tp", type=int, nargs="+", default=[8])
    parser.add_argument("--target", choices=sorted(TARGETS), default="trn1")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in MODELS.builders]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS.builders)}")
    print(f"{'model':<12} {'tp':>3} {'latency us':>11} {'ratio':>6} {'whole MiB':>10} {'compile s':>10}")
    for name in args.names or MODELS.builders:
        path = export(name, "dynamo", MODELS)
        base = None
        for tp in [1, *args.tp]:
            us, seconds = latency_us(path, tp, args.target)
            base = base or us
            whole = whole_mib(path, tp) if tp > 1 else float("nan")
            print(f"{name:<12} {tp:>3} {us:>11.1f} {us / base:>6.2f} {whole:>10.1f} {seconds:>10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
