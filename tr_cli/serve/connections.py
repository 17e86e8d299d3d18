"""Connections that cannot be held open for nothing: uvicorn closes a keep-alive connection that
idles after a response, but one that never sends a complete request head (or trickles it a byte
at a time) stays open for ever. `with_head_deadline` gives uvicorn's h11 protocol a deadline for
each request head; the body has its own read timeout in the app's RequestGate."""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_SECONDS = 10.0  # a client sends its request head at once; 10 s is generous over any network


def with_head_deadline(seconds: float = HEAD_SECONDS) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request head is not complete `seconds`
    after it opened (or after the previous response ended). Pass it as uvicorn's `http`."""

    class HeadDeadlineProtocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_deadline()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the head is complete
                self._disarm_head_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm_head_deadline()  # the next request on this connection gets its own

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_deadline()
            super().connection_lost(exc)

        def _arm_head_deadline(self) -> None:
            self._disarm_head_deadline()
            self._head_deadline = self.loop.call_later(seconds, self._head_deadline_passed)

        def _disarm_head_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_deadline_passed(self) -> None:
            self._head_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeadDeadlineProtocol
