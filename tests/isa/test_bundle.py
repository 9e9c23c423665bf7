"""The bundle file: deterministic bytes, and a clear refusal of anything damaged or foreign."""

from __future__ import annotations

import struct

import pytest

from isa import bundle as bundle_format
from isa.bundle import HEADER_SIZE, BundleError
from neuronx_cc_lite.compiler import compile_model
from tests.conftest import gemm_model
import runtime


@pytest.fixture(scope="module")
def data() -> bytes:
    return bundle_format.to_bytes(compile_model(gemm_model(7, 129, 300, trans_b=True)))


def test_same_model_same_bytes(data):
    again = bundle_format.to_bytes(compile_model(gemm_model(7, 129, 300, trans_b=True)))
    assert again == data


def test_bytes_round_trip(data):
    assert bundle_format.to_bytes(bundle_format.from_bytes(data)) == data


@pytest.mark.parametrize("where", [HEADER_SIZE + 10, HEADER_SIZE + 500, -1])
def test_one_flipped_byte_is_a_hash_error(tmp, data, where):
    damaged = bytearray(data)
    damaged[where] ^= 0x01
    path = f"{tmp}/bad.neff"
    with open(path, "wb") as f:
        f.write(damaged)
    with pytest.raises(runtime.LoadError, match="sha256 hash mismatch"):
        runtime.load(path)


def test_truncated(data):
    with pytest.raises(BundleError, match="truncated"):
        bundle_format.from_bytes(data[:-100])
    with pytest.raises(BundleError, match="shorter than"):
        bundle_format.from_bytes(data[:20])


def test_foreign_version_and_magic(data):
    newer = bytearray(data)
    struct.pack_into("<H", newer, 8, 99)
    with pytest.raises(BundleError, match="format version 99"):
        bundle_format.from_bytes(bytes(newer))
    with pytest.raises(BundleError, match="bad magic"):
        bundle_format.from_bytes(b"PK\x03\x04" + data[4:])


def test_write_is_atomic(tmp, data, monkeypatch):
    """A failed write leaves neither a partial bundle nor a temporary file."""
    b = bundle_format.from_bytes(data)
    path = f"{tmp}/out.neff"

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(bundle_format.os, "replace", boom)
    with pytest.raises(OSError):
        bundle_format.write(b, path)
    import os

    assert os.listdir(tmp) == []
