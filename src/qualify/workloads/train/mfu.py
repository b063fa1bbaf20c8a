"""Peak dense FLOP/s per (device, dtype), and MFU.

MFU = achieved model FLOP/s per device / peak FLOP/s of the device for the dtype the
matmuls run in. An unknown (device, dtype) pair has no peak: MFU is then None with a
reason, never a guess (a wrong fallback peak once reported 563% MFU elsewhere; dividing an
fp32 run by the bf16 peak understates it 2-15x). A CPU is always unknown unless the case
gives peak_flops_per_device (the manifest's training setting).

The dtype of the peak:
* "bf16", "fp16": the tensor-core figure of that type;
* "tf32": fp32 training whose matmuls PyTorch lets run in TF32
  (torch.backends.cuda.matmul.allow_tf32, or set_float32_matmul_precision("high"/"medium"));
* "fp32": fp32 training with full-precision matmuls (PyTorch's default since 1.12): the
  non-tensor FP32 figure.

Standard library only (peak_dtype takes torch as an argument).
"""

from __future__ import annotations

# (device key, dtype) -> dense FLOP/s WITHOUT sparsity. The device key is a sequence of
# words of torch.cuda.get_device_name() (lower case, '-'/'_' read as spaces); a name
# matches a key when the key's words appear in it consecutively, and the key with the
# most words wins ("h100 pcie" over "h100"). Data sheets print the tensor-core figures
# "with sparsity": the dense figure is half of that (the data sheets' own footnote).
_SXM_H = {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12}   # H100/H200/H800 SXM
_NVL_H = {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835e12, "fp16": 835e12}   # H100 NVL / H200 NVL
_PCIE_H = {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12}    # H100 PCIe / H800 PCIe
_A100 = {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}    # A100 / A800 SXM and PCIe

_DEVICES: dict[str, dict[str, float | None]] = {
    # NVIDIA H100 Tensor Core GPU data sheet (H100 SXM column): FP32 67 TFLOPS, TF32 989*,
    # BF16 1,979*, FP16 1,979* TFLOPS (* with sparsity). torch names it "NVIDIA H100 80GB HBM3".
    "h100": _SXM_H,
    # Same data sheet, H100 PCIe column: FP32 51, TF32 756*, BF16 1,513*, FP16 1,513*.
    "h100 pcie": _PCIE_H,
    # Same data sheet, H100 NVL column (per GPU): FP32 60, TF32 835*, BF16 1,671*, FP16 1,671*.
    "h100 nvl": _NVL_H,
    # NVIDIA H200 Tensor Core GPU data sheet, H200 SXM column: FP32 67, TF32 989*, BF16 1,979*.
    "h200": _SXM_H,
    # Same data sheet, H200 NVL column: FP32 60, TF32 835*, BF16 1,671*, FP16 1,671*.
    "h200 nvl": _NVL_H,
    # NVIDIA H800 data sheet: H800 SXM5 as H100 SXM (FP32 67, TF32 989*, BF16 1,979*);
    # H800 PCIe as H100 PCIe (FP32 51, TF32 756*, BF16 1,513*).
    "h800": _SXM_H,
    "h800 pcie": _PCIE_H,
    # NVIDIA H20 data sheet: FP32 44, TF32 74, BF16 148, FP16 148 TFLOPS (dense).
    "h20": {"fp32": 44e12, "tf32": 74e12, "bf16": 148e12, "fp16": 148e12},
    # NVIDIA A100 Tensor Core GPU data sheet (SXM and PCIe alike): FP32 19.5, TF32 156 (312*),
    # BF16 312 (624*), FP16 312 (624*). A800: the same compute (NVIDIA A800 data sheet).
    "a100": _A100,
    "a800": _A100,
    # NVIDIA L40S data sheet: FP32 91.6, TF32 183 (366*), BF16 362.05 (733*), FP16 362.05 (733*).
    "l40s": {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362.05e12, "fp16": 362.05e12},
    # T-Head PPU (the customer's accelerator): the vendor's dense figures are needed before MFU
    # can be reported; until then its MFU is null. Fill in from the data sheet, do not estimate.
    "ppu": {"fp32": None, "tf32": None, "bf16": None, "fp16": None},
}

PEAK_FLOPS: dict[tuple[str, str], float | None] = {
    (device, dtype): value for device, by_dtype in _DEVICES.items() for dtype, value in by_dtype.items()}
DTYPES = ("fp32", "tf32", "bf16", "fp16")


def _words(text: str) -> list[str]:
    return text.lower().replace("-", " ").replace("_", " ").split()


def _contains(words: list[str], key: list[str]) -> bool:
    n = len(key)
    return any(words[i:i + n] == key for i in range(len(words) - n + 1))


def device_key(device_name: str | None) -> str | None:
    """The table's device key for a device name (the longest matching key), or None."""
    if not device_name:
        return None
    words = _words(device_name)
    for key in sorted(_DEVICES, key=lambda k: len(k.split()), reverse=True):
        if _contains(words, key.split()):
            return key
    return None


def peak_entry(device_name: str | None, dtype: str) -> tuple[str, float] | None:
    """("<device key>/<dtype>", dense FLOP/s) for a device and dtype, or None when the pair is unknown."""
    key = device_key(device_name)
    if key is None:
        return None
    value = PEAK_FLOPS.get((key, dtype))
    return (f"{key}/{dtype}", value) if value else None


def lookup_peak(device_name: str | None, dtype: str) -> float | None:
    """Peak dense FLOP/s of a device for a dtype, or None when unknown."""
    entry = peak_entry(device_name, dtype)
    return entry[1] if entry else None


def peak_dtype(train_dtype: str, torch=None) -> str:
    """The dtype whose peak applies: fp32 training runs its matmuls in TF32 only when torch allows it."""
    if train_dtype != "fp32":
        return train_dtype
    if torch is not None:
        try:
            if torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest":
                return "tf32"
        except AttributeError:
            pass
    return "fp32"


def resolve_peak(*, manifest_peak: float | None, device_type: str, device_name: str | None,
                 dtype: str) -> dict[str, object]:
    """Which peak divides the achieved FLOP/s: {"peak", "source", "null_reason"}.

    The case's peak_flops_per_device (from the manifest) wins: source "manifest". Otherwise the
    table's (device, dtype) entry: source "table:<device>/<dtype>". Otherwise no peak, and the
    reason MFU is null.
    """
    if manifest_peak is not None:
        return {"peak": float(manifest_peak), "source": "manifest", "null_reason": None}
    if device_type != "cuda":
        return {"peak": None, "source": None,
                "null_reason": f"no peak FLOP/s for a {device_type} device (give peak_flops_per_device)"}
    entry = peak_entry(device_name, dtype)
    if entry is None:
        key = device_key(device_name)
        why = (f"device {device_name!r} is not in the peak table" if key is None
               else f"no {dtype} figure for {key} in the peak table")
        return {"peak": None, "source": None, "null_reason": why + " (give peak_flops_per_device)"}
    return {"peak": entry[1], "source": f"table:{entry[0]}", "null_reason": None}


def mfu(achieved_flops_per_device: float | None, peak: float | None) -> float | None:
    if achieved_flops_per_device is None or not peak or peak <= 0:
        return None
    return achieved_flops_per_device / peak
