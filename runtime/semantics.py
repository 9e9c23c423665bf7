"""What each instruction does, in numpy: one handler per mnemonic of the instruction table.

A handler gets the decoded instruction and numpy views on its operands (made once, at load) and returns an
`Issue` function. The simulator calls `issue()` when the instruction starts: it reads its inputs then and returns
a `Commit` that writes the results when the instruction completes. Reading at the start and writing at the end is
what lets an unsynchronised reader see stale data, as on the chip.

Engines compute in fp32 and cast on write: floats round to nearest even (ml_dtypes), integers round to nearest
even and saturate, NaN becomes 0. A bit-vector operator (bitwise and/or/xor, shifts) reads an integer tile's bits
instead, all 32 of an int32 (VectorE's bitwise operators take integer types), and its result wraps to the
destination's width.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from isa.functions import BITVEC_OPS, ActFunc, AluOp
from isa.instructions import Instruction
from runtime.errors import AccessError

Commit = Callable[[], None]
Issue = Callable[[], Commit]
Views = dict[str, Any]  # field name -> np.ndarray view for operands, the plain value otherwise

F32 = np.float32


# ---- reading and writing operands --------------------------------------------------------------------------------


def _flat(view: np.ndarray) -> np.ndarray | None:
    """`view` as (partitions, elements per partition) without copying, or None when its strides forbid it."""
    flat = view.view()
    try:
        flat.shape = (view.shape[0], -1)
    except AttributeError:
        return None
    return flat


def snapshot(view: np.ndarray, dtype: Any = None) -> Callable[[], np.ndarray]:
    """A function returning a fresh (partitions, n) copy of what `view` holds, cast to `dtype` if given."""
    flat = _flat(view)
    dtype = view.dtype if dtype is None else dtype
    if flat is not None:
        return lambda: flat.astype(dtype)
    return lambda: view.reshape(view.shape[0], -1).astype(dtype)


def read_f32(view: np.ndarray) -> Callable[[], np.ndarray]:
    return snapshot(view, F32)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.kind == "V" or "float" in dtype.name  # ml_dtypes' types are kind "V"


def convert(values: np.ndarray, dtype: np.dtype, wrap: bool = False) -> np.ndarray:
    """Cast as the engines do on write. With `wrap`, integers are bit patterns (the results of bit-vector
    operators) and wrap to the destination width; otherwise values round and saturate."""
    if values.dtype == dtype:
        return values
    if wrap and dtype.kind in "iu":
        return values.astype(np.int64).astype(dtype)
    if _is_float(dtype):
        return values.astype(dtype)
    info = np.iinfo(dtype)
    if values.dtype.kind == "f" or "float" in values.dtype.name:
        wide = np.rint(np.nan_to_num(values.astype(np.float64), nan=0.0))
    else:
        wide = values.astype(np.int64)
    return np.clip(wide, info.min, info.max).astype(dtype)


def write_to(view: np.ndarray, wrap: bool = False) -> Callable[[np.ndarray], None]:
    """A function that stores (partitions, n) values into `view`, casting to its dtype (see `convert`)."""
    flat = _flat(view)
    target, shape = (view, view.shape) if flat is None else (flat, None)
    cast_on_copy = _is_float(view.dtype)  # assignment casts to a float type as astype does, without a temporary

    def store(values: np.ndarray) -> None:
        if not cast_on_copy:
            values = convert(values, view.dtype, wrap)
        target[...] = values if shape is None else values.reshape(shape)

    return store


def _scalar(value: Any) -> Callable[[], Any]:
    """A tensor_scalar/activation scalar: an fp32 immediate, or a [P, 1] operand read at issue."""
    if isinstance(value, np.ndarray):
        return snapshot(value, F32)
    constant = F32(value)
    return lambda: constant


# ---- the functions and operators -------------------------------------------------------------------------------


_ERF_SERIES_BELOW = 2.5  # erf's Taylor series below, its Abramowitz-Stegun complement from here on
_ERF_SERIES_TERMS = 60  # enough for double precision at 2.5
_ERF_SERIES = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(36)]  # the rest: below 2^-47 at 2.5
_ERF_UNSURE = 2.0 ** -40  # relative; the nested sum is within 2^-45 of the term-by-term one (both round in float64)
_ERF_BLOCK = 16384  # values nested at a time: float64 blocks that stay in the cache through the 35 passes


def _erf_series_terms(small: np.ndarray) -> np.ndarray:
    """erf by its Taylor series, term by term as the definition of the semantics has it."""
    term = small.copy()
    total = small.copy()
    sq = small * small
    for n in range(1, _ERF_SERIES_TERMS):
        term = term * -sq / n
        total += term / (2 * n + 1)
    return total * (2 / math.sqrt(math.pi))


def _erf_series(small: np.ndarray) -> np.ndarray:
    """`_erf_series_terms` to the same fp32 bits, several times faster: the series nested (Horner), then summed
    term by term where the two could round to different fp32 values (a few values in ten thousand)."""
    sq = (small * small).reshape(-1)
    total = np.full_like(sq, _ERF_SERIES[-1])
    for start in range(0, total.size, _ERF_BLOCK):
        block, block_sq = total[start:start + _ERF_BLOCK], sq[start:start + _ERF_BLOCK]
        for c in reversed(_ERF_SERIES[:-1]):
            block *= block_sq
            block += c
    total = total.reshape(small.shape)
    total *= small * (2 / math.sqrt(math.pi))
    unsure = (total * (1 - _ERF_UNSURE)).astype(F32) != (total * (1 + _ERF_UNSURE)).astype(F32)  # NaN too
    if unsure.any():
        total[unsure] = _erf_series_terms(small[unsure])
    return total


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64: the Taylor series below 2.5 (converges to double precision in 60 terms), the
    Abramowitz-Stegun 7.1.26 complement above, where erf is within 4e-4 of 1 and its error of 1.5e-7 is below
    fp32 resolution of the result."""
    x64 = x.astype(np.float64)
    a = np.abs(x64)
    magnitude = _erf_series(np.minimum(a, _ERF_SERIES_BELOW))
    far = ~(a < _ERF_SERIES_BELOW)  # NaN too
    if far.any():
        # The sign a NaN comes out with depends on where numpy's vector loops put it, so with one the complement
        # is worked out over the whole tile, as the definition has it; other values come out alike on a part.
        magnitude[far] = _erf_complement(a)[far] if np.isnan(a).any() else _erf_complement(a[far])
    return (np.sign(x64) * magnitude).astype(F32)


def _erf_complement(a: np.ndarray) -> np.ndarray:
    t = 1 / (1 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return 1 - poly * np.exp(-a * a)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(F32)


def _softplus(x: np.ndarray) -> np.ndarray:
    return (np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)).astype(F32)


ACTIVATIONS: dict[ActFunc, Callable[[np.ndarray], np.ndarray]] = {
    ActFunc.copy: lambda x: x,
    ActFunc.relu: lambda x: np.maximum(x, F32(0)),
    ActFunc.sigmoid: _sigmoid,
    ActFunc.tanh: np.tanh,
    ActFunc.exp: np.exp,
    ActFunc.erf: _erf,
    ActFunc.gelu: lambda x: (F32(0.5) * x * (1 + _erf(x / F32(math.sqrt(2))))).astype(F32),
    ActFunc.gelu_apprx_tanh: lambda x: (F32(0.5) * x * (1 + np.tanh(
        F32(math.sqrt(2 / math.pi)) * (x + F32(0.044715) * x * x * x)))).astype(F32),
    ActFunc.silu: lambda x: x * _sigmoid(x),
    ActFunc.sqrt: np.sqrt,
    ActFunc.rsqrt: lambda x: F32(1) / np.sqrt(x),
    ActFunc.square: np.square,
    ActFunc.reciprocal: lambda x: F32(1) / x,
    ActFunc.abs: np.abs,
    ActFunc.sign: np.sign,
    ActFunc.log: np.log,
    ActFunc.softplus: _softplus,
    ActFunc.sin: np.sin,
    ActFunc.arctan: np.arctan,
    ActFunc.mish: lambda x: x * np.tanh(_softplus(x)),
    ActFunc.cos: np.cos,
    ActFunc.tan: np.tan,
}


def _flag(fn: Callable[[Any, Any], np.ndarray]) -> Callable[[Any, Any], np.ndarray]:
    return lambda a, b: fn(a, b).astype(F32)


def _bits(fn: Callable[[Any, Any], np.ndarray]) -> Callable[[Any, Any], np.ndarray]:
    """Bit-vector operators see integers: integer tiles read exactly (`_alu_input`), immediates as given."""
    return lambda a, b: fn(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64))


ALU: dict[AluOp, Callable[[Any, Any], np.ndarray]] = {
    AluOp.add: np.add,
    AluOp.subtract: np.subtract,
    AluOp.multiply: np.multiply,
    AluOp.divide: np.divide,
    AluOp.maximum: np.maximum,
    AluOp.minimum: np.minimum,
    AluOp.equal: _flag(np.equal),
    AluOp.not_equal: _flag(np.not_equal),
    AluOp.greater: _flag(np.greater),
    AluOp.greater_equal: _flag(np.greater_equal),
    AluOp.less: _flag(np.less),
    AluOp.less_equal: _flag(np.less_equal),
    AluOp.power: np.power,
    AluOp.abs_max: lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    AluOp.abs_min: lambda a, b: np.minimum(np.abs(a), np.abs(b)),
    AluOp.logical_and: _flag(lambda a, b: np.logical_and(a != 0, b != 0)),
    AluOp.logical_or: _flag(lambda a, b: np.logical_or(a != 0, b != 0)),
    AluOp.logical_xor: _flag(lambda a, b: np.logical_xor(a != 0, b != 0)),
    AluOp.bitwise_and: _bits(np.bitwise_and),
    AluOp.bitwise_or: _bits(np.bitwise_or),
    AluOp.bitwise_xor: _bits(np.bitwise_xor),
    AluOp.left_shift: _bits(np.left_shift),
    AluOp.right_shift: _bits(np.right_shift),
    AluOp.mod: np.fmod,
}

REDUCE: dict[AluOp, Callable[..., np.ndarray]] = {
    AluOp.add: np.sum,
    AluOp.multiply: np.prod,
    AluOp.maximum: np.max,
    AluOp.minimum: np.min,
    AluOp.abs_max: lambda x, axis: np.max(np.abs(x), axis=axis),
    AluOp.logical_and: lambda x, axis: np.all(x != 0, axis=axis).astype(F32),
    AluOp.logical_or: lambda x, axis: np.any(x != 0, axis=axis).astype(F32),
}


# ---- handlers ----------------------------------------------------------------------------------------------------


def dma_copy(instr: Instruction, v: Views) -> Issue:
    src, store = snapshot(v["src"]), write_to(v["dst"])
    rows = v["dst"].shape[0]
    if rows == v["src"].shape[0]:
        def issue() -> Commit:
            data = src()
            return lambda: store(data)
        return issue

    def fanned() -> Commit:  # the sides differ in shape: the elements move in order
        data = src().reshape(rows, -1)
        return lambda: store(data)

    return fanned

    return issue


def dma_gather(instr: Instruction, v: Views) -> Issue:
    """`table` is the view (rows, *row) of the whole table, which the row's implicit_reads hook describes."""
    table, index, store = v["table"], snapshot(v["index"], np.int64), write_to(v["dst"])
    rows = instr.args["rows"]

    def issue() -> Commit:
        chosen = index().reshape(-1)
        bad = (chosen < 0) | (chosen >= rows)
        if bad.any():
            raise AccessError(f"dma_gather index {int(chosen[bad][0])} outside the table's {rows} rows")
        data = table[chosen].reshape(len(chosen), -1)
        return lambda: store(data)

    return issue


def dma_scatter(instr: Instruction, v: Views) -> Issue:
    """`table` is the view (rows, *row) of the whole table, which the row's implicit_writes hook describes. Of
    equal indices the highest partition's row is written (numpy leaves repeated assignment unspecified)."""
    table, index, src = v["table"], snapshot(v["index"], np.int64), snapshot(v["src"])
    rows = instr.args["rows"]

    def issue() -> Commit:
        chosen = index().reshape(-1)
        bad = (chosen < 0) | (chosen >= rows)
        if bad.any():
            raise AccessError(f"dma_scatter index {int(chosen[bad][0])} outside the table's {rows} rows")
        _, last_from_end = np.unique(chosen[::-1], return_index=True)
        kept = len(chosen) - 1 - last_from_end  # the last partition naming each row
        data = convert(src()[kept], table.dtype).reshape((len(kept), *table.shape[1:]))

        def commit() -> None:
            table[chosen[kept]] = data

        return commit

    return issue


def nc_matmul(instr: Instruction, v: Views) -> Issue:
    """A systolic array computes every output column the same way, so equal columns give equal bits. numpy's
    sgemm does not promise that (its kernels treat the edge columns of a block apart), so products are summed in
    float64, where the order no longer shows, and rounded once to fp32."""
    stationary, moving = snapshot(v["stationary"], np.float64), snapshot(v["moving"], np.float64)
    accumulate = instr.args["accumulate"]
    old = snapshot(v["dst"], np.float64)
    store = write_to(v["dst"])
    rounds_on_store = v["dst"].dtype == F32  # storing rounds float64 to fp32 as astype would

    def issue() -> Commit:
        product = stationary().T @ moving()
        if accumulate:
            product += old()
        return lambda: store(product if rounds_on_store else product.astype(F32))

    return issue


def nc_transpose(instr: Instruction, v: Views) -> Issue:
    src, store = read_f32(v["src"]), write_to(v["dst"])

    def issue() -> Commit:
        result = np.ascontiguousarray(src().T)
        return lambda: store(result)

    return issue


def activation(instr: Instruction, v: Views) -> Issue:
    fn = ACTIVATIONS[instr.args["func"]]
    src, store = read_f32(v["src"]), write_to(v["dst"])
    # an immediate 1 multiplies nothing; a [P, 1] column (nki.isa.activation's vector scale) is read at issue
    scale = _scalar(v["scale"]) if isinstance(v["scale"], np.ndarray) or F32(v["scale"]) != 1 else None
    bias = _scalar(v["bias"]) if v["bias"] is not None else None
    store_sum = write_to(v["reduce"]) if v["reduce"] is not None else None

    def issue() -> Commit:
        x = src()
        if scale is not None:
            x = x * scale()
        if bias is not None:
            x = x + bias()
        y = fn(x).astype(F32, copy=False)
        total = y.sum(axis=1, keepdims=True, dtype=F32) if store_sum is not None else None

        def commit() -> None:
            store(y)
            if store_sum is not None:
                store_sum(total)

        return commit

    return issue


def _alu_input(view: np.ndarray, bits: bool) -> Callable[[], np.ndarray]:
    """An ALU input, as fp32; for a bit-vector operator an integer tile's bits, exactly."""
    return snapshot(view, np.int64) if bits and view.dtype.kind in "iu" else read_f32(view)


def tensor_tensor(instr: Instruction, v: Views) -> Issue:
    fn = ALU[instr.args["op"]]
    bits = instr.args["op"] in BITVEC_OPS
    a, b = _alu_input(v["a"], bits), _alu_input(v["b"], bits)
    store = write_to(v["dst"], wrap=instr.args["op"] in BITVEC_OPS)

    def issue() -> Commit:
        result = fn(a(), b())
        return lambda: store(result)

    return issue


def _apply(op: AluOp, x: Any, s: Any, reverse: bool) -> Any:
    return ALU[op](s, x) if reverse else ALU[op](x, s)


def tensor_scalar(instr: Instruction, v: Views) -> Issue:
    args = instr.args
    src = _alu_input(v["src"], args["op0"] in BITVEC_OPS)
    store = write_to(v["dst"], wrap=args["op0"] in BITVEC_OPS or args["op1"] in BITVEC_OPS)
    s0 = _scalar(v["scalar0"])
    s1 = _scalar(v["scalar1"]) if args["op1"] is not None else None

    def issue() -> Commit:
        result = _apply(args["op0"], src(), s0(), args["reverse0"])
        if s1 is not None:
            result = _apply(args["op1"], result, s1(), args["reverse1"])
        return lambda: store(result)

    return issue


def scalar_tensor_tensor(instr: Instruction, v: Views) -> Issue:
    args = instr.args
    src, b, scalar = read_f32(v["src"]), read_f32(v["b"]), _scalar(v["scalar"])
    store = write_to(v["dst"], wrap=args["op0"] in BITVEC_OPS or args["op1"] in BITVEC_OPS)

    def issue() -> Commit:
        result = ALU[args["op1"]](ALU[args["op0"]](src(), scalar()), b())
        return lambda: store(result)

    return issue


def tensor_copy(instr: Instruction, v: Views) -> Issue:
    src, store = read_f32(v["src"]), write_to(v["dst"])

    def issue() -> Commit:
        data = src()
        return lambda: store(data)

    return issue


def tensor_copy_predicated(instr: Instruction, v: Views) -> Issue:
    src, predicate, old = snapshot(v["src"]), snapshot(v["predicate"]), snapshot(v["dst"])
    store = write_to(v["dst"])

    def issue() -> Commit:
        result = np.where(predicate() != 0, src(), old())
        return lambda: store(result)

    return issue


def tensor_reduce(instr: Instruction, v: Views) -> Issue:
    fn = REDUCE[instr.args["op"]]
    src_view = v["src"]
    axes = tuple(range(src_view.ndim - instr.args["axes"], src_view.ndim))
    store = write_to(v["dst"])

    def issue() -> Commit:
        result = fn(src_view.astype(F32), axis=axes).astype(F32, copy=False)
        return lambda: store(result.reshape(result.shape[0], -1))

    return issue



def _moments(x: np.ndarray) -> np.ndarray:
    """(count, mean, variance * count) along axis 1 of fp64 values; an empty half gives (0, 0, 0)."""
    count = np.full(x.shape[0], x.shape[1], dtype=np.float64)
    mean = x.mean(axis=1) if x.shape[1] else np.zeros(x.shape[0])
    m2 = ((x - mean[:, None]) ** 2).sum(axis=1)
    return np.stack([count, mean, m2], axis=1)


def bn_stats(instr: Instruction, v: Views) -> Issue:
    """Statistics of the even and odd elements apart, as the hardware gives them; computed in fp64 from the inputs
    (every input type is exact in fp64) and rounded to fp32 once, as they are stored."""
    src, store = snapshot(v["src"], np.float64), write_to(v["dst"])

    def issue() -> Commit:
        with np.errstate(all="ignore"):
            x = src()
            result = np.concatenate([_moments(x[:, 0::2]), _moments(x[:, 1::2])], axis=1).astype(F32)
        return lambda: store(result)

    return issue


def bn_aggr(instr: Instruction, v: Views) -> Issue:
    """Chan et al.'s pairwise combination of (count, mean, M2) triples: mean, then M2 / count."""
    src, store = snapshot(v["src"], np.float64), write_to(v["dst"])

    def issue() -> Commit:
        with np.errstate(all="ignore"):
            t = src().reshape(v["src"].shape[0], -1, 3)
            count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
            total = count.sum(axis=1)
            grand = (count * mean).sum(axis=1) / total
            var = (m2.sum(axis=1) + (count * (mean - grand[:, None]) ** 2).sum(axis=1)) / total
            result = np.stack([grand, var], axis=1).astype(F32)
        return lambda: store(result)

    return issue

def _constant(instr: Instruction, v: Views, values: np.ndarray) -> Issue:
    store = write_to(v["dst"])
    values = values.reshape(values.shape[0], -1)
    return lambda: lambda: store(values)


def memset(instr: Instruction, v: Views) -> Issue:
    return _constant(instr, v, np.full(v["dst"].shape, F32(instr.args["value"]), dtype=F32))


def iota(instr: Instruction, v: Views) -> Issue:
    a = instr.args
    shape = v["dst"].shape
    grids = np.indices(shape, dtype=np.int64)
    values = a["base"] + grids[0] * a["channel_multiplier"]
    for step, grid in zip(a["steps"], grids[1:]):
        values = values + step * grid
    return _constant(instr, v, values)


# ---- selection, search, scans and cross-partition movement (nki.isa's max8 family, scans, selects, shuffles) ----


def max8(instr: Instruction, v: Views) -> Issue:
    src, store = read_f32(v["src"]), write_to(v["dst"])

    def issue() -> Commit:
        top = -np.sort(-src(), axis=1, kind="stable")[:, :8]
        return lambda: store(top)

    return issue


_NOT_FOUND = np.uint64(0xFFFFFFFF)


def _occurrences(row: np.ndarray, vals: np.ndarray, order: range) -> np.ndarray:
    """For vals[j], j in `order`, the first position of row holding it that no earlier j took (the all-ones index
    when there is none): equal vals take successive occurrences."""
    found = np.full(len(vals), _NOT_FOUND, dtype=np.uint64)
    taken: set[int] = set()
    for j in order:
        for k in np.flatnonzero(row == vals[j]):
            if int(k) not in taken:
                taken.add(int(k))
                found[j] = k
                break
    return found


def nc_find_index8(instr: Instruction, v: Views) -> Issue:
    """Equal vals take the value's occurrences in ascending order across their columns (the reference's tie rule)."""
    data, vals, store = read_f32(v["data"]), read_f32(v["vals"]), write_to(v["dst"], wrap=True)

    def issue() -> Commit:
        rows, wanted = data(), vals()
        found = np.stack([_occurrences(r, w, range(8)) for r, w in zip(rows, wanted)])
        return lambda: store(found)

    return issue


def nc_match_replace8(instr: Instruction, v: Views) -> Issue:
    """vals are matched from the last to the first, so equal vals pair with the value's occurrences in descending
    column order (the reference's rule, the opposite of nc_find_index8's)."""
    data, vals = snapshot(v["data"]), read_f32(v["vals"])
    store = write_to(v["dst"])
    store_index = write_to(v["dst_idx"], wrap=True) if v["dst_idx"] is not None else None
    imm = F32(instr.args["imm"])

    def issue() -> Commit:
        rows, wanted = data(), vals()
        found = np.stack([_occurrences(r.astype(F32), w, range(7, -1, -1)) for r, w in zip(rows, wanted)])
        replaced = rows.astype(F32)
        for p, hits in enumerate(found):
            replaced[p, hits[hits != _NOT_FOUND].astype(np.int64)] = imm

        def commit() -> None:
            store(replaced)
            if store_index is not None:
                store_index(found)

        return commit

    return issue


def tensor_tensor_scan(instr: Instruction, v: Views) -> Issue:
    """Element by element along the free axes, the carried value in fp32 (stored rounded to dst's type)."""
    a = instr.args
    data0, data1, initial, store = read_f32(v["data0"]), read_f32(v["data1"]), _scalar(v["initial"]), write_to(v["dst"])

    def issue() -> Commit:
        x0, x1 = data0(), data1()
        carried = np.broadcast_to(np.asarray(initial(), F32), (x0.shape[0], 1)).reshape(-1).astype(F32)
        out = np.empty_like(x0)
        for i in range(x0.shape[1]):
            carried = _apply(a["op0"], x0[:, i], carried, a["reverse0"]).astype(F32)
            carried = (ALU[a["op1"]](x1[:, i], carried) if a["reverse1"] else
                       ALU[a["op1"]](carried, x1[:, i])).astype(F32)
            out[:, i] = carried
        return lambda: store(out)

    return issue


def dropout_draws(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """u(seed, p, i): the uniform draws in [0, 1) dropout compares with its probability, in fp32 (Philox, keyed
    by the instruction's seed: the same draws every run, as a counter-based generator gives them)."""
    return np.random.Generator(np.random.Philox(key=seed & (2**64 - 1))).random(shape, dtype=F32)


def dropout(instr: Instruction, v: Views) -> Issue:
    src, store, prob = read_f32(v["src"]), write_to(v["dst"]), _scalar(v["prob"])
    seed = instr.args["seed"]

    def issue() -> Commit:
        x = src()
        kept = np.where(dropout_draws(seed, x.shape) >= prob(), x, F32(0))
        return lambda: store(kept)

    return issue


def nc_stream_shuffle(instr: Instruction, v: Views) -> Issue:
    src, old, store = snapshot(v["src"]), snapshot(v["dst"]), write_to(v["dst"])
    mask = instr.args["mask"]

    def issue() -> Commit:
        data, result = src(), old()
        for i in range(result.shape[0]):
            q, r = divmod(i, len(mask))
            if mask[r] != 255:
                result[i] = data[q * len(mask) + mask[r]]
        return lambda: store(result)

    return issue


def select_reduce(instr: Instruction, v: Views) -> Issue:
    predicate, on_true, on_false = snapshot(v["predicate"]), read_f32(v["on_true"]), _scalar(v["on_false"])
    store = write_to(v["dst"])
    store_max = write_to(v["reduce"]) if v["reduce"] is not None else None
    reverse = instr.args["reverse"]

    def issue() -> Commit:
        chosen = (predicate() != 0) != reverse
        result = np.where(chosen, on_true(), on_false()).astype(F32)
        peak = result.max(axis=1, keepdims=True) if store_max is not None else None

        def commit() -> None:
            store(result)
            if store_max is not None:
                store_max(peak)

        return commit

    return issue


def affine_select(instr: Instruction, v: Views) -> Issue:
    a = instr.args
    shape = v["dst"].shape
    grids = np.indices(shape, dtype=np.int64)
    value = a["offset"] + grids[0] * a["channel_multiplier"]
    for step, grid in zip(a["steps"], grids[1:]):
        value = value + step * grid
    keep = ALU[a["cmp"]](value, 0).astype(bool).reshape(shape[0], -1)
    src, store, fill_value = read_f32(v["src"]), write_to(v["dst"]), F32(a["fill"])

    def issue() -> Commit:
        result = np.where(keep, src(), fill_value)
        return lambda: store(result)

    return issue


def local_gather(instr: Instruction, v: Views) -> Issue:
    """Each group of 16 partitions reads its index slice down the partitions then along them (Fortran order) and
    gathers, within each of its partitions, `elems` elements at each of the first `valid` offsets."""
    src, index, store = snapshot(v["src"]), snapshot(v["index"], np.int64), write_to(v["dst"])
    run, valid = instr.args["elems"], instr.args["valid"]

    def issue() -> Commit:
        data, offsets = src(), index()
        out = np.empty((data.shape[0], valid * run), dtype=data.dtype)
        for g in range(0, data.shape[0], 16):
            starts = offsets[g:g + 16].reshape(-1, order="F")[:valid]
            at = (starts[:, None] + np.arange(run)[None, :]).reshape(-1)
            if at.size and (at.min() < 0 or at.max() >= data.shape[1]):
                raise AccessError(f"local_gather offset {int(at.max())} outside the {data.shape[1]} elements of a "
                                  "partition")
            out[g:g + 16] = data[g:g + 16][:, at]
        return lambda: store(out)

    return issue


def tensor_partition_reduce(instr: Instruction, v: Views) -> Issue:
    op = instr.args["op"]
    bits = op in BITVEC_OPS
    src, store = _alu_input(v["src"], bits), write_to(v["dst"], wrap=bits)

    def issue() -> Commit:
        rows = src()
        result = rows[0]
        for row in rows[1:]:
            result = ALU[op](result, row)
        return lambda: store(np.asarray(result).reshape(1, -1))

    return issue


HANDLERS: dict[str, Callable[[Instruction, Views], Issue]] = {
    fn.__name__: fn
    for fn in (dma_copy, dma_gather, dma_scatter, nc_matmul, nc_transpose, activation, tensor_tensor, tensor_scalar,
               scalar_tensor_tensor, tensor_copy,
               tensor_copy_predicated, tensor_reduce, bn_stats, bn_aggr, memset, iota, max8, nc_find_index8,
               nc_match_replace8, tensor_tensor_scan, dropout, nc_stream_shuffle, select_reduce, affine_select,
               local_gather, tensor_partition_reduce)
}
