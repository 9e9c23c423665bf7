"""Every exporter family of benchmarks/exports.py against its roofline on the calibrated chip model, in bf16
(--auto-cast matmult) and fp32, on trn1.

    .venv/bin/python benchmarks/families.py [NAME ...] [--exporter dynamo|torchscript] [--target T] [--json OUT]

Each model is exported as people export it (cached in build/exports/), compiled, and timed by the chip model
without computing values (runtime/profile.py timed_run); the summary's top operator types show where the time
goes. A compile that fails is reported with its error code, not raised.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.exports import EXPORTERS, FAMILY_MODELS, Registry, export  # noqa: E402

CASTS = {"bf16": {"auto_cast": "matmult", "auto_cast_type": "bf16"}, "fp32": {}}


def measure(name: str, exporter: str, target_name: str, cast: str,
            registry: Registry = FAMILY_MODELS) -> dict[str, object]:
    """One row: model `name` of `registry` (a family by default) exported, compiled in `cast` and timed."""
    from isa.streams import StreamId
    from isa.target import get_target
    from neuronx_cc_lite.compiler import Options, compile_model
    from neuronx_cc_lite.errors import CompileError
    from neuronx_cc_lite.frontend import load_model
    from runtime.profile import roofline, timed_run

    try:
        path = export(name, exporter, registry)
    except Exception as e:  # the exporter's failure is a row, not the end of the table
        return {"name": name, "cast": cast, "error": f"export failed: {type(e).__name__}: {str(e).splitlines()[0]}"}
    target = get_target(target_name)
    start = time.perf_counter()
    try:
        b = compile_model(load_model(path), Options(target=target_name, **CASTS[cast]))  # type: ignore[arg-type]
    except CompileError as e:
        return {"name": name, "cast": cast, "error": str(e).splitlines()[0]}
    compile_s = time.perf_counter() - start
    run = timed_run(b, target, trace=True)
    line = roofline(b, target)
    ops = {(s.core, s.name): s.ops for s in run.simulator.streams}
    busy: collections.Counter[str] = collections.Counter()
    for e in run.last_run.trace:
        op = ops[e.core, e.stream][e.index]
        busy[f"{StreamId.parse(e.stream).engine.name} {op.mnemonic}"] += e.end - e.start  # DMA: every queue
    latency = run.last_run.elapsed_ns
    return {"name": name, "cast": cast, "latency_us": latency / 1000, "roofline_us": line.ns / 1000,
            "ratio": latency / line.ns, "bound": line.bound, "compile_s": compile_s,
            "top": [(k, ns / 1000) for k, ns in busy.most_common(3)]}


def main(argv: list[str] | None = None, registry: Registry = FAMILY_MODELS, description: str | None = None) -> int:
    """The table of `registry`'s models (the families by default; benchmarks/architectures.py passes its own)."""
    known = registry.builders
    parser = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"models: {', '.join(known)} (all by default)")
    parser.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    parser.add_argument("--target", default="trn1")
    parser.add_argument("--cast", choices=list(CASTS), action="append", help="bf16 and fp32 by default")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    rows = []
    width = max(14, *(len(n) + 1 for n in known))
    label = "family" if registry is FAMILY_MODELS else "model"
    print(f"{label:<{width}} {'cast':<5} {'latency us':>11} {'roofline us':>12} {'ratio':>6}  bound    top engine time")
    for name in args.names or known:
        for cast in args.cast or list(CASTS):
            r = measure(name, args.exporter, args.target, cast, registry)
            rows.append(r)
            if "error" in r:
                print(f"{name:<{width}} {cast:<5} {r['error']}", flush=True)
                continue
            top = ", ".join(f"{k} {us:.0f}" for k, us in r["top"])  # type: ignore[union-attr]
            print(f"{name:<{width}} {cast:<5} {r['latency_us']:>11.1f} {r['roofline_us']:>12.1f} {r['ratio']:>6.2f}  "
                  f"{r['bound']:<8} {top}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
