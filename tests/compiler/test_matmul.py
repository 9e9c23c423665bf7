"""MatMul and Gemm for every M, K, N in {1, 7, 128, 129, 300, 513, 1024}: compile, run on the simulated chip,
compare with onnxruntime at rtol 1e-4 (see assert_close for the absolute floor near zero)."""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import assert_close, gemm_model, run_both

SIZES = (1, 7, 128, 129, 300, 513, 1024)


@pytest.mark.parametrize("m, k, n", list(itertools.product(SIZES, SIZES, SIZES)))
def test_matmul(tmp, m, k, n):
    ours, ref = run_both(gemm_model(m, k, n, op="MatMul", seed=m + k + n), tmp)
    assert_close(ours, ref, rtol=1e-4)


@pytest.mark.parametrize("m, k, n", list(itertools.product(SIZES, SIZES, SIZES)))
def test_gemm(tmp, m, k, n):
    """Gemm as torch exports nn.Linear (transB, bias); alpha and beta on a third of the cases."""
    extra = {"alpha": 0.5, "beta": 2.0} if (m + k + n) % 3 == 0 else {}
    ours, ref = run_both(gemm_model(m, k, n, trans_b=(k + n) % 2 == 0, seed=m * k + n, **extra), tmp)
    assert_close(ours, ref, rtol=1e-4)


@pytest.mark.parametrize("k", [7000, 8320])
def test_matmul_whose_weight_groups_are_narrower_than_a_bank(tmp, k):
    """A long K narrows B's column groups below a PSUM bank (256 columns at 55-96 fp32 K tiles): every column
    of each bank-wide block is computed, not only its first group's (they read as NaN)."""
    ours, ref = run_both(gemm_model(2, k, 1024, op="MatMul", bias=False), tmp)
    assert_close(ours, ref, rtol=1e-4)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("bias_shape", [None, (1,), (300,), (7, 1), (7, 300)])
def test_gemm_attributes(tmp, trans_a, bias_shape):
    import numpy as np
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    rng = np.random.default_rng(1)
    weights = {"w": rng.standard_normal((129, 300)).astype(np.float32)}
    inputs = ["x", "w"]
    if bias_shape:
        weights["c"] = rng.standard_normal(bias_shape).astype(np.float32)
        inputs.append("c")
    x_shape = [129, 7] if trans_a else [7, 129]
    model = make_model([helper.make_node("Gemm", inputs, ["y"], transA=trans_a, alpha=1.5, beta=0.25)],
                       {"x": (x_shape, TensorProto.FLOAT)}, {"y": ([7, 300], TensorProto.FLOAT)}, weights)
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)


def test_matmul_of_vectors(tmp):
    import numpy as np
    from onnx import TensorProto, helper

    from tests.conftest import make_model

    w = np.random.default_rng(2).standard_normal((300, 129)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ([300], TensorProto.FLOAT)},
                       {"y": ([129], TensorProto.FLOAT)}, {"w": w})
    ours, ref = run_both(model, tmp)
    assert_close(ours, ref, rtol=1e-4)
