"""The stages after lowering, in order: each takes the tile program (tile/program.py) to the next and is followed
by the tile-program verifier (tile/verify.py), which names the stage when it finds a fault. They are listed as
the graph passes are (passes/__init__.py): `--dump-ir-after NAME` prints the tile program after one
(tile/printer.py) and `--stop-after NAME` stops there. `emit` then turns the placed program into engine streams.

"lowering" and "keep-on-chip" run together (compiler.lower_program): a tensor keep-on-chip leaves stranded
between two layouts is lowered again by rows, and the two are listed for their dumps and their verifier.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # the list is data the command line reads; the stages load when they run
    from neuronx_cc_lite.tile.program import Program

log = logging.getLogger(__name__)


def _broadcast_on_pe(program: Program, optimize: int) -> str:
    from neuronx_cc_lite.codegen.broadcasts import broadcast_on_pe

    broadcast_on_pe(program)
    return ""


def _dedupe_loads(program: Program, optimize: int) -> str:
    from neuronx_cc_lite.codegen.dedupe import dedupe_loads

    dedupe_loads(program)
    return ""


def _second_writes(program: Program, optimize: int) -> str:
    from neuronx_cc_lite.codegen.second_writes import second_writes

    count = second_writes(program)
    return f"{count} copies" if count else ""


def _preload_act_table(program: Program, optimize: int) -> str:
    from neuronx_cc_lite.codegen.act_table import preload_act_table

    return "" if preload_act_table(program) else "no activation needs a table"


def _split_transfers(program: Program, optimize: int) -> str:
    from neuronx_cc_lite.codegen.transfers import split_transfers

    split_transfers(program)
    return ""


def _schedule(program: Program, optimize: int) -> str:
    """-O2: the list schedule within memory (schedule.py), which places every tile; -O1, or when no schedule fits,
    the lowering order, queues in turn, tiles placed by the planner (allocate.py)."""
    from neuronx_cc_lite.codegen.allocate import allocate
    from neuronx_cc_lite.codegen.schedule import assign_queues_in_order, schedule_within_memory

    if optimize >= 2 and schedule_within_memory(program):
        return f"{program.schedule_tries} tries" if program.schedule_tries > 1 else ""
    assign_queues_in_order(program)
    allocate(program)
    return "in lowering order"


def _hbm_layout(program: Program, optimize: int) -> str:
    from neuronx_cc_lite.codegen.allocate import layout_hbm

    program.hbm_size = layout_hbm(program)
    return f"{program.hbm_size} bytes of HBM, {len(program.hbm)} tensors"


@dataclass(frozen=True)
class Stage:
    name: str
    reason: str
    run: Callable[[Program, int], str] | None  # (program, -O level) -> a detail for the log; None: see docstring
    least_optimize: int = 1  # the -O level from which it runs


STAGES: list[Stage] = [
    Stage("lowering", "each node becomes tile instructions over SBUF and PSUM tiles and HBM tensors", None),
    Stage("keep-on-chip", "an intermediate tensor whose producer and readers agree on its layout stays in SBUF, "
                          "where its stores and loads were", None, 2),
    Stage("broadcast-on-pe", "a row loaded onto every partition is one row loaded, then a matmul with ones",
          _broadcast_on_pe, 2),
    Stage("dedupe-loads", "identical loads of a weight or constant are made once", _dedupe_loads, 2),
    Stage("second-writes", "a copy that narrows a result to its reader's type becomes a second write of the "
                           "result by its producer, beside the dependent chain instead of on it", _second_writes, 2),
    Stage("preload-act-table", "ScalarE loads its first function table while it waits for the first data, not "
                               "on the critical path after it", _preload_act_table, 2),
    Stage("split-transfers", "a large transfer cut into bands of partitions moves on several DMA queues at once",
          _split_transfers),
    Stage("schedule", "engines, queues and order from the cost model; every tile placed in SBUF or PSUM",
          _schedule),
    Stage("hbm-layout", "every HBM tensor given its offset", _hbm_layout),
]
STAGE_NAMES = [s.name for s in STAGES]
_BY_NAME = {s.name: s for s in STAGES}


class StopAfter(Exception):
    """`--stop-after` reached a stage: the tile program as text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class Stages:
    """Runs the stages of one rank's program: the verifier after each, the dumps asked for, the stop."""

    def __init__(self, optimize: int, dump: frozenset[str] = frozenset(), stop_after: str | None = None,
                 dump_after: Callable[[str, str], None] | None = None) -> None:
        self.optimize, self.dump, self.stop_after, self.dump_after = optimize, dump, stop_after, dump_after

    def done(self, name: str, program: Program, start: float, detail: str = "") -> float:
        """After stage `name`: verify, log, dump, stop. Returns when the next stage starts."""
        from neuronx_cc_lite.tile.verify import verify_program
        from neuronx_cc_lite.tile.printer import print_program

        verify_program(program, name)
        if log.isEnabledFor(logging.DEBUG):
            sizes = f"{len(program.instrs)} instructions, {len(program.tiles)} tiles"
            log.debug(f"stage {name}: {time.perf_counter() - start:.3f} s, {sizes}{', ' + detail if detail else ''}")
        queues = STAGE_NAMES.index(name) >= STAGE_NAMES.index("schedule")
        if self.dump_after is not None and name in self.dump:
            self.dump_after(name, print_program(program, queues))
        if name == self.stop_after:
            raise StopAfter(print_program(program, queues))
        return time.perf_counter()

    def run(self, program: Program, *names: str) -> None:
        for name in names:
            stage = _BY_NAME[name]
            assert stage.run is not None, f"stage {name} runs in the lowering loop"
            if self.optimize < stage.least_optimize:
                continue
            start = time.perf_counter()
            detail = stage.run(program, self.optimize)
            self.done(name, program, start, detail)
