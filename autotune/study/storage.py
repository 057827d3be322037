"""Where a study lives: Optuna storages from a `--storage` value, retries while it is away, and redaction.

    sqlite:///reports/s/study.db      one process (the embedded default)
    journal:reports/s/study.journal   several processes on one node (Optuna's journal file, file locks)
    postgresql+psycopg2://u:p@h/db    several nodes (any SQLAlchemy URL Optuna's RDBStorage takes)

Database storages get Optuna's heartbeat: a worker records one per running trial while it probes, and any
worker fails the trials whose heartbeat went quiet (`autotune.study.recover_stale_trials`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote

import optuna

from autotune.errors import Unavailable, UserError

__all__ = [
    "GRACE_SECONDS",
    "PATIENCE_SECONDS",
    "check_parallel_safe",
    "default_storage_url",
    "file_guard",
    "first_line",
    "is_sqlite",
    "journal_path",
    "make_storage",
    "redact",
    "remember_password",
    "retrying",
    "scrub",
    "sqlite_path",
    "transient",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

JOURNAL_PREFIX = "journal:"
HEARTBEAT_SECONDS = 20
# Storage outages: retry with doubling waits (1, 2, 4, ... capped at 30 s) for this long, then give up.
PATIENCE_SECONDS = 300.0
# A trial is stale after this long without a heartbeat: longer than an outage we ride out (every worker's
# heartbeats stop while the database is away), so that its return does not fail the live workers' trials.
GRACE_SECONDS = int(PATIENCE_SECONDS) + 300
_PASSWORDS: set[str] = set()  # of every storage URL opened: blanked in any message, wherever it came from


_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)([^&#]*)")


def _userinfo(url: str) -> tuple[str, str, str | None, str]:
    """(scheme://, user, password or None, what follows the userinfo's '@').

    The userinfo ends at the *last* '@': a password may hold '/', '?', '#', ':' or '@' unencoded, which URL
    parsers split elsewhere (urlsplit at the first '/'). Cutting at the last '@' may take a query's '@' along:
    that only blanks more, never less."""
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return url, "", None, ""
    user, colon, password = rest[:at].partition(":")
    return scheme + sep, user, password if colon else None, rest[at + 1 :]


def redact(url: str) -> str:
    """A storage URL without its password (user:password@ or ?password=), for every message and log."""
    head, user, password, rest = _userinfo(url)
    if password is not None:
        url = f"{head}{user}:***@{rest}"
    return _QUERY_PASSWORD.sub(r"\1***", url)


def remember_password(url: str) -> None:
    """Every form in which the URL's password can reach a message: as written, percent-decoded, as
    SQLAlchemy reads it, and the host SQLAlchemy would take when an unencoded '@' splits the password."""
    _, _, password, _ = _userinfo(url)
    found = [password, *(value for _, value in _QUERY_PASSWORD.findall(url))]
    found += [unquote(p) for p in found if p]
    with contextlib.suppress(Exception):  # not an SQLAlchemy URL (journal:, a path)
        import sqlalchemy

        parsed = sqlalchemy.engine.make_url(url)
        found += [parsed.password, *(v for k, v in parsed.query.items() if k.lower() == "password")]
        if parsed.host and "@" in parsed.host:
            found.append(parsed.host)
    _PASSWORDS.update(p for p in found if isinstance(p, str) and p)


def scrub(text: str, url: str = "") -> str:
    """`text` (a driver's error message, say) with every known storage password blanked."""
    if url:
        remember_password(url)
    for password in sorted(_PASSWORDS, key=len, reverse=True):  # a longer form before its parts
        text = text.replace(password, "***")
    return text


def file_guard(url: str) -> Callable[[], None]:
    """For an SQLite study: a check that its file is still the one opened. Deleted or replaced mid-run, the
    open connection would write into a file nobody will read again: stop instead (Unavailable), so that the
    measurement goes to the pending file and the next run records it into the study that is there."""
    path = sqlite_path(url)
    if path is None or not path.exists():
        return lambda: None
    opened = path.stat()

    def check() -> None:
        try:
            now = path.stat()
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
            raise Unavailable(
                f"the study file {path} was deleted or replaced while this run was using it; run the same "
                f"command again to go on in the file that is there now"
            )

    return check


def journal_path(url: str) -> Path | None:
    """The file of a journal storage value (`journal:PATH`, or a path ending in .journal), else None."""
    if url.startswith(JOURNAL_PREFIX):
        return Path(url[len(JOURNAL_PREFIX) :].removeprefix("//")).expanduser()
    if url.endswith(".journal") and "://" not in url:
        return Path(url).expanduser()
    return None


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:")


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL (sqlite:///relative or sqlite:////absolute), else None."""
    if not url.startswith("sqlite:///") or url.startswith("sqlite:///:memory:"):
        return None
    return Path(url.removeprefix("sqlite:///")).expanduser()


def check_parallel_safe(url: str, writers: int, by_default: bool = False) -> None:
    """SQLite locks the whole file per write: several writers get 'database is locked'."""
    if writers <= 1 or not is_sqlite(url):
        return
    if by_default:  # an existing study.db: the study began with one probe at a time
        raise UserError(
            f"--parallel {writers}: this study lives in SQLite ({redact(url)}), which is not safe for "
            f"concurrent probes; resume it with --parallel 1, or start another --study for --parallel"
        )
    raise UserError(
        f"--storage {redact(url)}: SQLite is not safe for {writers} concurrent probes; use journal:PATH "
        f"(one node) or a PostgreSQL URL, or leave --storage out for the default"
    )


def default_storage_url(study_dir: Path, parallel: int) -> str:
    """The embedded default: an existing study file wins; else SQLite for one probe, a journal for more."""
    database, journal = study_dir / "study.db", study_dir / "study.journal"
    if journal.exists() or (parallel > 1 and not database.exists()):
        return f"{JOURNAL_PREFIX}{journal.resolve()}"
    return f"sqlite:///{database.resolve()}"


def make_storage(
    url: str,
    heartbeat_seconds: int = HEARTBEAT_SECONDS,
    grace_seconds: int = GRACE_SECONDS,
    on_stale: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
) -> optuna.storages.BaseStorage:
    """An Optuna storage for a `--storage` value; database storages get heartbeats (see module doc)."""
    remember_password(url)
    path = journal_path(url)
    if path is not None:
        from optuna.storages.journal import JournalStorage

        from autotune.study.journal import SafeJournalFileBackend, check_journal

        if not path.parent.is_dir():
            raise UserError(f"--storage {url}: folder {path.parent} does not exist; create it first")
        check_journal(path)
        return JournalStorage(SafeJournalFileBackend(str(path)))
    for attempt in range(SETUP_ATTEMPTS):
        try:
            with warnings.catch_warnings():  # "experimental" in Optuna; they are how dead workers are found
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url,
                    heartbeat_interval=heartbeat_seconds,
                    grace_period=grace_seconds,
                    heartbeat_stale_trial_callback=on_stale,
                    engine_kwargs=_engine_options(url),
                )
        except Exception as exc:
            if not _lost_setup_race(exc) or attempt == SETUP_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


# Opening a new database creates Optuna's tables and its one version row. Two processes opening it at once
# (two workers, or `report` while `run` starts) race between "does it exist" and "create": the loser gets
# "table ... already exists" or a duplicate version row. Opened again, it finds the tables and goes on.
SETUP_ATTEMPTS = 16


def _lost_setup_race(exc: BaseException) -> bool:
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.IntegrityError):
        return True
    return isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.ProgrammingError) and (
        "already exists" in str(exc)
    )


def _engine_options(url: str) -> dict:
    """Fail fast on a dead server (the retry loop, not the driver, decides how long to wait)."""
    if url.startswith("postgresql"):
        # keepalives: a half-open connection (server gone, no FIN) fails in about a minute, not hours
        keepalive = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
        return {"connect_args": {"connect_timeout": 10, **keepalive}, "pool_pre_ping": True}
    if url.startswith("mysql"):
        return {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    return {}


def transient(exc: BaseException) -> bool:
    """An error that a storage coming back would cure (connection lost, file briefly unreadable)."""
    import sqlalchemy.exc

    return isinstance(
        exc,
        optuna.exceptions.StorageInternalError
        | sqlalchemy.exc.OperationalError
        | sqlalchemy.exc.InterfaceError
        | OSError,
    )


def retrying(
    operation: Callable[[], T],
    what: str,
    url: str,
    patience: float = PATIENCE_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    cancel: threading.Event | None = None,
) -> T:
    """Run a storage operation; while it fails transiently, retry with doubling waits for `patience` s
    (or until `cancel` is set: a second Ctrl-C gives up on the storage at once)."""
    started, wait = time.monotonic(), 1.0
    while True:
        try:
            return operation()
        except Exception as exc:
            if not transient(exc):
                raise
            waited = time.monotonic() - started
            if waited + wait > patience or (cancel is not None and cancel.is_set()):
                raise Unavailable(
                    f"storage {redact(url)} unreachable while {what} for {waited:.0f} s "
                    f"({type(exc).__name__}: {scrub(first_line(exc), url)}); every completed trial is kept: "
                    f"bring it back and run the same command again"
                ) from None
            log.warning(
                "storage %s: %s failed (%s); retrying in %.0f s",
                redact(url),
                what,
                scrub(str(exc), url),
                wait,
            )
            if cancel is not None:
                cancel.wait(wait)
            else:
                sleep(wait)
            wait = min(wait * 2, 30.0)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
