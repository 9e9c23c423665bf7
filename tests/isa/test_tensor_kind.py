"""HBM tensor kinds (isa/tensor_kind.py): every kind reads back from the form bundles and listings carry, that form
is the strings bundles have always held, and a kind that is none is refused naming it."""

from __future__ import annotations

import json
import re

import pytest

from isa import bundle as bundle_format
from isa.assembly import assemble, disassemble
from isa.bundle import HbmTensorInfo
from isa.listing import ParseError
from isa.tensor_kind import TensorKind
from neuronx_cc_lite.compiler import compile_model
from tests.conftest import gemm_model


def test_the_values_are_the_strings_bundles_carry():
    """Bundles already written and the compile cache hold these strings: they must not change."""
    assert [k.value for k in TensorKind] == ["input", "output", "state", "weight", "scratch"]


@pytest.mark.parametrize("kind", list(TensorKind), ids=str)
def test_every_kind_round_trips_through_the_manifest(kind):
    info = HbmTensorInfo("t", kind, 64, 128)
    text = json.dumps(info.to_json(), sort_keys=True)
    assert text == f'{{"hbm_offset": 64, "kind": "{kind.value}", "name": "t", "size": 128}}'
    back = HbmTensorInfo.from_json(json.loads(text))
    assert back == info and back.kind is kind
    assert TensorKind.parse(str(kind)) is kind and f"{kind}" == kind.value


@pytest.mark.parametrize("bad", ["spill", "Weight", "", "weights"])
def test_an_unknown_kind_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=f"^unknown HBM tensor kind {re.escape(repr(bad))} "
                                         r"\(known: input, output, state, weight, scratch\)$"):
        TensorKind.parse(bad)
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        HbmTensorInfo.from_json({"name": "t", "kind": bad, "hbm_offset": 0, "size": 4})


def test_a_compiled_bundle_holds_kinds_and_its_listing_refuses_an_unknown_one():
    b = bundle_format.from_bytes(bundle_format.to_bytes(compile_model(gemm_model(3, 5, 7))))
    assert {t.kind for t in b.hbm_tensors} >= {TensorKind.INPUT, TensorKind.OUTPUT, TensorKind.WEIGHT}
    assert all(isinstance(t.kind, TensorKind) for t in b.hbm_tensors)
    listing = disassemble(b)
    assert '"kind": "weight"' in listing  # the serialized form, as before
    with pytest.raises(ParseError, match=r"^NCC_ISA_PARSE: line \d+: bad tensor description: "
                                         r"unknown HBM tensor kind .spill."):
        assemble(listing.replace('"kind": "weight"', '"kind": "spill"', 1))
