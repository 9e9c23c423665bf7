"""The compile cache: a second compile of the same model and options is a hit (the same bytes, at least 10x
faster), other options or another model miss, a broken entry is rebuilt, concurrent writers leave one whole
entry, and --no-cache neither reads nor writes. An entry is bound to its key (another bundle in its place, or
another key's files, are never returned), any change to a model's files misses, special files in the cache are
refused at once, and the cache keeps to its size by dropping the least recently used entries."""

from __future__ import annotations

import glob
import io
import os
import re
import shutil
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import neuronx_cc_lite
import runtime
from isa import bundle as bundle_format
from neuronx_cc_lite import cache as cache_module
from neuronx_cc_lite.cli import main
from tests.conftest import make_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "bert_modern.onnx")


def _entries(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "*", "*.neff")))


def _timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def test_a_second_compile_is_a_hit_with_the_same_bytes_and_ten_times_faster(tmp):
    first, miss = _timed(lambda: neuronx_cc_lite.compile(MODEL, cache_dir=tmp))
    assert len(_entries(tmp)) == 1
    hits = [_timed(lambda: neuronx_cc_lite.compile(MODEL, cache_dir=tmp)) for _ in range(3)]
    assert all(bundle_format.to_bytes(b) == bundle_format.to_bytes(first) for b, _ in hits)
    assert miss >= 10 * min(t for _, t in hits), (miss, [t for _, t in hits])


def test_other_options_miss(tmp):
    neuronx_cc_lite.compile(MODEL, cache_dir=tmp)
    matmult = neuronx_cc_lite.compile(MODEL, cache_dir=tmp, auto_cast="matmult")
    assert len(_entries(tmp)) == 2 and matmult.flags["auto_cast"] == "matmult"


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_broken_entry_is_discarded_and_rebuilt(tmp, damage):
    good = bundle_format.to_bytes(neuronx_cc_lite.compile(MODEL, cache_dir=tmp))
    (entry,) = _entries(tmp)
    data = bytearray(open(entry, "rb").read())
    if damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    with open(entry, "wb") as f:
        f.write(data)
    assert bundle_format.to_bytes(neuronx_cc_lite.compile(MODEL, cache_dir=tmp)) == good
    assert open(entry, "rb").read() == good  # the entry is whole again


def test_concurrent_writers_leave_one_whole_entry(tmp):
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(bundle_format.to_bytes(
        neuronx_cc_lite.compile(MODEL, cache_dir=tmp)))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (entry,) = _entries(tmp)
    assert len(set(results)) == 1 and open(entry, "rb").read() == results[0]
    assert not [f for f in os.listdir(os.path.dirname(entry)) if f.startswith(".")]  # no temporary left


def test_the_command_line_uses_the_cache_unless_told_not_to(tmp):
    cache, out = os.path.join(tmp, "cache"), os.path.join(tmp, "m.neff")
    assert main(["compile", MODEL, "-o", out, "--no-cache", "--cache-dir", cache]) == 0
    assert not os.path.exists(cache)
    assert main(["compile", MODEL, "-o", out, "--cache-dir", cache]) == 0
    assert len(_entries(cache)) == 1
    assert main(["check", MODEL, "--cache-dir", cache]) == 0  # the same options: check reads the same entry
    assert len(_entries(cache)) == 1


# ---- entries bound to their key, files that change, special files, the size limit (issue 21, issue 20) ----

def _scale_model(folder: str, factor: float, name: str = "m.onnx") -> str:
    """y = factor * x with the factor's 2048 copies in an external data file beside the model."""
    w = np.full((1, 2048), factor, np.float32)
    model = make_model([helper.make_node("Mul", ["x", "w"], ["y"])], {"x": ([1, 2048], TensorProto.FLOAT)},
                       {"y": ([1, 2048], TensorProto.FLOAT)}, {"w": w})
    path = os.path.join(folder, name)
    onnx.save(model, path, save_as_external_data=True, location=name + ".data", size_threshold=0)
    return path


def _y(bundle) -> float:  # type: ignore[no-untyped-def]
    out = runtime.load(bundle).run({"x": np.ones((1, 2048), np.float32)})["y"]
    assert (out == out.flat[0]).all()
    return float(out.flat[0])


def _entry_of(cache: str, bundle) -> str:  # type: ignore[no-untyped-def]
    data = bundle_format.to_bytes(bundle)
    (entry,) = [e for e in _entries(cache) if open(e, "rb").read() == data]
    return entry


@pytest.fixture
def settled(monkeypatch):  # type: ignore[no-untyped-def]
    """Files count as settled (their digests remembered, entries trusted unhashed) 50 ms after their last change
    instead of 2 s where the wall clock decides (the file system's clock usually does, within a tick);
    `settled()` waits that long."""
    monkeypatch.setattr(cache_module, "TRUST_AFTER", 0.05)
    return lambda: time.sleep(0.1)


@pytest.mark.parametrize("how", ["rename", "in place, mtime put back"])
def test_an_entry_replaced_by_another_valid_bundle_is_not_returned(tmp, settled, how):
    cache = os.path.join(tmp, "cache")
    two, five = _scale_model(tmp, 2.0, "two.onnx"), _scale_model(tmp, 5.0, "five.onnx")
    settled()
    entry_two = _entry_of(cache, neuronx_cc_lite.compile(two, cache_dir=cache))
    entry_five = _entry_of(cache, neuronx_cc_lite.compile(five, cache_dir=cache))
    settled()
    assert _y(neuronx_cc_lite.compile(two, cache_dir=cache)) == 2.0  # a hit (checked in full once settled)
    settled()
    if how == "rename":
        shutil.copy(entry_five, entry_two + ".tmp")
        os.replace(entry_two + ".tmp", entry_two)
    else:
        st = os.stat(entry_two)
        assert st.st_size == os.path.getsize(entry_five)
        with open(entry_two, "r+b") as f:
            f.write(open(entry_five, "rb").read())
        os.utime(entry_two, ns=(st.st_atime_ns, st.st_mtime_ns))
    settled()
    assert _y(neuronx_cc_lite.compile(two, cache_dir=cache)) == 2.0
    assert _y(neuronx_cc_lite.compile(five, cache_dir=cache)) == 5.0


def test_an_entry_moved_under_another_key_is_not_returned(tmp):
    cache = os.path.join(tmp, "cache")
    two, five = _scale_model(tmp, 2.0, "two.onnx"), _scale_model(tmp, 5.0, "five.onnx")
    entry_two = _entry_of(cache, neuronx_cc_lite.compile(two, cache_dir=cache))
    entry_five = _entry_of(cache, neuronx_cc_lite.compile(five, cache_dir=cache))
    for suffix in (".neff", ".key"):  # both files of five's entry, under two's key
        shutil.copy(entry_five[:-5] + suffix, entry_two[:-5] + suffix)
    assert _y(neuronx_cc_lite.compile(two, cache_dir=cache)) == 2.0


@pytest.mark.parametrize("change", ["rewritten in place, mtime put back", "replaced by rename", "symlink moved"])
def test_any_change_to_the_weights_file_misses(tmp, settled, change):
    cache = os.path.join(tmp, "cache")
    model = _scale_model(tmp, 2.0)
    data = model + ".data"
    if change == "symlink moved":  # the weights reached through a link in the model's folder
        os.rename(data, os.path.join(tmp, "two.bin"))
        os.symlink("two.bin", data)
        _scale_model(tmp, 7.0, "seven.onnx")
    settled()
    assert _y(neuronx_cc_lite.compile(model, cache_dir=cache)) == 2.0
    hashed: list[str] = []
    real_hash = cache_module._hash_file
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cache_module, "_hash_file", lambda path, *a: hashed.append(path) or real_hash(path, *a))
        assert _y(neuronx_cc_lite.compile(model, cache_dir=cache)) == 2.0
        assert hashed == []  # the digests came from their records: nothing of 8 KB was read again
    if change == "rewritten in place, mtime put back":
        st = os.stat(data)
        with open(data, "r+b") as f:
            f.write(np.full(2048, 3.0, np.float32).tobytes())
        os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(data).st_size == st.st_size
    elif change == "replaced by rename":
        with open(data + ".new", "wb") as f:
            f.write(np.full(2048, 3.0, np.float32).tobytes())
        os.replace(data + ".new", data)
    else:
        os.unlink(data)
        os.symlink("seven.onnx.data", data)
    expected = 7.0 if change == "symlink moved" else 3.0
    assert _y(neuronx_cc_lite.compile(model, cache_dir=cache)) == expected


@pytest.mark.parametrize("special", ["fifo", "device", "symlink to a device", "directory"])
@pytest.mark.parametrize("which", [".neff", ".key"])
def test_a_special_file_in_the_cache_is_refused_at_once(tmp, special, which):
    cache = os.path.join(tmp, "cache")
    model = _scale_model(tmp, 2.0)
    entry = _entry_of(cache, neuronx_cc_lite.compile(model, cache_dir=cache))
    path = entry[:-5] + which
    os.unlink(path)
    if special == "fifo":
        os.mkfifo(path)
    elif special == "device":
        os.symlink("/dev/zero", path)
    elif special == "symlink to a device":
        os.symlink("/dev/full", path)
    else:
        os.mkdir(path)
    done = threading.Event()
    result: list[float] = []
    worker = threading.Thread(target=lambda: (result.append(_y(neuronx_cc_lite.compile(model, cache_dir=cache))),
                                              done.set()), daemon=True)
    worker.start()
    assert done.wait(30), "the compile hung on a special file in its cache"
    assert result == [2.0]


def test_the_cache_keeps_to_its_size_dropping_the_least_recently_used(tmp):
    cache = os.path.join(tmp, "cache")
    models = [_scale_model(tmp, float(k), f"m{k}.onnx") for k in range(1, 5)]
    one = os.path.getsize(_entry_of(cache, neuronx_cc_lite.compile(models[0], cache_dir=cache)))
    limit = 2 * one + 2048  # two entries (a bundle and its .key each), not three

    def compile_(k: int) -> None:
        neuronx_cc_lite.compile(models[k], cache_dir=cache, cache_size=limit)
        time.sleep(0.05)  # a later use has a later mtime

    compile_(1)
    compile_(0)  # a hit: 0 is now more recent than 1
    compile_(2)  # over the limit: 1, the least recently used, goes
    names = {os.path.basename(e) for e in _entries(cache)}
    assert len(names) == 2
    kept = {_entry_of(cache, neuronx_cc_lite.compile(models[k], cache_dir=cache, cache_size=limit))
            for k in (0, 2)}
    assert {os.path.basename(e) for e in kept} == names
    assert sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs) <= limit
    # an entry larger than the whole limit is not kept, and the compile still succeeds
    assert _y(neuronx_cc_lite.compile(models[3], cache_dir=cache, cache_size=one // 2)) == 4.0


def test_a_hit_written_to_an_output_does_not_tie_the_output_to_the_entry(tmp, settled):
    cache, out = os.path.join(tmp, "cache"), os.path.join(tmp, "out.neff")
    two, five = _scale_model(tmp, 2.0, "two.onnx"), _scale_model(tmp, 5.0, "five.onnx")
    neuronx_cc_lite.compile(two, cache_dir=cache, output=out)
    settled()
    neuronx_cc_lite.compile(two, cache_dir=cache, output=out)  # the hit written to the output
    assert _y(out) == 2.0
    assert os.stat(out).st_ino != os.stat(_entry_of(cache, runtime.load(out).bundle)).st_ino  # a copy, not a link
    with open(out, "r+b") as f:  # a user's tool editing the output in place
        f.seek(os.path.getsize(out) // 2)
        f.write(b"\xff" * 64)
    assert _y(neuronx_cc_lite.compile(two, cache_dir=cache)) == 2.0  # the entry is checked, dropped and rebuilt
    neuronx_cc_lite.compile(five, cache_dir=cache, output=out)  # another model onto the same output
    assert _y(out) == 5.0 and _y(neuronx_cc_lite.compile(two, cache_dir=cache)) == 2.0


def test_stale_temporaries_in_the_cache_are_swept(tmp):
    cache = os.path.join(tmp, "cache")
    model = _scale_model(tmp, 2.0)
    entry = _entry_of(cache, neuronx_cc_lite.compile(model, cache_dir=cache))
    stale, young = (os.path.join(os.path.dirname(entry), f".neff-{name}") for name in ("abcd1234", "wxyz5678"))
    for path in (stale, young):
        with open(path, "wb") as f:
            f.write(b"half a bundle")
    os.utime(stale, (time.time() - 2 * 3600,) * 2)
    neuronx_cc_lite.compile(_scale_model(tmp, 3.0, "other.onnx"), cache_dir=cache)  # any store sweeps
    assert not os.path.exists(stale) and os.path.exists(young)


def test_the_size_limit_is_a_flag_and_a_variable(tmp, monkeypatch, capsys):
    cache = os.path.join(tmp, "cache")
    model = _scale_model(tmp, 2.0)
    assert main(["compile", model, "-o", os.path.join(tmp, "m.neff"), "--cache-dir", cache, "--cache-size", "1K"]) == 0
    assert _entries(cache) == []  # larger than 1 KiB: not kept
    with pytest.raises(SystemExit) as exit_:
        main(["compile", model, "-o", os.path.join(tmp, "m.neff"), "--cache-size", "lots"])
    assert exit_.value.code == 2 and "NCC_USAGE" in capsys.readouterr().err
    monkeypatch.setenv("NEURONX_CC_LITE_CACHE_SIZE", "1M")
    assert cache_module.default_size() == 1 << 20
    assert [cache_module.parse_size(t) for t in ("4096", "500M", "4G", "1.5GiB")] == [
        4096, 500 << 20, 4 << 30, 3 << 29]


# ---- a hit on the command line: what it loads, what it writes, how the key of large weights is had (issue 20) ----

_HEAVY = ("numpy", "onnx", "ml_dtypes", "onnxruntime", "neuronx_cc_lite.compiler", "isa.bundle", "isa.codec",
          "runtime")


def test_a_command_line_hit_loads_no_compiler_and_writes_the_entry_s_bytes(tmp, settled, capsys):
    """A hit decodes nothing and loads neither the compiler, onnx, numpy nor ml_dtypes (a child process, so that
    this test's own imports do not count): it copies the entry, byte for byte, into a file of its own, and reports
    the bundle as the miss did (from the entry's .key)."""
    import subprocess
    import sys

    cache, first, again = (os.path.join(tmp, name) for name in ("cache", "first.neff", "again.neff"))
    model = _scale_model(tmp, 2.0)
    settled()  # the model and its weights are old enough for their digests to be remembered
    assert main(["compile", model, "-o", first, "--cache-dir", cache]) == 0  # the miss
    (entry,) = _entries(cache)
    report = re.search(r" s: \d+ instructions .*\n", capsys.readouterr().err).group()  # type: ignore[union-attr]
    code = ("import sys\nfrom neuronx_cc_lite.cli import main\nstatus = main(sys.argv[1:])\n"
            f"print('status', status, 'loaded', sorted(m for m in {_HEAVY!r} if m in sys.modules))")
    for _ in range(2):  # the entry checked in full (just written), then trusted by its identity
        result = subprocess.run([sys.executable, "-c", code, "compile", model, "-o", again, "--cache-dir", cache],
                                capture_output=True, text=True, timeout=120)
        assert "status 0 loaded []" in result.stdout, result.stdout + result.stderr
        assert f"-> {again} for trn1 in " in result.stderr and result.stderr.endswith(report), result.stderr
        settled()
    with open(first, "rb") as f, open(again, "rb") as g, open(entry, "rb") as e:
        assert f.read() == g.read() == e.read()
    assert _entries(cache) == [entry] and os.stat(again).st_ino != os.stat(entry).st_ino
    assert _y(again) == 2.0


def _frozen_clock(monkeypatch, folder: str) -> None:  # type: ignore[no-untyped-def]
    """The file system's clock, as the cache reads it, stands still before every file in `folder`'s file system:
    nothing settles (a file system whose clock ticks in seconds, caught within one tick)."""
    device = os.stat(folder).st_dev
    monkeypatch.setattr(cache_module, "_fs_clock", lambda _: (device, 0))


def test_a_weights_file_that_has_not_settled_is_hashed_at_every_compile(tmp, monkeypatch):
    """The key of large weights: a file's digest is remembered against its identity only once the file system's
    clock has moved past the file's last change, so a write in the same tick as the hashing cannot keep a stale
    digest; once it has, the digest comes from the record, and touching the file (same bytes) hashes it again and
    still hits."""
    cache = os.path.join(tmp, "cache")
    model = _scale_model(tmp, 2.0)
    hashed: list[str] = []
    real_hash, real_clock = cache_module._hash_file, cache_module._fs_clock
    monkeypatch.setattr(cache_module, "_hash_file", lambda path, *a: hashed.append(path) or real_hash(path, *a))
    _frozen_clock(monkeypatch, tmp)
    for _ in range(2):
        assert _y(neuronx_cc_lite.compile(model, cache_dir=cache)) == 2.0
    assert hashed.count(model + ".data") == 2 and not os.path.exists(os.path.join(cache, "files"))
    monkeypatch.setattr(cache_module, "_fs_clock", real_clock)
    neuronx_cc_lite.compile(model, cache_dir=cache)  # now remembered
    hashed.clear()
    neuronx_cc_lite.compile(model, cache_dir=cache)
    assert hashed == []
    os.utime(model + ".data")  # the same bytes, a new mtime and ctime
    assert _y(neuronx_cc_lite.compile(model, cache_dir=cache)) == 2.0
    assert hashed == [model, model + ".data"] and len(_entries(cache)) == 1


def _rescaled(data: bytes, old: float, new: float) -> bytes:
    """A bundle file's bytes with its one immediate `old` (a float64 in the stream) made `new`, its archive's CRCs
    mended, its header kept: a bundle that decodes and computes y = new * x, which only a hash of its payload tells
    from the original."""
    import struct
    import zipfile
    import zlib

    header = bundle_format.HEADER_SIZE
    at = data.index(np.float64(old).tobytes())
    assert data.count(np.float64(old).tobytes()) == 1
    edited = bytearray(data)
    edited[at:at + 8] = np.float64(new).tobytes()
    archive = zipfile.ZipFile(io.BytesIO(bytes(edited[header:])))
    info = max((i for i in archive.infolist() if header + i.header_offset < at), key=lambda i: i.header_offset)
    local = header + info.header_offset
    body = local + 30 + int.from_bytes(edited[local + 26:local + 28], "little") + int.from_bytes(
        edited[local + 28:local + 30], "little")
    crc = struct.pack("<I", zlib.crc32(edited[body:body + info.file_size]))
    edited[local + 14:local + 18] = crc
    central = header + archive.start_dir
    while edited[central:central + 4] == b"PK\x01\x02":  # the central directory's entry for the member
        if int.from_bytes(edited[central + 42:central + 46], "little") == info.header_offset:
            edited[central + 16:central + 20] = crc
        central += 46 + sum(int.from_bytes(edited[central + o:central + o + 2], "little") for o in (28, 30, 32))
    return bytes(edited)


def _payload_checks(monkeypatch) -> list[bool]:  # type: ignore[no-untyped-def]
    """For each entry read from now on, whether its payload was hashed in full."""
    checks: list[bool] = []
    real = cache_module._check_payload
    monkeypatch.setattr(cache_module, "_check_payload",
                        lambda f, size, sha256, in_full: checks.append(in_full) or real(f, size, sha256, in_full))
    return checks


def test_the_first_hit_right_after_the_store_hashes_nothing(tmp, monkeypatch):
    """The writer hashed the bundle as it wrote it and waited for the file system's clock to pass the file's last
    change: the first hit, straight after the miss, trusts the entry's identity as later ones do (issue 20)."""
    cache, out = os.path.join(tmp, "cache"), os.path.join(tmp, "m.neff")
    model = _scale_model(tmp, 2.0)
    time.sleep(0.05)  # the model a little older than one tick of the clock, as a user's is
    checks = _payload_checks(monkeypatch)
    assert main(["compile", model, "-o", out, "--cache-dir", cache, "-q"]) == 0  # the miss
    (entry,) = _entries(cache)
    hashed: list[str] = []
    real_hash = cache_module._hash_file
    monkeypatch.setattr(cache_module, "_hash_file", lambda path, *a: hashed.append(path) or real_hash(path, *a))
    os.unlink(out)
    assert main(["compile", model, "-o", out, "--cache-dir", cache, "-q"]) == 0  # the first hit
    assert checks == [False] and hashed == []  # neither the entry's payload nor the weights read to be hashed
    assert open(out, "rb").read() == open(entry, "rb").read() and _entries(cache) == [entry]
    assert not [f for _, _, fs in os.walk(cache) for f in fs if f.startswith(".")]  # no clock probe left behind


@pytest.mark.parametrize("clock", ["ticking", "frozen"])
@pytest.mark.parametrize("how", ["payload edited in place, mtime put back", "another bundle renamed onto it"])
def test_an_entry_changed_right_after_its_store_is_not_returned(tmp, monkeypatch, clock, how):
    """Changed in the same second as its store, an entry still misses: the store waited for the file system's
    clock, so an edit that keeps the header has a later ctime and the payload is hashed in full (another bundle
    fails the header's check at once). Where the clock does not move within SETTLE_WAIT (a file system that keeps
    seconds), the entry is stored untrusted: every hit hashes it in full until it has settled."""
    cache = os.path.join(tmp, "cache")
    two, five = _scale_model(tmp, 2.0, "two.onnx"), _scale_model(tmp, 5.0, "five.onnx")
    entry_five = _entry_of(cache, neuronx_cc_lite.compile(five, cache_dir=cache))
    checks = _payload_checks(monkeypatch)
    if clock == "frozen":
        _frozen_clock(monkeypatch, tmp)
        monkeypatch.setattr(cache_module, "SETTLE_WAIT", 0.2)  # the longest wait for the clock
    entry_two = _entry_of(cache, neuronx_cc_lite.compile(two, cache_dir=cache))
    stored = os.stat(entry_two)
    if how == "another bundle renamed onto it":
        shutil.copy(entry_five, entry_two + ".tmp")
        os.replace(entry_two + ".tmp", entry_two)
    else:  # a valid bundle computing 5x under the header (and hash) of the one computing 2x
        with open(entry_two, "r+b") as f:
            f.write(_rescaled(open(entry_two, "rb").read(), 2.0, 5.0))
        os.utime(entry_two, ns=(stored.st_atime_ns, stored.st_mtime_ns))
        assert os.stat(entry_two).st_size == stored.st_size
    assert os.stat(entry_two).st_ctime_ns - stored.st_ctime_ns < 1e9  # within the same second
    assert _y(neuronx_cc_lite.compile(two, cache_dir=cache)) == 2.0  # rebuilt, not the changed entry
    if how != "another bundle renamed onto it":
        assert checks == [True]  # the changed identity was seen: the payload hashed in full, found wrong
    assert _y(neuronx_cc_lite.compile(five, cache_dir=cache)) == 5.0


def test_an_entry_stored_while_the_clock_stands_still_is_hashed_until_it_settles(tmp, monkeypatch):
    cache = os.path.join(tmp, "cache")
    model = _scale_model(tmp, 2.0)
    checks = _payload_checks(monkeypatch)
    real_clock = cache_module._fs_clock
    _frozen_clock(monkeypatch, tmp)
    start = time.monotonic()
    neuronx_cc_lite.compile(model, cache_dir=cache)
    assert time.monotonic() - start < 30  # the store waited for the clock SETTLE_WAIT (1 s), no longer
    for _ in range(2):
        assert _y(neuronx_cc_lite.compile(model, cache_dir=cache)) == 2.0
    assert checks == [True, True]
    monkeypatch.setattr(cache_module, "_fs_clock", real_clock)  # the clock moves on: checked once more, then trusted
    for _ in range(2):
        assert _y(neuronx_cc_lite.compile(model, cache_dir=cache)) == 2.0
    assert checks == [True, True, True, False]


def test_a_copy_falls_back_to_reads_and_writes_where_the_kernel_cannot_copy(tmp, monkeypatch):
    import errno

    from isa.files import copy_file

    data = os.urandom(3 << 20)
    with open(os.path.join(tmp, "src"), "wb") as f:
        f.write(data)

    def refused(*args):  # type: ignore[no-untyped-def]
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    for kernel in (os.copy_file_range, refused):
        monkeypatch.setattr(os, "copy_file_range", kernel)
        with open(os.path.join(tmp, "src"), "rb") as src, open(os.path.join(tmp, "dst"), "wb") as dst:
            copy_file(src, dst, len(data))
        assert open(os.path.join(tmp, "dst"), "rb").read() == data
    with open(os.path.join(tmp, "src"), "rb") as src, open(os.path.join(tmp, "dst"), "wb") as dst:
        with pytest.raises(OSError, match="ended while it was copied"):
            copy_file(src, dst, len(data) + 1)
