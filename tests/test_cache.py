"""The compile cache: a second compile of the same model and options is a hit (the same bytes, at least 10x
faster), other options or another model miss, a broken entry is rebuilt, concurrent writers leave one whole
entry, and --no-cache neither reads nor writes."""

from __future__ import annotations

import glob
import os
import threading
import time

import pytest

import neuronx_cc_lite
from isa import bundle as bundle_format
from neuronx_cc_lite.cli import main

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
    assert not [f for f in os.listdir(os.path.dirname(entry)) if not f.endswith(".neff")]  # no temporary left


def test_the_command_line_uses_the_cache_unless_told_not_to(tmp):
    cache, out = os.path.join(tmp, "cache"), os.path.join(tmp, "m.neff")
    assert main(["compile", MODEL, "-o", out, "--no-cache", "--cache-dir", cache]) == 0
    assert not os.path.exists(cache)
    assert main(["compile", MODEL, "-o", out, "--cache-dir", cache]) == 0
    assert len(_entries(cache)) == 1
    assert main(["check", MODEL, "--cache-dir", cache]) == 0  # the same options: check reads the same entry
    assert len(_entries(cache)) == 1
