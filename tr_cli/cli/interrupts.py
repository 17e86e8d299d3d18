"""Ctrl-C while chatting: a flag checked between decode steps, a double press to leave, and no
echo of keys typed while a reply streams."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

DOUBLE_INTERRUPT_SECONDS = 1.0


class DoubleInterrupt(KeyboardInterrupt):
    """A second Ctrl-C within a second: leave (saving the matrix), exit status 130."""


class Interrupts:
    """Ctrl-C bookkeeping shared by the prompt and generation.

    While generating, SIGINT only sets a flag that the session checks between decode steps (the
    KV cache is consistent there), so a reply stops cleanly; a second Ctrl-C within a second
    raises DoubleInterrupt.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = float("-inf")
        self.pending = False

    def hit(self) -> bool:
        """Record a Ctrl-C; True when it is the second within DOUBLE_INTERRUPT_SECONDS."""
        now = self.clock()
        double = now - self.last < DOUBLE_INTERRUPT_SECONDS
        self.last = now
        return double

    def requested(self) -> bool:
        return self.pending

    def _handler(self, signum, frame) -> None:
        if self.hit():
            raise DoubleInterrupt()
        self.pending = True

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """SIGINT raises the flag instead of KeyboardInterrupt inside this block."""
        self.pending = False
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def no_echo(stream) -> Iterator[None]:
    """Keys typed while a reply streams are not echoed into it (they still reach the next prompt)."""
    try:
        import termios

        fd = stream.fileno()
        if not os.isatty(fd):
            raise OSError
        old = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError, AttributeError):
        yield
        return
    new = list(old)
    new[3] &= ~(termios.ECHO | getattr(termios, "ECHOCTL", 0))
    termios.tcsetattr(fd, termios.TCSANOW, new)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, old)
