"""disasm shows matmuls on PE writing PSUM and DMA loads from HBM; asm of the listing gives the same bytes."""

from __future__ import annotations

import glob
import os

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa import bundle as bundle_format
from isa.assembly import assemble, disassemble
from isa.listing import ParseError
from neuronx_cc_lite.compiler import compile_model
from tests.conftest import MODELS_DIR, gemm_model


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(MODELS_DIR, "*.onnx"))), ids=os.path.basename)
def test_disasm_then_asm_is_byte_identical(path):
    b = compile_model(onnx.load(path))
    data = bundle_format.to_bytes(b)
    listing = disassemble(bundle_format.from_bytes(data))
    assert bundle_format.to_bytes(assemble(listing)) == data


def test_listing_shows_the_engines_at_work():
    listing = disassemble(compile_model(gemm_model(129, 300, 513)))
    pe = listing.split(".stream PE\n")[1].split(".stream")[0]
    matmuls = [line for line in pe.splitlines() if "nc_matmul" in line]
    assert matmuls and all("dst=fp32 PSUM[" in line for line in matmuls)
    assert all(line.rstrip().endswith("; Gemm_0") for line in matmuls)
    loads = [line for line in listing.splitlines() if "dma_copy dst=fp32 SBUF" in line and "src=fp32 HBM" in line]
    assert loads


def test_listing_without_data_needs_the_weights_from_somewhere():
    b = compile_model(gemm_model(7, 7, 7))
    listing = disassemble(b, data=False)
    with pytest.raises(ParseError, match="give a bundle to take the weights from"):
        assemble(listing)
    assert bundle_format.to_bytes(assemble(listing, weights_from=b)) == bundle_format.to_bytes(b)


@pytest.mark.parametrize("damage, message", [
    (lambda s: s.replace("nc_matmul", "nc_matmol", 1), "cannot parse"),
    (lambda s: s.replace("func=copy", "func=coppy", 1), "unknown func value"),
    (lambda s: s.replace(".core 0", ".core 3"), "expected .core 0"),
    (lambda s: s.replace(".bundle", ".bundel"), "unknown directive"),
])
def test_bad_listings_say_where(damage, message):
    listing = disassemble(compile_model(gemm_model(7, 7, 7)))
    with pytest.raises(ParseError, match=message):
        assemble(damage(listing))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_damaged_listings_give_parse_errors(data):
    """Any edit of a listing assembles, or fails with a ParseError naming the line: never anything else."""
    lines = _LISTING.splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        j = data.draw(st.integers(0, len(line)))
        lines[i] = line[:j] + data.draw(st.text(alphabet=" .:;@[]{}()=,-0123456789abcsDMAPE", max_size=4)) + \
            line[j + data.draw(st.integers(0, 3)):]
    try:
        assemble("\n".join(lines))
    except ParseError:
        pass


_LISTING = disassemble(compile_model(gemm_model(3, 5, 4)))
