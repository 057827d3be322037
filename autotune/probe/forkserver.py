"""Warm start for probe ranks: a fork server that pays for `import torch`/`transformers`/`peft` once.

Every probe rank used to start a fresh interpreter and import torch, transformers and the model classes
(4-5 s) before doing any work. The launcher now starts, lazily and once per tuner process, the server program
`runners/fork_server.py`, which imports all of that up front and then forks one child per rank on request;
the child sets the rank's environment, process group and stderr file and runs the runner program's
`__main__` with `runpy`, so the runner's CLI and its exit codes are unchanged.

The server never initialises CUDA (children could not use it after a fork) and starts no thread before it
forks; it checks both and refuses to serve otherwise. It exits when its stdin closes (the tuner exited or
shut it down at exit) and dies with the tuner through PR_SET_PDEATHSIG; its ranks die with it the same way.

Anything wrong (the server cannot start, dies, or a request fails) costs nothing but the warm start: the
launcher spawns that probe's ranks as fresh processes. A server found dead is replaced at the next probe, up
to MAX_STARTS times per tuner process. Linux only. Set AUTOTUNE_FORKSERVER=0 to always spawn fresh processes.

Protocol (JSON lines over the server's stdin/stdout):
  server -> {"ready": bool, "reason", "pid", "import_seconds", "os_threads", "cuda_initialized"}  (first line)
  tuner  -> {"request": K, "argv": [program, *args], "env": {...}, "cwd", "log": path, "pgid": G (0: new),
             "cpus": the asking thread's cores}
  server -> {"request": K, "pid": N} or {"request": K, "error": str}, in request order;
            {"exit": N, "code": C} when rank N ends (C as Popen.returncode: negative for a signal).

Peak memory: a forked rank's peak resident set (VmHWM) starts from its RSS at the fork, which includes the
server's imports, as a fresh rank's includes its own; the child maps the server's library pages again (a fork
copies only anonymous page tables) so that CPU peaks match fresh processes' (measured: +2-3%, the extra
preloads).
"""

from __future__ import annotations

import array
import atexit
import contextlib
import ctypes
import importlib
import io
import itertools
import json
import logging
import os
import queue
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from autotune.errors import AutotuneError

__all__ = [
    "ForkServer",
    "ForkServerError",
    "ForkedRank",
    "enabled",
    "get",
    "serve",
    "server_program",
    "shutdown",
]

log = logging.getLogger(__name__)

SWITCH = "AUTOTUNE_FORKSERVER"
MAX_STARTS = 3
START_TIMEOUT_SECONDS = 180.0  # the server's imports, on a busy machine
REPLY_TIMEOUT_SECONDS = 30.0
REAP_SECONDS = 0.05  # the launcher polls its ranks at this rate too
# What a probe rank imports before any work. No torch op runs here: that would start torch's thread pools.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.utils.data",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.deberta_v2.modeling_deberta_v2",
    "peft",
    "autotune.probe.rank.measure",
    "autotune.probe.rank.ppo",
    "autotune.probe.rank.model_build",
    "autotune.probe.rank.prompts",
    "autotune.models.catalog",
    "autotune.models.tokenizer",
)
_PR_SET_PDEATHSIG = 1
_MADV_POPULATE_READ = 22  # Linux 5.14+


class ForkServerError(AutotuneError):
    """The server could not start or answer; the caller spawns fresh processes instead (never reaches the
    user: exit code 1 if it did)."""


# --------------------------------------------------------------------------------------------- tuner side


class ForkedRank:
    """A rank forked by the server, with the part of `subprocess.Popen` the launcher uses."""

    def __init__(self, pid: int, log_path: str) -> None:
        self.pid = pid
        self.log_path = log_path
        self.returncode: int | None = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


def server_program() -> Path:
    return Path(str(resources.files("autotune.runners").joinpath("fork_server.py")))


class ForkServer:
    """One running server: a reader thread routes its replies to `fork()` and its exit reports to ranks."""

    forked_total = 0  # ranks forked by every server of this process

    def __init__(self, program: Path | None = None) -> None:
        program = program or server_program()
        # The server's own messages, shown only if it fails to start.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        # Its own process group: the terminal's Ctrl-C goes to the tuner, which decides what to cancel.
        # Its PR_SET_PDEATHSIG fires when the *thread* that started it ends: `get` starts it from a thread
        # that lives as long as this process (a study's probe threads end with the study).
        self.proc = subprocess.Popen(
            [sys.executable, str(program), "--parent", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            process_group=0,
        )
        self.pid = self.proc.pid
        self._alive = True
        self._requests = itertools.count()
        self._ranks: dict[int, ForkedRank] = {}  # only the reader thread touches it
        self._pending: dict[int, str] = {}  # request number -> log path, for the reply
        self._replies: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()
        try:
            ready = self._replies.get(timeout=START_TIMEOUT_SECONDS)
        except queue.Empty:
            ready = {"reason": f"not ready after {START_TIMEOUT_SECONDS:.0f} s"}
        if not (isinstance(ready, dict) and ready.get("ready")):
            self.stop()
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace")[-2000:]
            reason = ready.get("reason", "exited") if isinstance(ready, dict) else "exited"
            raise ForkServerError(f"fork server did not start: {reason}\n{tail}".strip())
        self.info: dict[str, Any] = ready

    @property
    def alive(self) -> bool:
        return self._alive and self.proc.poll() is None

    def _read(self) -> None:
        try:
            for line in self.proc.stdout or ():
                message = json.loads(line)
                if "exit" in message:
                    rank = self._ranks.pop(message["exit"], None)
                    if rank is not None:
                        rank._exited(message["code"])
                elif "pid" in message and "request" in message:
                    # Registered here, before the next line is read, so that no exit report can be missed.
                    rank = ForkedRank(message["pid"], self._pending.pop(message["request"]))
                    self._ranks[rank.pid] = rank
                    self._replies.put(rank)
                else:
                    self._replies.put(message)
        except (OSError, ValueError, KeyError):
            pass
        finally:
            # The server is gone, and its ranks died with it (PR_SET_PDEATHSIG): say so where users look.
            self._alive = False
            for rank in self._ranks.values():
                with contextlib.suppress(OSError), open(rank.log_path, "a") as stderr:
                    stderr.write("\n[autotune] the fork server exited; this rank was killed with it\n")
                rank._exited(-signal.SIGKILL)
            self._replies.put(None)

    def fork(self, argv: list[str], env: dict[str, str], log_path: Path, pgid: int) -> ForkedRank:
        """Fork one rank running `argv` (program first) into process group `pgid` (0: a new one)."""
        with self._lock:
            if not self.alive:
                raise ForkServerError("fork server is not running")
            request = next(self._requests)
            self._pending[request] = str(log_path)
            message = {"request": request, "argv": argv, "env": env, "cwd": os.getcwd()}
            # the cores of the asking thread, as a fresh process started from it would have them: the
            # server has those of the thread that started it (the affinity is a thread's, not a process's)
            message.update(log=str(log_path), pgid=pgid, cpus=sorted(os.sched_getaffinity(0)))
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps(message).encode() + b"\n")
                self.proc.stdin.flush()
                reply = self._replies.get(timeout=REPLY_TIMEOUT_SECONDS)
            except (OSError, queue.Empty) as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            if not isinstance(reply, ForkedRank):
                # Out of step with the server (or it is gone): retire it rather than guess.
                self.stop()
                raise ForkServerError((reply or {}).get("error", "fork server exited"))
            ForkServer.forked_total += 1
            return reply

    def stop(self) -> None:
        """Close its stdin: the server kills the process groups of ranks still running and exits."""
        self._alive = False
        if self.proc.stdin:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_server: ForkServer | None = None
_keeper: queue.Queue[Future[ForkServer]] | None = None  # requests to the thread that starts every server
_starts = 0
_owner = os.getpid()
_lock = threading.Lock()


def enabled() -> bool:
    off = ("0", "false", "no", "off")
    return sys.platform.startswith("linux") and os.environ.get(SWITCH, "1").strip().lower() not in off


def get() -> ForkServer | None:
    """The tuner's server, started on first use; None means: spawn this probe's ranks as fresh processes.

    A server found dead is replaced at the next call, not this one, so a server that keeps dying costs every
    other probe its warm start at most, and only MAX_STARTS times.
    """
    global _server, _starts
    if not enabled() or os.getpid() != _owner:  # a forked copy of the tuner does not share the server
        return None
    with _lock:
        if _server is not None:
            if _server.alive:
                return _server
            log.debug("fork server %d exited; spawning fresh processes for this probe", _server.pid)
            _server.stop()
            _server = None
            return None
        if _starts >= MAX_STARTS:
            return None
        _starts += 1
        try:
            _server = _start_from_keeper()
        except (ForkServerError, OSError) as exc:
            log.debug("%s; probes spawn fresh processes", exc)
            _starts = MAX_STARTS  # it would fail the same way next time
            return None
        return _server


def _start_from_keeper() -> ForkServer:
    """A new server, started from the keeper: a daemon thread that lives until this process exits (after
    `shutdown` has stopped the server). The server dies with the thread that started it (PR_SET_PDEATHSIG):
    started from a study's probe thread, it died when the study ended, and every re-measure and gain probe
    after it paid a fresh start (3 s of 4 on the tests' tiny model)."""
    global _keeper
    if _keeper is None:
        _keeper = queue.Queue()
        threading.Thread(target=_keep, args=(_keeper,), name="forkserver-keeper", daemon=True).start()
    started: Future[ForkServer] = Future()
    _keeper.put(started)
    try:
        return started.result()
    except BaseException:  # interrupted while it starts (Ctrl-C): stop it once started, nobody will
        started.add_done_callback(_stop_unclaimed)
        raise


def _stop_unclaimed(started: Future[ForkServer]) -> None:
    if started.exception() is None:
        started.result().stop()


def _keep(requests: queue.Queue[Future[ForkServer]]) -> None:
    while True:
        started = requests.get()
        try:
            started.set_result(ForkServer())
        except BaseException as exc:  # the caller handles it, in its own thread
            started.set_exception(exc)


@atexit.register
def shutdown() -> None:
    global _server
    with _lock:
        if _server is not None:
            _server.stop()
            _server = None


# -------------------------------------------------------------------------------------------- server side


def _die_with(parent: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def _preload() -> dict[str, Any]:
    started = time.monotonic()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a rank that needs it fails the same way, with its own traceback
            print(f"fork server: cannot preload {name}: {exc}", file=sys.stderr)
    torch = sys.modules.get("torch")
    cuda = bool(torch and torch.cuda.is_initialized())
    with open("/proc/self/maps") as maps:
        cuda = cuda or "libcuda.so" in maps.read()  # the driver is loaded: something touched CUDA
    # The OS's view, not only Python's: a BLAS or OpenMP pool started here would be broken in a child.
    threads = len(os.listdir("/proc/self/task"))
    info = {
        "pid": os.getpid(),
        "import_seconds": round(time.monotonic() - started, 3),
        "os_threads": threads,
        "python_threads": threading.active_count(),
        "cuda_initialized": cuda,
    }
    reason = "CUDA was initialised" if cuda else f"{threads} threads" if threads > 1 else ""
    return {"ready": not reason, "reason": reason, **info}


def _mapped_file_pages() -> list[tuple[int, int]]:
    """(address, length) runs of the file pages (libraries) this process has mapped, from its pagemap."""
    page = os.sysconf("SC_PAGE_SIZE")
    runs = []
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/") or fields[5].startswith("/dev/"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            pagemap.seek(start // page * 8)
            entries = array.array("Q", pagemap.read((end - start) // page * 8))
            for present, group in itertools.groupby(entries, key=lambda entry: entry >> 63):
                length = sum(1 for _ in group) * page
                if present:
                    runs.append((start, length))
                start += length
    return runs


def _map_again(runs: list[tuple[int, int]]) -> None:
    """Map the server's library pages in this fork, as a fresh rank has them mapped after its imports.

    A fork copies the page tables of anonymous memory only: file pages come back when touched, so without
    this a forked rank's RSS (its VmHWM, the peak on CPU) misses ~100 MB of library pages that only the
    imports touched, and reads ~10% below a fresh process's for a tiny model. Best effort (old kernels).
    """
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for address, length in runs:
        madvise(address, length, _MADV_POPULATE_READ)


def _exit_code(code: object) -> int:
    """What the interpreter would exit with after `SystemExit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _child(
    request: dict[str, Any], log_fd: int, proto_fd: int, server: int, file_pages: list[tuple[int, int]]
) -> NoReturn:
    """In the forked child: become the rank a fresh `python PROGRAM ARGS` would have been, then run it."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (log_fd, 1), (log_fd, 2)):
            os.dup2(fd, target)
        for fd in (devnull, log_fd, proto_fd):
            os.close(fd)
        # Unbuffered, as PYTHONUNBUFFERED=1 in the rank's environment makes a fresh interpreter.
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), write_through=True)  # noqa: SIM115
        stderr = open(2, "wb", 0, closefd=False)  # noqa: SIM115
        sys.stderr = io.TextIOWrapper(stderr, write_through=True, errors="backslashreplace")
        os.setpgid(0, request["pgid"])  # the server does it too; whichever runs first wins
        _die_with(server)
        _map_again(file_pages)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        if request.get("cpus"):
            os.sched_setaffinity(0, request["cpus"])
        program = os.path.abspath(request["argv"][0])
        sys.argv = [program, *request["argv"][1:]]
        sys.path[0] = os.path.dirname(program)
        try:
            runpy.run_path(program, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException as exc:
            # As the interpreter would print it: from the program's frame down, without runpy's frames.
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != program:
                tb = tb.tb_next
            traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        # Then what the interpreter does at exit: wait for non-daemon threads, run the exit handlers that the
        # program and its imports registered (multiprocessing's DataLoader workers, logging).
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _fork(request: dict[str, Any], proto_fd: int, file_pages: list[tuple[int, int]]) -> dict[str, Any]:
    server = os.getpid()
    try:
        log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pid = os.fork()
    except OSError as exc:
        return {"request": request.get("request"), "error": f"{type(exc).__name__}: {exc}"}
    if pid == 0:
        _child(request, log_fd, proto_fd, server, file_pages)
    os.close(log_fd)
    # Set it from here too, before the launcher learns the pid: the next rank may join this group at once.
    with contextlib.suppress(OSError):  # the child exits if it cannot join its group
        os.setpgid(pid, request["pgid"] or pid)
    return {"request": request["request"], "pid": pid, "pgid": request["pgid"] or pid}


def _reap(groups: dict[int, int]) -> list[dict[str, int]]:
    exits = []
    while groups:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        groups.pop(pid, None)
        exits.append({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
    return exits


def serve(argv: list[str] | None = None) -> int:
    """The server's main loop (runners/fork_server.py): preload, report ready, fork and reap until EOF."""
    args = argv if argv is not None else sys.argv[1:]
    _die_with(int(args[args.index("--parent") + 1]))
    # Keep stdout for the protocol alone: anything printed here (imports, warnings) goes to stderr.
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # numpy's OpenBLAS starts its thread pool on import otherwise
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # an is_available() in an import must not init CUDA

    def send(message: dict[str, Any]) -> None:
        os.write(proto_fd, json.dumps(message).encode() + b"\n")

    ready = _preload()
    try:
        file_pages = _mapped_file_pages() if ready["ready"] else []
    except OSError:  # no pagemap (some sandboxes): forked ranks' peaks then read a little low
        file_pages = []
    send(ready)
    if not ready["ready"]:
        return 1
    groups: dict[int, int] = {}  # running rank -> its process group
    pending = b""
    try:
        while True:
            if select.select([0], [], [], REAP_SECONDS)[0]:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    break  # the tuner closed our stdin, or exited
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    reply = _fork(json.loads(line), proto_fd, file_pages)
                    if "pid" in reply:
                        groups[reply["pid"]] = reply.pop("pgid")
                    send(reply)
            for message in _reap(groups):
                send(message)
    finally:
        for pgid in set(groups.values()):  # the ranks die with us anyway; their own children might not
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
    return 0
