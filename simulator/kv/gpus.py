"""GPU catalog: memory, bandwidths, peak dense tensor throughput and a typical hourly price.

Conventions (so every entry is comparable):

* ``hbm_bytes`` is the datasheet capacity read as GiB (80 GB -> 80 × 2**30): the GPU's name and
  the catalog's defaults by memory size use it. ``reported_bytes`` is the total the driver
  reports, where a reading is cited: what ``torch.cuda.mem_get_info()`` returns as ``total``
  (``cudaMemGetInfo``; the same figure as ``torch.cuda.get_device_properties().total_memory`` and
  deviceQuery's "Total amount of global memory"), which the engines size their pools from — vLLM
  takes ``gpu_memory_utilization`` of it (vLLM 0.33.0: vllm/v1/worker/utils.py ``request_memory``,
  ``requested_memory = ceil(init_snapshot.total_memory × gpu_memory_utilization)``, the total from
  ``torch.accelerator.get_memory_info`` in vllm/utils/mem_utils.py ``MemorySnapshot``),
  TensorRT-LLM its free part.
  An H100-80GB reports 79.20 GiB, 1% under its 80 GiB. Where only nvidia-smi's total is cited
  (B300, GB200, GB300) that is taken; it is a little above the driver's (by 453–717 MiB on the
  H100, H200 and B200, where both are known). Without a reading (A10G, MI325X, MI355X) the
  datasheet figure stands. :attr:`GPUSpec.total_memory_bytes` is the one the sizing uses.
* Throughputs are *dense* (no 2:4 sparsity) tensor-core FLOP/s; ``dense_fp8_flops`` is 0 where
  the GPU has no fp8 tensor cores, ``dense_int8_ops`` (int8 ops/s) 0 where it has no int8 ones,
  ``dense_fp4_flops`` 0 where it has no FP4 ones. ``fp4_formats`` names the block-scaled FP4
  formats those tensor cores take: ``nvfp4`` (16-element blocks, FP8 E4M3 scales) and ``mxfp4``
  (OCP MX: 32-element blocks, E8M0 scales) on Blackwell, ``mxfp4`` only on CDNA 4 (MI355X).
  Vendors quote FP4 without sparsity for some parts and with it for others: each entry says which.
* Link bandwidths are *per direction*: datasheets quote NVLink / Infinity Fabric / PCIe as the
  bidirectional sum (NVLink 4: 900 GB/s = 450 each way; PCIe 4.0 x16: 64 GB/s = 32 each way),
  and a ring all-reduce or a one-way swap copy moves data one way per link. GPUs without a GPU
  fabric use PCIe for ``interconnect_bandwidth_bytes_s``.
* ``gpus_per_node`` GPUs share one fabric (an NVLink domain): 8 on an HGX/DGX board or an
  8-GPU Instinct platform, 72 in a GB200/GB300 NVL72 rack, whose 72 GPUs share one NVLink
  switch domain across 18 trays. Traffic to GPUs beyond it (an expert-parallel all-to-all over
  more ranks) takes the scale-out network at ``scaleout_bandwidth_bytes_s`` per GPU per
  direction. Default: 8 GPUs and one 400 Gb/s NIC per GPU (50 GB/s), as in NVIDIA's DGX
  H100/H200 (8 × ConnectX-7 400 Gb/s for the compute fabric, DGX H100/H200 user guide,
  "Hardware overview"); DGX A100 has 8 × ConnectX-6 200 Gb/s.
* Sources: each entry cites its vendor datasheet. For the Blackwell (B200, B300, GB200, GB300)
  and CDNA 3/4 (MI325X, MI355X) entries the figures were taken from the datasheets' tables as
  third parties reproduce them (glennklockwood.com/garden/processors/B200 and /B300, which give
  the dense and sparse columns of NVIDIA's HGX B200/B300 tables; The Register, 2025-06-12, and
  AMD's ISSCC 2026 paper as reported, for the MI355X's dense FP4 and FP8), and cross-checked with
  AIConfigurator's system files (aiconfigurator-core 0.12.0, systems/*.yaml); where these
  disagree the entry's comment says so.
* ``price_usd_per_hour`` is a typical on-demand cloud price per GPU, for cost comparisons only;
  prices change often, check the source. 0 where no price is cited (``kvplan capacity --price``
  supplies one; without it the cost columns stay empty).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from simulator.errors import KvplanError

_GIB = 2**30
_MIB = 2**20
_PCIE4_BYTES_S = 32e9  # PCIe 4.0 x16, per direction
_PCIE5_BYTES_S = 64e9  # PCIe 5.0 x16, per direction
_NVLINK5_BYTES_S = 900e9  # NVLink 5: 1.8 TB/s per GPU bidirectional (Blackwell datasheets)
_BLACKWELL_FP4 = ("nvfp4", "mxfp4")  # 5th-gen tensor cores: NVFP4 and MXFP4 block scaling


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator's datasheet numbers (see the module docstring for the conventions)."""

    name: str
    hbm_bytes: int
    hbm_bandwidth_bytes_s: float
    dense_bf16_flops: float
    dense_fp8_flops: float  # 0 if the GPU has no fp8 tensor cores
    interconnect_bandwidth_bytes_s: float  # NVLink / xGMI per GPU per direction, else PCIe
    pcie_bandwidth_bytes_s: float  # host link per direction (KV swap traffic)
    price_usd_per_hour: float
    # Dense int8 tensor-core ops/s (TOPS × 1e12), what W8A8 int8 GEMMs run at; 0 = none.
    dense_int8_ops: float = 0.0
    gpus_per_node: int = 8  # GPUs on one fabric: the NVLink domain (module docstring)
    scaleout_bandwidth_bytes_s: float = 50e9  # per GPU per direction beyond the node
    # Dense FP4 tensor-core FLOP/s, what W4A4 GEMMs in one of ``fp4_formats`` run at; 0 = none.
    dense_fp4_flops: float = 0.0
    fp4_formats: tuple[str, ...] = ()  # "nvfp4", "mxfp4": the FP4 block formats they take
    reported_bytes: int = 0  # total memory as the driver reports it (module docstring); 0: none cited

    @property
    def hbm_gib(self) -> float:
        return self.hbm_bytes / _GIB

    @property
    def total_memory_bytes(self) -> int:
        """The memory an engine sizes its pool from: the driver's total where a reading is cited,
        else the datasheet's (module docstring)."""
        return self.reported_bytes or self.hbm_bytes

    @property
    def total_memory_gib(self) -> float:
        return self.total_memory_bytes / _GIB


_CATALOG: tuple[GPUSpec, ...] = (
    # NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4): 40 GB HBM2 1,555 GB/s,
    # BF16 312 TFLOPS dense, NVLink 3 600 GB/s, PCIe 4.0. Price: Lambda on-demand 1x A100 40GB
    # SXM4, $1.29/GPU-h (lambda.ai/pricing, 2025).
    # INT8 624 TOPS dense (1,248 with sparsity), same datasheet.
    # Reported: 42,298,834,944 bytes (39.39 GiB), deviceQuery on an A100-SXM4-40GB, CUDA 12.2
    # (github.com/bottlerocket-os/bottlerocket/pull/3873); another deviceQuery shows 40,441 MiB
    # (39.49 GiB; upb-pc2.atlassian.net, "NVIDIA A100 40GB with NVLINK"): drivers differ.
    GPUSpec("A100-40GB", 40 * _GIB, 1.555e12, 312e12, 0.0, 300e9, _PCIE4_BYTES_S, 1.29,
            dense_int8_ops=624e12, scaleout_bandwidth_bytes_s=25e9, reported_bytes=42_298_834_944),
    # Same datasheet, 80 GB HBM2e 2,039 GB/s. Price: Lambda 8x A100 80GB SXM4, $1.79/GPU-h (2025).
    # Reported: 85,100,068,864 bytes (79.26 GiB), deviceQuery on 4 × A100-SXM4-80GB, CUDA 12.5
    # (github.com/thamada/nvidia-smi, gls/A100SXMx4_deviceQuery.py).
    GPUSpec("A100-80GB", 80 * _GIB, 2.039e12, 312e12, 0.0, 300e9, _PCIE4_BYTES_S, 1.79,
            dense_int8_ops=624e12, scaleout_bandwidth_bytes_s=25e9, reported_bytes=85_100_068_864),
    # NVIDIA H100 datasheet (SXM5): 80 GB HBM3 3.35 TB/s, BF16 989 TFLOPS and FP8 1,979 TFLOPS
    # dense (half the "with sparsity" figures), NVLink 4 900 GB/s, PCIe 5.0.
    # Price: Lambda 8x H100 SXM, $2.99/GPU-h (lambda.ai/pricing, 2025).
    # INT8 1,979 TOPS dense (3,958 with sparsity), same datasheet.
    # Reported: 85,045,477,376 bytes (79.20 GiB), deviceQuery on 8 × "NVIDIA H100 80GB HBM3",
    # CUDA 12.7 (github.com/thamada/nvidia-smi, nvsim/H100SXMx8_deviceQuery.py); vLLM's start-up
    # logs on H100s give 79.18 GiB (github.com/llm-d/llm-d-benchmark,
    # config_explorer/empirical-vllm-memory-results.md).
    GPUSpec("H100-80GB", 80 * _GIB, 3.35e12, 989.4e12, 1978.9e12, 450e9, _PCIE5_BYTES_S, 2.99,
            dense_int8_ops=1978.9e12, reported_bytes=85_045_477_376),
    # NVIDIA H200 product page (SXM): 141 GB HBM3e 4.8 TB/s, same tensor cores as H100,
    # NVLink 900 GB/s. Price: RunPod on-demand H200 SXM, $3.99/GPU-h (runpod.io/pricing, 2025).
    # INT8 3,958 TOPS with sparsity (H200 datasheet), 1,979 dense.
    # Reported: total_memory=143156MB (MiB; 139.80 GiB), torch.cuda.get_device_properties on an
    # "NVIDIA H200" (github.com/ai-bot-pro/achatbot, deploy/modal/src/llm/vllm/vlm/skywork_r1v.py);
    # nvidia-smi shows 143,771 MiB (github.com/NVIDIA/cuda-samples/issues/311).
    GPUSpec("H200-141GB", 141 * _GIB, 4.8e12, 989.4e12, 1978.9e12, 450e9, _PCIE5_BYTES_S, 3.99,
            dense_int8_ops=1978.9e12, reported_bytes=143_156 * _MIB),
    # NVIDIA L4 datasheet: 24 GB GDDR6 300 GB/s, BF16 242 / FP8 485 TFLOPS with sparsity (so
    # 121 / 242.5 dense), PCIe 4.0 x16 only. Price: Google Cloud g2-standard-4 (1x L4),
    # ~$0.71/h in us-central1 (cloud.google.com/compute/gpus-pricing, 2025).
    # INT8 485 TOPS with sparsity (same datasheet), 242.5 dense.
    # Reported: 23,583,784,960 bytes (21.96 GiB), deviceQuery on an L4, CUDA 12.2
    # (github.com/bottlerocket-os/bottlerocket-kernel-kit/pull/139).
    GPUSpec("L4", 24 * _GIB, 300e9, 121e12, 242.5e12, _PCIE4_BYTES_S, _PCIE4_BYTES_S, 0.71,
            dense_int8_ops=242.5e12, reported_bytes=23_583_784_960),
    # NVIDIA A10G (AWS's A10 variant): 24 GB GDDR6 600 GB/s, ~70 TFLOPS FP16/BF16 tensor
    # (baseten.co "NVIDIA A10 vs A10G for ML model inference"), PCIe 4.0, no fp8.
    # Price: AWS g5.xlarge on-demand, $1.006/h in us-east-1 (aws.amazon.com/ec2/pricing, 2025).
    # No int8 figure is published for the A10G; Ampere's int8 tensor rate is twice its FP16
    # one on every datasheet (A10 125 / 250, A100 312 / 624), so 2 × 70 = 140 TOPS, derived.
    GPUSpec("A10G", 24 * _GIB, 600e9, 70e12, 0.0, _PCIE4_BYTES_S, _PCIE4_BYTES_S, 1.006,
            dense_int8_ops=140e12),
    # NVIDIA Ada Lovelace architecture whitepaper, appendix (GeForce RTX 4090): 24 GB GDDR6X
    # 1,008 GB/s; BF16 165.2 and FP8 330.3 TFLOPS dense with FP32 accumulate; no NVLink.
    # Price: RunPod secure cloud RTX 4090, $0.69/h (runpod.io/pricing, 2025).
    # Same appendix: INT8 660.6 TOPS dense (1,321.2 with sparsity).
    # Reported: 25,386,352,640 bytes (23.64 GiB), deviceQuery on an RTX 4090, CUDA 12.4
    # (github.com/thamada/nvidia-smi, gls/RTX4090_deviceQuery.py).
    GPUSpec("RTX-4090", 24 * _GIB, 1.008e12, 165.2e12, 330.3e12, _PCIE4_BYTES_S,
            _PCIE4_BYTES_S, 0.69, dense_int8_ops=660.6e12, reported_bytes=25_386_352_640),
    # AMD Instinct MI300X product page: 192 GB HBM3 5.3 TB/s, BF16 1,307.4 and FP8 2,614.9
    # TFLOPS dense, Infinity Fabric 896 GB/s peak aggregate (448 each way), PCIe 5.0.
    # Price: RunPod on-demand MI300X, $2.49/GPU-h (runpod.io/pricing, 2025).
    # Same page: INT8 2,614.9 TOPS dense (5,229.8 with sparsity).
    # Reported: 196,592 MiB (191.98 GiB), the HIP device query on an MI300X
    # (github.com/thamada/nvidia-smi, package/MI300X_deviceQuery.py), as PyTorch on ROCm prints
    # it too (total_memory=196592MB).
    GPUSpec("MI300X", 192 * _GIB, 5.3e12, 1307.4e12, 2614.9e12, 448e9, _PCIE5_BYTES_S, 2.49,
            dense_int8_ops=2614.9e12, reported_bytes=196_592 * _MIB),
    # NVIDIA Blackwell datasheet, HGX B200 (8 GPUs; every tensor-core figure "with sparsity"):
    # FP4 144 PFLOPS, FP8/FP6 72, INT8 72 POPS, FP16/BF16 36 -> per GPU and dense (halved) FP4
    # 9,000, FP8 4,500, INT8 4,500, BF16 2,250 TFLOPS; 1.4 TB HBM3e, which the DGX B200 datasheet
    # gives as 1,440 GB = 180 GB per GPU (the package carries 192 GB; 180 is the capacity the
    # platform datasheets give), 64 TB/s = 8 TB/s per GPU; NVLink 5 1.8 TB/s per
    # GPU (14.4 TB/s per board). Host link PCIe 5.0 x16 (the DGX B200's Xeon hosts are PCIe
    # Gen5); scale-out 8 × ConnectX-7 400 Gb/s (DGX B200 datasheet). Cross-check (AIConfigurator
    # systems/b200_sxm.yaml, Apache-2.0): the same peaks and 180 GiB, but 7.7 TB/s and PCIe 6.0.
    # Price: Lambda on-demand 8x B200 SXM6, $4.99/GPU-h (lambda.ai/pricing, 2025).
    # Reported: total_memory=182642MB (MiB; 178.36 GiB), torch.cuda.get_device_properties on an
    # "NVIDIA B200" (github.com/ai-bot-pro/achatbot, deploy/modal/src/llm/vllm/vlm/
    # skywork_r1v.py); a CUDA query prints 182,631 MiB (github.com/pytorch/ao/pull/4002).
    GPUSpec("B200-180GB", 180 * _GIB, 8.0e12, 2250e12, 4500e12, _NVLINK5_BYTES_S, _PCIE5_BYTES_S,
            4.99, dense_int8_ops=4500e12, dense_fp4_flops=9000e12, fp4_formats=_BLACKWELL_FP4,
            reported_bytes=182_642 * _MIB),
    # NVIDIA Blackwell Ultra datasheet, HGX B300 (8 GPUs): FP4 144 PFLOPS with sparsity, 105
    # PFLOPS without (Blackwell Ultra's FP4 is quoted both ways) -> 13,125 TFLOPS dense per GPU;
    # FP8/FP6 72 PFLOPS, FP16/BF16 36 PFLOPS, INT8 2 POPS, all with sparsity -> 4,500, 2,250 and
    # 125 TOPS dense per GPU (Blackwell Ultra cut INT8); 288 GB HBM3e per GPU (2.3 TB per
    # board), 8 TB/s; NVLink 5 1.8 TB/s; scale-out 8 × ConnectX-8 800 Gb/s = 100 GB/s per GPU
    # (1.6 TB/s networking per board); host link PCIe 5.0 x16 (x86 hosts; the GPU is PCIe Gen6).
    # Cross-check (AIConfigurator systems/b300_sxm.yaml): BF16 2,250 and FP8 4,500 TFLOPS, but
    # FP4 14 PFLOPS, INT8 153.5 TOPS and 7.75 TB/s dense; its memory, 275,040 MiB as nvidia-smi
    # reports it (268.6 GiB), is 7% under the 288 GiB this catalog's convention reads.
    # Price: $10.31/GPU-h, North-America blended spot/on-demand/reserved average (signwl.com GPU
    # market pulse, week of 2026-04-06): no on-demand list price is cited.
    # Reported: nvidia-smi's 275,040 MiB (AIConfigurator systems/b300_sxm.yaml), no driver reading.
    GPUSpec("B300-288GB", 288 * _GIB, 8.0e12, 2250e12, 4500e12, _NVLINK5_BYTES_S, _PCIE5_BYTES_S,
            10.31, dense_int8_ops=125e12, scaleout_bandwidth_bytes_s=100e9,
            dense_fp4_flops=13125e12, fp4_formats=_BLACKWELL_FP4, reported_bytes=275_040 * _MIB),
    # NVIDIA Blackwell datasheet, GB200 NVL72 (36 Grace : 72 Blackwell GPUs in one NVLink
    # domain; tensor-core figures with sparsity): FP4 1,440 PFLOPS, FP8/FP6 720, INT8 720 POPS,
    # FP16/BF16 360 -> per GPU dense FP4 10,000, FP8 5,000, INT8 5,000, BF16 2,500 TFLOPS (above
    # HGX B200's: the superchip's GPU has a higher power limit); up to 13.4 TB HBM3e at
    # 576 TB/s -> 186 GB and 8 TB/s per GPU; NVLink 5 130 TB/s = 1.8 TB/s per GPU across all
    # 72. Host link: the superchip's NVLink-C2C, 900 GB/s bidirectional between Grace and its
    # two GPUs -> 225 GB/s per GPU per direction (derived). Scale-out: the default one
    # 400 Gb/s NIC per GPU. Cross-check (AIConfigurator systems/gb200.yaml): the same peaks,
    # 8 TB/s, 189,471 MiB as nvidia-smi reports it (185.0 GiB), 72 GPUs per rack on NVLink.
    # Price: $12.47/GPU-h, North-America blended average (signwl.com, week of 2026-04-06).
    # Reported: nvidia-smi's 189,471 MiB (AIConfigurator systems/gb200.yaml), no driver reading.
    GPUSpec("GB200", 186 * _GIB, 8.0e12, 2500e12, 5000e12, _NVLINK5_BYTES_S, 225e9, 12.47,
            dense_int8_ops=5000e12, gpus_per_node=72, dense_fp4_flops=10000e12,
            fp4_formats=_BLACKWELL_FP4, reported_bytes=189_471 * _MIB),
    # NVIDIA Blackwell Ultra datasheet, GB300 NVL72 (72 Blackwell Ultra GPUs in one NVLink
    # domain): FP4 1,440 PFLOPS with sparsity | 1,080 without -> 15,000 TFLOPS dense per GPU;
    # FP8/FP6 720 PFLOPS, FP16/BF16 360, INT8 24 POPS, with sparsity -> 5,000, 2,500 and 166.7
    # TOPS dense per GPU; 288 GB HBM3e per GPU (up to 20 TB per rack) at 576 TB/s = 8 TB/s;
    # NVLink 5 130 TB/s (1.8 TB/s per GPU); 72 ConnectX-8 800 Gb/s = 100 GB/s per GPU. Host
    # link: NVLink-C2C as GB200 (225 GB/s per GPU per direction, derived). Cross-check
    # (AIConfigurator systems/gb300.yaml): FP4 15, FP8 5, BF16 2.5 PFLOPS, INT8 165 TOPS,
    # 8 TB/s; 284,208 MiB as nvidia-smi reports it (277.5 GiB).
    # Price: $12.32/GPU-h, North-America blended average (signwl.com, week of 2026-04-06).
    # Reported: nvidia-smi's 284,208 MiB (AIConfigurator systems/gb300.yaml), no driver reading.
    GPUSpec("GB300", 288 * _GIB, 8.0e12, 2500e12, 5000e12, _NVLINK5_BYTES_S, 225e9, 12.32,
            dense_int8_ops=166.7e12, gpus_per_node=72, scaleout_bandwidth_bytes_s=100e9,
            dense_fp4_flops=15000e12, fp4_formats=_BLACKWELL_FP4, reported_bytes=284_208 * _MIB),
    # AMD Instinct MI325X data sheet: 256 GB HBM3E 6 TB/s, FP16/BF16 1,307.4 and FP8 2,614.9
    # TFLOPS dense (2,614.9 / 5,229.8 with sparsity), INT8 2,614.9 TOPS dense; CDNA 3, no FP4;
    # Infinity Fabric 896 GB/s peak aggregate (448 each way), PCIe 5.0 x16. ROCm's GPU
    # specifications table lists 256 GiB VRAM.
    # Price: TensorWave on-demand MI325X, $1.95/GPU-h (as quoted by cliffcenter.com, "AMD
    # inference economics", 2026-05-18).
    GPUSpec("MI325X", 256 * _GIB, 6.0e12, 1307.4e12, 2614.9e12, 448e9, _PCIE5_BYTES_S, 1.95,
            dense_int8_ops=2614.9e12),
    # AMD Instinct MI355X data sheet: 288 GB HBM3E 8 TB/s; FP16/BF16 2,516.6, FP8 5,033.2 and
    # MXFP6/MXFP4 10,066.3 TFLOPS dense (FP16/FP8 double with sparsity; MXFP4 is quoted without
    # it), INT8 5,033.2 TOPS dense; Infinity Fabric 7 links × 153.6 GB/s = 1,075.2 GB/s
    # aggregate (537.6 each way); PCIe 5.0 x16. CDNA 4 takes OCP MX FP4 (E8M0 scales), not NVFP4.
    # ROCm's GPU specifications table lists 288 GiB VRAM. Price: none cited (0).
    GPUSpec("MI355X", 288 * _GIB, 8.0e12, 2516.6e12, 5033.2e12, 537.6e9, _PCIE5_BYTES_S, 0.0,
            dense_int8_ops=5033.2e12, dense_fp4_flops=10066.3e12, fp4_formats=("mxfp4",)),
)

# Short names people type; keys are normalized by _normalize.
_ALIASES: dict[str, str] = {
    "a100": "A100-80GB", "a100sxm": "A100-80GB", "a100sxm80gb": "A100-80GB",
    "a100sxm40gb": "A100-40GB",
    "h100": "H100-80GB", "h100sxm": "H100-80GB", "h100sxm5": "H100-80GB",
    "h100sxm80gb": "H100-80GB",
    "h200": "H200-141GB", "h200sxm": "H200-141GB",
    "nvidial4": "L4", "a10": "A10G",
    "4090": "RTX-4090", "geforcertx4090": "RTX-4090",
    "mi300": "MI300X", "instinctmi300x": "MI300X",
    "b200": "B200-180GB", "b200sxm": "B200-180GB", "b200sxm6": "B200-180GB",
    "hgxb200": "B200-180GB", "dgxb200": "B200-180GB",
    "b300": "B300-288GB", "b300sxm": "B300-288GB", "hgxb300": "B300-288GB",
    "dgxb300": "B300-288GB", "blackwellultra": "B300-288GB",
    "gb200nvl72": "GB200", "gb200nvl": "GB200", "gb300nvl72": "GB300", "gb300nvl": "GB300",
    "mi325": "MI325X", "instinctmi325x": "MI325X", "mi355": "MI355X", "instinctmi355x": "MI355X",
}


# Each GPU's architecture (the chip generation its tensor cores and memory system come from),
# as its vendor names it: NVIDIA's architecture whitepapers (Ampere GA100/GA102, Ada AD102/AD104,
# Hopper GH100, Blackwell GB100/GB110 with Blackwell Ultra in B300/GB300) and AMD's CDNA 3
# (MI300X, MI325X) and CDNA 4 (MI355X) whitepapers. The roofline's fitted constants may differ by
# architecture (simulator/latency/constants.py: a GPU takes its architecture's set, where one was
# fitted, else the global set).
ARCHITECTURE: dict[str, str] = {
    "A100-40GB": "ampere", "A100-80GB": "ampere", "A10G": "ampere",
    "L4": "ada", "RTX-4090": "ada",
    "H100-80GB": "hopper", "H200-141GB": "hopper",
    "B200-180GB": "blackwell", "B300-288GB": "blackwell", "GB200": "blackwell", "GB300": "blackwell",
    "MI300X": "cdna3", "MI325X": "cdna3", "MI355X": "cdna4",
}


def architecture(gpu: GPUSpec | str) -> str:
    """The GPU's architecture (:data:`ARCHITECTURE`); "" for a GPU outside the catalog."""
    return ARCHITECTURE.get(gpu if isinstance(gpu, str) else gpu.name, "")


def _normalize(name: str) -> str:
    """Case, spaces, dashes and underscores do not matter: "H100_80GB" == "h100-80gb"."""
    return re.sub(r"[\s_\-]", "", name.lower())


_BY_KEY: dict[str, GPUSpec] = {_normalize(gpu.name): gpu for gpu in _CATALOG}
_BY_KEY.update({alias: _BY_KEY[_normalize(name)] for alias, name in _ALIASES.items()})


def list_gpus() -> tuple[str, ...]:
    """Names of the catalog's GPUs."""
    return tuple(gpu.name for gpu in _CATALOG)


def get_gpu(name: str) -> GPUSpec:
    """The GPU called ``name`` (case-insensitive; aliases such as ``h100``, ``a100`` (the 80 GB
    model), ``4090``). Unknown -> KvplanError with a suggestion."""
    key = _normalize(name)
    gpu = _BY_KEY.get(key)
    if gpu is None:
        close = difflib.get_close_matches(key, list(_BY_KEY), n=1, cutoff=0.6)
        hint = f" — did you mean '{_BY_KEY[close[0]].name}'?" if close else ""
        raise KvplanError(f"unknown GPU '{name}'{hint} (known: {', '.join(list_gpus())})")
    return gpu
