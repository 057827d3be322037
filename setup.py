"""Packages by discovery: every `autotune*` package, plus `runners/` and `search_spaces/`, which live at the
top of the checkout (launched by path and read as data) but ship inside the package as `autotune.runners` and
`autotune.search_spaces`, so that no generic top-level name is installed. The rest is in pyproject.toml."""

from setuptools import find_packages, setup

MAPPED = {"autotune.runners": "runners", "autotune.search_spaces": "search_spaces"}

setup(packages=[*find_packages(include=["autotune", "autotune.*"]), *MAPPED], package_dir=MAPPED)
