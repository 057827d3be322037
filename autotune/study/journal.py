"""Optuna's journal file, made crash-safe: a record is appended whole or not at all.

Optuna appends each batch of records as JSON lines. When the disk fills (or the process dies) in the middle
of a write, a torn line stays at the end of the file; the next append lands after it, the torn line is then in
the middle, and from then on every reader of the study fails on it. Here:

- an append that fails truncates the file back to where it began, under the journal's lock, so no torn line
  is left behind by us;
- before appending, a torn tail left by a process that died mid-write (no final newline) is cut off, and the
  cut bytes are kept beside the journal (`<journal>.torn-<time>`);
- when a study is opened, a damaged line in the middle of the file (which no append of ours can leave) is
  refused with one line saying how to repair it: the records before it are complete and are kept.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import get_lock_file

from autotune.errors import UserError

__all__ = ["SafeJournalFileBackend", "check_journal"]

log = logging.getLogger(__name__)


class SafeJournalFileBackend(JournalFileBackend):
    """Optuna's journal file backend whose appends are all-or-nothing (see the module docstring)."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(entry, separators=(",", ":")) + "\n" for entry in logs).encode("utf-8")
        with get_lock_file(self._lock), open(self._file_path, "r+b") as handle:
            start = _cut_torn_tail(handle, Path(self._file_path))
            try:
                handle.seek(start)
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            except OSError:
                handle.truncate(start)  # frees what was written: the file ends on its last whole record
                raise


def _cut_torn_tail(handle, path: Path) -> int:
    """The end of the last whole record; a torn tail after it is cut off and kept beside the journal."""
    size = os.fstat(handle.fileno()).st_size
    if size == 0:
        return 0
    end = _last_newline_end(handle, size)
    if end == size:
        return size
    handle.seek(end)
    torn = handle.read()
    kept = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    kept.write_bytes(torn)
    handle.truncate(end)
    log.warning("journal %s ended in a torn record (%d bytes): cut off and kept in %s", path, len(torn), kept)
    return end


def _last_newline_end(handle, size: int, block: int = 1 << 16) -> int:
    """The offset just after the file's last newline (0 when it has none)."""
    position = size
    while position > 0:
        start = max(0, position - block)
        handle.seek(start)
        chunk = handle.read(position - start)
        index = chunk.rfind(b"\n")
        if index >= 0:
            return start + index + 1
        position = start
    return 0


def check_journal(path: Path) -> None:
    """Refuse a journal with a damaged record before its end (a torn last record is cut at the next write).

    One line: which line, and how to repair (the records before it are whole: keeping them keeps the trials
    they hold)."""
    if not path.is_file():
        return
    with path.open("rb") as handle:
        lines = handle.read().split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):  # the last piece is the (possibly torn) tail
        try:
            json.loads(line)
        except ValueError:
            raise UserError(
                f"journal {path} line {number} of {len(lines) - 1} is damaged (not a JSON record); "
                f"the {number - 1} records before it are whole: copy the file aside, then keep only them "
                f"(head -n {number - 1} COPY > {path}) and run the same command again"
            ) from None
