"""Listings round-trip any node name: disasm then asm gives the identical bundle (issue 9)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isa import bundle as bundle_format
from isa.assembly import assemble, disassemble
from neuronx_cc_lite.compiler import compile_model
from tests.conftest import gemm_model


@pytest.fixture(scope="module")
def bundle() -> bundle_format.Bundle:
    return compile_model(gemm_model(3, 5, 7))


def _renamed(b: bundle_format.Bundle, name: str) -> bundle_format.Bundle:
    cores = [{k: dataclasses.replace(s, nodes=[name] * len(s.nodes)) for k, s in core.items()} for core in b.cores]
    return dataclasses.replace(b, cores=cores)


HOSTILE = [" lead", "trail ", "a\rb", "a\vb", "a\fb", "a\x85b", "a\u2028b", "a\u2029b", "a\x1cb", "a\nb",
           ".core 0", ".data 0 0 4", ".end", '"quoted"', '"', "; not a comment", "tab\there", "\x00nul", "é ü 名"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_round_trip(bundle, name):
    b = _renamed(bundle, name)
    again = assemble(disassemble(b))
    assert bundle_format.to_bytes(again) == bundle_format.to_bytes(b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=24))
def test_any_name_round_trips(bundle, name):
    b = _renamed(bundle, name)
    assert bundle_format.to_bytes(assemble(disassemble(b))) == bundle_format.to_bytes(b)
