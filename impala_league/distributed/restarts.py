"""The supervisors' restart rule: a crash *rate*, not a lifetime count.

A long run sees sporadic crashes (an OOM kill, a flaky emulator) that a restart cures; a crash loop (a
child that dies again as soon as it starts) has a cause a restart will not fix. `RestartBudget` tells the
two apart by counting restarts in a sliding window of time.
"""

from __future__ import annotations

import collections
import time
from typing import Callable


class RestartBudget:
    """At most `max_restarts` restarts within any `window_s` seconds (a sliding window).

    max_restarts: restarts allowed in one window (0: none at all).
    window_s: the window's length in seconds (> 0); a restart older than that no longer counts.
    clock: monotonic seconds (`time.monotonic`; tests pass a simulated one).

    With the defaults (run.max_restarts 20, run.restart_window_s 600) one crash a minute goes on for
    ever, while a child that dies within seconds of each start uses up the budget in a minute or two.
    """

    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if max_restarts < 0 or window_s <= 0:
            raise ValueError(f"max_restarts >= 0 and window_s > 0, got {max_restarts} and {window_s}")
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.clock = clock
        self.times: collections.deque[float] = collections.deque()  # restarts still inside the window
        self.total = 0  # restarts over the budget's life

    def take(self) -> bool:
        """Count one restart now; False (nothing counted) when the window already holds `max_restarts`."""
        now = self.clock()
        while self.times and self.times[0] <= now - self.window_s:
            self.times.popleft()
        if len(self.times) >= self.max_restarts:
            return False
        self.times.append(now)
        self.total += 1
        return True

    def describe(self) -> str:
        """The rule in words, for the supervisor's error: '21 crashes within 600 s (...)'."""
        return (f"{len(self.times) + 1} crashes within {self.window_s:g} s, more than run.max_restarts="
                f"{self.max_restarts} per run.restart_window_s={self.window_s:g}")
