"""ScalarE's first lookup table loaded while it waits for its first data.

ScalarE holds one function table at a time; an activation whose function is in another loads it first (isa/costs.py
table_of: an estimate, no public figure). At the start of a program ScalarE waits for the first loads from HBM, and
the first activation that needs a table then loads it on the critical path (a scan layer's gate: its sigmoid waits
for the table after the projection it follows). One activation of that function over one element, at the start,
loads the table in that wait instead: it reads a constant tile and writes a tile of its own, and nothing depends on
it, so the schedule puts it wherever ScalarE is idle first.
"""

from __future__ import annotations

from isa.costs import TABLELESS
from isa.dtypes import DType
from isa.operand import Engine
from neuronx_cc_lite.tile.program import PendingInstr, Program


def preload_act_table(program: Program) -> bool:
    """Put a one-element activation of the first tabled function (in program order) first on ScalarE; False when
    no activation needs a table."""
    first = next((p for p in program.instrs if p.op == "activation" and p.args["func"] not in TABLELESS), None)
    if first is None:
        return False
    zero = program.scalar(0.0, DType.fp32)  # filled at the start of the program
    loaded = program.sbuf(1, 1, DType.fp32, "act-table")
    args = {name: None for name in first.args} | {"dst": loaded.ap(), "src": zero.ap(partitions=1),
                                                   "func": first.args["func"], "scale": 1.0}
    at = next(i for i, p in enumerate(program.instrs) if p.args.get("dst") is not None and
              getattr(p.args["dst"], "tile", None) is zero) + 1
    program.instrs.insert(at, PendingInstr("activation", Engine.ACT, 0, args, ""))
    return True
