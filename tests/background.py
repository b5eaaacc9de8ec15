"""A thread for tests that run a loop (a learner's, an actor's) in the background and check how it ended."""

from __future__ import annotations

import threading
from typing import Callable


class Background(threading.Thread):
    """Runs `target()` on a daemon thread; the exception it raised, if any, is kept in `error`."""

    def __init__(self, target: Callable[[], object]):
        super().__init__(daemon=True)
        self.call = target
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.call()
        except Exception as e:  # kept for the test to report
            self.error = e
