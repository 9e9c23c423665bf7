"""`neuronx-cc-lite generate` as the issue's interface gives it: the ids on stdout, the JSON keys, coded errors."""

from __future__ import annotations

import json
import os

import onnx
import pytest

from neuronx_cc_lite.cli import main
from tests.conftest import MODELS_DIR
from tests.generate.test_static_cache import onnxruntime_greedy, static_decoder


@pytest.fixture()
def decoder(tmp):
    path = os.path.join(tmp, "static.onnx")
    onnx.save(static_decoder(), path)
    return path


def test_generate_prints_the_ids_and_writes_the_json(decoder, tmp, capsys):
    out = os.path.join(tmp, "out.json")
    assert main(["generate", decoder, "--prompt-ids", "7,3,30,11", "--max-new-tokens", "5", "--target", "inf2",
                 "--json", out]) == 0
    want = onnxruntime_greedy(static_decoder(), [7, 3, 30, 11], 5)
    assert capsys.readouterr().out.split() == [str(t) for t in want]
    with open(out) as f:
        report = json.load(f)
    assert report["tokens"] == want
    assert {"ttft_us", "tpot_us", "tokens_per_s", "host_device_bytes_per_step"} <= set(report)
    assert report["host_device_bytes_per_step"] == 4 + 48 * 4 and report["tpot_us"] > 0


@pytest.mark.parametrize("args, code, status", [
    (["--tp", "2"], "NCC_OPTION", 1),
    (["--max-length", "32"], "NCC_GENERATE", 1),
    (["--prompt-ids", "1,99"], "NCC_USAGE", 2),  # past the vocabulary of 48
    (["--max-new-tokens", "30"], "NCC_USAGE", 2),  # more than the cache holds
])
def test_requests_it_cannot_meet_are_one_coded_line(decoder, tmp, capsys, args, code, status):
    out = os.path.join(tmp, "out.json")
    base = {"--prompt-ids": "1,2", "--max-new-tokens": "3"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["generate", decoder, *[x for kv in base.items() for x in kv], "--json", out]
    assert main(argv) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"error: {code}:" in err[0]
    assert not os.path.exists(out)


def test_a_model_without_a_cache_is_named(tmp, capsys):
    assert main(["generate", os.path.join(MODELS_DIR, "mlp_small.onnx"), "--prompt-ids", "1",
                 "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "NCC_GENERATE" in err and "mlp_small.onnx" in err and "no input_ids input" in err
