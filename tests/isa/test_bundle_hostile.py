"""Hostile bundles: every archive or manifest the writer would never make is refused with one coded error, before
the loader spends memory on what it declares (issue 9)."""

from __future__ import annotations

import hashlib
import io
import json
import warnings
import zipfile
from typing import Any, Callable

import pytest

from isa import bundle as bundle_format
from isa.bundle import HEADER, HEADER_SIZE, MAGIC
from isa.errors import BundleError
from isa.limits import MAX_INSTRUCTIONS_PER_STREAM
from neuronx_cc_lite.compiler import compile_model
from tests.conftest import gemm_model


@pytest.fixture(scope="module")
def good() -> dict[str, bytes]:
    data = bundle_format.to_bytes(compile_model(gemm_model(3, 5, 7)))
    with zipfile.ZipFile(io.BytesIO(data[HEADER_SIZE:])) as z:
        return {name: z.read(name) for name in z.namelist()}


def _pack(files: dict[str, bytes], *, version: int = bundle_format.FORMAT_VERSION,
          method: int = zipfile.ZIP_STORED, encrypted: bool = False, extra: list[tuple[str, bytes]] = ()) -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", method) as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about a duplicate name, which is the point
        for name, content in [*files.items(), *extra]:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            z.writestr(info, content)
    payload = archive.getvalue()
    if encrypted:  # zipfile writes no encrypted members: set the flag in every central directory record
        payload = payload.replace(b"PK\x01\x02\x14\x03\x14\x00\x00\x00", b"PK\x01\x02\x14\x03\x14\x00\x01\x00")
    head = HEADER.pack(MAGIC, version, HEADER_SIZE, 1, len(payload), hashlib.sha256(payload).digest(), b"trn1")
    return head.ljust(HEADER_SIZE, b"\0") + payload


def _with_manifest(files: dict[str, bytes], change: Callable[[dict[str, Any]], None] | None = None,
                   text: str | None = None) -> dict[str, bytes]:
    manifest = json.loads(files["manifest.json"])
    if change:
        change(manifest)
    return {**files, "manifest.json": (text if text is not None else json.dumps(manifest)).encode()}


def _refused(data: bytes, says: str) -> None:
    with pytest.raises(BundleError, match=says) as e:
        bundle_format.from_bytes(data)
    assert str(e.value).startswith("NCC_BUNDLE: ") and "\n" not in str(e.value)


def test_the_writers_own_bundle_loads(good):
    assert bundle_format.from_bytes(_pack(good)).target == "trn1"


def test_compressed_members_are_refused(good):
    _refused(_pack(good, method=zipfile.ZIP_DEFLATED), "compressed")
    _refused(_pack(good, method=zipfile.ZIP_LZMA), "compressed")


def test_encrypted_and_duplicate_members_are_refused(good):
    _refused(_pack(good, encrypted=True), "encrypted")
    _refused(_pack(good, extra=[("weights.bin", b"")]), "twice")


def test_an_old_format_is_refused_with_a_hint(good):
    _refused(_pack(good, version=1), "format version 1.*recompile")


@pytest.mark.parametrize("change, says", [
    (lambda m: m.update(hbm_size=-1), "hbm_size"),
    (lambda m: m.update(hbm_size=1.5), "hbm_size: expected an integer"),
    (lambda m: m.update(lnc="2"), "lnc"),
    (lambda m: m["outputs"][0].update(shape=[-3, 7]), r"outputs\[0\].shape"),
    (lambda m: m["outputs"][0].update(shape=[2**40, 2**40, 2**40]), "elements"),
    (lambda m: m["outputs"][0].update(dtype="float33"), "not a numpy type"),
    (lambda m: m["outputs"][0].update(device_dtype="fp99"), "device_dtype"),
    (lambda m: m["outputs"][0]["placements"][0].update(rank=5), "rank"),
    (lambda m: m["outputs"][0]["placements"][0].update(stop=99), "stop"),
    (lambda m: m["outputs"][0].update(placements=[]), "no placement"),
    (lambda m: m.update(groups=[[0, 0]]), "distinct ranks"),
    (lambda m: m.update(flags=[]), "flags: expected an object"),
    (lambda m: m["hbm_tensors"][0].update(kind="spill"), r"hbm_tensors\[0\].kind: unknown HBM tensor kind 'spill'"),
    (lambda m: m["hbm_tensors"][0].update(kind=3), r"hbm_tensors\[0\].kind: expected a string"),
    (lambda m: m.pop("cores"), "missing cores"),
    (lambda m: m["weights"].append({"rank": 0, "hbm_offset": 0, "size": 10**12}), "weights.bin"),
])
def test_manifest_schema(good, change, says):
    _refused(_pack(_with_manifest(good, change)), says)


def test_overlapping_weight_segments_are_refused(good):
    manifest = json.loads(good["manifest.json"])
    first = manifest["weights"][0]
    blob = good["weights.bin"]
    manifest["weights"] = [first, {**first, "hbm_offset": first["hbm_offset"] + 4}]
    files = {**good, "manifest.json": json.dumps(manifest).encode(), "weights.bin": blob[:first["size"]] * 2}
    _refused(_pack(files), "overlap")


def test_infinity_and_deep_nesting_are_refused(good):
    text = good["manifest.json"].decode()
    _refused(_pack(_with_manifest(good, text=text.replace('"hbm_size": ', '"hbm_size": Infinity, "x": ', 1))),
             "Infinity")
    deep = json.loads(text)
    deep["flags"] = {"a": "[" * 100000 + "]" * 100000}
    nested = json.dumps(deep).replace('"' + "[" * 100000 + "]" * 100000 + '"', "[" * 100000 + "]" * 100000)
    _refused(_pack(_with_manifest(good, text=nested)), "nests")


def test_a_stream_declaring_too_many_instructions_is_refused_before_decoding(good):
    stream = next(name for name in good if name.startswith("core0/"))
    for count in (MAX_INSTRUCTIONS_PER_STREAM + 1, 1_000_000):
        files = {**good, stream: count.to_bytes(4, "little") + good[stream][4:]}
        with pytest.raises(Exception, match="NCC_ISA_DECODE: .*(at most|declares)"):
            bundle_format.from_bytes(_pack(files))
