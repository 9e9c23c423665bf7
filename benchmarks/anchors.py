"""End-to-end anchors on inf2 beside AWS's published P50 (the Neuron inf2 performance tables: batch 1, fp32
models, matmult auto-cast to bf16, P50 with the runtime's overhead; ../shared/CHIP.md).

    .venv/bin/python benchmarks/anchors.py [--exporter dynamo|torchscript] [--json OUT.json] [NAME ...]

Each model is exported as people export it (benchmarks/exports.py: transformers and torch modules, random weights,
torch.onnx.export; ALBERT from benchmarks/architectures.py), compiled for inf2 with --auto-cast matmult
--auto-cast-type bf16, and timed by the chip model without computing values (runtime/profile.py
estimated_latency_ns: the time every run has). The end to end figure adds the runtime's overhead per inference
(launch and input/output copies: isa/target.py host_launch_us, host_link_gbps), which is what a P50 measured on the
host contains. A BERT-base layer is (BERT-base - DistilBERT) / 6: 12 and 6 layers of the same size, fixed costs
cancelled (AWS: ~70 us).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from benchmarks.architectures import LARGE_MODELS  # noqa: E402
from benchmarks.exports import EXPORTERS, FAMILIES, export  # noqa: E402

# AWS's inf2 performance tables, P50 ms (CHIP.md): the model each anchor stands for and its published latency.
PUBLISHED_MS = {
    "bert_base": ("bert-base-uncased, seq 128", 0.999),
    "bert_large": ("bert-large-uncased, seq 128", 2.69),
    "distilbert": ("distilbert-base-uncased, seq 128", 0.579),
    "resnet18": ("ResNet-18, 224x224 (SDK 2.21)", 0.596),
    "resnet50": ("ResNet-50, 224x224", 0.83),
    "albert_base": ("albert-base-v2, seq 128", 0.937),  # (benchmarks/architectures.py's)
}


def measure(name: str, exporter: str) -> dict[str, object]:
    from isa.target import get_target
    from neuronx_cc_lite.compiler import Options, compile_model
    from neuronx_cc_lite.frontend import load_model
    from runtime.profile import estimated_latency_ns, host_overhead_us, roofline

    path = export(name, exporter) if name in FAMILIES else export(name, exporter, LARGE_MODELS)
    target = get_target("inf2")
    start = time.perf_counter()
    b = compile_model(load_model(path), Options(target="inf2", auto_cast="matmult", auto_cast_type="bf16"))
    compile_s = time.perf_counter() - start
    device_us = estimated_latency_ns(b, target) / 1000
    host_us = host_overhead_us(b, target)
    what, published_ms = PUBLISHED_MS[name]
    return {"name": name, "model": what, "exporter": exporter, "device_us": device_us, "host_us": host_us,
            "end_to_end_us": device_us + host_us, "roofline_us": roofline(b, target).ns / 1000,
            "aws_p50_us": published_ms * 1000, "ratio": (device_us + host_us) / (published_ms * 1000),
            "compile_s": compile_s}


def report(rows: list[dict[str, object]]) -> str:
    lines = [f"{'model':<34} {'device us':>10} {'+ runtime':>10} {'end to end':>11} {'AWS P50 us':>11} "
             f"{'ratio':>6} {'roofline us':>12}"]
    for r in rows:
        lines.append(f"{r['model']:<34} {r['device_us']:>10.1f} {r['host_us']:>10.1f} {r['end_to_end_us']:>11.1f} "
                     f"{r['aws_p50_us']:>11.0f} {r['ratio']:>6.2f} {r['roofline_us']:>12.1f}")
    by = {r["name"]: r for r in rows}
    if "bert_base" in by and "distilbert" in by:
        layer = (by["bert_base"]["device_us"] - by["distilbert"]["device_us"]) / 6  # type: ignore[operator]
        lines.append(f"BERT-base layer: (BERT-base - DistilBERT) / 6 = {layer:.1f} us (AWS: "
                     f"{(0.999 - 0.579) / 6 * 1000:.0f} us)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"anchors to measure: {', '.join(PUBLISHED_MS)} (all by default)")
    parser.add_argument("--exporter", choices=EXPORTERS, default="dynamo",
                        help="torch.onnx.export's path (dynamo: its default in torch 2.13)")
    parser.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in PUBLISHED_MS]
    if unknown:
        parser.error(f"unknown anchor(s) {', '.join(unknown)}; known: {', '.join(PUBLISHED_MS)}")
    rows = []
    for name in args.names or PUBLISHED_MS:
        rows.append(measure(name, args.exporter))
        print(f"measured {name} (compiled in {rows[-1]['compile_s']:.1f} s)", file=sys.stderr, flush=True)
    print(report(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
