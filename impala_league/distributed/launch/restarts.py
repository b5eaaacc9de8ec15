"""The supervisors' restart rule: a crash *loop* of one child, not a count of crashes.

A long run sees sporadic crashes (an OOM kill, a flaky emulator, a lost node taking many actors at once)
that a restart cures; a crash loop (a child that dies again as soon as it starts) has a cause a restart
will not fix. `RestartBudget` tells the two apart per child: only a crash within `loop_s` of the child's
(re)start counts, and a child whose counted crashes fill a sliding window of time is a crash loop.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Callable


class RestartBudget:
    """Per child, at most `max_restarts` counted restarts within any `window_s` seconds (a sliding window);
    a restart counts when the crash came within `loop_s` seconds of the child's (re)start.

    max_restarts: counted restarts allowed to one child in one window (0: none at all).
    window_s: the window's length in seconds (> 0); a restart older than that no longer counts.
    loop_s: a crash this soon after the child's start (> 0; `math.inf`: every crash) is part of a loop; a
        child that had run longer is restarted without counting, so one event that ends many
        long-running children at once (a lost node, a Redis failover) spends nothing.
    clock: monotonic seconds (`time.monotonic`; tests pass a simulated one).

    With the defaults (run.max_restarts 20, run.restart_window_s 600, run.crash_loop_s 60) a child that
    dies within seconds of each start is stopped after 20 restarts in a minute or two, while crashes
    after a minute or more of running are restarted for ever.
    """

    def __init__(self, max_restarts: int, window_s: float, loop_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_restarts < 0 or window_s <= 0 or loop_s <= 0:
            raise ValueError(f"max_restarts >= 0, window_s > 0 and loop_s > 0, got {max_restarts}, {window_s} "
                             f"and {loop_s}")
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.loop_s = loop_s
        self.clock = clock
        self.times: dict[str, collections.deque[float]] = {}  # child -> its counted restarts inside the window
        self.total = 0  # restarts over the budget's life, counted or not

    def take(self, child: str, ran_s: float) -> bool:
        """Restart `child`, which crashed `ran_s` seconds after its (re)start: True, counted only when
        `ran_s` < loop_s; False (nothing counted) when that child's window already holds `max_restarts`."""
        if ran_s >= self.loop_s:
            self.total += 1
            return True
        now = self.clock()
        times = self.times.setdefault(child, collections.deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.max_restarts:
            return False
        times.append(now)
        self.total += 1
        return True

    def describe(self, child: str) -> str:
        """The rule in words, for the supervisor's error: '21 crashes within 600 s (...)'."""
        soon = "" if math.isinf(self.loop_s) else f", each within run.crash_loop_s={self.loop_s:g} s of its start"
        return (f"{len(self.times.get(child, ())) + 1} crashes within {self.window_s:g} s{soon}, more than "
                f"run.max_restarts={self.max_restarts} per run.restart_window_s={self.window_s:g}")
