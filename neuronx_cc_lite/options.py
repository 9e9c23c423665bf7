"""The compile options, as the command line, the Python API and the cache key see them.

Kept apart from compiler.py so that a compile cache hit, which needs only the options' flags for its key, does not
load the compiler (onnx, the passes, the lowering).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from isa.target import Target, get_target
from neuronx_cc_lite.errors import CompileError
from neuronx_cc_lite.precision import MODES, TYPES

FALLBACKS = ("none", "host")  # what the chip cannot run: refused, or run on the CPU (partition/host.py)

@dataclass
class Options:
    target: str = "trn1"
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dump_ir_after: frozenset[str] = frozenset()
    stop_after: str | None = None
    auto_cast: str = "none"  # see precision.py
    auto_cast_type: str = "bf16"
    optimize: int = 2  # -O1: lowering order, fast compiles; -O2: list scheduling
    tp: int = 1  # tensor-parallel ranks per replica group
    dp: int = 1  # replica groups, each on its share of the batch
    lnc: int | None = None  # physical cores per rank; None: the target's default
    input_values: dict[str, Any] = field(default_factory=dict)  # inputs pinned to constants (numbers, nested lists)
    fallback: str = "none"  # "host": what the chip cannot run goes to the CPU (partition/host.py)
    model_type: str | None = None  # what neuronx-cc users state (--model-type): recorded, not used yet
    state: dict[str, str] = field(default_factory=dict)  # device state: input -> the output holding its next value
    decoder: dict[str, Any] | None = None  # a generate step over a KV cache on the device (generate/kv_cache.py)

    def flags(self) -> dict[str, Any]:
        """What the bundle records of how it was made (the ranks only when there are several, so that a one-rank
        bundle is what it was before ranks existed)."""
        flags: dict[str, Any] = {"target": self.target, "auto_cast": self.auto_cast,
                                 "auto_cast_type": self.auto_cast_type,
                                 "input_shapes": {k: list(v) for k, v in sorted(self.input_shapes.items())},
                                 "optimize": self.optimize}
        if self.tp * self.dp > 1 or self.lnc is not None:
            flags.update(tp=self.tp, dp=self.dp, lnc=self.lnc)
        if self.fallback != "none":
            flags["fallback"] = self.fallback
        if self.input_values:  # the program depends on them: they are part of the cache key
            import numpy as np  # only here: a cache hit without pinned inputs does not load numpy

            flags["input_values"] = {k: np.asarray(v).tolist() for k, v in sorted(self.input_values.items())}
        if self.model_type is not None:
            flags["model_type"] = self.model_type
        if self.state:
            flags["state"] = dict(sorted(self.state.items()))
        if self.decoder is not None:
            flags["decoder"] = dict(sorted(self.decoder.items()))
        return flags

    def check(self) -> None:
        if self.auto_cast not in MODES:
            raise CompileError("NCC_OPTION", f"auto-cast (--auto-cast, auto_cast=) must be one of {', '.join(MODES)}")
        if self.auto_cast_type not in TYPES:
            raise CompileError("NCC_OPTION", f"the auto-cast type (--auto-cast-type, auto_cast_type=) must be one of "
                                             f"{', '.join(TYPES)}")
        if self.fallback not in FALLBACKS:
            raise CompileError("NCC_OPTION", f"the fallback (--fallback, fallback=) must be one of "
                                             f"{', '.join(FALLBACKS)}")
        if self.optimize not in (1, 2):
            raise CompileError("NCC_OPTION", "the optimisation level must be 1 or 2")
        for flag, value in (("tp", self.tp), ("dp", self.dp)):
            if not isinstance(value, int) or value < 1:
                raise CompileError("NCC_OPTION", f"--{flag} ({flag}=) must be a positive integer, not {value!r}")
        try:
            target = get_target(self.target)
        except KeyError:
            return  # the target's own error comes from _target
        lnc = self.ranks_lnc(target)
        if lnc not in target.lnc_choices:
            raise CompileError("NCC_OPTION", f"--lnc (lnc=) on {target.name} must be one of "
                                             f"{', '.join(map(str, target.lnc_choices))}, not {lnc}")
        most = target.ranks_per_chip(lnc) * target.chips_per_instance * target.max_instances
        if self.tp * self.dp > most:
            raise CompileError("NCC_OPTION", f"--tp {self.tp} x --dp {self.dp} = {self.tp * self.dp} ranks, but "
                                             f"{target.name} at LNC {lnc} holds at most {most} "
                                             f"({target.ranks_per_chip(lnc)} per chip, {target.chips_per_instance} "
                                             f"chips per instance, {target.max_instances} instances)")

    def ranks_lnc(self, target: Target) -> int:
        return self.lnc if self.lnc is not None else target.default_lnc
