"""docs/design.md's module map names every module of the tree, in its own package: a reader who looks a module
up there finds it, and a module added without a word in the map fails here."""

from __future__ import annotations

import re

from tests.conftest import REPO

PACKAGE_LINE = re.compile(r"^(?P<indent> +)(?P<name>\w+)/(\s|$)")


def module_map() -> dict[str, str]:
    """{package path (`autotune`, `autotune/probe/rank`): the map's text for it}."""
    text = (REPO / "docs" / "design.md").read_text()
    block = next(b for b in text.split("\n```\n") if b.startswith("autotune/"))
    texts: dict[str, str] = {"autotune": ""}
    stack: list[tuple[int, str]] = [(0, "autotune")]
    for line in block.splitlines()[1:]:
        if line and not line.startswith(" "):  # runners/, search_spaces/, bench/: outside autotune/
            break
        found = PACKAGE_LINE.match(line)
        if found:
            indent = len(found["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = f"{stack[-1][1]}/{found['name']}"
            stack.append((indent, path))
            texts[path] = line[found.end() :]
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent <= 2:  # a module of autotune/ itself (`  cli.py ...`)
            stack = [(0, "autotune")]
        texts[stack[-1][1]] = texts.get(stack[-1][1], "") + " " + line
    return texts


def test_the_module_map_names_every_module_in_its_package():
    texts = module_map()
    missing = []
    for module in sorted((REPO / "autotune").rglob("*.py")):
        if module.name == "__init__.py" or "__pycache__" in module.parts:
            continue
        package = module.parent.relative_to(REPO).as_posix()
        if not re.search(rf"(?<![\w.]){re.escape(module.name)}", texts.get(package, "")):
            missing.append(module.relative_to(REPO).as_posix())
    assert missing == []


def test_the_map_names_no_module_that_is_gone():
    gone = []
    for package, text in module_map().items():
        for name in re.findall(r"(?<![\w./])(\w+\.py)\b", text):
            if not (REPO / package / name).exists():
                gone.append(f"{package}/{name}")
    assert gone == []
