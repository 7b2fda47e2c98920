"""Slow clients: a connection that does not deliver a request head within the read timeout is closed.

uvicorn times out idle keep-alive connections but not a request head that trickles in (or never comes), so a
few slow clients could hold connections for ever. Its own HTTP protocol class (httptools or h11, whichever
uvicorn picks) is extended by one timer, armed when a connection opens and after each response, and honoured
only if no new request head arrived meanwhile. The body is timed by `app.Guard` (a 408 error object).
Imports uvicorn: import this module only when serving.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol


def timed_protocol(head_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, closing connections whose request head takes over `head_timeout` seconds."""

    class HeadTimeout(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            waiting_after = self.cycle  # the request before the one whose head is awaited (None: first)
            self._head_timer = self.loop.call_later(head_timeout, self._expired, waiting_after)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self, waiting_after: Any) -> None:
            self._head_timer = None
            if self.cycle is waiting_after and not self.transport.is_closing():
                self.transport.close()

    return HeadTimeout
