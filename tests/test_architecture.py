"""The package's import graph, read from the source (ast): no cycles, each stage imports only the stages below
it (docs/design.md, "Layout"), nothing imports the command line, and the tuner side never imports what runs
inside a probe rank (docs/design.md, "The process boundary")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
RANK = "autotune.probe.rank"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The package's modules a file imports, anywhere in it (functions included): `from a.b import c`
    names a.b.c when that is a module, else a.b."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> nx.DiGraph:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        for target in imported(ast.parse(path.read_text(), str(path)), set(files)):
            if target != name and not name.startswith(f"{target}."):  # a package's own __init__ is no edge
                graph.add_edge(name, target)
    return graph


GRAPH = import_graph()


def test_the_graph_sees_the_package():
    assert {"autotune.cli", "autotune.run.tuner", f"{RANK}.ppo"} <= set(GRAPH)
    assert GRAPH.has_edge("autotune.run.tuner", "autotune.search.policy")


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(GRAPH))
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles)


# The stages, lowest first: a package or top-level module imports its own modules and the layers below it,
# never a sibling in its own layer nor a layer above.
LAYERS = (
    ("errors",),  # one error base, with the exit codes
    ("units", "status", "files", "swap"),  # the vocabulary every stage shares
    ("config",),  # knobs and their rules
    ("models",),  # the registry of architectures
    ("data", "formats"),  # datasets' lengths; the file formats a config is read from and written to
    ("memory",),  # the memory model, budgets and the verdict on a config
    ("space", "probe"),  # propose: the space every sample is valid in; measure: the probe
    ("trainers",),  # each trainer's files, defaults, export checks and probe engine, behind one interface
    ("study",),  # record: the Optuna study, trials, outcomes, outages
    ("search", "report"),  # propose and decide (sampler, surrogate, policy); report (pick, gain, files)
    ("run",),  # the loop that drives them: `autotune run` and `autotune worker`
    ("check",),  # `autotune check`: a config file against the rules and the memory verdict
    ("commands",),  # each command's parser and entry point
    ("cli",),  # the entry point, the one-line error path and the registry walk
    ("__main__",),
)
LAYER = {stage: index for index, stages in enumerate(LAYERS) for stage in stages}


def stage(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_every_stage_is_in_the_layer_order():
    assert {stage(name) for name in GRAPH if name != "autotune"} <= set(LAYER)


def test_each_stage_imports_only_the_stages_below_it():
    upward = sorted(
        f"{source} -> {target}"
        for source, target in GRAPH.edges
        if stage(source) != stage(target) and LAYER[stage(target)] >= LAYER[stage(source)]
    )
    assert upward == [], "imports against the stage order (docs/design.md, Layout): " + "; ".join(upward)


def test_nothing_imports_the_command_line():
    importers = sorted(GRAPH.predecessors("autotune.cli"))
    assert importers == ["autotune.__main__"], f"only the entry point may import autotune.cli: {importers}"


def test_the_tuner_side_never_imports_a_rank_side_module():
    crossing = sorted(
        (source, target)
        for source, target in GRAPH.edges
        if target.startswith(RANK) and not source.startswith(RANK)
    )
    assert crossing == [], f"tuner-side modules importing probe-rank modules: {crossing}"


def test_every_module_says_what_it_offers():
    missing = sorted(
        name
        for name, path in ((module_name(p), p) for p in PACKAGE.rglob("*.py"))
        if name not in ("autotune.__main__",) and "__all__" not in path.read_text()
    )
    assert missing == [], f"modules without __all__: {missing}"


def test_each_package_lists_its_modules():
    """A package's `__all__` names its modules and subpackages, no more and no fewer (the commands package
    also offers its registry)."""
    drifted = {}
    for init in PACKAGE.rglob("__init__.py"):
        folder = init.parent
        modules = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
        modules |= {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()}
        listed = next(
            {element.value for element in node.value.elts}
            for node in ast.parse(init.read_text()).body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and getattr(node.targets[0] if isinstance(node, ast.Assign) else node.target, "id", "")
            == "__all__"
        )
        if listed - {"COMMANDS"} != modules:
            drifted[module_name(init)] = sorted(listed ^ modules)
    assert drifted == {}, f"__all__ differs from the package's modules: {drifted}"


def test_optunas_private_storage_api_is_used_in_one_module():
    """Optuna has no public call for a trial's id, a heartbeat now, or a write by id: study/optuna_private.py
    says why and is the one place that reaches in."""
    private = re.compile(r"\._(trial_id|storage|study_id)\b")
    found = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if path.name != "optuna_private.py" and private.search(path.read_text())
    )
    assert found == [], f"Optuna's private storage API outside study/optuna_private.py: {found}"
