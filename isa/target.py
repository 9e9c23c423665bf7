"""One configuration per target chip. Every size, clock and bandwidth the compiler, the validator and the
cost model (isa/costs.py) use comes from here; the numbers are those of ../shared/CHIP.md (AWS Neuron docs:
nki/arch/trainium_inferentia2_arch, trainium2_arch, the nki.isa reference, the NKI performance guide and the NKI
DMA bandwidth guide). Where the docs give two values, the one chosen is named in a comment; the one figure no
document gives (the cost of one contiguous piece of a DMA) is marked as this model's choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
    min_ii_cycles: int  # MIN_II: the shortest initiation interval of ACT/DVE/POOL instructions
    access_start_cycles: int  # fixed cost of starting an SBUF/PSUM access (ACT/DVE/POOL)
    # Elements per partition per cycle of VectorE, for 2-byte types and for the others.
    dve_lanes_16bit: int
    dve_lanes: int
    # TensorE speed of fp8 operands relative to bf16 (fp32 runs at a quarter of it on every target).
    pe_fp8_speedup: int
    # DMA: one queue per DMA engine, running one transfer at a time.
    dma_queues: int
    dma_queue_gbps: float  # GB/s of one DMA engine
    dma_launch_ns: float  # fixed cost of every transfer: descriptor setup and semaphore-to-start latency
    dma_piece_ns: float  # fixed cost of every contiguous piece of a transfer (this model's choice, see TRN1)
    # Synchronisation: hardware semaphores per core. CHIP.md gives no figure; 32 is this model's choice.
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
    max_instances: int  # the most instances one bundle may span (this model's choice)

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

    def allowed_start_partitions(self, count: int) -> tuple[int, ...]:
        """Where a compute-engine access of `count` partitions may start: engines see the partitions in
        quadrants of pmax/4, so a span over half the array starts at 0, a span over a quadrant at a half."""
        quadrant = self.partitions // 4
        if count > 2 * quadrant:
            return (0,)
        if count > quadrant:
            return (0, 2 * quadrant)
        return tuple(range(0, self.partitions, quadrant))


_KIB = 1024
_GIB = 1024**3

TRN1 = Target(
    name="trn1",
    cores_per_chip=2,
    hbm_bytes=32 * _GIB,
    hbm_gbps=820.0,
    partitions=128,
    sbuf_partition_bytes=192 * _KIB,
    psum_partition_bytes=16 * _KIB,
    psum_banks=8,
    gemm_stationary_fmax=128,
    gemm_moving_fmax=512,
    bn_stats_fmax=512,
    pe_ghz=2.8,
    act_ghz=1.4,
    dve_ghz=1.12,
    pool_ghz=1.4,
    min_ii_cycles=64,
    access_start_cycles=60,
    dve_lanes_16bit=1,  # 128 elements per cycle: one per partition
    dve_lanes=1,
    pe_fp8_speedup=1,  # 92 TFLOPS for bf16, fp16, tf32 and fp8 alike
    dma_queues=16,
    # The per-engine figure (the NKI DMA overview says 27.2 GB/s); the bandwidth guide's table gives 17 B/ns.
    dma_queue_gbps=27.0,
    dma_launch_ns=1300.0,  # "~1300 ns cross-engine" (NKI DMA bandwidth guide)
    # No document gives a per-piece figure; the bandwidth guide says pieces of >= 4 KiB per partition sustain an
    # engine's peak and small ones leave it mostly idle. 16 ns (the time of ~430 bytes) gives 4 KiB pieces 90% of
    # the engine's rate, 512-byte pieces 54% and the 2-4 byte pieces of an element-strided transpose under 1%.
    dma_piece_ns=16.0,
    semaphores=32,
    default_lnc=1,
    lnc_choices=(1,),
    chip_grid=(4, 4),  # trn1.32xlarge: 16 chips in a 2D torus
    link_gbps=384.0,  # NeuronLink-v2 per chip
    link_hop_ns=1500.0,  # CHIP.md: "ring (per hop 1-2 us)"; the middle
    chip_hop_ns=1300.0,  # a DMA's launch: the hop is one transfer between the cores' buffers
    # CHIP.md gives EFA only for trn2 (3.2 Tbps); trn1n's 1.6 Tbps = 200 GB/s is this model's choice for trn1.
    efa_gbps=200.0,
    efa_hop_ns=15000.0,  # CHIP.md: "about 15 us per hop over EFA"
    max_instances=8,
)

# inf2 shares NeuronCore-v2 with trn1; its chip-to-chip ring differs, which matters only for collectives.
INF2 = Target(**{**TRN1.__dict__, "name": "inf2", "chip_grid": (12,),  # inf2.48xlarge: 12 chips in a ring
                 "link_gbps": 192.0,
                 "efa_gbps": 12.5})  # inf2.48xlarge's 100 Gbps EFA (this model's choice: CHIP.md has none)

TRN2 = Target(
    name="trn2",
    cores_per_chip=8,  # physical cores (LNC=1)
    hbm_bytes=96 * _GIB,
    hbm_gbps=2900.0,  # one page says 3 TB/s
    partitions=128,
    sbuf_partition_bytes=224 * _KIB,
    psum_partition_bytes=16 * _KIB,
    psum_banks=8,
    gemm_stationary_fmax=128,
    gemm_moving_fmax=512,
    bn_stats_fmax=512,
    pe_ghz=2.4,
    act_ghz=1.2,
    dve_ghz=0.96,
    pool_ghz=1.2,
    min_ii_cycles=64,
    access_start_cycles=60,
    dve_lanes_16bit=4,  # 512 elements per cycle for bf16/fp16
    dve_lanes=2,  # 256 otherwise
    pe_fp8_speedup=2,  # 158 TFLOPS fp8 against 79 bf16
    dma_queues=16,
    dma_queue_gbps=23.0,  # CHIP.md's 23 B/ns, read like trn1's 17 B/ns table as a per-engine rate
    dma_launch_ns=1300.0,
    dma_piece_ns=16.0,  # as TRN1
    semaphores=32,
    default_lnc=2,  # CHIP.md: LNC=2 is the default, two physical cores act as one rank
    lnc_choices=(1, 2),
    chip_grid=(4, 4),  # trn2.48xlarge: 16 chips in a 4x4 torus
    link_gbps=1024.0,
    link_hop_ns=1500.0,
    chip_hop_ns=1300.0,
    efa_gbps=400.0,  # CHIP.md: EFA 3.2 Tbps between trn2 instances
    efa_hop_ns=15000.0,
    max_instances=8,
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, INF2, TRN2)}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise KeyError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}") from None
