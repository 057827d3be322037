"""Which device a probe runs on: `--device auto|cpu|cuda` against the GPUs this machine shows."""

from __future__ import annotations

from autotune.errors import UserError

__all__ = ["DEVICES", "device_label", "resolve_device"]

DEVICES = ("auto", "cpu", "cuda")


def device_label(device: str) -> str:
    """The device a study measures on: 'cpu', or 'cuda' with the card's name (timings of two cards differ)."""
    if device != "cuda":
        return device
    import torch

    return f"cuda {torch.cuda.get_device_name(0)}"


def resolve_device(requested: str, gpus: int) -> str:
    """'cuda' or 'cpu' ('auto': CUDA when a GPU is visible); too few GPUs for `gpus` ranks is a UserError."""
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = ("cuda" if available else "cpu") if requested == "auto" else requested
    if device == "cuda" and gpus > available:
        raise UserError(
            f"--gpus {gpus}: only {available} CUDA GPU(s) are visible here; use --gpus {max(available, 1)}"
            f"{' or --device cpu' if not available else ''}"
        )
    return device
