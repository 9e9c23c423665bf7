"""The instruction table: each instruction defined once.

A row gives the mnemonic, the opcode, the engines that may run it, its fields in order (each with a kind, and for
operands whether it is read or written and which memories it may name), its cost in engine cycles (from the
nki.isa reference, via CHIP.md) and a validation hook for what the generic checks cannot say. The binary codec
(codec.py), the listing printer and the lark grammar (listing.py) and the validator (validate.py) are all derived
from these rows; the runtime has one semantics function per mnemonic (runtime/semantics.py).

Adding an instruction: one `OpSpec` row here, one hook if it has shape rules, one handler in the runtime.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from isa.functions import REDUCE_OPS, ActFunc, AluOp
from isa.operand import Engine, Mem, Operand


class Kind(enum.Enum):
    OPERAND = "operand"  # an access pattern
    SCALAR = "scalar"  # a float immediate or a [P, 1] operand broadcast along the free axis
    ENUM = "enum"
    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    INTS = "ints"  # up to four integers, one per free dimension


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    enum: type[enum.IntEnum] | None = None
    optional: bool = False  # absent fields hold None
    writes: bool = False  # operand written by the instruction (else read)
    mems: frozenset[Mem] = frozenset(Mem)  # memories this operand may name


def dst(*mems: Mem) -> Field:
    return Field("dst", Kind.OPERAND, writes=True, mems=frozenset(mems or Mem))


def src(name: str = "src", *mems: Mem, optional: bool = False) -> Field:
    return Field(name, Kind.OPERAND, optional=optional, mems=frozenset(mems or Mem))


@dataclass
class Instruction:
    """One instruction: a mnemonic, its field values, and its synchronisation.

    `waits` holds (semaphore, value) pairs: the instruction starts only when every named semaphore has reached
    its value. `signal` names a semaphore that is incremented by one when the instruction completes.
    """

    op: str
    args: dict[str, Any]
    waits: tuple[tuple[int, int], ...] = ()
    signal: int | None = None

    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    def operands(self) -> Iterator[tuple[Field, Operand]]:
        """Every operand the instruction touches, scalars given as [P, 1] operands included."""
        for f in self.spec.operand_fields:
            value = self.args[f.name]
            if isinstance(value, Operand):
                yield f, value

    def reads(self) -> list[Operand]:
        implicit = self.spec.implicit_reads(self) if self.spec.implicit_reads else {}
        return [o for f, o in self.operands() if not f.writes] + list(implicit.values())

    def writes(self) -> list[Operand]:
        implicit = self.spec.implicit_writes(self) if self.spec.implicit_writes else {}
        return [o for f, o in self.operands() if f.writes] + list(implicit.values())

    def implicit_operands(self) -> dict[str, tuple[Operand, bool]]:
        """The memory touched beyond the fields' own operands, by name, with whether it is written."""
        spec = self.spec
        found: dict[str, tuple[Operand, bool]] = {}
        for hook, writes in ((spec.implicit_reads, False), (spec.implicit_writes, True)):
            found.update({name: (o, writes) for name, o in (hook(self) if hook else {}).items()})
        return found


Cycles = Callable[[Instruction, Any], int]  # (instruction, Target) -> engine cycles
Check = Callable[[Instruction, Any], Iterator[str]]  # (instruction, Target) -> problems


@dataclass(frozen=True)
class OpSpec:
    name: str
    opcode: int
    engines: frozenset[Engine]
    fields: tuple[Field, ...]
    cycles: Cycles | None  # None: timed by the DMA model, not in engine cycles
    check: Check | None = None
    doc: str = ""
    # Memory read or written beyond the operands' own footprints, by name (the whole table of an indirect DMA).
    implicit_reads: Callable[[Instruction], dict[str, Operand]] | None = None
    implicit_writes: Callable[[Instruction], dict[str, Operand]] | None = None
    # A collective: every rank of its replica group runs it together (the runtime's collective model times it).
    collective: bool = False
    field_index: dict[str, Field] = field(init=False, repr=False, compare=False)
    # the fields that may hold an operand (operands and scalars), in order: what walks over an instruction's memory
    # accesses visits only these (for speed: it runs for every instruction at every stage)
    operand_fields: tuple[Field, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "field_index", {f.name: f for f in self.fields})
        object.__setattr__(self, "operand_fields",
                           tuple(f for f in self.fields if f.kind in (Kind.OPERAND, Kind.SCALAR)))


def make(mnemonic: str, /, *, waits: tuple[tuple[int, int], ...] = (), signal: int | None = None,
         **args: Any) -> Instruction:
    """Build an instruction by keyword, filling absent optional fields with None and refusing unknown ones."""
    spec = OPS[mnemonic]
    unknown = set(args) - set(spec.field_index)
    if unknown:
        raise TypeError(f"{mnemonic} has no field(s) {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for f in spec.fields:
        value = args.get(f.name)
        if value is None and not f.optional:
            raise TypeError(f"{mnemonic} needs field {f.name}")
        values[f.name] = value
    return Instruction(mnemonic, values, tuple(waits), signal)


# ---- shape rules the generic checks cannot state -------------------------------------------------------------


def _same_elements(instr: Instruction, names: tuple[str, ...]) -> Iterator[str]:
    """Elementwise instructions: every named operand has the partition count and per-partition size of dst."""
    d = instr.args["dst"]
    for name in names:
        o = instr.args[name]
        if isinstance(o, Operand) and (o.num_partitions, o.free_size) != (d.num_partitions, d.free_size):
            yield (f"{name} is {o.num_partitions}x{o.free_size} elements but dst is "
                   f"{d.num_partitions}x{d.free_size}")


def _per_partition_scalars(instr: Instruction, names: tuple[str, ...]) -> Iterator[str]:
    d = instr.args["dst"]
    for name in names:
        o = instr.args[name]
        if isinstance(o, Operand) and (o.num_partitions != d.num_partitions or o.free_size != 1):
            yield f"{name} must be [{d.num_partitions}, 1], got {list(o.shape)}"


def _check_dma(instr: Instruction, target: Any) -> Iterator[str]:
    """A transfer moves its elements in order, whatever the shapes of its sides: a DMA engine walks address
    patterns, so one partition's runs may fan out over several partitions, or gather in (lower/row_depthwise.py)."""
    d, s = instr.args["dst"], instr.args["src"]
    if d.num_partitions * d.free_size != s.num_partitions * s.free_size:
        yield (f"src is {s.num_partitions}x{s.free_size} elements but dst is "
               f"{d.num_partitions}x{d.free_size}: a transfer moves as many as it reads")


def _check_indirect(instr: Instruction, rows_name: str, table_name: str) -> Iterator[str]:
    """An indirect DMA moves the rows of `rows_name` (one per partition, its index in `index`) from or to the
    table whose row 0 is `table_name`."""
    moved, row, index = instr.args[rows_name], instr.args[table_name], instr.args["index"]
    if row.num_partitions != 1:
        yield f"{table_name} describes one row of the table: one partition"
    if moved.free_size != row.free_size:
        yield f"{rows_name} holds {moved.free_size} elements per partition, a table row {row.free_size}"
    if (index.num_partitions, index.free_size) != (moved.num_partitions, 1) or index.dtype.name != "int32":
        yield f"index must be int32 [{moved.num_partitions}, 1]"
    if instr.args["rows"] < 1 or instr.args["row_stride"] < 0:
        yield "the table needs at least one row and a non-negative row stride"


def _check_gather(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _check_indirect(instr, "dst", "src")


def _check_scatter(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _check_indirect(instr, "src", "dst")
    if instr.args["rows"] > 1 and instr.args["row_stride"] == 0:
        yield "a written table needs a positive row stride: its rows cannot be one"


def _table(row_name: str) -> Callable[[Instruction], dict[str, Operand]]:
    """The whole table of an indirect DMA whose row 0 is the operand `row_name`: `rows` partitions, `row_stride`
    elements apart."""
    def table(instr: Instruction) -> dict[str, Operand]:
        row = instr.args[row_name]
        return {"table": Operand(row.mem, row.dtype, 0, instr.args["rows"], row.offset, row.dims,
                                 instr.args["row_stride"])}
    return table


def _check_matmul(instr: Instruction, target: Any) -> Iterator[str]:
    d, s, m = instr.args["dst"], instr.args["stationary"], instr.args["moving"]
    if s.num_partitions != m.num_partitions:
        yield f"contraction mismatch: stationary has {s.num_partitions} partitions, moving {m.num_partitions}"
    if s.start_partition != m.start_partition:
        yield (f"the contraction runs along PE rows: stationary starts at partition {s.start_partition}, "
               f"moving at {m.start_partition}")
    if s.free_size > target.gemm_stationary_fmax:
        yield f"stationary free size {s.free_size} exceeds {target.gemm_stationary_fmax}"
    if m.free_size > target.gemm_moving_fmax:
        yield f"moving free size {m.free_size} exceeds {target.gemm_moving_fmax}"
    if (d.num_partitions, d.free_size) != (s.free_size, m.free_size):
        yield f"dst must be {s.free_size}x{m.free_size}, got {d.num_partitions}x{d.free_size}"
    if d.dtype.name != "fp32":
        yield "matmul accumulates in fp32: dst must be fp32"
    if (s.dtype.name == "fp32") != (m.dtype.name == "fp32"):
        yield "an fp32 matmul needs both inputs in fp32"
    yield from _within_one_psum_bank(d, target)


def _within_one_psum_bank(o: Operand, target: Any) -> Iterator[str]:
    first, last = o.partition_span
    if first // target.psum_bank_bytes != last // target.psum_bank_bytes:
        yield f"PSUM access [{first}, {last}] crosses a {target.psum_bank_bytes}-byte bank boundary"


def _check_transpose(instr: Instruction, target: Any) -> Iterator[str]:
    d, s = instr.args["dst"], instr.args["src"]
    if (d.num_partitions, d.free_size) != (s.free_size, s.num_partitions):
        yield f"dst must be {s.free_size}x{s.num_partitions} (src transposed), got {d.num_partitions}x{d.free_size}"
    if s.free_size > target.partitions:
        yield f"src free size {s.free_size} exceeds {target.partitions}"
    if d.dtype != s.dtype:
        yield f"a transpose keeps its type: dst is {d.dtype.name}, src {s.dtype.name}"
    yield from _within_one_psum_bank(d, target)


def _check_activation(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("src",))
    yield from _per_partition_scalars(instr, ("bias", "scale", "reduce"))


def _check_tensor_tensor(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("a", "b"))
    if instr.args["a"].mem == Mem.PSUM and instr.args["b"].mem == Mem.PSUM:
        yield "the two inputs cannot both be in PSUM"


def _check_tensor_scalar(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("src",))
    yield from _per_partition_scalars(instr, ("scalar0", "scalar1"))
    if (instr.args["op1"] is None) != (instr.args["scalar1"] is None):
        yield "op1 and scalar1 come together"


def _check_scalar_tensor_tensor(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("src", "b"))
    yield from _per_partition_scalars(instr, ("scalar",))
    if instr.args["src"].mem == Mem.PSUM and instr.args["b"].mem == Mem.PSUM:
        yield "the two inputs cannot both be in PSUM"


def _check_copy(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("src",))


def _check_predicated(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("src", "predicate"))


def _check_reduce(instr: Instruction, target: Any) -> Iterator[str]:
    d, s, axes = instr.args["dst"], instr.args["src"], instr.args["axes"]
    if instr.args["op"] not in REDUCE_OPS:
        yield (f"tensor_reduce reduces with {', '.join(o.name for o in sorted(REDUCE_OPS))}, "
               f"not {instr.args['op'].name}")
    if not 1 <= axes <= len(s.dims):
        yield f"axes must be between 1 and {len(s.dims)}, got {axes}"
        return
    kept = s.free_shape[: len(s.dims) - axes]
    kept_size = 1
    for n in kept:
        kept_size *= n
    if (d.num_partitions, d.free_size) != (s.num_partitions, kept_size):
        yield f"dst must be {s.num_partitions}x{kept_size}, got {d.num_partitions}x{d.free_size}"


def _check_iota(instr: Instruction, target: Any) -> Iterator[str]:
    if len(instr.args["steps"]) != len(instr.args["dst"].dims):
        yield "iota needs one step per free dimension of dst"


COLLECTIVE_REDUCE_OPS = frozenset({AluOp.add, AluOp.maximum, AluOp.minimum, AluOp.multiply})


def _check_collective(instr: Instruction, target: Any) -> Iterator[str]:
    """What one rank can check alone; sizes against the group's size are checked where the groups are known
    (the runtime, runtime/collectives.py)."""
    if instr.args["group"] < 0:
        yield f"group {instr.args['group']} is negative"
    op = instr.args.get("op")
    if op is not None and op not in COLLECTIVE_REDUCE_OPS:
        yield f"a collective reduces with {', '.join(o.name for o in sorted(COLLECTIVE_REDUCE_OPS))}, not {op.name}"
    if instr.op in ("all_reduce", "all_to_all", "permute"):
        yield from _same_elements(instr, ("src",))
    if instr.args["dst"].mem is not instr.args["src"].mem:
        yield f"a collective's src and dst are both in HBM or both in SBUF, not {instr.args['src'].mem.name} and " \
              f"{instr.args['dst'].mem.name}"
    if instr.args["dst"].dtype != instr.args["src"].dtype:
        yield f"a collective keeps its type: dst is {instr.args['dst'].dtype.name}, src {instr.args['src'].dtype.name}"


# ---- costs in engine cycles (the nki.isa reference; isa/costs.py adds each engine's fixed costs) -------------

def _free(instr: Instruction, name: str = "dst") -> int:
    return instr.args[name].free_size


def pe_rate(dtype: Any, target: Any) -> float:
    """TensorE passes per cycle relative to bf16: fp32 takes four passes, fp8 may run faster (trn2)."""
    if dtype.name == "fp32":
        return 0.25
    return target.pe_fp8_speedup if dtype.name.startswith("fp8") else 1


def _matmul_cycles(instr: Instruction, target: Any) -> int:
    """Back-to-back matmuls issue every max(N, 64) cycles; the next stationary loads in the background."""
    m, n = instr.args["stationary"].free_size, instr.args["moving"].free_size
    return math.ceil(max(min(target.min_ii_cycles, m), n) / pe_rate(instr.args["moving"].dtype, target))


def _transpose_cycles(instr: Instruction, target: Any) -> int:
    """A transpose is a matmul of the tile (stationary) against the identity (moving, P columns)."""
    s = instr.args["src"]
    return math.ceil(max(s.num_partitions, min(target.min_ii_cycles, s.free_size)) / pe_rate(s.dtype, target))


_ONE_PASS_OPS = frozenset({AluOp.add, AluOp.subtract, AluOp.multiply})


def _two_input_cycles(first: str, op: str, second: str | None = "b") -> Cycles:
    """tensor_tensor (and scalar_tensor_tensor, 'approximately the same latency'): N when one input is in PSUM
    and the other in SBUF, or both in SBUF with every type bf16, the operator add, subtract or multiply and the
    inputs contiguous; 2N otherwise. `second` None: the second input is the predicate (tensor_copy_predicated's
    table: N with one input in PSUM, 2N with both in SBUF)."""
    def cycles(instr: Instruction, target: Any) -> int:
        a, b, d = instr.args[first], instr.args[second or "predicate"], instr.args["dst"]
        n = _free(instr)
        if (a.mem is Mem.PSUM) != (b.mem is Mem.PSUM):
            return n
        contiguous = all(o.dims[-1][1] == 1 or o.dims[-1][0] == 1 for o in (a, b))
        if second and all(o.dtype.name == "bf16" for o in (a, b, d)) and instr.args[op] in _ONE_PASS_OPS \
                and contiguous:
            return n
        return 2 * n
    return cycles


def _reduce_cycles(instr: Instruction, target: Any) -> int:
    """N/2 when input and output are bf16 and the operator adds or takes the maximum, else N."""
    s, d = instr.args["src"], instr.args["dst"]
    fast = s.dtype.name == d.dtype.name == "bf16" and instr.args["op"] in (AluOp.add, AluOp.maximum)
    return math.ceil(s.free_size / 2) if fast else s.free_size


def _streaming(instr: Instruction, target: Any) -> int:
    return _free(instr)


def _check_bn_stats(instr: Instruction, target: Any) -> Iterator[str]:
    d, s = instr.args["dst"], instr.args["src"]
    if s.free_size > target.bn_stats_fmax:
        yield f"src has {s.free_size} elements per partition; bn_stats takes at most {target.bn_stats_fmax}"
    if (d.num_partitions, d.free_size) != (s.num_partitions, 6):
        yield f"dst must be {s.num_partitions}x6, got {d.num_partitions}x{d.free_size}"
    if d.dtype.name != "fp32":
        yield "bn_stats writes fp32 statistics: dst must be fp32"


def _check_bn_aggr(instr: Instruction, target: Any) -> Iterator[str]:
    d, s = instr.args["dst"], instr.args["src"]
    if s.free_size == 0 or s.free_size % 3:
        yield f"src must hold (count, mean, variance * count) triples, got {s.free_size} elements per partition"
    if (d.num_partitions, d.free_size) != (s.num_partitions, 2):
        yield f"dst must be {s.num_partitions}x2, got {d.num_partitions}x{d.free_size}"
    if s.dtype.name != "fp32":
        yield "bn_aggr reads bn_stats' fp32 statistics: src must be fp32"

MAX8_FMAX = 16384  # elements per partition max8, nc_find_index8 and nc_match_replace8 read at most (nki.isa)
LOCAL_GATHER_MAX_INDICES = 4096  # indices a GpSimd core gathers with at most (nki.isa.local_gather)


def _check_max8(instr: Instruction, target: Any) -> Iterator[str]:
    d, s = instr.args["dst"], instr.args["src"]
    if not 8 <= s.free_size <= MAX8_FMAX:
        yield f"src holds {s.free_size} elements per partition; max8 reads 8 to {MAX8_FMAX}"
    if (d.num_partitions, d.free_size) != (s.num_partitions, 8):
        yield f"dst must be {s.num_partitions}x8, got {d.num_partitions}x{d.free_size}"


_INDEX_TYPES = ("uint16", "uint32")


def _check_find_index8(instr: Instruction, target: Any) -> Iterator[str]:
    d, data, vals = instr.args["dst"], instr.args["data"], instr.args["vals"]
    if not 8 <= data.free_size <= MAX8_FMAX:
        yield f"data holds {data.free_size} elements per partition; nc_find_index8 reads 8 to {MAX8_FMAX}"
    for name, o in (("vals", vals), ("dst", d)):
        if (o.num_partitions, o.free_size) != (data.num_partitions, 8):
            yield f"{name} must be {data.num_partitions}x8, got {o.num_partitions}x{o.free_size}"
    if d.dtype.name not in _INDEX_TYPES:
        yield f"dst holds indices: uint16 or uint32, not {d.dtype.name}"


def _check_match_replace8(instr: Instruction, target: Any) -> Iterator[str]:
    d, data, vals, index = instr.args["dst"], instr.args["data"], instr.args["vals"], instr.args["dst_idx"]
    yield from _same_elements(instr, ("data",))
    if data.free_size > MAX8_FMAX:
        yield f"data holds {data.free_size} elements per partition; nc_match_replace8 reads at most " \
              f"{MAX8_FMAX}"
    for name, o in (("vals", vals), ("dst_idx", index)):
        if o is not None and (o.num_partitions, o.free_size) != (data.num_partitions, 8):
            yield f"{name} must be {data.num_partitions}x8, got {o.num_partitions}x{o.free_size}"
    if index is not None and index.dtype.name not in _INDEX_TYPES:
        yield f"dst_idx holds indices: uint16 or uint32, not {index.dtype.name}"
    if d.dtype != data.dtype:
        yield f"the replaced data keeps its type: dst is {d.dtype.name}, data {data.dtype.name}"


def _check_scan(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("data0", "data1"))
    yield from _per_partition_scalars(instr, ("initial",))
    if instr.args["data0"].mem == Mem.PSUM and instr.args["data1"].mem == Mem.PSUM:
        yield "the two inputs cannot both be in PSUM"


def _check_affine_select(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("src",))
    if len(instr.args["steps"]) != len(instr.args["dst"].dims):
        yield "affine_select needs one step per free dimension of dst"
    if instr.args["cmp"] not in COMPARISONS:
        yield f"the predicate compares with {', '.join(o.name for o in sorted(COMPARISONS))}, not " \
              f"{instr.args['cmp'].name}"


def _check_dropout(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("src",))
    yield from _per_partition_scalars(instr, ("prob",))


QUADRANT = 32  # partitions a stream shuffle permutes within (nki.isa.nc_stream_shuffle)
SHUFFLE_KEEP = 255  # a shuffle mask entry that leaves its destination partition as it is


def _check_shuffle(instr: Instruction, target: Any) -> Iterator[str]:
    d, s, mask = instr.args["dst"], instr.args["src"], instr.args["mask"]
    if d.free_size != s.free_size or d.num_partitions != s.num_partitions:
        yield f"dst is {d.num_partitions}x{d.free_size} elements but src is {s.num_partitions}x{s.free_size}"
    if s.num_partitions % QUADRANT:
        yield f"a shuffle moves whole quadrants: {s.num_partitions} partitions is not a multiple of {QUADRANT}"
    if d.dtype != s.dtype:
        yield f"a shuffle keeps its type: dst is {d.dtype.name}, src {s.dtype.name}"
    if len(mask) != QUADRANT or any(not (0 <= m < QUADRANT or m == SHUFFLE_KEEP) for m in mask):
        yield f"the mask names, for each of {QUADRANT} partitions, a source partition of its quadrant or " \
              f"{SHUFFLE_KEEP} (kept)"
    elif any(q * QUADRANT + m >= s.num_partitions for q in range(-(-d.num_partitions // QUADRANT))
             for i, m in enumerate(mask) if m != SHUFFLE_KEEP and q * QUADRANT + i < d.num_partitions):
        yield "the mask names a partition src does not have"
    for o in (d, s):
        if o.start_partition % QUADRANT:
            yield f"a shuffle starts on a quadrant boundary (a multiple of {QUADRANT}), not {o.start_partition}"


GPSIMD_CORE_PARTITIONS = 16  # the SBUF partitions each of GpSimdE's eight cores reads (nki.isa.local_gather)
LOCAL_GATHER_RUNS = (1, 2, 4, 8, 16, 32)


def _check_local_gather(instr: Instruction, target: Any) -> Iterator[str]:
    d, s, index = instr.args["dst"], instr.args["src"], instr.args["index"]
    run, valid = instr.args["elems"], instr.args["valid"]
    if s.num_partitions % GPSIMD_CORE_PARTITIONS or s.start_partition % GPSIMD_CORE_PARTITIONS:
        yield f"src spans whole {GPSIMD_CORE_PARTITIONS}-partition groups of GpSimdE's cores"
    if index.num_partitions != s.num_partitions or index.start_partition != s.start_partition:
        yield "index lies on the partitions src does"
    if index.dtype.name != "uint16":
        yield f"index holds uint16 element offsets, not {index.dtype.name}"
    if run not in LOCAL_GATHER_RUNS:
        yield f"elems (elements gathered per index) is one of {', '.join(map(str, LOCAL_GATHER_RUNS))}"
    per_core = index.free_size * GPSIMD_CORE_PARTITIONS
    if not 0 < valid <= min(per_core, LOCAL_GATHER_MAX_INDICES):
        yield f"valid indices per core must be 1 to {min(per_core, LOCAL_GATHER_MAX_INDICES)}"
    if (d.num_partitions, d.free_size) != (s.num_partitions, valid * run):
        yield f"dst must be {s.num_partitions}x{valid * run}, got {d.num_partitions}x{d.free_size}"
    if d.dtype != s.dtype:
        yield f"a gather keeps its type: dst is {d.dtype.name}, src {s.dtype.name}"


def _local_gather_cycles(instr: Instruction, target: Any) -> int:
    """150 + valid * elems / C GpSimd cycles (costs.py adds the 150), C = ((28 + t e) / (t e)) / min(4 / dtype
    size, e), t = 4, as the nki.isa reference gives it."""
    run, t = instr.args["elems"], 4
    c = ((28 + t * run) / (t * run)) / min(4 / instr.args["src"].dtype.size, run)
    return math.ceil(instr.args["valid"] * run / c)


def _check_select_reduce(instr: Instruction, target: Any) -> Iterator[str]:
    yield from _same_elements(instr, ("on_true", "predicate"))
    yield from _per_partition_scalars(instr, ("on_false", "reduce"))
    if instr.args["on_true"].mem == Mem.PSUM and instr.args["predicate"].mem == Mem.PSUM:
        yield "on_true and predicate cannot both be in PSUM"
    if instr.args["predicate"].dtype.is_float:
        yield f"the predicate is an integer tile, not {instr.args['predicate'].dtype.name}"


def _check_partition_reduce(instr: Instruction, target: Any) -> Iterator[str]:
    d, s = instr.args["dst"], instr.args["src"]
    if instr.args["op"] not in PARTITION_REDUCE_OPS:
        yield f"tensor_partition_reduce reduces with {', '.join(o.name for o in sorted(PARTITION_REDUCE_OPS))}, " \
              f"not {instr.args['op'].name}"
    if (d.num_partitions, d.free_size) != (1, s.free_size):
        yield f"dst must be 1x{s.free_size}, got {d.num_partitions}x{d.free_size}"


def _partition_reduce_cycles(instr: Instruction, target: Any) -> int:
    """The reference gives no figure (an estimate): the partitions combined one after another, each row of N
    elements at 16 a cycle (a GpSimd core's 512-bit SIMD unit on fp32), with no credit for the eight cores
    working in parallel."""
    s = instr.args["src"]
    return s.num_partitions * s.free_size // GPSIMD_CORE_PARTITIONS


COMPARISONS = frozenset({AluOp.equal, AluOp.not_equal, AluOp.greater, AluOp.greater_equal, AluOp.less,
                         AluOp.less_equal})
PARTITION_REDUCE_OPS = frozenset({AluOp.add, AluOp.maximum, AluOp.bitwise_or, AluOp.bitwise_and})

# ---- the table ------------------------------------------------------------------------------------------------

_ON_CHIP = (Mem.SBUF, Mem.PSUM)
_DVE_ACT_POOL = frozenset({Engine.DVE, Engine.ACT, Engine.POOL})

_ROWS = (
    OpSpec("dma_copy", 0x01, frozenset({Engine.DMA, Engine.SP}),
           (dst(Mem.HBM, Mem.SBUF), src("src", Mem.HBM, Mem.SBUF)),
           None, _check_dma,
           "copy between HBM and SBUF (any direction), casting when the dtypes differ"),
    OpSpec("dma_gather", 0x02, frozenset({Engine.DMA, Engine.SP}),
           (dst(Mem.SBUF), src("src", Mem.HBM), src("index", Mem.SBUF), Field("rows", Kind.INT),
            Field("row_stride", Kind.INT)),
           None, _check_gather,
           "indirect DMA: dst[p] = row index[p] of the table whose row 0 is src, rows apart by row_stride",
           implicit_reads=_table("src")),
    OpSpec("dma_scatter", 0x03, frozenset({Engine.DMA, Engine.SP}),
           (dst(Mem.HBM), src("src", Mem.SBUF), src("index", Mem.SBUF), Field("rows", Kind.INT),
            Field("row_stride", Kind.INT)),
           None, _check_scatter,
           "indirect DMA: row index[p] of the table whose row 0 is dst, rows apart by row_stride, = src[p]; "
           "rows are written in partition order, so of equal indices the highest partition's row wins",
           implicit_writes=_table("dst")),
    OpSpec("nc_matmul", 0x10, frozenset({Engine.PE}),
           (dst(Mem.PSUM), src("stationary", Mem.SBUF), src("moving", Mem.SBUF),
            Field("accumulate", Kind.BOOL)),
           _matmul_cycles, _check_matmul,
           "dst (+)= stationary[K,M].T @ moving[K,N], fp32 in PSUM; accumulate adds to what dst holds"),
    OpSpec("nc_transpose", 0x11, frozenset({Engine.PE}),
           (dst(Mem.PSUM), src("src", Mem.SBUF)),
           _transpose_cycles, _check_transpose,
           "dst[F,P] = src[P,F] through the PE array, in src's type"),
    OpSpec("activation", 0x20, frozenset({Engine.ACT}),
           (dst(*_ON_CHIP), src("src", *_ON_CHIP), src("bias", *_ON_CHIP, optional=True),
            Field("func", Kind.ENUM, ActFunc), Field("scale", Kind.SCALAR, mems=frozenset(_ON_CHIP)),
            Field("reduce", Kind.OPERAND, optional=True, writes=True, mems=frozenset(_ON_CHIP))),
           _streaming, _check_activation,
           "dst = func(src * scale + bias), scale an immediate or a [P, 1] column (nki.isa.activation: a scalar or "
           "a vector, at no extra cost); reduce, when given, receives the sum of dst along the free axes"),
    OpSpec("tensor_tensor", 0x30, frozenset({Engine.DVE, Engine.POOL}),
           (dst(*_ON_CHIP), src("a", *_ON_CHIP), src("b", *_ON_CHIP), Field("op", Kind.ENUM, AluOp)),
           _two_input_cycles("a", "op"), _check_tensor_tensor,
           "dst = a op b, elementwise"),
    OpSpec("tensor_scalar", 0x31, _DVE_ACT_POOL,
           (dst(*_ON_CHIP), src("src", *_ON_CHIP),
            Field("op0", Kind.ENUM, AluOp), Field("scalar0", Kind.SCALAR, mems=frozenset(_ON_CHIP)),
            Field("reverse0", Kind.BOOL),
            Field("op1", Kind.ENUM, AluOp, optional=True),
            Field("scalar1", Kind.SCALAR, optional=True, mems=frozenset(_ON_CHIP)),
            Field("reverse1", Kind.BOOL)),
           _streaming, _check_tensor_scalar,
           "dst = (src op0 scalar0) op1 scalar1; a reverse flag swaps the two sides of its operator"),
    OpSpec("scalar_tensor_tensor", 0x36, frozenset({Engine.DVE, Engine.POOL}),
           (dst(*_ON_CHIP), src("src", *_ON_CHIP), Field("op0", Kind.ENUM, AluOp),
            Field("scalar", Kind.SCALAR, mems=frozenset(_ON_CHIP)), Field("op1", Kind.ENUM, AluOp),
            src("b", *_ON_CHIP)),
           _two_input_cycles("src", "op1"), _check_scalar_tensor_tensor,
           "dst = (src op0 scalar) op1 b: a scaled or shifted tensor combined with another in one pass"),
    OpSpec("tensor_copy", 0x32, _DVE_ACT_POOL,
           (dst(*_ON_CHIP), src("src", *_ON_CHIP)),
           _streaming, _check_copy,
           "dst = src, casting to dst's dtype"),
    OpSpec("tensor_copy_predicated", 0x35, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("src", *_ON_CHIP), src("predicate", *_ON_CHIP)),
           _streaming, _check_predicated,
           "dst = src where predicate is non-zero; elsewhere dst keeps what it holds"),
    OpSpec("tensor_reduce", 0x33, frozenset({Engine.DVE, Engine.POOL}),
           (dst(*_ON_CHIP), src("src", *_ON_CHIP), Field("op", Kind.ENUM, AluOp), Field("axes", Kind.INT)),
           _reduce_cycles, _check_reduce,
           "dst = reduction with op over the last `axes` free dimensions of src"),
    OpSpec("bn_stats", 0x37, frozenset({Engine.DVE}),
           (dst(Mem.SBUF), src("src", *_ON_CHIP)),
           lambda i, t: _free(i, "src"), _check_bn_stats,
           "dst[p] = (count, mean, variance * count) of src[p]'s even elements, then of its odd ones"),
    OpSpec("bn_aggr", 0x38, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("src", Mem.SBUF)),
           lambda i, t: 13 * _free(i, "src") // 3, _check_bn_aggr,
           "dst[p] = (mean, variance) of the elements whose bn_stats triples src[p] holds"),
    OpSpec("memset", 0x34, frozenset({Engine.DVE, Engine.POOL}),
           (dst(*_ON_CHIP), Field("value", Kind.FLOAT)),
           _streaming, None,
           "fill dst with value"),
    OpSpec("max8", 0x39, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("src", *_ON_CHIP)),
           lambda i, t: _free(i, "src"), _check_max8,
           "dst[p] = the 8 largest values of src[p], largest first (N cycles)"),
    OpSpec("nc_find_index8", 0x3A, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("data", *_ON_CHIP), src("vals", *_ON_CHIP)),
           lambda i, t: _free(i, "data"), _check_find_index8,
           "dst[p, j] = where vals[p, j] first occurs in data[p]; equal vals take its occurrences in order; one not "
           "found gets the all-ones index (N cycles)"),
    OpSpec("nc_match_replace8", 0x3B, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("data", *_ON_CHIP), src("vals", *_ON_CHIP), Field("imm", Kind.FLOAT),
            Field("dst_idx", Kind.OPERAND, optional=True, writes=True, mems=frozenset(_ON_CHIP))),
           lambda i, t: _free(i, "data"), _check_match_replace8,
           "dst = data with the first occurrence of each of vals[p] (vals taken from the last, each occurrence "
           "once) replaced by imm; dst_idx, when given, receives where each was (N cycles)"),
    OpSpec("tensor_tensor_scan", 0x3C, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("data0", *_ON_CHIP), src("data1", *_ON_CHIP),
            Field("initial", Kind.SCALAR, mems=frozenset(_ON_CHIP)), Field("op0", Kind.ENUM, AluOp),
            Field("op1", Kind.ENUM, AluOp), Field("reverse0", Kind.BOOL), Field("reverse1", Kind.BOOL)),
           lambda i, t: 2 * _free(i), _check_scan,
           "dst[p, i] = (data0[p, i] op0 dst[p, i-1]) op1 data1[p, i] along the free axes, dst[p, -1] = initial, "
           "in fp32; a reverse flag swaps its operator's sides (2N cycles)"),
    OpSpec("dropout", 0x3D, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("src", *_ON_CHIP), Field("prob", Kind.SCALAR, mems=frozenset(_ON_CHIP)),
            Field("seed", Kind.INT)),
           _streaming, _check_dropout,
           "dst = src, or 0 with probability prob: element (p, i) is dropped when u(seed, p, i) < prob, u uniform in "
           "[0, 1) from a counter-based generator (N cycles)"),
    OpSpec("nc_stream_shuffle", 0x3E, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("src", *_ON_CHIP), Field("mask", Kind.INTS)),
           lambda i, t: _free(i, "src"), _check_shuffle,
           "in each quadrant of 32 partitions, dst partition i = src partition mask[i] (255: dst keeps it) (N "
           "cycles)"),
    OpSpec("select_reduce", 0x3F, frozenset({Engine.DVE}),
           (dst(*_ON_CHIP), src("predicate", *_ON_CHIP), src("on_true", *_ON_CHIP),
            Field("on_false", Kind.SCALAR, mems=frozenset(_ON_CHIP)), Field("reverse", Kind.BOOL),
            Field("reduce", Kind.OPERAND, optional=True, writes=True, mems=frozenset(_ON_CHIP))),
           _two_input_cycles("on_true", "reverse", None), _check_select_reduce,
           "dst = on_true where predicate is non-zero (zero, with reverse), else on_false; reduce, when given, "
           "receives the maximum of dst along the free axes (cycles: tensor_copy_predicated's, an estimate)"),
    OpSpec("affine_select", 0x41, frozenset({Engine.POOL}),
           (dst(Mem.SBUF), src("src", Mem.SBUF), Field("offset", Kind.INT), Field("channel_multiplier", Kind.INT),
            Field("steps", Kind.INTS), Field("cmp", Kind.ENUM, AluOp), Field("fill", Kind.FLOAT)),
           _streaming, _check_affine_select,
           "dst[p, i...] = src[p, i...] where cmp(offset + p * channel_multiplier + sum(steps[k] * i[k]), 0), else "
           "fill (GPSIMD_START + N cycles)"),
    OpSpec("local_gather", 0x42, frozenset({Engine.POOL}),
           (dst(Mem.SBUF), src("src", Mem.SBUF), src("index", Mem.SBUF), Field("elems", Kind.INT),
            Field("valid", Kind.INT)),
           _local_gather_cycles, _check_local_gather,
           "per group of 16 partitions (a GpSimd core): the group's first `valid` indices, read down the partitions "
           "then along them, are element offsets; dst[p, k, e] = src[p, index_k + e] for e < elems"),
    OpSpec("tensor_partition_reduce", 0x43, frozenset({Engine.POOL}),
           (dst(Mem.SBUF), src("src", Mem.SBUF), Field("op", Kind.ENUM, AluOp)),
           _partition_reduce_cycles, _check_partition_reduce,
           "dst[0, i] = src[0, i] op src[1, i] op ... over the partitions (cycles: an estimate, see the hook)"),
    OpSpec("iota", 0x40, frozenset({Engine.POOL}),
           (dst(Mem.SBUF), Field("base", Kind.INT), Field("channel_multiplier", Kind.INT),
            Field("steps", Kind.INTS)),
           _streaming, _check_iota,
           "dst[p, i...] = base + p * channel_multiplier + sum(steps[k] * i[k])"),
)


def _collective(name: str, opcode: int, reduces: bool, doc: str, *extra: Field) -> OpSpec:
    op = (Field("op", Kind.ENUM, AluOp),) if reduces else ()
    return OpSpec(name, opcode, frozenset({Engine.CC}),
                  (dst(Mem.HBM, Mem.SBUF), src("src", Mem.HBM, Mem.SBUF), *op, Field("group", Kind.INT), *extra),
                  None, _check_collective, doc, collective=True)


# Collectives over the ranks of replica group `group` (the bundle's groups[group], in rank order; i is this rank's
# place in it, n its size). A buffer is its operand's elements in order (partition, then free dimensions); a block
# is one n-th of it. Every rank of the group runs the same collective, as its k-th on that group. Operands are
# both in HBM or both in SBUF (nki.collectives: "not a mix of the two"); in SBUF the ranks' DMA engines move the
# data between their SBUFs, and HBM is not touched.
_ROWS += (
    _collective("all_reduce", 0x50, True, "dst = src of every rank of the group, combined with op"),
    _collective("all_gather", 0x51, False, "dst = the src of every rank of the group, block j from rank j"),
    _collective("reduce_scatter", 0x52, True, "dst = block i of src of every rank, combined with op"),
    _collective("all_to_all", 0x53, False, "dst block j = block i of src on rank j"),
    _collective("permute", 0x54, False, "send src to rank (i + shift) % n of the group; dst = what rank "
                "(i - shift) % n sends", Field("shift", Kind.INT)),
)

OPS: dict[str, OpSpec] = {row.name: row for row in _ROWS}
BY_OPCODE: dict[int, OpSpec] = {row.opcode: row for row in _ROWS}
assert len(BY_OPCODE) == len(OPS), "opcodes must be unique"
