"""Whose training passes a probe runs and the memory model prices: one name per schedule, and what each does.

`Passes.VERL` is verl's: packed rows of the data's own lengths, the rollout in vLLM's pool beside the
training side. `Passes.TRL` is the built-in probe's TRL-like one: padded rows, Hugging Face `generate` inside
the step. `Passes.TRL_FUSED` is TRL 1.16's own (`--engine trl`, a TRL file): padded rows and a fused LM head.
Code asks a schedule what it does (`packed`, `padded`, `fused_head`), not whose it is.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Passes"]


class Passes(StrEnum):
    """A training-pass schedule; its value is what studies and probe settings store."""

    VERL = "verl"
    TRL = "trl"
    TRL_FUSED = "trl_fused"

    @property
    def packed(self) -> bool:
        """Micro batches packed without padding, at the data's own lengths (verl's `use_remove_padding`)."""
        return self is Passes.VERL

    @property
    def padded(self) -> bool:
        """Every row padded to the batch's longest: priced at the length limits, whatever the data."""
        return not self.packed

    @property
    def fused_head(self) -> bool:
        """The LM head and the loss fused in tiles (TRL 1.16), so no whole logits tensor is held."""
        return self is Passes.TRL_FUSED
