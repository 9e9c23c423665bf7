"""A convolution whose stride is its kernel (a ViT's patch embedding), which canonicalize makes a PatchEmbedding
(lower/patches.py): the contraction over (channel, kernel row) with the image's rows loaded whole, compared with
onnxruntime, and free of DMA pieces under 512 bytes where the image's rows are that long."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from neuronx_cc_lite.compiler import Options, compile_model, prepare
from neuronx_cc_lite.reference import onnxruntime_outputs, seeded_inputs
from runtime.profile import small_pieces_by_node
from tests.compiler.one_node import bf16_operands, check, rng_weights
from tests.conftest import assert_close, compile_to_model, make_model


def vit_embedding(n: int, c: int, spatial: list[int], m: int, kernel: list[int], bias: bool = True
                  ) -> onnx.ModelProto:
    """The patch embedding as a ViT has it: Conv with stride = kernel, then its grid flattened and transposed to a
    token per patch, [n, patches, m]."""
    weights = rng_weights(0, w=(m, c, *kernel), b=(m,))
    if not bias:
        del weights["b"]
    weights["tokens"] = np.array([n, m, -1], np.int64)
    patches = (spatial[0] // kernel[0]) * (spatial[1] // kernel[1])
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["grid"], strides=kernel),
             helper.make_node("Reshape", ["grid", "tokens"], ["flat"]),
             helper.make_node("Transpose", ["flat"], ["y"], perm=[0, 2, 1])]
    return make_model(nodes, {"x": ([n, c, *spatial], TensorProto.FLOAT)}, {"y": ([n, patches, m], TensorProto.FLOAT)},
                      weights)


CASES = {
    # ViT-Base's: 3 channels x 16 kernel rows on 48 partitions, 196 patches in blocks of 9 and 5 patch rows
    "vit-224": dict(n=1, c=3, spatial=[224, 224], m=96, kernel=[16, 16]),
    "batch2-no-bias": dict(n=2, c=3, spatial=[32, 128], m=128, kernel=[8, 8], bias=False),
    "oblong-kernel": dict(n=1, c=4, spatial=[24, 128], m=12, kernel=[4, 16]),
    # 16 channels x 12 rows: K tiles of 128 and 64 partitions, the second starting inside channel 10
    "two-k-tiles": dict(n=1, c=16, spatial=[24, 132], m=24, kernel=[12, 12]),
    # 130 patches a row (more than PE's 128 columns) and 600 features (two PSUM banks)
    "wide-rows-two-banks": dict(n=1, c=1, spatial=[4, 260], m=600, kernel=[2, 2]),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_patch_embedding_matches(tmp, case):
    model = vit_embedding(**case)
    assert "PatchEmbedding" in [n.op for n in prepare(model, Options()).nodes]
    assert small_pieces_by_node(compile_model(model)) == {}
    check(model, tmp, rtol=1e-5)


def test_patches_of_short_rows_match(tmp):
    """Rows of 16 fp32 (64 bytes) are as long as a load can take them; the answer still matches."""
    check(vit_embedding(n=1, c=3, spatial=[16, 16], m=8, kernel=[4, 4]), tmp, rtol=1e-5)


def test_patch_embedding_in_bf16_matches(tmp):
    """Under --auto-cast matmult the windows and weights load as bf16 (the DMA casts) and PE sums in fp32: as the
    convolution of the rounded operands, the bias added exactly."""
    model = vit_embedding(n=1, c=3, spatial=[64, 128], m=40, kernel=[16, 16])
    compiled = compile_to_model(model, tmp, Options(auto_cast="matmult", auto_cast_type="bf16"))
    inputs = seeded_inputs(compiled.inputs, 0)
    assert_close(compiled.run(inputs), onnxruntime_outputs(bf16_operands(model), inputs), rtol=1e-4)
