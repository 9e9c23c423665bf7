"""The bundle written and read a member at a time: the same bytes as `to_bytes`, weights mapped from the file (and
given back as the runtime copies them), and the checks a whole-file reader made."""

from __future__ import annotations

import hashlib
import io
import zipfile

import numpy as np
import pytest

from isa import bundle as bundle_format
from isa.bundle import HEADER, HEADER_SIZE, MAGIC
from isa.errors import BundleError
from neuronx_cc_lite.compiler import compile_model
from tests.conftest import gemm_model


@pytest.fixture(scope="module")
def bundle() -> bundle_format.Bundle:
    return compile_model(gemm_model(300, 200, 100))


def test_write_streams_the_bytes_to_bytes_makes(bundle, tmp_path):
    path = tmp_path / "m.neff"
    bundle_format.write(bundle, path)
    assert path.read_bytes() == bundle_format.to_bytes(bundle)


def test_read_maps_the_weights_and_copy_to_gives_them_back(bundle, tmp_path):
    path = tmp_path / "m.neff"
    bundle_format.write(bundle, path)
    read = bundle_format.read(path)
    assert read == bundle_format.from_bytes(path.read_bytes())
    for seg, original in zip(read.weights, bundle.weights):
        assert isinstance(seg.data, memoryview) and seg.mapped is not None
        dst = np.zeros(len(seg.data), np.uint8)
        seg.copy_to(dst)
        assert dst.tobytes() == original.data
        seg.copy_to(dst)  # pages given back are read again from the file
        assert dst.tobytes() == original.data


def test_a_weights_member_failing_its_crc_is_refused(bundle, tmp_path):
    """The mapped member is not read through zipfile, which checked its CRC: the reader checks it."""
    data = bundle_format.to_bytes(bundle)
    payload = bytearray(data[HEADER_SIZE:])
    with zipfile.ZipFile(io.BytesIO(bytes(payload))) as z:
        info = z.getinfo("weights.bin")
    start = info.header_offset + 30 + len(info.filename)
    payload[start] ^= 0xFF
    head = HEADER.pack(MAGIC, bundle_format.FORMAT_VERSION, HEADER_SIZE, 1, len(payload),
                       hashlib.sha256(payload).digest(), b"trn1")
    path = tmp_path / "m.neff"
    path.write_bytes(head.ljust(HEADER_SIZE, b"\0") + bytes(payload))
    with pytest.raises(BundleError, match="CRC"):
        bundle_format.read(path)


def test_a_truncated_file_is_refused_before_it_is_mapped(bundle, tmp_path):
    path = tmp_path / "m.neff"
    path.write_bytes(bundle_format.to_bytes(bundle)[:-100])
    with pytest.raises(BundleError, match="truncated"):
        bundle_format.read(path)


def test_an_interrupt_while_the_weights_are_written_comes_through_and_leaves_nothing(bundle, tmp_path, monkeypatch):
    """zipfile closes the archive on the way out, rewriting what it wrote: the interrupt is what the caller sees
    (the command line turns it into NCC_INTERRUPTED), and the temporary file is gone."""
    write = zipfile._ZipWriteFile.write

    def interrupted(self, data):  # type: ignore[no-untyped-def]
        if self._zinfo.filename == "weights.bin":
            raise KeyboardInterrupt
        return write(self, data)

    monkeypatch.setattr(zipfile._ZipWriteFile, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bundle_format.write(bundle, tmp_path / "m.neff")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [KeyboardInterrupt, lambda: OSError(28, "No space left on device")])
def test_an_archive_given_up_before_the_weights_leaves_no_finaliser_to_fail(bundle, tmp_path, monkeypatch, error):
    """An interrupt or a full disk while the small members are written: the archive's finaliser, which runs once
    nothing holds it (at exit, in the command), writes nothing into the closed file and prints no "Exception
    ignored" after the command's error line (seen in CI: a SIGINT 0.4 s into a compile)."""
    import gc
    import sys

    write = zipfile._ZipWriteFile.write

    def failing(self, data):  # type: ignore[no-untyped-def]
        if self._zinfo.filename == "manifest.json":
            raise error()
        return write(self, data)

    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    monkeypatch.setattr(zipfile._ZipWriteFile, "write", failing)
    with pytest.raises((KeyboardInterrupt, OSError)) as caught:
        bundle_format.write(bundle, tmp_path / "m.neff")
    del caught  # its traceback holds the archive, as the command's does until exit
    gc.collect()
    assert ignored == [] and list(tmp_path.iterdir()) == []
