"""Auto-cast: computing in a narrower float type than the model's fp32, as neuronx-cc's --auto-cast does.

    --auto-cast none      every value keeps its type (the default here; neuronx-cc defaults to matmult)
    --auto-cast matmult   the operands of matrix multiplications (MatMul, Gemm, Conv) are cast to the auto-cast
                          type as they are loaded into SBUF; PSUM still accumulates in fp32 and results stay fp32
    --auto-cast all       additionally every fp32 tensor inside the model (weights and intermediate results,
                          not the model's inputs and outputs) is held in the auto-cast type; the engines still
                          compute in fp32 and round when they write
    --auto-cast-type      bf16 (default), fp16, fp8_e4m3, fp8_e5m2

The error each setting is expected to meet is given as the largest element error over the root-mean-square of
the reference output: |ours - reference| <= bound * rms(reference) for every element. Rounding an operand to a
type with p mantissa bits has a relative error of at most u = 2**-(p+1) (bf16: 2**-8, fp16: 2**-11,
fp8_e4m3: 2**-4, fp8_e5m2: 2**-3); a dot product of rounded operands accumulated in fp32 then has an error of
about 2u times the root-sum-square of its terms, which is the output's own scale, and a network of a few layers
compounds that by a small factor. The bounds below allow for the largest element of an output (a few RMS), the
layers of the bundled models, and ScalarE's fp32 functions, with margin: tests/compiler/test_autocast.py checks
every bundled model against them, except the quantized ones: quantization turns any perturbation of a value near a
rounding tie into a whole step, which no bound in units of the roundoff covers (the README's quantized models).

Constants that auto-cast narrows saturate to the narrow type's largest finite value (a mask written as float32's
lowest value stays the lowest value). Values the engines compute and write into a narrow type do not: they
round as IEEE/OCP conversion does, so with `all` and an fp8 type a model that computes magnitudes beyond the
type's range (fp8_e4m3: 448; an attention mask scaled by -10000) gets NaN. Use bf16 or fp16 for such models.
"""

from __future__ import annotations

MODES = ("none", "matmult", "all")
# The auto-cast types, named as isa.dtypes.DType names them (DType[name] is the type). Names only: the command line
# builds its parser from them, and importing the types' module (ml_dtypes) would cost it a second.
TYPES = ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2")
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp8_e4m3": 2.0**-4, "fp8_e5m2": 2.0**-3}

# bound = factor * u: the factor covers 2u per dot product, the largest element of a tensor, and a few layers.
# Measured on the bundled models (worst output, in units of u): matmult 8.2 (cnn_ops: three convolutions in a
# row), all 13.8; the factors keep twice that as margin.
_FACTOR = {"matmult": 16.0, "all": 32.0}


def error_bound(mode: str, cast_type: str) -> float | None:
    """The documented bound on max |error| / rms(reference), or None when nothing is cast (fp32: the caller's
    rtol/atol apply)."""
    if mode == "none":
        return None
    return _FACTOR[mode] * UNIT_ROUNDOFF[cast_type]


# A mismatch under auto-cast within this factor of the cast's own error (onnxruntime with what auto-cast narrows
# rounded: reference.cast_only_model) is the model's, not the compiler's
CAST_OWN_FACTOR = 2.0


def the_casts_own(error: float, cast_error: float, bound: float) -> bool:
    """Whether an error over the documented bound is about the cast's own: the cast alone misses the bound too, and
    the compiled model is within CAST_OWN_FACTOR of it (`check`'s note; benchmarks/architectures.py's verdict)."""
    return cast_error > bound and error <= CAST_OWN_FACTOR * cast_error
