"""Ctrl-C counting in `autotune run` (autotune.run.loop.StopControl): the first press finishes the running
probe, the second kills it, also when both arrive before Python runs the handler once."""

from __future__ import annotations

import io
import os
import signal
import threading
import time

from rich.console import Console

from autotune.run.loop import StopControl


def _press_twice_while_the_main_thread_waits() -> None:
    """Two SIGINTs the C-level handler takes on another thread while the main thread waits in a read: Python
    then runs the handler once, for both (the merge that made a quick double Ctrl-C count as one)."""
    waiting, done = threading.Event(), os.pipe()

    def press() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        waiting.wait()
        time.sleep(0.1)  # the main thread is in its read by now
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        os.write(done[1], b"x")

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # not delivered to this thread
    presser = threading.Thread(target=press)
    try:
        presser.start()
        waiting.set()
        os.read(done[0], 1)  # one C call: no handler runs until it returns
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        presser.join()
        for end in done:
            os.close(end)


def test_two_presses_handled_at_once_kill_the_probe():
    said = io.StringIO()
    calls = []
    with StopControl(Console(file=said)) as control:
        handler = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, lambda signum, frame: (calls.append(signum), handler(signum, frame)))
        _press_twice_while_the_main_thread_waits()
        time.sleep(0.05)  # the handler runs at the main thread's next check
    assert calls == [signal.SIGINT]  # one handler call for two presses
    assert control.stop_requested and control.cancel.is_set()
    assert "finishing the running probe" in said.getvalue() and "Ctrl-C again: killing" in said.getvalue()


def test_one_press_finishes_the_probe_and_a_later_one_kills_it():
    said = io.StringIO()
    with StopControl(Console(file=said)) as control:
        signal.raise_signal(signal.SIGINT)
        assert control.stop_requested and not control.cancel.is_set()
        assert control.stop_reason == "stopped by Ctrl-C"
        signal.raise_signal(signal.SIGTERM)
        assert control.cancel.is_set()
    assert "SIGTERM again: killing" in said.getvalue()


def _wakeup_fd() -> int:
    """The process's signal wakeup fd (-1: none), left as it was."""
    current = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(current)
    return current


def test_leaving_restores_the_handlers_and_the_wakeup_fd():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), _wakeup_fd()
    with StopControl(Console(file=io.StringIO())):
        assert _wakeup_fd() not in (-1, before[2])  # its own, while it listens
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), _wakeup_fd()) == before
