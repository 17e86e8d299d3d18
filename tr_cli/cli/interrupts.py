"""Signals: Ctrl-C while chatting (a flag checked between decode steps, a double press to
leave), SIGTERM and SIGHUP (leave, saving), and no echo of keys typed while a reply streams."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

DOUBLE_INTERRUPT_SECONDS = 1.0


class DoubleInterrupt(KeyboardInterrupt):
    """A second Ctrl-C within a second: leave (saving the matrix), exit status 130."""


@contextlib.contextmanager
def handling(signals: tuple[int, ...], handler: Callable) -> Iterator[None]:
    """`handler` answers these signals inside the block; the previous handlers come back after.
    Only the main thread may install handlers: elsewhere the block runs with them unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Terminated(BaseException):
    """SIGTERM or SIGHUP (a service manager, a closed terminal): leave as after Ctrl-C, the hot
    state saved by the `finally` blocks on the way out, exit status 128 + the signal. Not an
    Exception, so no error handler on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


TERMINATING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signum)


def terminating_signals() -> contextlib.AbstractContextManager[None]:
    """Inside this block SIGTERM and SIGHUP raise Terminated instead of killing the process at
    once (which lost what the run had learned)."""
    return handling(TERMINATING_SIGNALS, _raise_terminated)


@contextlib.contextmanager
def ending_app(app) -> Iterator[None]:
    """While `app` (a prompt-toolkit Application) runs, SIGTERM and SIGHUP end it with Terminated
    through its own exit. Raised where the main thread happens to be, Terminated could land inside
    one of the event loop's callbacks (while it handles keys), where asyncio hands it to
    prompt-toolkit's error page ("Press ENTER to continue"): the chat sat at its prompt, killed only
    by SIGKILL, its learning lost. A signal the app could no longer take (it was already closing)
    is raised once the block is left; one that comes with another way out (Ctrl-D, Ctrl-C) wins."""
    received: list[int] = []

    def end(signum: int) -> None:
        future = app.future
        if future is not None and not future.done():
            app.exit(exception=Terminated(signum))

    def handler(signum, frame) -> None:
        received.append(signum)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop in between: plain Python, raising here is safe
            raise Terminated(signum) from None
        loop.call_soon_threadsafe(end, signum)

    with handling(TERMINATING_SIGNALS, handler):
        try:
            yield
        except BaseException as exc:
            if received and not isinstance(exc, Terminated):
                raise Terminated(received[0]) from None
            raise
    if received:
        raise Terminated(received[0])


@contextlib.contextmanager
def held_back() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait until this block is done, then act as they would have
    (KeyboardInterrupt, Terminated). For the save on the way out: a signal that cut it short
    (say while it waits up to LOCK_WAIT_SECONDS for another process's lock) lost the run's
    learning without a word."""
    received: list[int] = []
    with handling((signal.SIGINT, *TERMINATING_SIGNALS), lambda signum, frame: received.append(signum)):
        yield
    if not received:
        return
    signum = received[0]
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


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
        with handling((signal.SIGINT,), self._handler):
            yield


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
