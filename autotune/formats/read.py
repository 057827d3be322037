"""Read any config file autotune knows: the seed schema (the article's YAML, best_config.yaml) or verl
overrides.

    target = read_target(Path("best_config.yaml"))     # or verl_overrides.txt
    target.config, target.sharding, target.findings     # findings: unknown keys and the like

A file that cannot be read as either format, a knob of the wrong type, or a missing batch knob is a
UserError (exit 2): nothing can be checked. An unknown key is a finding: the file is readable, and a typo must
not hide the other problems.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from autotune.errors import UserError
from autotune.formats.seed_yaml import read_seed
from autotune.formats.target import Target, looks_like_overrides
from autotune.formats.verl import read_overrides

__all__ = ["read_target"]


def read_target(path: Path) -> Target:
    """A seed-schema YAML or a verl override file; UserError when it is neither or cannot be used."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config '{path}' " + ("is a directory" if path.is_dir() else "does not exist"))
    text = path.read_text(encoding="utf-8", errors="replace")
    if looks_like_overrides(text):
        return read_overrides(text)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"config '{path}' is not valid YAML: {reason}") from None
    if not isinstance(data, dict):
        raise UserError(
            f"config '{path}' is neither best_config.yaml's schema (a mapping of knobs) nor verl "
            f"overrides (key=value lines)"
        )
    return read_seed(data, path)
