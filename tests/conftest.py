import contextlib
import gc
import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
# cpu-tiny's shape at a quarter of its work (probes of about 3 s): for e2e runs that need a few real probes
QUICK_SPACE = str(REPO / "tests" / "data" / "quick_space.yaml")
# cpu-tiny as it was until 2026-12-01 (240 configurations, a budget over half of them exceed): the grid the
# sampler's, the Optuna view's and verl's knobs' tests were written against
TINY_GRID = REPO / "tests" / "data" / "tiny_grid_space.yaml"
# verl 0.9.1's own environment (./setup.sh test makes it): the exports' referee, the trace's verl functions
VERL_PYTHON = Path(os.environ.get("AUTOTUNE_VERL_PYTHON", REPO / ".venv-verl" / "bin" / "python"))
ISSUE_EXAMPLE = [
    "--set",
    "train_batch_size=16",
    "--set",
    "rollout_batch_size=8",
    "--set",
    "micro_batch_size=4",
    "--set",
    "gradient_accumulation_steps=2",
    "--set",
    "max_prompt_length=32",
    "--set",
    "max_response_length=16",
]


# --- the fast tier ---------------------------------------------------------------------------------------
# `pytest -m "not e2e"` is the logic tier: it starts no process. A test that starts one (the CLI, a probe, the
# fork server, a database, a browser, a tokenizer training, DataLoader workers) must be marked e2e; this rule
# makes an unmarked one fail instead of relying on memory. Fixtures are covered too: they are set up inside
# the phases watched here.


def _refuse_processes(nodeid: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{nodeid} starts a process: mark it @pytest.mark.e2e (see tests/conftest.py)")

    return refuse


@contextlib.contextmanager
def _no_processes(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("e2e"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        refuse = _refuse_processes(item.nodeid)
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                patch.setattr(os, name, refuse)
        yield


def pytest_collection_modifyitems(config, items):
    """A `cuda` test starts the probe's processes on the GPU: it must be `e2e` too, or the fast tier would run
    it on a GPU machine (where it does not skip) and the process rule above would fail it.
    The order is the files' (`--dist loadfile` hands out whole files in it; check.sh turns xdist's own
    reordering off): the files with `first` tests, then the others, the most tests first, as xdist orders
    them. A `first` test mostly waits (a trainer's start-up): first, the rest of the suite runs beside it."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(
        files.values(),
        key=lambda tests: (not any(t.get_closest_marker("first") for t in tests), -len(tests)),
    )
    items[:] = [item for tests in ordered for item in tests]
    unmarked = [
        item.nodeid
        for item in items
        if item.get_closest_marker("cuda") and not item.get_closest_marker("e2e")
    ]
    if unmarked:
        raise pytest.UsageError(f"cuda tests must also be marked e2e: {', '.join(unmarked)}")


ALL_CORES = sorted(os.sched_getaffinity(0))  # before an xdist worker is pinned to its share


def pytest_configure(config):
    _pin_xdist_worker()


@pytest.fixture(autouse=True)
def _cores_asked(request) -> Iterator[None]:
    """A `cores(n)` test gets the machine's cores back for its duration (it shares them with the other
    worker, which only slows it); with fewer cores than n it skips and says why."""
    marker = request.node.get_closest_marker("cores")
    if marker is None:
        yield
        return
    if len(ALL_CORES) < marker.args[0]:
        pytest.skip(f"needs {marker.args[0]} cores; this machine has {len(ALL_CORES)}")
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, ALL_CORES)
    try:
        yield
    finally:
        os.sched_setaffinity(0, pinned)


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (`-n N`), give each worker its own share of the cores. Every process a test starts
    inherits it, and probes split only the cores they may run on (`usable_cores`): two workers' probes never
    compete for one core, where torch's spinning threads would turn a 3 s probe into a timeout."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return
    cores = sorted(os.sched_getaffinity(0))
    index = int(worker[2:])
    share = [core for position, core in enumerate(cores) if position % count == index % count]
    os.sched_setaffinity(0, share or cores)


def pytest_sessionstart(session):
    """matplotlib builds its font cache on first import and asks `fc-list` for the system's fonts where
    fontconfig is installed (Debian's chromium brings it): a process, which the fast tier refuses inside a
    test. Build the cache once, here, before any test runs."""
    with contextlib.suppress(ImportError):
        import matplotlib.font_manager  # noqa: F401


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, hypothesis, every test module: most of the heap) lives
    as long as the session. Frozen, the garbage collector's full passes skip it: each one during the tests,
    pytest's own at the end, and the interpreter's at exit scan only what the tests made."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _no_processes(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _no_processes(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    with _no_processes(item):
        yield


# --- helpers ---------------------------------------------------------------------------------------------


def run_cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real command line, in a child process, as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
    )


def wait_for(predicate: Callable[[], bool], timeout: float, every: float = 0.5) -> bool:
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def probe_json(*args: str, timeout: float = 600, own_process: bool = False) -> tuple[int, dict]:
    """`autotune probe --device cpu --json ARGS`: through the CLI's entry point in this process, or with
    `own_process` as a user types it. In this process the probe's ranks are still real processes, forked from
    this worker's fork server, which stays warm from one test to the next; a fresh `autotune` process imports
    torch and starts a server of its own first, about 8 s of every probe on two cores."""
    if own_process:
        proc = run_cli("probe", "--device", "cpu", "--json", *args, timeout=timeout)
        assert proc.stdout, proc.stderr
        return proc.returncode, json.loads(proc.stdout)
    from autotune.cli import main

    said = io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(said):
        code = main(["probe", "--device", "cpu", "--json", "--timeout-per-probe", f"{timeout:.0f}", *args])
    if code == 130:  # the CLI turns Ctrl-C into its exit code: here it must stop the test run
        raise KeyboardInterrupt
    assert said.getvalue(), f"autotune probe {' '.join(args)} printed nothing (exit {code})"
    return code, json.loads(said.getvalue())


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def cli_here(capsys, monkeypatch, tmp_path) -> Callable[..., subprocess.CompletedProcess]:
    """The CLI's entry point in this process, in a fresh folder: for what the CLI says before it starts any
    work (a one-line error, a parse). No interpreter start and no imports, so seconds become milliseconds; the
    result reads like `run_cli`'s. A path that starts a process fails in the fast tier (see above)."""
    from autotune.cli import main

    monkeypatch.chdir(tmp_path)

    def call(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = main(list(args))
        said = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, said.out, said.err)

    return call


# PostgreSQL for the tests that share one study between processes: `./setup.sh test` (as root) provisions a
# local server and writes its URL here; AUTOTUNE_TEST_POSTGRES names another server instead.
POSTGRES_URL_FILE = REPO / ".venv" / "postgres-url"
POSTGRES_ENV = "AUTOTUNE_TEST_POSTGRES"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A reachable PostgreSQL storage URL (SQLAlchemy form, e.g. ``postgresql+psycopg2://u:p@host:port/db``).

    From $AUTOTUNE_TEST_POSTGRES, else from .venv/postgres-url. Skips when neither is configured; fails when
    one is but the server does not answer within a few seconds (CI provisions it: it must not silently skip).
    Tests share the database: give each study a fresh name (``study_name``, ``unique_study_name``) and drop
    nothing.
    """
    url = os.environ.get(POSTGRES_ENV, "").strip()
    source = f"${POSTGRES_ENV}"
    if not url and POSTGRES_URL_FILE.is_file():
        url, source = POSTGRES_URL_FILE.read_text().strip(), str(POSTGRES_URL_FILE)
    if not url:
        pytest.skip(
            f"no PostgreSQL: run ./setup.sh test as root, or set {POSTGRES_ENV}=postgresql+psycopg2://..."
        )
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    shown = "(a URL SQLAlchemy cannot parse)"
    try:
        parsed = sqlalchemy.engine.make_url(url)
        shown = parsed.render_as_string(hide_password=True)
        timeout = {"connect_timeout": 5} if parsed.get_driver_name() in ("psycopg2", "psycopg") else {}
        engine = sqlalchemy.create_engine(parsed, poolclass=NullPool, connect_args=timeout)
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:
        pytest.fail(
            f"PostgreSQL {shown} (from {source}) is unreachable: {type(exc).__name__}: {exc}\n"
            f"Run ./setup.sh test as root (it starts the local cluster), or fix or unset {POSTGRES_ENV}.",
            pytrace=False,
        )
    return url


def unique_study_name(prefix: str = "test") -> str:
    """A study name no other test run uses, for a storage several tests (and runs) share."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def study_name(request) -> str:
    """A fresh study name per test, readable in the database: the test's name plus a random suffix."""
    return unique_study_name(request.node.name)


# verl 0.9.1's own Hydra configuration, composed in this process by hydra-core (autotune's dependency): one
# initialisation per session, since Hydra's global state allows one at a time.
VERL_HOW = "./setup.sh test (installs verl 0.9.1 with its dependencies into .venv-verl)"


def verl_config_dir() -> Path | None:
    """verl 0.9.1's `verl/trainer/config`: $VERL_CONFIG_DIR, else setup.sh's .venv-verl."""
    if os.environ.get("VERL_CONFIG_DIR"):
        return Path(os.environ["VERL_CONFIG_DIR"])
    return next(iter(sorted(REPO.glob(".venv-verl/lib/python*/site-packages/verl/trainer/config"))), None)


@pytest.fixture(scope="session")
def verl_compose():
    """compose(overrides) -> verl's composed ppo_trainer config; skips without verl 0.9.1's files."""
    config_dir = verl_config_dir()
    if config_dir is None or not (config_dir / "ppo_trainer.yaml").is_file():
        pytest.skip(f"verl 0.9.1's config files were not found (VERL_CONFIG_DIR unset); to run: {VERL_HOW}")
    version_file = config_dir.parent.parent / "version" / "version"
    version = version_file.read_text().strip() if version_file.is_file() else "unknown"
    if version != "0.9.1":
        pytest.skip(f"found verl {version} at {config_dir}; autotune reads verl 0.9.1 ({VERL_HOW})")
    from hydra import compose, initialize_config_dir

    with _read_once(), initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
        yield lambda overrides: compose("ppo_trainer", overrides=overrides)


@contextlib.contextmanager
def _read_once() -> Iterator[None]:
    """Hydra parses each of verl's ~30 YAML files again at every compose: half its time. The files do not
    change during a session, so each is parsed once and Hydra gets a fresh copy of it (Hydra merges into what
    it loads); everything Hydra does with the files is unchanged. The class patched is the one Hydra resolves
    for file:// (its plugin scan loads it a second time: the class a plain import gives is not it, and a patch
    on that one never ran). Measured: 0.39 s a compose before, 0.23 s now; Hydra's own pkg:// files, cached
    too, saved nothing measurable."""
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    Plugins.instance()  # the scan registers the config sources
    source = SourcesRegistry.instance().resolve("file")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(source, "load_config", _parsed_once(source.load_config))
        yield


def _parsed_once(parse: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    import copy

    parsed: dict[tuple[str, str], Any] = {}

    def load_config(self, config_path: str):
        key = (self.path, config_path)
        if key not in parsed:
            parsed[key] = parse(self, config_path)
        return copy.deepcopy(parsed[key])

    return load_config
