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

    monkeypatch.setattr(bundle_format.os, "rename", boom)
    with pytest.raises(OSError):
        bundle_format.write(b, path)
    import os

    assert os.listdir(tmp) == []


def test_a_bundle_written_over_another_replaces_it_or_leaves_it_whole(tmp, data, monkeypatch):
    """The old file is renamed aside before the new one takes its name (isa/files.py `_rename_into_place`): it is
    gone after, with nothing else left; if the new one cannot take the name, the old one is back, as it was."""
    import os

    b = bundle_format.from_bytes(data)
    path = f"{tmp}/out.neff"
    with open(path, "wb") as f:
        f.write(bundle_format.to_bytes(b)[:-1] + b"!")  # an older bundle (check_output reads only the header)
    old = open(path, "rb").read()
    rename = os.rename

    def refused(src, dst):  # the new file's rename fails; the others go through
        if not os.path.basename(dst) == "out.neff" or os.path.getsize(src) == len(old) and \
                open(src, "rb").read() == old:
            return rename(src, dst)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "rename", refused)
    with pytest.raises(OSError):
        bundle_format.write(b, path)
    assert os.listdir(tmp) == ["out.neff"] and open(path, "rb").read() == old
    monkeypatch.setattr(os, "rename", rename)
    bundle_format.write(b, path)
    assert os.listdir(tmp) == ["out.neff"] and open(path, "rb").read() == bundle_format.to_bytes(b)
