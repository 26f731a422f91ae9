"""SIGTERM stops a run the way Ctrl-C does.

CI timeouts, ``kill``, Slurm's time limit and container stops end pytest with SIGTERM, whose
default action kills the process on the spot: no fixture teardown, no final ``results.json``,
and none of `launch.process`'s cleanup for the job that was running (for a Slurm job, the
``scancel`` of its step). Turned into ``KeyboardInterrupt``, SIGTERM takes Ctrl-C's path
instead: the running job is stopped and cancelled (`launch.process.run_commands`), pytest
tears the fixtures down, and the plugin writes ``results.json`` with every measurement taken
before the signal. A second SIGTERM is ignored so that it cannot cut that cleanup short
(SIGKILL still can; then the guards end the job, `launch.guard`).

Installed by the plugin in the main thread of every pytest process but the ranks' own, and
only where nobody else handles SIGTERM. No pytest import.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["SigtermInterrupt", "sigterm_as_keyboard_interrupt"]


class SigtermInterrupt(KeyboardInterrupt):
    """The KeyboardInterrupt that a SIGTERM became."""


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        print(
            "\ngpucluster: SIGTERM received: stopping as on Ctrl-C (the running job is stopped, "
            "fixtures are torn down, results.json keeps what was measured)",
            file=sys.stderr,
            flush=True,
        )
    raise SigtermInterrupt("SIGTERM")


def sigterm_as_keyboard_interrupt() -> Callable[[], None] | None:
    """Install the handler; returns the function that puts the previous one back, or None
    when nothing was installed (not the main thread, or SIGTERM already has a handler)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return None
    signal.signal(signal.SIGTERM, _interrupt)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) in (_interrupt, signal.SIG_IGN):
            signal.signal(signal.SIGTERM, previous)

    return restore
