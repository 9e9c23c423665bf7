"""--tp auto: the tensor-parallel degree that minimises a decode step's latency on the chip model.

Candidates are the degrees one instance of the target holds: powers of two up to its ranks, and its ranks (24 on
inf2.48xlarge). Each candidate's decode step is compiled (a degree the model cannot be cut into, or whose share
does not fit a rank's HBM, is skipped with its reason) and timed by the timing-only simulation
(runtime.profile.timed_run: the same timeline a run has, no values computed), plus the runtime's launch and copies.
The fastest wins; on a tie the smaller degree (fewer ranks for the same time). The table of every candidate is
kept so that the choice can say why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from isa.target import get_target
from neuronx_cc_lite.errors import CompileError


@dataclass
class TpChoice:
    tp: int
    step_us: dict[int, float] = field(default_factory=dict)  # candidate -> decode step, device and host overhead
    skipped: dict[int, str] = field(default_factory=dict)  # candidate -> why not

    def why(self) -> str:
        timed = ", ".join(f"{n}: {us:,.1f} us" for n, us in sorted(self.step_us.items()))
        out = f"--tp auto chose {self.tp}: a decode step takes {self.step_us[self.tp]:,.1f} us ({timed})"
        if self.skipped:
            out += "; not " + "; ".join(f"{n} ({why})" for n, why in sorted(self.skipped.items()))
        return out


def candidates(target: str, lnc: int | None) -> list[int]:
    t = get_target(target)
    ranks = t.ranks_per_chip(lnc or t.default_lnc) * t.chips_per_instance
    found = [1 << k for k in range(ranks.bit_length()) if 1 << k <= ranks]
    return sorted({*found, ranks})


def choose_tp(decode_bundle: Callable[[int], Any], target: str, lnc: int | None = None) -> TpChoice:
    """The degree whose decode step (`decode_bundle(tp)`, a compiled Bundle) is fastest (module docstring)."""
    from runtime.profile import host_overhead_us, timed_run

    t = get_target(target)
    choice = TpChoice(0)
    for n in candidates(target, lnc):
        try:
            bundle = decode_bundle(n)
        except CompileError as e:
            choice.skipped[n] = f"{e.code}: {e.message[:80]}"
            continue
        choice.step_us[n] = timed_run(bundle, t).last_run.elapsed_ns / 1e3 + host_overhead_us(bundle, t)
    if not choice.step_us:
        raise CompileError("NCC_OPTION", "--tp auto: no degree compiles: " + "; ".join(
            f"{n}: {why}" for n, why in choice.skipped.items()))
    choice.tp = min(choice.step_us, key=lambda n: (choice.step_us[n], n))
    return choice
