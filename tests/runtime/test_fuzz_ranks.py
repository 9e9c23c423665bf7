"""Random multi-rank bundles (LNC, ranks, groups, placements, collectives with any group and sizes) either load
and run, or stop with a coded runtime error: never a traceback, never a hang."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime
from isa.bundle import Bundle, Placement, Stream, TensorInfo
from isa.dtypes import DType
from isa.functions import AluOp
from isa.instructions import make
from tests.runtime.helpers import hbm

HBM_SIZE = 4096
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute"]


def _maybe(draw: st.DrawFn, good: st.SearchStrategy, bad: st.SearchStrategy):  # type: ignore[no-untyped-def]
    """Mostly a value that makes sense, sometimes any value: so that most bundles get past the checks."""
    return draw(bad) if draw(st.integers(0, 9)) == 0 else draw(good)


@st.composite
def bundles(draw: st.DrawFn) -> Bundle:
    """Every rank of a group runs the group's collectives in order (sized for it), except that now and then a rank
    changes one, drops one, or the layout itself is bad."""
    target = draw(st.sampled_from(["trn1", "inf2", "trn2"]))
    lnc = _maybe(draw, st.sampled_from([1, 2] if target == "trn2" else [1]), st.integers(0, 3))
    ranks = draw(st.integers(1, 6))
    in_range = st.integers(0, ranks - 1)
    groups = [_maybe(draw, st.lists(in_range, min_size=1, unique=True).map(tuple),
                     st.lists(st.integers(-1, ranks), max_size=ranks + 1).map(tuple))
              for _ in range(draw(st.integers(1, 3)))]
    dtype = draw(st.sampled_from([DType.fp32, DType.int32]))
    cores: list[list] = [[] for _ in range(ranks)]
    for _ in range(draw(st.integers(0, 3))):
        g = draw(st.integers(0, len(groups) - 1))
        n = max(1, len(groups[g]))
        op = draw(st.sampled_from(COLLECTIVES))
        block = draw(st.integers(1, 3))
        src, dst = {"all_gather": (block, n * block), "reduce_scatter": (n * block, block)}.get(op, (n * block,) * 2)
        fields = {"op": draw(st.sampled_from([AluOp.add, AluOp.maximum]))} if op in ("all_reduce",
                                                                                   "reduce_scatter") else {}
        if op == "permute":
            fields["shift"] = draw(st.integers(-3, 3))
        for rank in groups[g]:
            if not 0 <= rank < ranks or draw(st.integers(0, 19)) == 0:
                continue  # a rank that never posts it
            changed = draw(st.integers(0, 19)) == 0  # a rank that posts something else
            cores[rank].append(make(op, dst=hbm(1024, 1, dst + changed, dtype), src=hbm(0, 1, src, dtype),
                                    group=_maybe(draw, st.just(g), st.integers(-1, 3)), **fields))
    width = draw(st.integers(1, 8))

    def placements(offset: int) -> tuple[Placement, ...]:
        good = st.just(tuple(Placement(r, offset, 0, r, r + 1) for r in range(ranks)))
        bad = st.lists(st.builds(Placement, st.integers(-1, ranks), st.sampled_from([0, offset, HBM_SIZE - 8]),
                                 st.integers(-1, 2), st.integers(-1, ranks), st.integers(0, ranks + 1)),
                       max_size=3).map(tuple)
        return _maybe(draw, good, bad)

    name = dtype.np.name
    return Bundle(target, HBM_SIZE, [TensorInfo("x", (ranks, width), name, dtype.name, placements(0))],
                  [TensorInfo("y", (ranks, width), name, dtype.name, placements(1024 + 64))],
                  [{"CC": Stream(instrs, [""] * len(instrs))} if instrs else {} for instrs in cores],
                  lnc=lnc, groups=groups)


@settings(max_examples=150, deadline=None)
@given(b=bundles())
def test_random_multi_rank_bundles_load_and_run_or_give_a_coded_error(b):
    try:
        model = runtime.Model(b)
        x = np.ones(b.inputs[0].shape, np.dtype(b.inputs[0].dtype))
        model.run({"x": x}, policy="random")
    except runtime.NeuronRuntimeError as e:
        text = str(e)
        assert "\n" not in text and text.startswith("NRT_")
