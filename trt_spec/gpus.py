"""The GPUs a spec may name (its ``engine.gpu``), and the facts about each that the plan uses:
memory for the memory plan (``trt_spec.plan.memory``), bandwidth and FLOP/s for the projection
(``trt_spec.plan.projection``). The one table of GPU facts in the package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

MIB = 1024**2
TERA = 1e12
GIGA = 1e9

GpuName = Literal["h100", "h200"]  # the spec's `gpu` values: the keys of GPUS


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's capacity and peak figures."""

    name: str
    memory_bytes: int  # total memory, as nvidia-smi reports it
    hbm_bytes_per_s: float  # HBM bandwidth
    fp16_flops_per_s: float  # dense FP16/BF16 tensor-core peak (the datasheet's sparse figure / 2)
    nvlink_bytes_per_s: float  # NVLink bandwidth per direction (900 GB/s bidirectional / 2)

    @property
    def ridge_point(self) -> float:
        """FLOP per byte above which a step is compute-bound."""
        return self.fp16_flops_per_s / self.hbm_bytes_per_s


# Memory: `nvidia-smi --query-gpu=memory.total` reports 81,559 MiB on an H100 SXM ("NVIDIA H100
# 80GB HBM3"), 143,771 MiB on an H200.
# Peaks, from NVIDIA's datasheets: H100 SXM 3.35 TB/s HBM3, H200 SXM 4.8 TB/s HBM3e; both FP16
# tensor core 1,979 TFLOPS with sparsity (989.4 dense) and fourth-generation NVLink 900 GB/s. Not
# retrieved in this project; the same figures appear in NVIDIA's MLPerf system descriptions ("18x
# 4th Gen NVLink, 900GB/s", mlcommons/inference_results_v4.1) and, for NVLink's 450 GB/s line rate
# per direction, from NCCL's maintainer (NVIDIA/nccl-tests issue 212).
GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        "H100 SXM",
        memory_bytes=81_559 * MIB,
        hbm_bytes_per_s=3.35 * TERA,
        fp16_flops_per_s=989.4 * TERA,
        nvlink_bytes_per_s=450 * GIGA,
    ),
    "h200": GpuSpec(
        "H200 SXM",
        memory_bytes=143_771 * MIB,
        hbm_bytes_per_s=4.8 * TERA,
        fp16_flops_per_s=989.4 * TERA,
        nvlink_bytes_per_s=450 * GIGA,
    ),
}
assert set(GPUS) == set(get_args(GpuName)), "GpuName and GPUS must name the same GPUs"
