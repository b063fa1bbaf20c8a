"""Peak dense bf16 FLOP/s per device, and MFU.

MFU = achieved model FLOP/s per device / peak FLOP/s of the device. An unknown
device has no peak: MFU is then None, never a guess (a wrong fallback peak once
reported 563% MFU elsewhere). A CPU is always unknown unless the case gives
peak_flops_per_device.
"""

from __future__ import annotations

# (substring of torch.cuda.get_device_name(), lower case) -> dense bf16 FLOP/s without
# sparsity, from the vendors' data sheets. Longer keys are tried first, so "h100 pcie"
# wins over "h100".
PEAK_BF16_FLOPS: dict[str, float | None] = {
    "h100 pcie": 756e12,     # NVIDIA H100 PCIe data sheet
    "h100 nvl": 835e12,      # NVIDIA H100 NVL data sheet
    "h100": 989e12,          # H100 SXM5 (e.g. "NVIDIA H100 80GB HBM3")
    "h200": 989e12,          # H200 SXM (same GH100 tensor cores as H100 SXM)
    "h800": 989e12,          # H800 SXM
    "h20": 148e12,           # H20 data sheet
    "a100": 312e12,          # A100 SXM/PCIe
    "a800": 312e12,
    "l40s": 362e12,          # L40S data sheet, dense
    # T-Head PPU (the customer's accelerator): the vendor's dense bf16 figure is needed
    # before MFU can be reported; until then its MFU is null. Fill in, do not estimate.
    "ppu": None,
}


def lookup_peak(device_name: str | None) -> float | None:
    """Peak dense bf16 FLOP/s for a device name, or None when unknown."""
    if not device_name:
        return None
    name = device_name.lower()
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(achieved_flops_per_device: float | None, peak: float | None) -> float | None:
    if achieved_flops_per_device is None or not peak or peak <= 0:
        return None
    return achieved_flops_per_device / peak
