"""Census of DMA pieces under 512 bytes (isa/costs.small_pieces) on every model of models/ and every exporter family
of benchmarks/exports.py, in bf16 (--auto-cast matmult) and fp32, on trn1: per model the count and the ONNX nodes
(with their operator) that cut them.

    .venv/bin/python benchmarks/small_pieces.py [NAME ...] [--models-only | --families-only]
                                                [--exporter dynamo|torchscript] [--cast bf16|fp32] [--json OUT]

A piece counts only where a partition's data is longer than 512 B and the transfer cuts it smaller: a layout
choice, not the tensor's size. A compile that fails is a row with its error code, not the end of the census.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.exports import EXPORTERS, FAMILIES, export  # noqa: E402
from benchmarks.families import CASTS  # noqa: E402

MODELS = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "models", "*.onnx")))


def census(path: str, cast: str) -> dict[str, object]:
    """Compile `path` with `cast`'s options and count its small pieces per node, naming each node's operator."""
    import onnx

    from neuronx_cc_lite.compiler import Options, compile_model
    from neuronx_cc_lite.errors import CompileError
    from neuronx_cc_lite.frontend import load_model
    from runtime.profile import small_pieces_by_node

    start = time.perf_counter()
    try:
        bundle = compile_model(load_model(path), Options(**CASTS[cast]))  # type: ignore[arg-type]
    except CompileError as e:
        return {"error": str(e).splitlines()[0]}
    found = small_pieces_by_node(bundle)
    graph = onnx.load(path, load_external_data=False).graph
    ops = {n.name: n.op_type for n in graph.node}
    nodes = sorted(found.items(), key=lambda r: (-r[1], r[0]))
    return {"pieces": sum(found.values()), "compile_s": time.perf_counter() - start,
            "nodes": [{"node": name, "op": ops.get(name, "?"), "pieces": n} for name, n in nodes]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="models of models/ or families (all by default)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--models-only", action="store_true")
    which.add_argument("--families-only", action="store_true")
    parser.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    parser.add_argument("--cast", choices=list(CASTS), action="append", help="bf16 and fp32 by default")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in MODELS and n not in FAMILIES]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS + list(FAMILIES))}")
    names = args.names or ([] if args.families_only else MODELS) + ([] if args.models_only else list(FAMILIES))
    rows = []
    for name in names:
        for cast in args.cast or list(CASTS):
            if name in FAMILIES:
                try:
                    path = export(name, args.exporter)
                except Exception as e:  # the exporter's failure is a row
                    row: dict[str, object] = {"error": f"export failed: {type(e).__name__}"}
                else:
                    row = census(path, cast)
            else:
                row = census(os.path.join(ROOT, "models", f"{name}.onnx"), cast)
            row = {"name": name, "cast": cast, **row}
            rows.append(row)
            if "error" in row:
                print(f"{name:<16} {cast:<5} {row['error']}", flush=True)
                continue
            top = ", ".join(f"{r['node']} ({r['op']}) {r['pieces']}" for r in row["nodes"][:6])  # type: ignore
            print(f"{name:<16} {cast:<5} {row['pieces']:>8}  {top}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
