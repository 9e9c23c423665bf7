"""One configuration per target chip. Every size, clock, bandwidth and fixed cost the compiler, the validator and
the cost models (isa/costs.py, isa/collectives.py) use comes from here, and each figure names where it comes from
in `sources`: a document and the figure it gives (`doc:`), a published measurement (`measured:`), a figure this
model fitted to published measurements (`fitted:`), or this model's estimate where nothing public gives one
(`estimate:`). Where two documents disagree, the measured one is taken (../shared/CHIP.md, "Published
measurements"); `benchmarks/calibration.py` holds the model against every published measurement.

Documents: the NKI architecture guide (nki/arch/trainium_inferentia2_arch, trainium2_arch), the nki.isa API
reference, the NKI performance guide, the NKI DMA overview and DMA bandwidth guide, the intra- and inter-node
collectives pages and the nccom-test user guide of the Neuron runtime, and the inf2 performance tables.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Target:
    name: str
    cores_per_chip: int
    hbm_bytes: int
    hbm_gbps: float  # GB/s per chip
    # On-chip memories, per NeuronCore.
    partitions: int  # pmax
    sbuf_partition_bytes: int
    psum_partition_bytes: int
    psum_banks: int
    # Tile limits of the Tensor engine and bn_stats, in elements.
    gemm_stationary_fmax: int
    gemm_moving_fmax: int
    bn_stats_fmax: int
    # Engine clocks (GHz) and the fixed per-instruction costs of the NKI ISA reference.
    pe_ghz: float
    act_ghz: float
    dve_ghz: float
    pool_ghz: float
    min_ii_cycles: int  # MIN_II: the shortest initiation interval of ACT/DVE instructions
    access_start_cycles: int  # fixed cost of starting an SBUF/PSUM access (ACT/DVE)
    gpsimd_start_cycles: int  # GPSIMD_START: the startup of every GpSimd instruction (in place of MIN_II)
    static_overhead_cycles: int  # extra for a small instruction (N < min_efficient_elements) or a dependent one
    min_efficient_elements: int  # elements per partition below which an instruction is "small"
    act_accumulate_cycles: int  # reading ScalarE's add-reduce accumulator back (ActReadAccumulator)
    act_table_load_ns: float  # ScalarE loading another function's lookup table
    fast_stride_bytes: int  # an SBUF/PSUM access whose innermost stride exceeds this runs at half bandwidth
    semaphore_handoff_ns: float  # from a semaphore increment to the waiting engine of another stream starting
    # Elements per partition per cycle of VectorE, for 2-byte types and for the others.
    dve_lanes_16bit: int
    dve_lanes: int
    # TensorE speed of fp8 operands relative to bf16 (fp32 runs at a quarter of it on every target).
    pe_fp8_speedup: int
    # DMA: one queue per DMA engine, running the data of one transfer at a time, in order.
    dma_queues: int
    dma_queue_gbps: float  # GB/s one DMA engine sustains
    dma_latency_ns: float  # from a transfer's trigger to its first byte, when nothing is queued before it
    dma_descriptor_ns: float  # a core's descriptor generation: one transfer at a time, this long each
    dma_piece_ns: float  # engine time per contiguous piece of a transfer (descriptor element)
    dma_queue_depth: int  # transfers a queue holds at once: one moving its data, the next being prepared
    # Synchronisation: hardware semaphores per core.
    semaphores: int
    # Many cores (CHIP.md, "Collectives"). Ranks are logical cores: `lnc` physical cores act as one (trn2).
    default_lnc: int
    lnc_choices: tuple[int, ...]
    # The chips of one instance and how NeuronLink joins them: a ring (one size) or a 2D torus (two sizes).
    chip_grid: tuple[int, ...]
    link_gbps: float  # GB/s out of one chip over NeuronLink, split evenly over its neighbours in the grid
    link_hop_ns: float  # fixed cost of one step of a collective over NeuronLink
    chip_hop_ns: float  # fixed cost of one step between two ranks of one chip
    efa_gbps: float  # GB/s out of one instance over EFA
    efa_hop_ns: float  # fixed cost of one step between instances
    max_instances: int  # the most instances one bundle may span
    # A collective's own costs (isa/collectives.py): set-up, a barrier of log2(ranks) rounds, the rate one rank's
    # collective DMA moves a transfer at, and the extra set-up of a collective that crosses instances.
    cc_setup_ns: float
    cc_sync_round_ns: float
    cc_rank_gbps: float  # the most one rank's collective transfers move per second
    cc_reduce_gelems: float  # elements per ns one rank's collective DMA combines (a reduction's extra time)
    cc_chunk_bytes: int  # a collective transfer is cut into pieces of this size, each on a DMA engine of its own
    cc_efa_setup_ns: tuple[tuple[int, float], ...]  # (bytes per rank, ns): interpolated on log2(bytes)
    # The host: the runtime's fixed cost per inference (launch, synchronisation) and its input/output copies.
    host_launch_us: float
    host_link_gbps: float
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def psum_bank_bytes(self) -> int:
        return self.psum_partition_bytes // self.psum_banks

    @property
    def psum_bank_fmax(self) -> int:
        """fp32 elements of one PSUM bank per partition (512 on every target so far)."""
        return self.psum_bank_bytes // 4

    @property
    def core_dma_gbps(self) -> float:
        """The most one core's DMA engines can move per second, in GB/s: all queues at once, within HBM's."""
        return min(self.dma_queues * self.dma_queue_gbps, self.hbm_gbps)

    @property
    def chips_per_instance(self) -> int:
        return math.prod(self.chip_grid)

    def ranks_per_chip(self, lnc: int) -> int:
        return self.cores_per_chip // lnc

    def chip_neighbours(self) -> int:
        """NeuronLink ports a chip uses: 2 in a ring, 4 in a torus whose sides exceed 2."""
        return sum(min(2, n - 1) for n in self.chip_grid)

    def pe_tflops(self, dtype_name: str) -> float:
        """TensorE peak for operands of this type: 128 x 128 multiply-adds per cycle."""
        per_cycle = 2 * self.partitions * self.gemm_stationary_fmax
        rate = 0.25 if dtype_name == "fp32" else self.pe_fp8_speedup if dtype_name.startswith("fp8") else 1
        return per_cycle * self.pe_ghz * rate / 1000

    def host_overhead_us(self, io_bytes: int) -> float:
        """The runtime's cost of one inference beyond the device's: its fixed launch and the copies of the inputs
        and outputs (`io_bytes` together) between host and device."""
        return self.host_launch_us + io_bytes / (self.host_link_gbps * 1000)

    def allowed_start_partitions(self, count: int) -> tuple[int, ...]:
        """Where a compute-engine access of `count` partitions may start: engines see the partitions in
        quadrants of pmax/4, so a span over half the array starts at 0, a span over a quadrant at a half."""
        quadrant = self.partitions // 4
        if count > 2 * quadrant:
            return (0,)
        if count > quadrant:
            return (0, 2 * quadrant)
        return tuple(range(0, self.partitions, quadrant))


def _target(sources: dict[str, tuple[object, str]], **fixed: object) -> Target:
    """A Target from (value, source) pairs for its figures and plain values for its names and shapes."""
    values = {name: value for name, (value, _) in sources.items()}
    return Target(**fixed, **values, sources={name: text for name, (_, text) in sources.items()})  # type: ignore


def _derived(base: Target, name: str, **changes: tuple[object, str]) -> Target:
    """Another target sharing base's figures but those changed, each with its source."""
    sources = {**base.sources, **{k: text for k, (_, text) in changes.items()}}
    return dataclasses.replace(base, name=name, sources=sources, **{k: v for k, (v, _) in changes.items()})


_KIB = 1024
_GIB = 1024**3
_ARCH = "doc: NKI architecture guide"
_ISA = "doc: nki.isa reference"

TRN1 = _target(
    {
        "cores_per_chip": (2, _ARCH + ": 2 NeuronCore-v2 per Trainium / Inferentia2 chip"),
        "default_lnc": (1, "doc: one rank per NeuronCore on trn1 and inf2"),
        "lnc_choices": ((1,), "doc: NeuronCore-v2 has no logical NeuronCore grouping"),
        "chip_grid": ((4, 4), "doc: trn1.32xlarge, 16 chips in a 2D torus"),
        "hbm_bytes": (32 * _GIB, _ARCH + ": 32 GiB of HBM per Trainium chip"),
        "hbm_gbps": (820.0, _ARCH + ": 820 GB/s per chip"),
        "partitions": (128, _ARCH + ": SBUF and PSUM have 128 partitions (pmax)"),
        "sbuf_partition_bytes": (192 * _KIB, _ARCH + ": SBUF 24 MiB = 128 partitions x 192 KiB"),
        "psum_partition_bytes": (16 * _KIB, _ARCH + ": PSUM 2 MiB = 128 partitions x 16 KiB"),
        "psum_banks": (8, _ARCH + ": 8 PSUM banks of 2 KiB per partition"),
        "gemm_stationary_fmax": (128, _ISA + ": nc_matmul stationary free size <= 128"),
        "gemm_moving_fmax": (512, _ISA + ": nc_matmul moving free size <= 512"),
        "bn_stats_fmax": (512, _ISA + ": bn_stats free size <= 512"),
        "pe_ghz": (2.8, _ARCH + ": TensorE 2.8 GHz (x 128 x 128 x 2 = 92 TFLOPS bf16)"),
        "act_ghz": (1.4, _ARCH + ": ScalarE 1.4 GHz"),
        "dve_ghz": (1.12, _ARCH + ": VectorE 1.12 GHz"),
        "pool_ghz": (1.4, _ARCH + ": GpSimdE 1.4 GHz"),
        "min_ii_cycles": (64, _ISA + ": MIN_II 'roughly 64 engine cycles'"),
        "access_start_cycles": (60, "doc: NKI performance guide, starting an SBUF/PSUM access 'about 60 cycles'"),
        "gpsimd_start_cycles": (150, _ISA + ": GPSIMD_START 'roughly 150 engine cycles' (iota, affine_select)"),
        "static_overhead_cycles": (140, "fitted: the NKI performance guide measures 264 ScalarE cycles between "
                                        "dependent one-element activations = MIN_II 64 + access 60 + 140; the "
                                        "architecture guide says 'about 100'"),
        "min_efficient_elements": (128, _ARCH + ": engines need 'at least 128 elements per partition'"),
        "act_accumulate_cycles": (64, _ARCH + ": ActReadAccumulator 'roughly 64 ScalarE cycles'"),
        "act_table_load_ns": (1000.0, "estimate: no public figure for loading another function's table"),
        "fast_stride_bytes": (16, "doc: NKI performance guide, an innermost stride over 16 bytes halves bandwidth"),
        "semaphore_handoff_ns": (50.0, "estimate: no public figure for a semaphore hand-off between engines"),
        "dve_lanes_16bit": (1, _ARCH + ": VectorE 128 elements per cycle, one per partition"),
        "dve_lanes": (1, _ARCH + ": VectorE 128 elements per cycle"),
        "pe_fp8_speedup": (1, _ARCH + ": 92 TFLOPS for bf16, fp16, tf32 and fp8 alike"),
        "dma_queues": (16, "doc: NKI DMA overview, 16 DMA engines per NeuronCore"),
        "dma_queue_gbps": (17.0, "measured: NKI DMA bandwidth guide table, 17 B/ns per engine = 272 GB/s per "
                                 "core (the overview's 27.2 GB/s is a theoretical peak)"),
        "dma_latency_ns": (1300.0, "doc: NKI DMA bandwidth guide, descriptor setup and semaphore-to-start "
                                   "'~1300 ns cross-engine'"),
        "dma_descriptor_ns": (25.0, "estimate: trn2's measured figure (NKI DMA overview profile: the 16 packets of "
                                    "one transfer start (468 - 97) / 15 = 25 ns apart), taken for trn1"),
        "dma_piece_ns": (2.0, "fitted: NKI DMA overview profile, 8 rows of 256 B in 97 ns on one engine "
                              "(2048 B at 23 B/ns is 89 ns)"),
        "dma_queue_depth": (2, "fitted: with one transfer moving and the next prepared, back-to-back transfers "
                               "of >= 4 KiB per partition saturate a queue and < 256 B do not (DMA bandwidth "
                               "guide)"),
        "semaphores": (32, "estimate: no public count of semaphores per core"),
        "link_gbps": (384.0, _ARCH + ": NeuronLink-v2, 384 GB/s per chip"),
        "link_hop_ns": (1500.0, "doc: intra-node collectives page, ring per-hop latency 'about 1-2 us'"),
        "chip_hop_ns": (1300.0, "doc: one DMA's latency (bandwidth guide): a hop inside a chip is one transfer"),
        "efa_gbps": (200.0, "estimate: trn1n's 1.6 Tbps EFA (CHIP.md gives EFA for trn2 only)"),
        "efa_hop_ns": (15000.0, "doc: inter-node collectives page, 'the per-hop latency is ~15 us'"),
        "max_instances": (8, "estimate: this model's limit"),
        "cc_setup_ns": (30000.0, "fitted: nccom-test on trn1, 2-rank all_reduce of 1-64 KiB in 58 us (with one "
                                 "barrier round)"),
        "cc_sync_round_ns": (23000.0, "fitted: nccom-test on trn1, 32-rank all_gather of 1-64 KiB in ~150 us "
                                      "(5 barrier rounds)"),
        "cc_rank_gbps": (61.2, "fitted: nccom-test on trn1, 2-rank fp32 all_reduce of 1 GiB in 18,930 us: each "
                               "rank sends the buffer once and combines what it receives (56.7 GB/s in all)"),
        "cc_reduce_gelems": (100.0, "fitted: nccom-test on trn1, 2-rank all_reduce of 32 MiB of uint8 in 768 us "
                                    "against 1 GiB of fp32 in 18,930 us (in a ring, each rank combines half the buffer)"),
        "cc_chunk_bytes": (64 * _KIB, "fitted: nccom-test, 32-rank all_gather from 64 to 512 KiB grows at one "
                                      "DMA engine's rate (its 16 KiB transfers are one chunk each)"),
        "cc_efa_setup_ns": (((128, 352000.0), (256, 512000.0), (64 * _KIB, 1100000.0)),
                            "fitted: nccom-test, 64 ranks on two trn1 instances, 520 us at <= 128 B rising to "
                            "1,315 us at 64 KiB (no document gives the mechanism)"),
        "host_launch_us": (140.0, "fitted: inf2 performance tables, BERT-base 0.999 ms and DistilBERT 0.579 ms "
                                  "(12 and 6 layers) leave a 0.159 ms intercept; less ~20 us of embeddings and "
                                  "pooler on the device"),
        "host_link_gbps": (16.0, "estimate: half of PCIe Gen4 x16 for the runtime's input and output copies"),
    },
    name="trn1",
)

# inf2 shares NeuronCore-v2 with trn1; its chip-to-chip ring differs, which matters only for collectives.
INF2 = _derived(
    TRN1, "inf2",
    chip_grid=((12,), "doc: inf2.48xlarge, 12 chips in a ring"),
    link_gbps=(192.0, _ARCH + ": inf2 NeuronLink, 192 GB/s per chip"),
    efa_gbps=(12.5, "estimate: inf2.48xlarge's 100 Gbps networking (nccom-test runs inf2 on one instance only)"),
)

TRN2 = _derived(
    TRN1, "trn2",
    cores_per_chip=(8, "doc: trainium2_arch, 8 NeuronCores per chip (LNC=1)"),
    hbm_bytes=(96 * _GIB, "doc: trainium2_arch, 96 GiB per chip"),
    hbm_gbps=(2900.0, "doc: trainium2_arch, 2.9 TB/s (another page says 3 TB/s)"),
    sbuf_partition_bytes=(224 * _KIB, "doc: trainium2_arch, SBUF 28 MiB = 128 x 224 KiB"),
    pe_ghz=(2.4, "doc: trainium2_arch, TensorE 2.4 GHz (79 TFLOPS bf16)"),
    act_ghz=(1.2, "doc: trainium2_arch, ScalarE 1.2 GHz"),
    dve_ghz=(0.96, "doc: trainium2_arch, VectorE 0.96 GHz"),
    pool_ghz=(1.2, "doc: trainium2_arch, GpSimdE 1.2 GHz"),
    dve_lanes_16bit=(4, "doc: trainium2_arch, VectorE 512 elements per cycle for bf16/fp16"),
    dve_lanes=(2, "doc: trainium2_arch, VectorE 256 elements per cycle otherwise"),
    pe_fp8_speedup=(2, "doc: trainium2_arch, 158 TFLOPS fp8 against 79 bf16"),
    dma_queue_gbps=(23.0, "measured: NKI DMA bandwidth guide table, 23 B/ns per engine = 368 GB/s per core"),
    dma_latency_ns=(740.0, "measured: NKI DMA overview profile on trn2, trigger at 33,300 ns, first engine at "
                           "34,039 ns"),
    dma_descriptor_ns=(25.0, "measured: NKI DMA overview profile on trn2, packets (468 - 97) / 15 = 25 ns apart"),
    default_lnc=(2, "doc: trn2 runs LNC=2 by default, two physical cores act as one rank"),
    lnc_choices=((1, 2), "doc: LNC=1 or 2 on trn2"),
    link_gbps=(1024.0, "doc: trn2.48xlarge, 1024 GB/s NeuronLink per chip"),
    efa_gbps=(400.0, "doc: CHIP.md, EFA 3.2 Tbps between trn2 instances"),
    cc_rank_gbps=(61.2, "estimate: trn1's fit (no trn2 nccom-test table is published)"),
    cc_reduce_gelems=(100.0, "estimate: trn1's fit (no trn2 nccom-test table is published)"),
    cc_setup_ns=(30000.0, "estimate: trn1's fit (no trn2 nccom-test table is published)"),
    cc_sync_round_ns=(23000.0, "estimate: trn1's fit (no trn2 nccom-test table is published)"),
    cc_efa_setup_ns=(TRN1.cc_efa_setup_ns, "estimate: trn1's fit (no trn2 nccom-test table is published)"),
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, INF2, TRN2)}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise KeyError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}") from None
