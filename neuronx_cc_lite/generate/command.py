"""`neuronx-cc-lite generate`: the command line of generate/generator.py.

    neuronx-cc-lite generate MODEL.onnx --prompt-ids 1,2,3 --max-new-tokens N [--target T] [--tp N]
                    [--max-length L] [--sampling greedy|top-k|top-p] [--top-k K] [--top-p P] [--temperature T]
                    [--seed S] [--stop-token ID] [--buckets 16,32] [--json OUT.json]

It prints the generated ids on one line (stdout) and the times on stderr; --json writes {"tokens", "ttft_us",
"tpot_us", "tokens_per_s", "host_device_bytes_per_step", ...}. Building the parser imports nothing heavy.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

SAMPLING = ("greedy", "top-k", "top-p")


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids as 1,2,3, got {text!r}") from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"expected one or more token ids >= 0 as 1,2,3, got {text!r}")
    return ids


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _number(high: float, what: str) -> Callable[[str], float]:
    """A parser of numbers in (0, high]."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


_fraction = _number(1.0, "a number in (0, 1]")
_temperature = _number(1e30, "a positive number")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from isa.target import TARGETS
    from neuronx_cc_lite.precision import MODES, TYPES

    p.add_argument("model", metavar="MODEL.onnx",
                   help="a decoder exported with its cache: input_ids, attention_mask, [position_ids], "
                        "past_key_values.N.key/.value in; logits, present.N.key/.value out")
    p.add_argument("--prompt-ids", type=_ids, required=True, metavar="1,2,3", help="the prompt's token ids")
    p.add_argument("--max-new-tokens", type=_positive, required=True, metavar="N", help="tokens to generate at most")
    p.add_argument("--target", default="trn1", choices=sorted(TARGETS), help="chip to compile for and time on")
    p.add_argument("--tp", type=_positive, default=1, metavar="N",
                   help="tensor-parallel ranks (1 only, for now: the device state is not sharded yet)")
    p.add_argument("--max-length", type=_positive, metavar="L",
                   help="the KV cache's capacity in tokens, prompt and generated (default: a static cache's "
                        "length, else 128)")
    p.add_argument("--buckets", type=_ids, metavar="16,32",
                   help="prefill lengths compiled, the prompt padded to the smallest that holds it (default: powers "
                        "of two from 16, and --max-length)")
    p.add_argument("--sampling", choices=SAMPLING, default="greedy",
                   help="greedy (the device picks the token), or a seeded draw on the host")
    p.add_argument("--top-k", type=_positive, default=50, metavar="K", help="top-k: draw among the K likeliest")
    p.add_argument("--top-p", type=_fraction, default=0.9, metavar="P",
                   help="top-p: draw among the likeliest tokens that together hold P of the probability")
    p.add_argument("--temperature", type=_temperature, default=1.0, metavar="T", help="divides the logits")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws")
    p.add_argument("--stop-token", type=int, action="append", default=[], metavar="ID",
                   help="end generation after this token (repeatable)")
    p.add_argument("--auto-cast", choices=MODES, default="none", help="compute in a narrower type (as compile)")
    p.add_argument("--auto-cast-type", choices=TYPES, default="bf16", help="the type auto-cast uses")
    p.add_argument("--json", metavar="OUT.json", help="also write the tokens and times as JSON")
    p.add_argument("--cache-dir", metavar="DIR", help="the compile cache (as compile)")
    p.add_argument("--no-cache", action="store_true", help="compile without reading or writing the cache")


def generation(args: argparse.Namespace) -> Any:
    """The Generation the arguments ask for (generate/generator.py); ValueError for a request that cannot be met."""
    from neuronx_cc_lite.errors import CompileError
    from neuronx_cc_lite.generate.generator import Generator

    if args.tp != 1:
        raise CompileError("NCC_OPTION", f"generate --tp {args.tp}: the KV cache is not sharded over ranks yet; "
                                         "use --tp 1")
    generator = Generator(args.model, max_length=args.max_length, target=args.target, buckets=args.buckets,
                          auto_cast=args.auto_cast, auto_cast_type=args.auto_cast_type, cache=not args.no_cache,
                          cache_dir=args.cache_dir)
    return generator.generate(args.prompt_ids, args.max_new_tokens, sampling=args.sampling, top_k=args.top_k,
                              top_p=args.top_p, temperature=args.temperature, seed=args.seed,
                              stop_tokens=args.stop_token)
