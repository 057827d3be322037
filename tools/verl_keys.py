"""Write every key of verl 0.9.1's composed trainer config to `autotune/formats/verl_keys.txt`.

`autotune check` reads a verl override file against that list: verl's Hydra config is in struct mode, so an
override of a key it does not have makes `python -m verl.trainer.main_ppo` fail at start-up, and a misspelt
key must be a finding, not silence. autotune never imports verl; this tool reads verl's config files (the
copy `./setup.sh test` installs in .venv-verl) with hydra-core, once, and the list ships with autotune.

    .venv/bin/python tools/verl_keys.py            # writes the list
    .venv/bin/python tools/verl_keys.py --check    # exit 1 if the shipped list differs from verl's config
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = next(iter(sorted(REPO.glob(".venv-verl/lib/python*/site-packages/verl/trainer/config"))), None)
OUT_FILE = REPO / "autotune" / "formats" / "verl_keys.txt"
HEADER = "# every key of verl 0.9.1's composed ppo_trainer config (tools/verl_keys.py writes this file)\n"


def verl_keys(config_dir: Path | None = CONFIG_DIR) -> list[str]:
    from hydra import compose, initialize_config_dir

    if config_dir is None:
        raise SystemExit("verl 0.9.1 is not installed in .venv-verl: run ./setup.sh test first")
    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
        return keys_of(compose("ppo_trainer"))


def keys_of(config) -> list[str]:
    """Every key path of a composed config, sorted; node by node, no interpolation resolved."""
    from omegaconf import DictConfig

    keys: list[str] = []

    def walk(node: DictConfig, prefix: str) -> None:
        for key in node:
            path = f"{prefix}{key}"
            keys.append(path)
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
                walk(child, f"{path}.")

    walk(config, "")
    return sorted(keys)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare with the shipped list instead")
    args = parser.parse_args()
    text = HEADER + "".join(f"{key}\n" for key in verl_keys())
    if args.check:
        same = OUT_FILE.read_text() == text
        print("verl_keys.txt matches verl 0.9.1's config" if same else "verl_keys.txt differs: regenerate it")
        return 0 if same else 1
    OUT_FILE.write_text(text)
    print(f"wrote {OUT_FILE} ({text.count(chr(10)) - 1} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
