"""Every architecture of benchmarks/architectures.py (transformers' text encoders, decoders, vision and speech
models at a small size) exports from both of torch.onnx.export's exporters, compiles, and matches onnxruntime in
fp32 and under --auto-cast matmult (slow tier: each exports its model, a few seconds apiece)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from benchmarks.architectures import SMALL, check  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("name", list(SMALL))
def test_an_exported_architecture_matches_onnxruntime(name, exporter):
    for cast in ("fp32", "bf16"):
        row = check(name, exporter, cast)
        assert row["ok"], row
        assert row["values"] > 1e-3, row  # outputs of a working network, not the zeros of a dead one
