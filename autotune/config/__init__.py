"""The configuration a probe measures and the rules it must keep: knobs, invariants, YAML validation."""

__all__ = [
    "knobs",
    "lengths",
    "numbers",
    "passes",
    "rules",
    "schema",
]
