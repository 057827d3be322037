"""What a peak is judged against: memory per GPU and the headroom kept below it, one type for the study's
budget and for the card `check` is asked about.

    Budget(int(40 * GIB)).limit                      # 36 GiB: feasible peaks stay at or below it
    Budget(int(24 * GIB), name="rtx3090").label      # "24 GiB (rtx3090)"
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config.knobs import DEFAULT_HEADROOM
from autotune.units import GIB

__all__ = ["Budget"]


@dataclass(frozen=True)
class Budget:
    bytes: int
    headroom: float = DEFAULT_HEADROOM
    name: str = "the study's budget"  # or the card: "a100-40g", "--memory-budget"

    @property
    def limit(self) -> float:
        """Feasible peaks stay at or below this: the budget less its headroom."""
        return self.bytes * (1.0 - self.headroom)

    @property
    def label(self) -> str:
        return f"{self.bytes / GIB:g} GiB ({self.name})"
