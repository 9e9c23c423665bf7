"""A damaged bundle is refused with a LoadError, never a traceback: mutate the archive and even re-sign it with a
correct hash, so that the decoder, the manifest reader and the validator are what must hold."""

from __future__ import annotations

import hashlib
import io
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isa import bundle as bundle_format
from isa.bundle import HEADER, HEADER_SIZE
from neuronx_cc_lite.compiler import compile_model
import runtime
from tests.conftest import gemm_model


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    data = bundle_format.to_bytes(compile_model(gemm_model(7, 129, 30, trans_b=True)))
    with zipfile.ZipFile(io.BytesIO(data[HEADER_SIZE:])) as z:
        return {name: z.read(name) for name in z.namelist()}


def _signed(files: dict[str, bytes]) -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)
    payload = archive.getvalue()
    header = HEADER.pack(bundle_format.MAGIC, bundle_format.FORMAT_VERSION, HEADER_SIZE, 1, len(payload),
                         hashlib.sha256(payload).digest(), b"trn1")
    return header.ljust(HEADER_SIZE, b"\0") + payload


def _load(tmp_path, data: bytes) -> None:
    path = tmp_path / "fuzz.neff"
    path.write_bytes(data)
    try:
        runtime.load(str(path))
    except runtime.LoadError as e:
        assert "\n" not in str(e) and str(e).startswith("NRT_LOAD")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_and_resigned_bundles_are_refused_cleanly(tmp_path, files, data):
    name = data.draw(st.sampled_from(sorted(files)))
    content = bytearray(files[name])
    for _ in range(data.draw(st.integers(1, 4))):
        if not content:
            break
        at = data.draw(st.integers(0, len(content) - 1))
        action = data.draw(st.sampled_from(["flip", "truncate", "byte"]))
        if action == "flip":
            content[at] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "byte":
            content[at] = data.draw(st.integers(0, 255))
        else:
            del content[at:]
    _load(tmp_path, _signed({**files, name: bytes(content)}))


@pytest.mark.parametrize("drop", ["manifest.json", "debug.json", "weights.bin", "core0/PE.bin"])
def test_missing_archive_members(tmp_path, files, drop):
    with pytest.raises(runtime.LoadError):
        _strict_load(tmp_path, _signed({k: v for k, v in files.items() if k != drop}))


def _strict_load(tmp_path, data: bytes) -> None:
    path = tmp_path / "bad.neff"
    path.write_bytes(data)
    runtime.load(str(path))
