"""neuronx-cc's own flags, as its users type them: each is taken with its meaning here, or taken and said to change
nothing (with why), or refused with a sentence that says what this compiler does instead. Data, read by the
command line's parser (cli.py); the meanings are those of neuronx-cc's CLI reference.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Sequence

log = logging.getLogger("neuronx_cc_lite.cli")

# Flags that neuronx-cc takes without a value and that this compiler does already, whatever is given.
ALWAYS_SO = {
    "--enable-fast-loading-neuron-binaries":
        "a bundle is always stored uncompressed, and its weights are mapped from the file as it loads",
    "--enable-mixed-precision-accumulation":
        "the engines always compute in fp32 and PSUM accumulates in fp32, whatever --auto-cast narrows "
        "(the README's Precision section)",
}

# Flags of neuronx-cc (or of neuron-cc before it) that this compiler refuses, with what to do instead.
REFUSED = {
    "--distribution-strategy":
        "neuronx-cc's training strategies (llm-training, nemo, fsdp) do not apply: neuronx-cc-lite compiles "
        "inference graphs and shards them with --tp N (tensor parallel) and --dp N (data parallel)",
    "--enable-saturate-infinity":
        "not modelled: constants that auto-cast narrows already saturate to the type's largest finite value, and "
        "values the engines compute round as IEEE/OCP conversion does (to inf, or NaN in fp8_e4m3); keep values in "
        "range with --auto-cast-type bf16 or fp16",
    "--fast-math":
        "that is neuron-cc's (Inf1) option; neuronx-cc and neuronx-cc-lite choose precision with --auto-cast "
        "none|matmult|all and --auto-cast-type bf16|fp16|fp8_e4m3|fp8_e5m2",
}

# Values of valued flags that are refused, with what to do instead.
REFUSED_VALUES = {
    ("--auto-cast-type", "tf32"):
        "tf32 is not modelled: give bf16, fp16, fp8_e4m3 or fp8_e5m2, or leave --auto-cast none for fp32 matmuls "
        "(fp32 products, fp32 accumulation)",
}

# Model types neuronx-cc takes: recorded in the bundle's flags, no optimisation of their own here yet.
MODEL_TYPES = ("generic", "transformer", "unet-inference")

# --verbose as neuronx-cc (lower case, and critical) and neuron-cc (DEBUG, INFO, WARN, ERROR) spell it.
LEVEL_ALIASES = {"warn": "warning"}


class _AlwaysSo(argparse.Action):
    """A flag that asks for what is always done: taken, and said so at info level."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        notes = getattr(namespace, "notes", [])
        namespace.notes = [*notes, f"{option_string}: always so here: {ALWAYS_SO[self.option_strings[0]]}"]


class _Refused(argparse.Action):
    """A flag refused as a usage error with the sentence that says what to do instead."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string}: {REFUSED[self.option_strings[0]]}")


def add_to(parser: argparse.ArgumentParser) -> None:
    """neuronx-cc's flags that a compile takes or refuses here (see the tables above)."""
    for flag, why in ALWAYS_SO.items():
        parser.add_argument(flag, action=_AlwaysSo, help=f"neuronx-cc's flag; always so here: {why}")
    for flag in REFUSED:
        parser.add_argument(flag, action=_Refused, metavar="VALUE", help=argparse.SUPPRESS)


def auto_cast_type(text: str) -> str:
    """--auto-cast-type's parser: a name in any case; a refused one with its sentence."""
    name = text.lower()
    if ("--auto-cast-type", name) in REFUSED_VALUES:
        raise argparse.ArgumentTypeError(REFUSED_VALUES["--auto-cast-type", name])
    return name


def log_level(text: str) -> str:
    """--verbose's parser: any case, neuron-cc's WARN."""
    name = text.lower()
    return LEVEL_ALIASES.get(name, name)


def say_notes(args: argparse.Namespace) -> None:
    """Log what the flags that change nothing said (once logging is set up)."""
    for note in getattr(args, "notes", []):
        log.info(note)
