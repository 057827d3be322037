"""The configuration a probe measures and the rules it must keep: knobs, invariants, YAML validation, whose
training passes."""

__all__ = [
    "knobs",
    "lengths",
    "numbers",
    "passes",
    "rules",
    "schema",
]
