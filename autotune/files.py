"""Files the tool writes for a user: the output folder, and whole files that never appear half-written."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from autotune.errors import UserError

__all__ = ["hold_lock", "make_folder", "write_whole"]


def make_folder(path: Path, option: str = "--out") -> Path:
    """Create `path` (and its parents); a folder that cannot be made is a UserError naming `option`."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"{option}: cannot create {path} ({exc.strerror}); choose a writable folder"
        ) from None
    return path


@contextlib.contextmanager
def hold_lock(path: Path, refusal: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (with our pid in it) while the block runs; the kernel releases it when
    the process dies. Taken already: a UserError of `refusal` with the holder's pid appended."""
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise UserError(f"{refusal} (pid {holder})") from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_whole(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a full disk never leaves a truncated best_config.yaml
    for a training job to pick up."""
    partial = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.partial")  # one per writer
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
