"""The chip model reproduces the published measurements (benchmarks/calibration.py): every held row within its
band, and every figure of every target names its source."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import calibration
from isa.target import TARGETS


@pytest.mark.parametrize("section", list(calibration.SECTIONS))
def test_every_held_row_is_within_its_band(section):
    rows = calibration.SECTIONS[section]()
    assert rows
    out = [f"{r.name}: model {r.model:.4g} against {r.published} (band {r.band})" for r in rows if r.held and not r.ok]
    assert not out, "\n".join(out)
    assert all(r.note for r in rows if not r.held), "an informational row says why it is not held"


def test_the_collective_rows_cover_every_published_table():
    tables = {table for *_, table in calibration.NCCOM_ROWS}
    assert len(calibration.NCCOM_ROWS) == 11 + 4 + 28 + 1 and len(tables) == 4


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_figure_names_its_source(name):
    target = TARGETS[name]
    fields = [f.name for f in dataclasses.fields(target) if f.name not in ("name", "sources")]
    missing = [f for f in fields if f not in target.sources]
    assert not missing, f"{name}: no source for {missing}"
    kinds = {text.split(":")[0] for text in target.sources.values()}
    assert kinds <= {"doc", "measured", "fitted", "estimate"}, kinds
