"""SIGTERM and SIGHUP at the chat prompt end it with Terminated, whatever the prompt is doing when
the signal comes. tr's handler used to raise wherever the main thread was: while prompt-toolkit's
event loop handled keys, inside one of its callbacks, where asyncio hands the exception to
prompt-toolkit's error page, which printed it and waited for Enter: the chat stayed at its prompt
(the e2e test of keys typed at the prompt hung in half its runs or more). Each case runs in a
child process (tests/prompt_signal_check.py), bounded in time and memory."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs POSIX signals")

SCRIPT = Path(__file__).parents[2] / "prompt_signal_check.py"
SECONDS = 30  # far more than a prompt ended by the signal takes (well under 1 s)


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def prompt_signalled(sig: signal.Signals, when: str) -> list[str]:
    """The child's lines: what its prompt raised or read, and whether tr's handler is back."""
    try:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), sig.name, when],
            capture_output=True,
            text=True,
            timeout=SECONDS,
            preexec_fn=_capped,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the prompt was still running {SECONDS} s after {sig.name}: {exc.stdout!r}")
    return done.stdout.splitlines()


@pytest.mark.parametrize("when", ["handling-a-key", "idle-other-thread", "idle-main-thread"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_terminating_signal_ends_the_prompt_whatever_it_does(sig, when):
    """And afterwards SIGTERM is tr's handler again: the prompt's does not outlive it (asyncio's
    remove_signal_handler would have left the default, which kills without saving)."""
    assert prompt_signalled(sig, when) == [f"raised Terminated {sig.name}", "handler tr"]
