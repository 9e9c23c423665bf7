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


@pytest.mark.parametrize("cast", ["fp32", "bf16"])
def test_a_classifier_takes_its_weights_stationary(tmp, cast):
    """Logits of one row, [1, 1024] x [1024, 1000] with a bias and Relu, the graph's output (a CNN's classifier):
    the weights stationary, 128 of their columns at a time, PE streams the row (8 K tiles x 8 blocks of one
    column: 64 cycles each, where the row stationary streams 1,000 columns for each K tile); the eight blocks share
    a bank, evacuated by one instruction. numpy's result, the operands rounded as auto-cast rounds them in bf16."""
    import numpy as np
    from onnx import TensorProto, helper

    from isa.operand import Mem
    from neuronx_cc_lite.compiler import Options, compile_model
    from tests.conftest import make_model

    rng = np.random.default_rng(2)
    weights = {"w": rng.standard_normal((1000, 1024)).astype(np.float32) / 32,
               "b": rng.standard_normal(1000).astype(np.float32)}
    model = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),
                        helper.make_node("Relu", ["g"], ["y"])],
                       {"x": ([1, 1024], TensorProto.FLOAT)}, {"y": ([1, 1000], TensorProto.FLOAT)}, weights)
    options = Options(auto_cast="matmult", auto_cast_type="bf16") if cast == "bf16" else Options()
    core = compile_model(model, options).cores[0]
    pe = [(i.args["stationary"].free_size, i.args["moving"].free_size) for i in core["PE"].instructions
          if i.op == "nc_matmul"]
    assert len(pe) == 8 * 8 and set(pe) == {(128, 1), (104, 1)}
    evacuations = [i for e in ("ACT", "DVE", "POOL") if e in core for i in core[e].instructions
                   if i.op in ("activation", "scalar_tensor_tensor") and any(o.mem is Mem.PSUM for _, o in
                                                                              i.operands())]  # (not A^T's copy)
    assert len(evacuations) == 1
    import ml_dtypes

    from neuronx_cc_lite.reference import seeded_inputs
    from tests.conftest import compile_to_model

    compiled = compile_to_model(model, tmp, options)
    inputs = seeded_inputs(compiled.inputs)
    x, w = inputs["x"], weights["w"]
    if cast == "bf16":  # the operands as auto-cast rounds them; the products summed in fp32 on PE
        x, w = (v.astype(ml_dtypes.bfloat16).astype(np.float32) for v in (x, w))
    reference = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + weights["b"], 0).astype(np.float32)
    assert_close(compiled.run(inputs), {"y": reference}, rtol=1e-4)


@pytest.mark.parametrize("reader, evacuations", [("HardSwish", 1), ("Relu", 8)])
def test_a_hidden_layer_of_one_row_shares_a_bank_unless_a_matmul_reads_it(tmp, reader, evacuations):
    """[1, 512] @ [512, 1024], laid out feature-major (the next matmul contracts over its 1,024 features: 8 blocks
    of 128), in bf16: PE makes a block (4 matmuls of one column) faster than ScalarE evacuates one, so the blocks
    share a bank and one instruction evacuates them where the epilogue is more than one instruction (a HardSwish
    fused into the product: its relu and product once for all blocks too); with one (a fused Relu), each block
    is evacuated as the next is computed, and the next layer starts on the first. The result is exact to bf16
    operands: each product's inputs rounded to bf16, the hidden layer's activation applied in fp32 before its
    rounding."""
    import ml_dtypes
    import numpy as np
    from onnx import TensorProto, helper

    from isa.operand import Mem
    from neuronx_cc_lite.compiler import Options, compile_model
    from tests.conftest import compile_to_model, make_model

    rng = np.random.default_rng(4)
    weights = {"w1": rng.standard_normal((512, 1024)).astype(np.float32) / 16,
               "w2": rng.standard_normal((1024, 64)).astype(np.float32) / 32}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node(reader, ["h"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"])]
    model = make_model(nodes, {"x": ([1, 512], TensorProto.FLOAT)}, {"y": ([1, 64], TensorProto.FLOAT)}, weights)
    options = Options(auto_cast="matmult", auto_cast_type="bf16")
    core = compile_model(model, options).cores[0]
    found = [i for e in ("ACT", "DVE", "POOL") if e in core for i in core[e].instructions
             if i.op in ("activation", "tensor_scalar", "scalar_tensor_tensor") and
             i.args["dst"].num_partitions == 128 and any(o.mem is Mem.PSUM for _, o in i.operands())]
    assert len(found) == evacuations
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    ours = compile_to_model(model, tmp, options).run({"x": x})

    def bf16(a: np.ndarray) -> np.ndarray:
        return a.astype(ml_dtypes.bfloat16).astype(np.float64)

    h = bf16(x) @ bf16(weights["w1"])
    a = h * np.clip(h / 6 + 0.5, 0, 1) if reader == "HardSwish" else np.maximum(h, 0)
    assert_close(ours, {"y": (bf16(a) @ bf16(weights["w2"])).astype(np.float32)}, rtol=1e-5)
