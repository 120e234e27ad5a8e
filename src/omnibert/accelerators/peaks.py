"""Peak FLOP/s of the devices, the denominator of MFU (model FLOPs utilisation).

:data:`PEAK_BF16` is the dense bf16 tensor-core peak of NVIDIA GPUs by a fragment of the name
``torch.cuda.get_device_name`` reports (NVIDIA's data sheets, without sparsity). The first
fragment found in the name wins, so the longer names come before the ones they contain
("H100 PCIe" before "H100", "A10G" before "A10"). MFU is measured against this figure
whatever the training precision (an fp32 or fp8 run's MFU is on the bf16 peak too), as the
GPU benchmark and the throughput callback both report it. No vendor SDK: the name is
torch's.
"""

from __future__ import annotations

import torch

__all__ = ["PEAK_BF16", "device_peak_flops", "peak_for_name"]

#: dense bf16 tensor-core peak FLOP/s by device-name fragment (first match wins)
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("V100", 125e12),  # fp16 tensor cores (V100 has no bf16)
)


def peak_for_name(name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``name`` (:data:`PEAK_BF16`), or ``None``."""
    return next((peak for fragment, peak in PEAK_BF16 if fragment in name), None)


def device_peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The dense bf16 peak of ``device`` and its name: ``(None, "cpu")`` off CUDA, ``None``
    for a GPU the table does not know."""
    if device.type != "cuda":
        return None, device.type
    name = torch.cuda.get_device_name(device)
    return peak_for_name(name), name
