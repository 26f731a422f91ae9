"""SIGTERM becomes KeyboardInterrupt once, then is ignored; a handler someone else set is left alone
(each case in a fresh Python, so this process's own signal handling is never touched)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, signal, sys, time
from pytest_gpucluster.sigterm import SigtermInterrupt, sigterm_as_keyboard_interrupt
{setup}
restore = sigterm_as_keyboard_interrupt()
print("installed" if restore else "not installed", flush=True)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("no interrupt", flush=True)
except SigtermInterrupt:
    print("interrupted", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # a second one during the cleanup
    time.sleep(0.2)
    print("cleanup finished", flush=True)
    restore()
    print("restored", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
"""


def run(setup: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(setup=setup)], capture_output=True, text=True, timeout=30
    )


def test_sigterm_takes_the_keyboard_interrupt_path_once():
    done = run()
    assert done.stdout.splitlines() == ["installed", "interrupted", "cleanup finished", "restored True"]
    assert "gpucluster: SIGTERM received: stopping as on Ctrl-C" in done.stderr
    assert done.returncode == 0


def test_an_existing_sigterm_handler_is_left_alone():
    done = run("signal.signal(signal.SIGTERM, lambda *a: print('their handler', flush=True))")
    assert done.stdout.splitlines() == ["not installed", "their handler", "no interrupt"]
