"""Tensor parallelism on the issue's encoder: the 12-layer BERT (hidden 256, seq 128, bf16 matmult) compiled at
--tp 1 and --tp N on trn1, each run once on the simulated chip and checked against onnxruntime; prints the
simulated latency of each, the ratio to --tp 1 (the goal at --tp 2 on one chip: at most 0.7), the per-rank
matmul FLOPs and the compile time.

    .venv/bin/python benchmarks/tp_scaling.py [--tp 2 4] [--target trn1] [--layers 12] [--hidden 256] [--seq 128]

Sharding pays where a layer's work outweighs its two all-reduces (about 58 us each for two ranks of a chip, as
nccom-test measures them): try --hidden 1024 --seq 512 --layers 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import runtime  # noqa: E402
from benchmarks.cases import BF16, bert_layers  # noqa: E402
from neuronx_cc_lite.compiler import Options, compile_model  # noqa: E402
from neuronx_cc_lite.reference import bundle_inputs, error_over_rms, onnxruntime_outputs  # noqa: E402


def measure(model, tp: int, target: str):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    bundle = compile_model(model, Options(target=target, tp=tp, **BF16))  # type: ignore[arg-type]
    compile_s = time.perf_counter() - start
    inputs = bundle_inputs(bundle)
    loaded = runtime.load(bundle)
    outputs = loaded.run(inputs)
    expected = onnxruntime_outputs(model, inputs)
    err = max(error_over_rms(outputs[k], expected[k]) for k in expected)
    flops = bundle.stats.get("rank_flops", [bundle.stats["model_flops"]])
    return loaded.last_run.elapsed_ns, compile_s, max(flops), err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[2])
    parser.add_argument("--target", default="trn1")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    model = bert_layers(args.layers, args.hidden, args.seq)
    base = None
    print(f"{'tp':>3} {'latency us':>11} {'ratio':>6} {'FLOPs/rank':>11} {'compile s':>10} {'err/rms':>8}")
    for tp in [1, *args.tp]:
        ns, compile_s, flops, err = measure(model, tp, args.target)
        base = base or ns
        print(f"{tp:>3} {ns / 1000:>11.1f} {ns / base:>6.2f} {flops:>11.3g} {compile_s:>10.2f} {err:>8.1e}")
    assert np.isfinite(base)


if __name__ == "__main__":
    main()
