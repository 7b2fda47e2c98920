"""A job's place in the server's queue: held from admission until the job ends, or until its client leaves while
it is still waiting, whichever comes first, and released exactly once.

Without this a queued request whose client disconnected kept its place until the worker reached it, i.e. until
the running generation ended (hours, for a long job), and new clients were answered 429 meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class QueueSlot:
    """waiting -> running -> released, or waiting -> released (abandoned); `leave` runs once, under `lock`."""

    def __init__(self, lock: threading.Lock | None = None, leave: Callable[[], None] = lambda: None) -> None:
        self._lock = lock or threading.Lock()
        self._leave = leave
        self._state = "waiting"

    def start(self) -> bool:
        """The worker reached the job: -> False if it was abandoned meanwhile (then it must not run)."""
        with self._lock:
            if self._state != "waiting":
                return False
            self._state = "running"
            return True

    def release_if_waiting(self) -> bool:
        """The client left: free the place now if the job has not started; -> whether it was freed."""
        with self._lock:
            if self._state != "waiting":
                return False
            self._release()
            return True

    def finish(self) -> None:
        """The job ended; the caller holds the lock."""
        if self._state != "released":
            self._release()

    def _release(self) -> None:
        self._state = "released"
        self._leave()
