"""The configuration a probe measures and the rules it must keep: knobs, invariants, YAML validation, whose
training passes."""

__all__ = [
    "checker",
    "job_lengths",
    "knobs",
    "numbers",
    "passes",
    "rules",
]
