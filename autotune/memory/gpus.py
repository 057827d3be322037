"""Known GPU cards and their memory, for `autotune check --gpu NAME`.

Memory is the total `nvidia-smi` reports (MiB / 1024), not the marketing figure: an "80 GB" H100 shows
81,559 MiB = 79.6 GiB. The CUDA context is not subtracted here: the memory model's constant accounts for it.

    gpu_memory_gib("A100-40GB")   # 40.0
"""

from __future__ import annotations

import difflib
import re

from autotune.errors import UserError

__all__ = ["gpu_memory_gib", "normalise"]

# name -> (GiB as nvidia-smi reports the total, what it is)
GPUS: dict[str, tuple[float, str]] = {
    "a100-40g": (40.0, "NVIDIA A100 40GB (SXM4/PCIe), 40,960 MiB"),
    "a100-80g": (80.0, "NVIDIA A100 80GB (SXM4/PCIe), 81,920 MiB"),
    "a800-80g": (80.0, "NVIDIA A800 80GB, 81,920 MiB"),
    "h100-80g": (79.6, "NVIDIA H100 80GB (SXM5/PCIe), 81,559 MiB"),
    "h800-80g": (79.6, "NVIDIA H800 80GB, 81,559 MiB"),
    "h100-94g": (93.6, "NVIDIA H100 NVL 94GB, 95,830 MiB"),
    "h20": (95.6, "NVIDIA H20 96GB, 97,871 MiB"),
    "h200": (140.4, "NVIDIA H200 141GB, 143,771 MiB"),
    "b200": (179.1, "NVIDIA B200 180GB, 183,359 MiB"),
    "l40s": (45.0, "NVIDIA L40S 48GB (ECC on), 46,068 MiB"),
    "l40": (45.0, "NVIDIA L40 48GB (ECC on), 46,068 MiB"),
    "l4": (22.5, "NVIDIA L4 24GB, 23,034 MiB"),
    "a10": (22.5, "NVIDIA A10 / A10G 24GB, 23,028 MiB"),
    "a6000": (48.0, "NVIDIA RTX A6000 48GB, 49,140 MiB"),
    "rtx3090": (24.0, "NVIDIA GeForce RTX 3090 24GB, 24,576 MiB"),
    "rtx4090": (24.0, "NVIDIA GeForce RTX 4090 24GB, 24,564 MiB"),
    "v100-16g": (16.0, "NVIDIA V100 16GB, 16,384 MiB"),
    "v100-32g": (32.0, "NVIDIA V100 32GB, 32,768 MiB"),
    "t4": (15.0, "NVIDIA T4 16GB, 15,360 MiB"),
}
ALIASES = {"a10g": "a10", "rtx-a6000": "a6000", "3090": "rtx3090", "4090": "rtx4090", "h200-141g": "h200"}


def normalise(name: str) -> str:
    """ "A100-40GB", "a100_40g", "RTX 3090" -> "a100-40g", "a100-40g", "rtx3090"."""
    text = name.strip().lower().replace("_", "-").replace(" ", "")
    text = re.sub(r"(\d+)gb$", r"\1g", text)
    text = re.sub(r"^(rtx)-?(\d)", r"\1\2", text)
    return ALIASES.get(text, text)


def gpu_memory_gib(name: str) -> float:
    """Total memory of a known card in GiB; an unknown name is a UserError listing the known ones."""
    key = normalise(name)
    if key in GPUS:
        return GPUS[key][0]
    close = difflib.get_close_matches(key, list(GPUS), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    raise UserError(f"unknown GPU {name!r}{guess}: use one of {', '.join(GPUS)}, or --memory-budget GiB")
